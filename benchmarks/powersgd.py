"""PowerSGD's step time on CPU: psgd's hook against torch's `powerSGD_hook` and DDP's plain all-reduce, side by side
in one run, 2 gloo workers with one thread each.

    python benchmarks/powersgd.py                       # SINGA CNN, batch 32, ~1 min on 2 cores
    python benchmarks/powersgd.py --model wide_resnet --batch 16 --steps 10

psgd's hook issues its all-reduces from the hook, in one order on every rank (it waits for P there, Q needs it);
torch's issues the second and third from future callbacks, which on gloo fails with two or more buckets
(pytorch#58467): torch's is therefore timed with every gradient in one bucket (bucket_cap_mb 1000), psgd's with
that too and with DDP's default buckets. Each variant takes `--steps` steps after `--warmup` (PowerSGD from the
third step, rank 2) in every round, rounds interleaved (A B C A B C ...); the figure is the median step (ms) of
rank 0 over all rounds. Data are random MNIST- or CIFAR-shaped batches: the network's arithmetic is what is timed.
"""

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from psgd.models import SingaCNN, WideResNet
from psgd.strategies.compression import PowerSGD, build_compressor

MODELS = {"singa_cnn": (SingaCNN, (1, 28, 28)), "wide_resnet": (WideResNet, (1, 28, 28))}
VARIANTS = {  # name: (hook, bucket_cap_mb)
    "DDP all-reduce (no compression), default buckets": ("none", None),
    "torch's powerSGD_hook, one bucket": ("torch", 1000),
    "psgd's PowerSGD, one bucket": ("psgd", 1000),
    "psgd's PowerSGD, DDP's default buckets": ("psgd", None),
}


def timed_steps(model_name: str, variant: str, steps: int, warmup: int, batch: int, rank: int) -> list[float]:
    build, shape = MODELS[model_name]
    torch.manual_seed(0)
    model = build()
    hook, cap = VARIANTS[variant]
    ddp = DistributedDataParallel(model, **({"bucket_cap_mb": cap} if cap else {}))
    params = list(model.parameters())
    if hook == "torch":
        ddp.register_comm_hook(powerSGD_hook.PowerSGDState(None, 2, 2, random_seed=0), powerSGD_hook.powerSGD_hook)
    elif hook == "psgd":
        compressor = PowerSGD(None, params, 2, 2)
        ddp.register_comm_hook(None, compressor.hook)
    else:
        compressor = build_compressor("none", None, params)
        ddp.register_comm_hook(None, compressor.hook)
    opt = torch.optim.SGD(params, lr=0.01)
    data = torch.Generator().manual_seed(rank)
    times = []
    for step in range(warmup + steps):
        x, y = torch.randn(batch, *shape, generator=data), torch.randint(0, 10, (batch,), generator=data)
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if step >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return times


def worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    try:
        for _ in range(args.rounds):
            for name in VARIANTS:
                times[name] += timed_steps(args.model, name, args.steps, args.warmup, args.batch, rank)
        if rank == 0:
            torch.save(times, out)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="singa_cnn")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "times.pt")
        mp.start_processes(worker, args=(port, args, out), nprocs=2, start_method="spawn")
        times = torch.load(out, weights_only=True)
    reference = statistics.median(times["torch's powerSGD_hook, one bucket"])
    print(f"{args.model}, batch {args.batch} per worker, 2 gloo workers, {args.rounds} x {args.steps} steps each")
    print("| variant | median step (ms) | vs torch's PowerSGD |\n|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t):.1f} | {statistics.median(t) / reference:.2f} |")


if __name__ == "__main__":
    main()
