"""Scaling out with torchrun (torch elastic), on this machine over loopback.

Two torchrun invocations with node ranks 0 and 1 make a real 2-node x 2-process job (static
rendezvous at 127.0.0.1); an elastic job with --max-restarts 1 survives one killed worker, with static
and with c10d rendezvous; Ctrl-C on a torchrun job marks it interrupted, once; killing the agent
outright stops its workers. Slow:
    pytest -m slow tests/integration/test_multinode.py
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from conftest import DUMPS_STACKS, ROOT, ended
from helpers import metrics, scalars, tensorboard

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

TINY = ["quiet=true", "data.batch_size=16", "data.eval_batch_size=64", "threads_per_worker=1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    *overrides: str,
    nnodes: int,
    node_rank: int,
    nproc: int,
    port: int,
    restarts: int = 0,
    rdzv: str = "static",
    session: bool = False,
):
    """torchrun running train.py; `session`: in a process group of its own, as a terminal's job is."""
    if rdzv == "static":  # fixed node ranks, the master's address
        rendezvous = [f"--node-rank={node_rank}", "--master-addr=127.0.0.1", f"--master-port={port}"]
    else:  # elastic: the agents agree on the ranks through a c10d store
        rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=psgd-test"]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        *rendezvous,
        f"--max-restarts={restarts}",
        str(ROOT / "train.py"),
        *overrides,
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **DUMPS_STACKS}
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=session
    )


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str, str]:
    out, err = ended(proc, timeout)  # (fails showing the agent's and workers' stacks if not)
    return proc.returncode, out, err


def one_node_job(run_dir, *overrides: str, epochs: int, nproc: int = 2, **launch) -> subprocess.Popen:
    """An `nproc`-process torchrun job of `epochs` epochs on this machine, started in the background."""
    common = [
        f"trainer.max_epochs={epochs}",
        f"data.root={launch.pop('data')}",
        "data.val_split=0",
        f"hydra.run.dir={run_dir}",
    ]
    return torchrun(
        f"workers={nproc}", *overrides, *common, *TINY, nnodes=1, node_rank=0, nproc=nproc, port=free_port(), **launch
    )


def worker_pids(agent: int) -> dict[int, int]:
    """The workers a torchrun agent started: global rank -> pid."""
    out = subprocess.run(["pgrep", "-P", str(agent)], capture_output=True, text=True).stdout
    ranks = {}
    for pid in map(int, out.split()):
        with contextlib.suppress(OSError):
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ranks[int(next(v for v in env if v.startswith(b"RANK="))[5:])] = pid
    return ranks


def wait_for_epochs(run_dir, proc: subprocess.Popen, epochs: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (run_dir / "metrics.json").exists() or metrics(run_dir)["epochs"] < epochs:
        assert proc.poll() is None and time.monotonic() < deadline, f"fewer than {epochs} epochs finished"
        time.sleep(0.1)


@pytest.mark.parametrize("strategy", ["ddp", "model_averaging", "decentralized"])
def test_two_nodes_of_two_processes_share_one_job(strategy, tiny_data, tmp_path):
    run_dir, port = tmp_path / "run", free_port()
    common = [
        f"strategy={strategy}",
        "workers=2",
        "trainer.num_nodes=2",
        "trainer.max_epochs=2",
        "lr_scaling=linear",  # x 4 workers in all
        "scheduler=warmup",
        "scheduler.warmup_epochs=2",  # from 1/4 of that: from the base lr
        "record_shards=true",
        "record_weights=true",
        "stragglers.slowdown=[1,1,1,2]",  # one factor per worker of every node: the last one is node 1's second
        f"data.root={tiny_data}",
        "data.val_split=0",
        f"hydra.run.dir={run_dir}",
        *TINY,
    ]
    nodes = [torchrun(*common, nnodes=2, node_rank=r, nproc=2, port=port) for r in (0, 1)]
    results = [finish(p) for p in nodes]
    for rc, _, err in results:
        assert rc == 0, err[-3000:]
    assert "psgd: test_acc=" in results[0][1]  # global rank 0 (on node 0) reports, once
    assert "psgd: test_acc=" not in results[1][1]
    m = metrics(run_dir)
    assert (m["world_size"], m["num_nodes"], m["launcher"], m["status"]) == (4, 2, "torchrun", "completed")
    assert m["straggler_wait_s"][:3] == [0, 0, 0] and m["straggler_wait_s"][3] > 0
    # lr_scaling and the warm-up's 1/workers both count all nodes' workers: the lr starts at the base 0.02
    # (it started at 0.04, 1/2 of 0.08, the workers of one node)
    assert scalars(tensorboard(run_dir), "lr") == pytest.approx([0.02, 0.05])
    for epoch in (0, 1):
        shards = [torch.load(run_dir / "shards" / f"epoch{epoch}_rank{r}.pt") for r in range(4)]
        everything = torch.cat(shards)
        assert len(everything) == len(set(everything.tolist())) == 512  # disjoint, and they cover the data
    weights = [torch.load(run_dir / "weights" / f"rank{r}.pt") for r in range(4)]
    for key in weights[0]:
        assert all(torch.equal(weights[0][key], w[key]) for w in weights[1:]), key


@pytest.mark.parametrize(
    ("rdzv", "strategy"), [("static", "ddp"), ("c10d", "ddp"), ("c10d", "model_averaging"), ("c10d", "decentralized")]
)
def test_elastic_restart_resumes_from_the_last_checkpoint(rdzv, strategy, tiny_data, tmp_path):
    run_dir, epochs = tmp_path / "run", 120
    proc = one_node_job(run_dir, f"strategy={strategy}", epochs=epochs, data=tiny_data, restarts=1, rdzv=rdzv)
    wait_for_epochs(run_dir, proc, 3)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2, workers
    before = metrics(run_dir)["history"]
    killed_at = len(before)
    os.kill(int(workers[1]), signal.SIGKILL)
    rc, out, err = finish(proc)
    assert rc == 0, err[-3000:]
    assert "psgd: restart 1: resuming from" in err
    m = metrics(run_dir)
    assert m["status"] == "completed" and m["epochs"] == epochs
    assert killed_at < epochs
    assert [h["epoch"] for h in m["history"]] == list(range(1, epochs + 1))  # no epoch lost or repeated
    # resumed, not started over: the epochs in the checkpoint (all but perhaps the one the kill hit) are
    # the ones trained before the kill, timings and all
    assert m["history"][: killed_at - 1] == before[: killed_at - 1]


def test_ctrl_c_on_a_torchrun_job_marks_it_interrupted_and_says_so_once(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    proc = one_node_job(run_dir, epochs=200, data=tiny_data, session=True)
    wait_for_epochs(run_dir, proc, 2)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: SIGINT to the agent and both workers
    rc, _, err = finish(proc)
    assert rc != 0
    # one line for the job, from global rank 0 (each worker used to print it)
    assert err.count("psgd: interrupted") == 1, err[-3000:]
    m = metrics(run_dir)
    assert m["status"] == "interrupted" and m["epochs"] >= 2


@pytest.mark.parametrize(("strategy", "killed"), [("ddp", 1), ("model_averaging", 0)])
def test_a_torchrun_worker_killed_outright_is_named_and_the_run_marked_failed(strategy, killed, tiny_data, tmp_path):
    """A worker killed by SIGKILL (the OOM killer, kill -9) says nothing; torchrun's agent then SIGTERMs
    the others (or their collective fails first). The run used to end as "interrupted" (or "worker rank 0
    failed: ... another worker went away"), as if a user had stopped it: it names the dead rank now, once,
    also when rank 0 (the one that writes metrics.json) is the one that died."""
    run_dir = tmp_path / "run"
    proc = one_node_job(run_dir, f"strategy={strategy}", epochs=300, nproc=3, data=tiny_data)
    wait_for_epochs(run_dir, proc, 2)
    workers = worker_pids(proc.pid)
    assert sorted(workers) == [0, 1, 2], workers
    marks = list(Path(tempfile.gettempdir()).glob(f"psgd-torchrun-{proc.pid}-*"))
    assert len(marks) == 1 and sorted(p.name for p in marks[0].iterdir()) == ["0", "1", "2"]
    os.kill(workers[killed], signal.SIGKILL)
    rc, _, err = finish(proc)
    assert rc != 0
    line = f"psgd: error: worker rank {killed} died ("
    assert err.count(line) == 1, err[-3000:]  # one line, from the lowest rank still running
    assert "psgd: interrupted" not in err and "another worker went away" not in err
    m = metrics(run_dir)
    assert m["status"] == "failed" and m["error"].startswith(f"worker rank {killed} died (") and m["epochs"] >= 2
    assert not marks[0].exists()  # the last worker out took the dead one's mark too


def test_workers_stop_when_the_torchrun_agent_is_killed(tiny_data, tmp_path):
    """torchrun starts its workers in sessions of their own with no parent-death signal: an agent taken
    by the OOM killer or `kill -9` left them training on, orphaned, to the last epoch."""
    run_dir = tmp_path / "run"
    proc = one_node_job(run_dir, epochs=200, data=tiny_data)
    wait_for_epochs(run_dir, proc, 2)
    out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
    workers = [int(p) for p in out.split()]
    assert len(workers) == 2, workers
    proc.kill()  # the agent, outright

    def running() -> list[int]:  # (an exited worker not yet reaped is a zombie: "Z")
        left = []
        for p in workers:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0] != "Z":
                    left.append(p)
        return left

    try:
        deadline = time.monotonic() + 20
        while running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running() == [], "workers still training after their torchrun agent died"
    finally:
        for p in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    _, err = proc.communicate(timeout=10)
    m = metrics(run_dir)
    assert m["status"] == "interrupted" and 2 <= m["epochs"] < 200
    assert f"psgd: interrupted (SIGTERM); finished epochs are kept in {run_dir}" in err
