"""Where a run's workers meet: a free port for psgd's launcher, a process group per attempt under torchrun."""

import os
import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta

import torch
import torch.distributed as dist


@contextmanager
def rendezvous_port() -> Iterator[None]:
    """MASTER_PORT, unless set, a random free port while fit runs: two runs started at once may be handed the
    same port by the kernel (Lightning binds port 0). Removed afterwards: the next job of a sweep draws its own."""
    if "MASTER_PORT" in os.environ:
        yield
        return
    rng = random.SystemRandom()
    while True:
        port = rng.randint(20000, 60999)
        with socket.socket() as s, suppress(OSError):
            s.bind(("", port))
            break
    os.environ["MASTER_PORT"] = str(port)
    try:
        yield
    finally:
        os.environ.pop("MASTER_PORT", None)


def init_elastic_process_group(accelerator: str, backend: str | None, timeout: timedelta) -> None:
    """Under torchrun, make the process group on a store prefix of its own per restart attempt (Lightning then
    uses it): torchrun's agent may keep one store for the whole job, where a restarted worker would read the
    address a dead worker of the previous attempt published (gloo: "connection refused")."""
    env = os.environ
    world_size = int(env.get("WORLD_SIZE", "1"))
    if world_size == 1 or dist.is_initialized():
        return
    rank = int(env["RANK"])
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        world_size,
        is_master=not agent_store and rank == 0,  # otherwise the agent serves it
        timeout=timeout,
        multi_tenant=True,
    )
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    if accelerator == "gpu":
        torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend or ("nccl" if accelerator == "gpu" else "gloo"),
        store=dist.PrefixStore(f"psgd/attempt{attempt}", store),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
