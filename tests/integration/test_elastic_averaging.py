"""Elastic averaging SGD (EASGD) through psgd's run: real 2-process gloo runs on generated data."""

from pathlib import Path

import pytest
import pytorch_lightning as L
import torch
from conftest import compose_cfg
from helpers import metrics, undocumented

from psgd.run import train

pytestmark = pytest.mark.distributed

TINY = ["quiet=true", "data.batch_size=32", "data.eval_batch_size=64"]
EASGD = ["strategy=elastic_averaging", "workers=2", "trainer.max_epochs=1", *TINY]


def weights(run_dir: Path, name: str = "last.ckpt") -> dict:
    return torch.load(run_dir / "checkpoints" / name, weights_only=True)["state_dict"]


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


class ElasticSteps(L.Callback):
    """Each worker's x_i and the centre x̃ just before and after every elastic step, into <folder>/<n>_<rank>.pt."""

    def __init__(self, folder: Path):
        self.folder = str(folder)

    def on_train_start(self, trainer, pl_module):
        strategy, elastic_step, steps = trainer.strategy, trainer.strategy._sync, []

        def recorded() -> None:
            before = (flat(pl_module.parameters()), flat(strategy.centre))
            elastic_step()
            after = (flat(pl_module.parameters()), flat(strategy.centre))
            torch.save((before, after), Path(self.folder, f"{len(steps)}_{trainer.global_rank}.pt"))
            steps.append(1)

        strategy._sync = recorded  # the real step, observed around it


class StartWeights(L.Callback):
    """Rank 0's weights when training starts (after same_init's broadcast), into <folder>/start.pt."""

    def __init__(self, folder: Path):
        self.folder = str(folder)

    def on_train_start(self, trainer, pl_module):
        if trainer.global_rank == 0:
            torch.save(
                {k: v.detach().clone() for k, v in pl_module.state_dict().items()}, Path(self.folder, "start.pt")
            )


def test_an_elastic_step_keeps_the_centre_plus_the_replicas_and_the_centre_is_the_final_model(tiny_data, tmp_path):
    """x̃ + Σ_i x_i is unchanged by each elastic step (τ = 2: 4 of them in 8 steps); the replicas move towards
    the centre and the centre towards their mean; the final weights are the centre, each worker's own accuracy
    reported beside it."""
    cfg = compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *EASGD, "strategy.tau=2", "strategy.alpha=0.3")
    m = train(cfg, tmp_path / "run", callbacks=[ElasticSteps(tmp_path)])
    for n in range(4):
        (x0, c0), (x0_after, c0_after) = torch.load(tmp_path / f"{n}_0.pt")
        (x1, c1), (x1_after, c1_after) = torch.load(tmp_path / f"{n}_1.pt")
        assert torch.equal(c0, c1) and torch.equal(c0_after, c1_after)  # one centre, on every worker
        assert (c0 + x0 + x1 - (c0_after + x0_after + x1_after)).abs().max() <= 1e-6
        assert torch.allclose(x0_after, x0 - 0.3 * (x0 - c0), atol=1e-7)  # e_i = α (x_i − x̃)
        assert torch.allclose(c0_after, c0 + 2 * 0.3 * ((x0 + x1) / 2 - c0), atol=1e-7)
    assert m["periodic_averagings"] == 4 and m["comm_calls"] == [4, 4] and len(m["worker_test_acc"]) == 2
    final = flat(v for k, v in weights(tmp_path / "run").items() if k.startswith("net.") and v.is_floating_point())
    (_, _), (_, centre) = torch.load(tmp_path / "3_0.pt")
    assert torch.allclose(final, centre, atol=1e-7)  # after the last elastic step (step 8, the last) the centre
    assert undocumented(tmp_path / "run") == []
    assert m["test_acc"] > 0.2


def test_a_vanishing_pull_leaves_the_workers_independent_and_the_centre_at_the_start(tiny_data, tmp_path):
    """α → 0 (1e-30): each replica trains on its own, and the centre, the final model, is where training started."""
    cfg = compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *EASGD, "strategy.tau=1", "strategy.alpha=1e-30")
    cfg.strategy.save_replicas = True
    train(cfg, tmp_path / "run", callbacks=[StartWeights(tmp_path)])
    start, final = torch.load(tmp_path / "start.pt"), weights(tmp_path / "run")
    replicas = [torch.load(tmp_path / "run" / "replicas" / f"rank{r}.pt") for r in range(2)]
    for k, v in start.items():
        if k.startswith("net.") and v.is_floating_point():
            assert torch.equal(final[k], v), k
    key = "net.features.0.weight"
    assert not torch.equal(replicas[0][key], start[key]) and not torch.equal(replicas[0][key], replicas[1][key])


@pytest.mark.slow  # ~20 s: two runs; the centre's checkpoint key is read by the default tests' runs too
def test_the_centre_is_kept_in_checkpoints_and_a_resume_goes_on_exactly(tiny_data, tmp_path):
    settings = [*EASGD, "trainer.max_epochs=2", "strategy.tau=3"]
    train(
        compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *settings, "checkpoint_every_epoch=true"),
        tmp_path / "straight",
    )
    checkpoint = tmp_path / "straight" / "checkpoints" / "epoch0.ckpt"
    assert torch.load(checkpoint, weights_only=True)["psgd_centre"]
    train(
        compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *settings, f"ckpt_path={checkpoint}"),
        tmp_path / "resumed",
    )
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(tmp_path / "resumed")["epochs"] == 2


@pytest.mark.parametrize(
    "schedule",
    [
        # all slow (~8 s each): the common-steps rule they follow runs by default in test_model_averaging (sizes)
        pytest.param(["strategy=elastic_averaging", "strategy.tau=2"], marks=pytest.mark.slow),
        pytest.param(["strategy=model_averaging", "strategy.group_periods={2:2}"], marks=pytest.mark.slow),
        pytest.param(["strategy=diloco", "strategy.period=2"], marks=pytest.mark.slow),
    ],
    ids=["easgd", "hierarchical", "diloco"],
)
def test_uneven_shards_and_speeds_never_hang(tiny_data, tmp_path, schedule):
    """A 70/30 split, worker 0 also twice as slow (stragglers): each worker trains its whole shard, and the
    synchronisation points are the steps both take (the smaller shard's 5 batches of 32 an epoch), as model
    averaging's."""
    settings = ["workers=2", "data.partition=sizes", "data.partition_sizes=[0.7,0.3]", "trainer.max_epochs=1", *TINY]
    settings += [*schedule, "stragglers.slowdown=[2,1]"]
    m = train(compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *settings), tmp_path / "run")
    assert m["status"] == "completed" and m["history"][0]["samples"] == 512
    assert m["straggler_wait_s"][0] > 0 and m["straggler_wait_s"][1] == 0
    assert m["periodic_averagings"] == 2  # 5 common steps: at 2 and 4
