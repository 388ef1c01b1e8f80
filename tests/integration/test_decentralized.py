"""Decentralized SGD through train.py: real gloo runs on generated data, gossiping by point-to-point."""

import pytest
import torch
from conftest import compose_cfg
from helpers import metrics, tensorboard, undocumented

from psgd.run import train

pytestmark = pytest.mark.distributed

TINY = ["quiet=true", "data.batch_size=32", "data.eval_batch_size=64"]
# plain SGD: nothing that differs between one update rule and another
PLAIN = ["model.dropout=0", "optimizer.momentum=0", "optimizer.weight_decay=0", "scheduler=none"]


def weights(run_dir, name="last.ckpt"):
    return torch.load(run_dir / "checkpoints" / name, weights_only=True)["state_dict"]


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def run(tiny_data, run_dir, *overrides: str) -> dict:
    cfg = compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *TINY, *overrides)
    train(cfg, run_dir)
    return metrics(run_dir)


def test_gossip_on_a_complete_graph_after_each_step_is_local_sgd_with_period_one(tiny_data, tmp_path):
    """x_i <- sum_j W_ij (x_j - lr g_j) with W = 11^T / P is every worker's step, averaged: model averaging every
    step. (D-PSGD's own order, the mix before the step, is not: its gradients are at the unmixed replicas.)"""
    common = ["workers=4", "trainer.max_epochs=1", *PLAIN]
    gossip = ["strategy=decentralized", "strategy.topology=complete", "strategy.order=step_then_mix"]
    m = run(tiny_data, tmp_path / "complete", *common, *gossip)
    run(tiny_data, tmp_path / "averaged", *common, "strategy=model_averaging", "strategy.period=1")
    assert max_diff(weights(tmp_path / "complete"), weights(tmp_path / "averaged")) <= 1e-6
    # 4 batches a worker: 4 rounds, each worker sending to its 3 neighbours; the final mean is one all-reduce more
    params = sum(t.numel() for t in weights(tmp_path / "complete").values() if t.is_floating_point())
    assert m["periodic_averagings"] == 4 and m["comm_calls"] == [4 * 3 + 1] * 4
    assert m["spectral_gap"] == pytest.approx(1.0) and m["topology"] == "complete"
    assert m["comm_bytes"][0] >= 4 * 3 * params * 4


def test_d_psgds_order_steps_each_mixed_replica_with_its_own_gradient(tiny_data, tmp_path):
    """One step from equal replicas on a complete graph: D-PSGD's order (mix, then each replica's own step) leaves
    the replicas apart by their gradients, step-then-mix leaves them equal; their mean is the same (x0 - lr mean g)."""
    one_step = ["workers=2", "trainer.max_epochs=1", "trainer.limit_train_batches=1", *PLAIN]
    gossip = ["strategy=decentralized", "strategy.topology=complete"]
    runs = {}
    for order in ("mix_then_step", "step_then_mix"):
        runs[order] = run(tiny_data, tmp_path / order, *one_step, *gossip, f"strategy.order={order}")
    assert runs["mix_then_step"]["replica_distance"] > 1e-4 and runs["step_then_mix"]["replica_distance"] == 0
    assert max_diff(weights(tmp_path / "mix_then_step"), weights(tmp_path / "step_then_mix")) <= 1e-6


def test_one_worker_is_plain_sgd(tiny_data, tmp_path):
    run(tiny_data, tmp_path / "alone", "strategy=decentralized", "trainer.max_epochs=2", *PLAIN)
    run(tiny_data, tmp_path / "sgd", "trainer.max_epochs=2", *PLAIN)
    assert max_diff(weights(tmp_path / "alone"), weights(tmp_path / "sgd")) <= 1e-6


def test_a_ring_run_reports_its_consensus_distance_its_replicas_and_their_mean(tiny_data, tmp_path):
    m = run(
        tiny_data, tmp_path / "ring", "strategy=decentralized", "workers=4", "trainer.max_epochs=4",
        "strategy.log_consensus_every=2",
    )  # fmt: skip
    assert m["status"] == "completed" and m["test_acc"] > 0.5  # chance is 0.1
    assert len(m["worker_test_acc"]) == 4 and m["spectral_gap"] == pytest.approx(1 - 1 / 3)  # ring of 4: rho 1/3
    distances = [h["consensus_distance"] for h in m["history"]]
    assert len(distances) == 4 and all(d > 0 for d in distances)  # the replicas differ: each trains its own shard
    acc = tensorboard(tmp_path / "ring")
    # 4 steps an epoch: every 2 steps (at Lightning's step of the epoch's figures: the steps taken less one), the
    # epoch's end also as the epoch's figure
    logged = {e.step: e.value for e in acc.Scalars("decentralized/consensus_distance")}
    assert sorted(logged) == [1, 3, 5, 7, 9, 11, 13, 15]
    assert [logged[s] for s in (3, 7, 11, 15)] == pytest.approx(distances, rel=1e-4)
    # the final model is the replicas' mean: every worker's weights were replaced by it
    final = weights(tmp_path / "ring")
    replicas = torch.load(tmp_path / "ring" / "checkpoints" / "last.ckpt", weights_only=True)["replicas"]
    assert all(max_diff(r["state_dict"], final) == 0 for r in replicas)
    assert undocumented(tmp_path / "ring") == []  # every key it wrote is in docs/outputs.md


def test_uneven_shards_gossip_the_same_rounds_on_every_worker(tiny_data, tmp_path):
    """Shards of 70 and 30 %: the smaller one's steps an epoch are the rounds (model averaging's count), so no
    worker waits at a round the other never reaches."""
    uneven = ["data.partition=sizes", "data.partition_sizes=[0.7,0.3]", "trainer.max_epochs=2"]
    m = run(tiny_data, tmp_path / "uneven", "strategy=decentralized", "workers=2", *uneven)
    fast, slow = m["steps_per_worker"]
    assert m["status"] == "completed" and fast > slow == 2 * 5  # 154 samples a worker: 5 batches of 32 an epoch
    assert m["periodic_averagings"] == slow and m["comm_calls"] == [slow + 1, slow + 1]  # a send a round, the mean


def test_a_ring_with_choco_topk_resumes_to_the_uninterrupted_weights(tiny_data, tmp_path):
    """CHOCO's public copies x̂_i and s_i are each worker's own, kept in every checkpoint."""
    settings = ["workers=2", "trainer.max_epochs=2", "strategy=decentralized", "strategy.compression=topk"]
    settings += ["strategy.consensus_lr=0.5", "strategy.topk_ratio=0.1"]
    run(tiny_data, tmp_path / "straight", *settings, "checkpoint_every_epoch=true")
    checkpoint = tmp_path / "straight" / "checkpoints" / "epoch0.ckpt"
    replicas = torch.load(checkpoint, weights_only=True)["replicas"]
    assert all(len(r["psgd_choco"]) == 2 for r in replicas)
    run(tiny_data, tmp_path / "resumed", *settings, f"ckpt_path={checkpoint}")
    assert max_diff(weights(tmp_path / "resumed"), weights(tmp_path / "straight")) == 0


@pytest.mark.slow  # ~25 s: a 4-worker run of each other topology (ring's runs by default)
@pytest.mark.parametrize("topology", ["torus", "exponential", "one_peer_exponential", "complete", "random_matching"])
def test_every_topology_trains_four_workers(tiny_data, tmp_path, topology):
    m = run(tiny_data, tmp_path / topology, "strategy=decentralized", "workers=4", f"strategy.topology={topology}")
    assert m["status"] == "completed" and m["test_acc"] > 0.5
    assert all(h["consensus_distance"] is not None for h in m["history"])
