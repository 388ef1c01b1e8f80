"""Simulated stragglers (psgd.stragglers) in real runs: HogWild's fast workers go on, delays repeat by seed.

DDP's straggler test is in test_ddp (beside the run whose workers keep pace), model averaging's in
test_model_averaging (uneven shards and speeds)."""

import numpy as np
import pytest
import torch
from conftest import compose_cfg
from helpers import metrics, scalars, tensorboard, undocumented

from psgd.run import train
from psgd.stragglers import DRAWS

TINY = ["quiet=true", "data.batch_size=32", "data.eval_batch_size=64"]


@pytest.mark.distributed
def test_hogwild_from_a_shared_queue_lets_the_fast_worker_take_more_of_the_epoch(tiny_data, tmp_path):
    """slowdown [1, 3]: the workers take the epoch's batches from one queue, so the fast worker takes about three
    times the slow one's (at least twice), every batch exactly once, and the shared model still trains."""
    run_dir = tmp_path / "run"
    settings = ["strategy=hogwild", "strategy.shared_queue=true", "workers=2", "stragglers.slowdown=[1,3]"]
    settings += ["trainer.max_epochs=3", "record_shards=true", "optimizer.lr=0.01", "optimizer.momentum=0.5"]
    train(compose_cfg(*settings, f"data.root={tiny_data}", "data.val_split=0", *TINY), run_dir)
    m = metrics(run_dir)
    fast, slow = m["updates_per_worker"]
    assert fast >= 2 * slow > 0, m["updates_per_worker"]
    assert m["steps_per_worker"] == m["updates_per_worker"] and fast + slow == 3 * 16  # 512 samples: 16 batches
    for epoch in range(3):  # the two workers' batches: the whole training set, each sample once
        taken = torch.cat([torch.load(run_dir / "shards" / f"epoch{epoch}_rank{r}.pt") for r in range(2)])
        assert sorted(taken.tolist()) == list(range(512))
    assert m["straggler_wait_s"][0] == 0 and m["straggler_wait_s"][1] > 0
    assert m["test_acc"] > 0.5 and all(h["val_acc"] is not None for h in m["history"])  # validated every epoch
    assert undocumented(run_dir) == []


def test_an_exponential_delay_sleeps_the_seeded_draws_of_its_worker_and_epoch(tiny_data, tmp_path):
    """distribution=exponential: each step sleeps shift_s + Exp(mean delay_s), drawn from the stream of (seed,
    rank, epoch), so a rerun (or a resume at an epoch) sleeps exactly the same."""
    settings = ["stragglers.distribution=exponential", "stragglers.delay_s=0.004", "stragglers.shift_s=0.001"]
    m = train(
        compose_cfg(*settings, "seed=3", "trainer.max_epochs=2", f"data.root={tiny_data}", "data.val_split=0", *TINY),
        tmp_path,
    )
    steps = 16  # 512 samples in batches of 32, one worker
    expected = [
        steps * 0.001 + np.random.default_rng([3, DRAWS, 0, epoch]).exponential(0.004, size=steps).sum()
        for epoch in range(2)
    ]
    assert [h["straggler_wait_s"][0] for h in m["history"]] == pytest.approx(expected, abs=1e-4)
    assert m["straggler_wait_s"] == [pytest.approx(sum(expected), abs=2e-4)]
    assert scalars(tensorboard(tmp_path), "stragglers/wait_s") == pytest.approx(expected, abs=1e-4)
