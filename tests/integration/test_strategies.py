"""What every parallel strategy owes the plain run: with one worker it is the plain run."""

import pytest
import torch
from conftest import run_cli
from helpers import metrics

ONE_WORKER = [
    "workers=1",
    "threads_per_worker=1",
    "trainer.max_epochs=1",
    "quiet=true",
    "data.batch_size=16",
    "data.eval_batch_size=64",
]


def final_weights(run_dir, tiny_data, *overrides: str) -> dict:
    proc = run_cli(
        "train.py", f"data.root={tiny_data}", "data.val_split=0", f"hydra.run.dir={run_dir}", *ONE_WORKER, *overrides
    )
    assert proc.returncode == 0, proc.stderr
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def plain(tiny_data, tmp_path_factory):
    """The in-process single-worker run (strategy=ddp with one worker runs without a process group)."""
    return final_weights(tmp_path_factory.mktemp("plain") / "run", tiny_data)


@pytest.mark.distributed
# hogwild slow: the same single-worker process as model_averaging's; its one-worker resume is slow too
@pytest.mark.parametrize("strategy", ["model_averaging", pytest.param("hogwild", marks=pytest.mark.slow)])
def test_one_worker_gives_the_plain_runs_weights(plain, tiny_data, tmp_path, strategy):
    # a worker process of its own (spawn or forkserver), yet the same data order, random stream and
    # updates: bit for bit the same weights
    weights = final_weights(tmp_path / "run", tiny_data, f"strategy={strategy}")
    assert weights.keys() == plain.keys()
    assert all(torch.equal(weights[k], plain[k]) for k in plain)
    m = metrics(tmp_path / "run")
    assert (m["comm_bytes"], m["comm_calls"]) == ([0], [0])  # one worker exchanges nothing (it said 0.85 MB)
    assert not (tmp_path / "run" / "train.log").exists()  # Hydra's job log was made, and stayed empty


@pytest.mark.slow  # ~1.5 min: three 2-worker runs that each compile the network in every worker
@pytest.mark.distributed
@pytest.mark.parametrize("strategy", ["ddp", "model_averaging", "hogwild"])
def test_every_strategy_trains_a_compiled_network_with_two_workers(plain, tiny_data, tmp_path, strategy):
    """compile=true in each worker (forked from psgd's fork server), whatever the strategy does with the
    parameters (DDP's gradient hooks, averaging's in-place copies, HogWild's shared memory); the
    checkpoint keeps the eager network's keys."""
    run_dir = tmp_path / "run"
    two = [f"strategy={strategy}", "workers=2", "compile=true", "trainer.max_epochs=2", *ONE_WORKER[3:]]
    proc = run_cli(
        "train.py",
        f"data.root={tiny_data}",
        "data.val_split=0",
        f"hydra.run.dir={run_dir}",
        "threads_per_worker=1",
        *two,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # inductor's C++ builder warned of CUDA_HOME in each worker (a CUDA build of torch on a CPU machine)
    assert "No CUDA runtime is found" not in proc.stderr
    m = metrics(run_dir)
    assert m["status"] == "completed" and m["world_size"] == 2 and m["test_acc"] > 0.3, m  # chance is 0.1
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert state.keys() == plain.keys()
