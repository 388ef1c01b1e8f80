"""What every parallel strategy owes the plain run: with one worker it is the plain run."""

import pytest
import torch
from conftest import run_cli

ONE_WORKER = [
    "workers=1",
    "threads_per_worker=1",
    "trainer.max_epochs=1",
    "quiet=true",
    "data.batch_size=16",
    "data.eval_batch_size=64",
]


def final_weights(run_dir, tiny_data, *overrides: str) -> dict:
    proc = run_cli("train.py", f"data.root={tiny_data}", f"hydra.run.dir={run_dir}", *ONE_WORKER, *overrides)
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
