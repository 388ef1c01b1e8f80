"""Model averaging and local SGD through train.py: real 2-process gloo runs on generated data."""

import math
from pathlib import Path

import pytest
import pytorch_lightning as L
import torch
from conftest import compose_cfg, run_cli
from helpers import hparam_columns, metrics, scalars, tensorboard, undocumented

from psgd.run import train

pytestmark = pytest.mark.distributed

TINY = ["quiet=true", "data.batch_size=32", "data.eval_batch_size=64"]
# plain SGD with nothing that differs between one update rule and another: no momentum, weight
# decay, BatchNorm, dropout or schedule
PLAIN = ["model.dropout=0", "optimizer.momentum=0", "optimizer.weight_decay=0", "scheduler=none"]
# the `averaged` run's shards differ in length and its cosine moves per step: each worker's lr schedule
# counts its own steps, so each must resume its own
UNEVEN_PER_STEP = ["data.partition=sizes", "data.partition_sizes=[0.6,0.4]", "scheduler.interval=step"]
# the lr for an update of 32 samples: a model-averaging worker updates with its own batch of 32, so its
# lr stays optimizer.lr (scaling by workers, as DDP's update of 64 samples is, would double it)
BY_BATCH = ["lr_scaling=linear", "lr_reference_batch=32"]
AVERAGED = ["strategy=model_averaging", "workers=2", "trainer.max_epochs=2", *UNEVEN_PER_STEP, *BY_BATCH, *TINY]


def weights(run_dir, name="last.ckpt"):
    return torch.load(run_dir / "checkpoints" / name, weights_only=True)["state_dict"]


def assert_close(a: dict, b: dict, atol: float):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=atol, rtol=0), (k, (a[k] - b[k]).abs().max())


@pytest.fixture(scope="module")
def averaged_run(tiny_data, tmp_path_factory):
    """The run dir and the stdout of a 2-worker model-averaging run (averaged at the end only)."""
    run_dir = tmp_path_factory.mktemp("ma") / "run"
    proc = run_cli(
        "train.py",
        *AVERAGED,
        f"data.root={tiny_data}",
        "data.val_split=0",
        "strategy.save_replicas=true",
        "checkpoint_every_epoch=true",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


@pytest.fixture(scope="module")
def averaged(averaged_run):
    return averaged_run[0]


def test_final_weights_are_the_mean_of_the_replicas(averaged):
    # each worker saved its own weights just before the final averaging, in its own process
    r0 = torch.load(averaged / "replicas" / "rank0.pt", weights_only=True)
    r1 = torch.load(averaged / "replicas" / "rank1.pt", weights_only=True)
    assert not torch.allclose(r0["net.features.0.weight"], r1["net.features.0.weight"])  # they did drift apart
    final = weights(averaged)
    for k, v in final.items():
        if v.is_floating_point():
            assert torch.allclose(v, (r0[k] + r1[k]) / 2, atol=1e-6, rtol=0), k


def test_reports_each_worker_and_the_averaged_model(averaged):
    assert undocumented(averaged) == []  # every key and tag is in the README (the replicas' figures too)
    m = metrics(averaged)
    assert (m["strategy"], m["world_size"], m["period"], m["same_init"]) == ("model_averaging", 2, None, True)
    assert m["periodic_averagings"] == 0
    assert m["parallel_batches"] == 1  # each worker updates with its own batch (it said 2, as DDP's)
    assert (m["lr"], m["lr_reference_batch"]) == (pytest.approx(0.02), 32)  # 0.02 x 32 / 32 (BY_BATCH)
    assert len(m["worker_test_acc"]) == len(m["worker_test_loss"]) == 2
    assert m["replica_distance"] > 0
    # averaged only at the end: no time in periodic averaging, and no gradient all-reduce
    assert not {"averaging_share", "allreduce_wait_share"} & m.keys() and "averaging_s" not in m["history"][0]
    # validation runs on the test split: the final val numbers are the averaged model's test numbers
    assert m["val_acc"] == pytest.approx(m["test_acc"], abs=1e-6)
    assert m["val_loss"] == pytest.approx(m["test_loss"], abs=1e-5)
    assert m["test_acc"] > 0.3
    acc = tensorboard(averaged)
    tags = set(acc.Tags()["scalars"])
    for r in range(2):
        assert {f"worker/{r}/val_acc", f"worker/{r}/val_loss", f"worker/{r}/test_acc"} <= tags
        assert scalars(acc, f"worker/{r}/test_acc") == pytest.approx([m["worker_test_acc"][r]], abs=1e-6)
    # each epoch val/acc is the mean of the replicas' accuracies (equal-size, unsharded evaluation), and only that
    per_worker = [scalars(acc, f"worker/{r}/val_acc") for r in range(2)]
    assert scalars(acc, "val/acc") == pytest.approx([(a + b) / 2 for a, b in zip(*per_worker)], abs=1e-6)
    assert scalars(acc, "val/acc")[-1] == pytest.approx(m["val_acc_before_averaging"], abs=1e-6)


def test_the_averaged_model_and_the_drifting_replicas_have_tensorboard_tags_of_their_own(averaged_run):
    """The averaged model's figures shared val/acc with the replicas' mean (one point more, a step later), the
    replica distance was written at the end only, and the HParams tab listed DDP's and HogWild's figures."""
    averaged, stdout = averaged_run
    m, acc = metrics(averaged), tensorboard(averaged)
    assert scalars(acc, "averaged/val_acc") == pytest.approx([m["val_acc"]], abs=1e-6)
    assert scalars(acc, "averaged/test_acc") == pytest.approx([m["test_acc"]], abs=1e-6)
    assert scalars(acc, "averaged/test_loss") == pytest.approx([m["test_loss"]], abs=1e-5)
    # how far the replicas drifted apart, at each epoch's end: never averaged before the end, so it grows
    distances = [h["replica_distance"] for h in m["history"]]
    assert scalars(acc, "averaging/replica_distance") == pytest.approx(distances, abs=1e-5)
    assert 0 < distances[0] < distances[1] and distances[-1] == pytest.approx(m["replica_distance"], abs=1e-5)
    # each worker's own training loss: uneven shards, so train/loss weighs them by their samples (0.6 / 0.4)
    own = [scalars(acc, f"worker/{r}/train_loss") for r in range(2)]
    assert own[0] != own[1] and len(own[0]) == 2
    weighed = [a * 0.6 + b * 0.4 for a, b in zip(*own)]
    assert scalars(acc, "train/loss") == pytest.approx(weighed, rel=0.02)
    columns = hparam_columns(acc)
    assert {"test/acc", "averaging/replica_distance", "averaged/test_acc"} <= columns
    assert not any(c.startswith(("hogwild/", "ddp/")) for c in columns) and "averaging/time_s" not in columns
    # the last line says why test_acc is not what the replicas scored
    workers = " ".join(f"{a:.4f}" for a in m["worker_test_acc"])
    distance = f"{m['replica_distance']:.4f}"
    expected = f"test_acc={m['test_acc']:.4f} (averaged model; the workers' own {workers}, replica_distance={distance})"
    assert expected in stdout


class OwnEvaluation(L.Callback):
    """Each worker's own evaluation of its replica at each validation's end, into <folder>/<epoch>_<rank>."""

    def __init__(self, folder: Path):
        self.folder = str(folder)

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            acc, loss = pl_module.evaluate(trainer.datamodule.full_eval_loader("val"))
            Path(self.folder, f"{trainer.current_epoch}_{trainer.global_rank}").write_text(f"{acc} {loss}")


def test_each_workers_validation_figures_are_its_own_replicas(tiny_data, tmp_path):
    """worker/<r>/val_loss at the first validation was the workers' mean for every worker: the metrics' states,
    pickled into the workers, shared memory, and the sanity check's batches counted into the first validation."""
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "strategy=model_averaging",
        "workers=2",
        "trainer.max_epochs=2",
        *TINY,
    )
    train(cfg, tmp_path / "run", callbacks=[OwnEvaluation(tmp_path)])
    acc = tensorboard(tmp_path / "run")
    own = [[tuple(map(float, (tmp_path / f"{e}_{r}").read_text().split())) for e in range(2)] for r in range(2)]
    for r in range(2):
        assert scalars(acc, f"worker/{r}/val_acc") == pytest.approx([a for a, _ in own[r]], abs=1e-6)
        assert scalars(acc, f"worker/{r}/val_loss") == pytest.approx([loss for _, loss in own[r]], abs=1e-5)
    assert own[0][0][1] != own[1][0][1]  # the replicas differ from the first epoch on
    means = [(own[0][e][1] + own[1][e][1]) / 2 for e in range(2)]  # equal-size, unsharded evaluations
    assert scalars(acc, "val/loss")[:2] == pytest.approx(means, abs=1e-5)


def resume_averaged(ckpt_path, run_dir, tiny_data) -> None:
    """Resume the `averaged` run's settings from `ckpt_path` (a checkpoint or a run dir) into run_dir."""
    proc = run_cli(
        "train.py",
        *AVERAGED,
        f"data.root={tiny_data}",
        "data.val_split=0",
        f"ckpt_path={ckpt_path}",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 0, proc.stderr


def test_checkpoints_hold_every_replica_and_resume_gives_the_uninterrupted_weights(averaged, tiny_data, tmp_path):
    mid = torch.load(averaged / "checkpoints" / "epoch0.ckpt", weights_only=True)
    assert len(mid["replicas"]) == 2 and mid["averaged"] is False
    assert not torch.equal(
        mid["replicas"][0]["state_dict"]["net.features.0.weight"],
        mid["replicas"][1]["state_dict"]["net.features.0.weight"],
    )
    # and its own lr schedule: the shards differ in length, so the per-step cosines have counted
    # different numbers of steps and have different horizons
    steps = [r["lr_schedulers"][0]["last_epoch"] for r in mid["replicas"]]  # one epoch's, each worker's own
    assert steps[0] > steps[1] > 0
    assert [r["lr_schedulers"][0]["T_max"] for r in mid["replicas"]] == [2 * s for s in steps]
    # resume after epoch 1 (dropout on: each worker's random stream is reseeded per epoch); each worker
    # must continue from its own replica and momentum for the end result to match bit for bit
    resumed = tmp_path / "resumed"
    resume_averaged(averaged / "checkpoints" / "epoch0.ckpt", resumed, tiny_data)
    assert metrics(resumed)["epochs"] == 2
    final = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["averaged"] is True
    assert_close(final["state_dict"], weights(averaged), atol=0)
    # with the figures of its end, which a resume with nothing left to train reports again (below)
    report = final["psgd_strategy_report"]
    assert report["worker_test_acc"] == metrics(resumed)["worker_test_acc"] and report["period"] is None


@pytest.mark.slow  # ~13 s; resuming every replica from a mid-run checkpoint is tested by default above
def test_the_final_checkpoint_resumes_each_worker_on_the_average_and_its_own_schedule(averaged, tiny_data, tmp_path):
    # the same run resumed from its end: nothing left to train, but every worker loads the checkpoint.
    # Worker 1's per-step schedule counts its own (shorter) epochs, not rank 0's, so the resume is not refused
    again = tmp_path / "again"
    resume_averaged(averaged, again, tiny_data)
    before, now = metrics(averaged), metrics(again)
    assert now["test_acc"] == pytest.approx(before["test_acc"])
    # and reports the figures of the training that made those weights: val_acc is the averaged model's,
    # not the replicas' mean from the last epoch
    for key in ("val_acc", "val_acc_before_averaging", "worker_test_acc", "replica_distance", "same_init"):
        assert now[key] == before[key], key


@pytest.mark.parametrize(
    "update",
    [
        pytest.param([], id="plain-sgd", marks=pytest.mark.slow),  # ~13 s; the momentum case covers it
        # SGD's momentum is linear: with every worker on its own buffer m_i = mu*m_i + g_i and the weights
        # averaged after every step, w - lr*mean(m_i) and mean(m_i) = mu*mean(m_i) + mean(g) are DDP's
        # update and buffer, so averaging the buffers too changes nothing here
        pytest.param(["optimizer.momentum=0.9"], id="momentum"),
        pytest.param(
            ["optimizer.momentum=0.9", "strategy.average_optimizer_state=true"],
            id="momentum-averaged",
            marks=pytest.mark.slow,  # ~13 s
        ),
    ],
)
def test_period_one_is_exactly_synchronous_sgd(tiny_data, tmp_path, update):
    """Also with gradient accumulation that leaves each epoch a shorter last step (8 batches, 3 per step:
    3, 3, 2), which Lightning takes: it did not count towards the period, so that step was not averaged
    and the second epoch drifted from DDP's (4e-5 with momentum)."""
    runs = {}
    for strategy, extra in (("ddp", []), ("model_averaging", ["strategy.period=1"])):
        extra = [*extra, *update] if strategy == "model_averaging" else [*extra, *update[:1]]
        settings = [f"strategy={strategy}", "workers=2", "trainer.max_epochs=2", "trainer.accumulate_grad_batches=3"]
        train(
            compose_cfg(*settings, f"data.root={tiny_data}", "data.val_split=0", *PLAIN, *TINY, *extra),
            tmp_path / strategy,
        )
        runs[strategy] = weights(tmp_path / strategy)
    assert_close(runs["model_averaging"], runs["ddp"], atol=1e-5)


def test_a_period_longer_than_an_epoch_still_averages_every_period_steps(tiny_data, tmp_path):
    """2 workers, 8 steps each per epoch, 3 epochs: period 12 averages at steps 12 and 24, the last
    one, so the replicas are equal before the final averaging (replica_distance 0). The period used
    to restart with every epoch: with 12 > 8 the replicas were never averaged during training. A run
    resumed after epoch 2 (step 16) keeps the count: it averages at step 24 too, to the same weights.
    Without validation and with one test batch (of 4), the end-of-run evaluation of each replica takes
    what the test takes: the same batch (it took the whole split), and no averaged val figures."""
    settings = ["strategy=model_averaging", "workers=2", "strategy.period=12", "trainer.max_epochs=3", *TINY]
    settings += ["trainer.limit_val_batches=0", "trainer.limit_test_batches=1"]
    run_dir, resumed = tmp_path / "run", tmp_path / "resumed"
    train(compose_cfg(*settings, "checkpoint_every_epoch=true", f"data.root={tiny_data}", "data.val_split=0"), run_dir)
    m = metrics(run_dir)
    assert m["history"][-1]["step"] == 24  # each worker's optimizer steps
    assert m["replica_distance"] == 0 and m["periodic_averagings"] == 2  # at steps 12 and 24
    assert m["worker_test_acc"][0] == m["worker_test_acc"][1] == m["test_acc"]  # one model, one test batch
    assert m["worker_test_loss"] == pytest.approx([m["test_loss"]] * 2, rel=1e-5)
    assert m["val_acc"] is None and {h["val_acc"] for h in m["history"]} == {None}
    # the time in periodic averaging, each epoch: none in epoch 1, whose 8 steps hold no averaging point
    spent = [h["averaging_s"] for h in m["history"]]
    assert spent[0] == 0 and all(s > 0 for s in spent[1:]) and scalars(tensorboard(run_dir), "averaging/time_s")[0] == 0
    assert 0 < m["averaging_share"] < 1
    # the bytes: the parameters and floating buffers once per averaging point (steps 12, 24) and at the end
    model_bytes = sum(v.numel() * 4 for v in weights(run_dir).values() if v.is_floating_point())
    assert m["comm_bytes"] == m["comm_sent_bytes"] == [3 * model_bytes] * 2 and m["comm_calls"] == [3, 3]
    assert [h["comm_bytes"] for h in m["history"]] == [[0, 0], [model_bytes] * 2, [model_bytes] * 2]
    ckpt = run_dir / "checkpoints" / "epoch1.ckpt"
    train(compose_cfg(*settings, f"ckpt_path={ckpt}", f"data.root={tiny_data}", "data.val_split=0"), resumed)
    # the count goes on over the whole run: step 12 before the checkpoint, 24 after it
    assert metrics(resumed)["replica_distance"] == 0 and metrics(resumed)["periodic_averagings"] == 2
    assert_close(weights(resumed), weights(run_dir), atol=0)
    assert metrics(resumed)["comm_bytes"] == m["comm_bytes"]  # the epochs before the resume counted too


@pytest.mark.parametrize(
    "partition",
    [
        ["data.partition=sizes", "data.partition_sizes=[0.7,0.3]"],
        pytest.param(["data.partition=by_label"], marks=pytest.mark.slow),  # uneven as well: sizes runs by default
    ],
    ids=["sizes", "by_label"],
)
def test_uneven_shards_and_uneven_speeds_complete_with_periodic_averaging(tiny_data, tmp_path, partition):
    """Worker 0 also three times slower (stragglers.slowdown): the replicas still average at the same points,
    the fast worker waiting there for the slow one, and the run ends."""
    run_dir = tmp_path / "run"
    settings = ["strategy=model_averaging", "workers=2", "strategy.period=2", "trainer.max_epochs=2"]
    settings += [
        "record_shards=true",
        "stragglers.slowdown=[3,1]",
        f"data.root={tiny_data}",
        "data.val_split=0",
        *partition,
        *TINY,
    ]
    train(compose_cfg(*settings), run_dir)
    m = metrics(run_dir)
    assert m["straggler_wait_s"][0] > 0 and m["straggler_wait_s"][1] == 0
    # each worker trained on its whole shard (no lockstep), so every sample was used each epoch
    assert [h["samples"] for h in m["history"]] == [512, 512]
    sizes = sorted(len(torch.load(run_dir / "shards" / f"epoch0_rank{r}.pt")) for r in range(2))
    assert sum(sizes) == 512
    # F steps per epoch, the smaller shard's batches of 32, counted over both epochs: an averaging every 2
    assert m["periodic_averagings"] == 2 * math.ceil(sizes[0] / 32) // 2
    assert m["comm_calls"] == [m["periodic_averagings"] + 1] * 2  # and the final average, on both workers
    if "data.partition=sizes" in partition:
        assert sizes == [154, 358] and m["periodic_averagings"] == 5  # at steps 2, 4, 6, 8, 10


class Checksums(L.Callback):
    """Each worker's parameter sum after every optimizer step (averaging included), into <folder>/<rank>."""

    def __init__(self, folder: Path):
        self.folder = str(folder)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        total = sum(float(p.detach().double().sum()) for p in pl_module.parameters())
        with open(Path(self.folder, str(trainer.global_rank)), "a") as f:
            f.write(f"{total!r}\n")


class Updates(L.Callback):
    """Each worker's parameters and gradients before every optimizer step, and its lr, into <folder>/<rank>.pt
    at the end: what a hand-written update starts from."""

    def __init__(self, folder: Path):
        self.folder, self.steps = str(folder), []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        params = list(pl_module.parameters())
        lr = optimizer.param_groups[0]["lr"]
        self.steps.append(([p.detach().clone() for p in params], [p.grad.detach().clone() for p in params], lr))

    def on_train_end(self, trainer, pl_module):
        torch.save(self.steps, Path(self.folder, f"{trainer.global_rank}.pt"))


def assert_hand_computed(folder: Path, workers: int, group_at) -> None:
    """Each recorded step against plain SGD by hand: w_i <- w_i - lr g_i, then, where `group_at(step)` (from 1)
    names a group size, the mean over each group of that many consecutive ranks; the next step's weights agree."""
    steps = [torch.load(folder / f"{r}.pt", weights_only=True) for r in range(workers)]
    for t in range(len(steps[0]) - 1):
        moved = []
        for r in range(workers):
            weights, grads, lr = steps[r][t]
            moved.append([w - lr * g for w, g in zip(weights, grads, strict=True)])
        size = group_at(t + 1)
        for r in range(workers):
            expected = moved[r]
            if size:
                group = range(r // size * size, r // size * size + size)
                expected = [sum(moved[q][i] for q in group) / size for i in range(len(moved[r]))]
            for got, want in zip(steps[r][t + 1][0], expected, strict=True):
                assert torch.allclose(got, want, atol=1e-6, rtol=0), (t + 1, r)


def test_post_local_sgd_averages_every_step_until_sync_steps_then_every_period(tiny_data, tmp_path):
    """sync_steps=3, period=4, 8 steps per worker: the replicas are equal after steps 1, 2, 3 (synchronous
    start), differ after 5, 6, 7 and are equal at the averaging points 4 and 8: no silent fallback to DDP or to
    plain local SGD; and each step's weights are a hand-written SGD step, averaged at those points."""
    settings = ["strategy=model_averaging", "workers=2", "strategy.period=4", "strategy.sync_steps=3", *TINY]
    settings += ["trainer.max_epochs=1", *PLAIN]
    callbacks = [Checksums(tmp_path), Updates(tmp_path)]
    m = train(
        compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *settings), tmp_path / "run", callbacks=callbacks
    )
    sums = [[float(x) for x in (tmp_path / str(r)).read_text().split()] for r in range(2)]
    equal = [a == b for a, b in zip(*sums, strict=True)]
    assert equal == [True, True, True, True, False, False, False, True]
    assert m["periodic_averagings"] == 5 and m["comm_calls"] == [6, 6]  # and the final average
    assert_hand_computed(tmp_path, 2, lambda step: 2 if step <= 3 or step % 4 == 0 else 0)


DILOCO_H1 = ["strategy=diloco", "strategy.period=1", "strategy.outer_optimizer.lr=0.5", "optimizer.lr=0.02"]


@pytest.mark.parametrize(
    "outer,reference,atol",
    [
        pytest.param(  # outer Nesterov SGD at every step: DDP with SGD(lr 0.02 x 0.5, momentum 0.9, nesterov)
            DILOCO_H1,
            ["strategy=ddp", "optimizer.lr=0.01", "optimizer.momentum=0.9", "optimizer.nesterov=true"],
            1e-5,
            id="H1-is-ddp-nesterov",
        ),
        pytest.param(  # an outer step of lr 1 without momentum lands on the mean: plain periodic averaging
            [
                "strategy=diloco",
                "strategy.period=3",
                "strategy.outer_optimizer.lr=1",
                "strategy.outer_optimizer.momentum=0",
                "strategy.outer_optimizer.nesterov=false",
            ],
            ["strategy=model_averaging", "strategy.period=3"],
            1e-6,
            id="lr1-is-local-sgd",
            marks=pytest.mark.slow,  # ~16 s; the DDP case runs the outer step by default
        ),
    ],
)
def test_diloco_reduces_to_the_method_it_generalises(tiny_data, tmp_path, outer, reference, atol):
    """DiLoCo's outer step (Δ = θ_g − mean θ_i as the gradient of an outer SGD from θ_g): with H = 1 and plain inner
    SGD it is DDP with the outer optimizer's momentum and the product of the lrs; with outer lr 1 and no momentum
    it is plain local SGD. Each worker's inner optimizer here has no state of its own (PLAIN: no momentum)."""
    runs = {}
    for name, settings in (("diloco", outer), ("reference", reference)):
        cfg = compose_cfg(
            f"data.root={tiny_data}", "data.val_split=0", "workers=2", "trainer.max_epochs=2", *PLAIN, *TINY, *settings
        )
        train(cfg, tmp_path / name)
        runs[name] = weights(tmp_path / name)
    assert_close(runs["diloco"], runs["reference"], atol=atol)


@pytest.mark.slow  # ~20 s: two runs; the outer step itself runs by default (H1-is-ddp-nesterov)
def test_diloco_keeps_its_outer_state_in_checkpoints_and_resumes_exactly(tiny_data, tmp_path):
    """θ_g and the outer optimizer's momentum are in every checkpoint: a resume from the first epoch's ends with
    the uninterrupted run's weights (a fresh momentum would not)."""
    settings = ["workers=2", "trainer.max_epochs=2", "strategy=diloco", "strategy.period=3", *TINY]
    train(
        compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *settings, "checkpoint_every_epoch=true"),
        tmp_path / "straight",
    )
    checkpoint = tmp_path / "straight" / "checkpoints" / "epoch0.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["psgd_outer"]
    assert saved["optimizer"]["state"] and len(saved["start"]) == len(list(weights(tmp_path / "straight")))
    train(
        compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *settings, f"ckpt_path={checkpoint}"),
        tmp_path / "resumed",
    )
    assert_close(weights(tmp_path / "resumed"), weights(tmp_path / "straight"), atol=0)


def test_diloco_ends_a_partial_round_with_an_outer_step(tiny_data, tmp_path):
    """8 steps per worker, period 3: averaging points after steps 3 and 6, then 2 steps of a partial round. The
    final model is the outer model: a hand-written Nesterov step (lr 0.7, momentum 0.9) from the θ_g and momentum
    of the epoch's checkpoint, Δ = θ_g − the replicas' mean (saved before the end) as its gradient; not the mean."""
    settings = ["workers=2", "trainer.max_epochs=1", "strategy=diloco", "strategy.period=3", *PLAIN, *TINY]
    settings += [
        "strategy.save_replicas=true",
        "checkpoint_every_epoch=true",
        f"data.root={tiny_data}",
        "data.val_split=0",
    ]
    m = train(compose_cfg(*settings), tmp_path / "run")
    assert (m["strategy"], m["outer_optimizer"], m["periodic_averagings"]) == ("diloco", "SGD", 2)  # its own name
    saved = torch.load(tmp_path / "run" / "checkpoints" / "epoch0.ckpt", weights_only=True)["psgd_outer"]
    replicas = [torch.load(tmp_path / "run" / "replicas" / f"rank{r}.pt", weights_only=True) for r in range(2)]
    final = weights(tmp_path / "run")
    names = [k for k in final if k in replicas[0]]
    assert len(names) == len(saved["start"])  # the lab CNN's state is its parameters
    for name, start, state in zip(names, saved["start"], saved["optimizer"]["state"].values(), strict=True):
        mean = (replicas[0][name] + replicas[1][name]) / 2
        delta = start - mean
        momentum = 0.9 * state["momentum_buffer"] + delta
        expected = start - 0.7 * (delta + 0.9 * momentum)
        assert torch.allclose(final[name], expected, atol=1e-6, rtol=0), name
        assert not torch.allclose(final[name], mean, atol=1e-4, rtol=0), name  # the plain mean is not it


def test_one_group_of_all_workers_is_plain_periodic_averaging(tiny_data, tmp_path):
    """Hierarchical averaging with a single group, all workers every 4 steps: local SGD with period 4."""
    runs = {}
    for name, schedule in (("groups", "strategy.group_periods={2:4}"), ("period", "strategy.period=4")):
        cfg = compose_cfg(
            f"data.root={tiny_data}", "data.val_split=0", "strategy=model_averaging", "workers=2", schedule, *TINY
        )
        cfg.trainer.max_epochs = 2
        m = train(cfg, tmp_path / name)
        runs[name] = weights(tmp_path / name)
        assert m["periodic_averagings"] == 4  # 16 common steps
    assert_close(runs["groups"], runs["period"], atol=0)


@pytest.mark.slow  # ~30 s: 4 processes on 2 cores; one group is plain local SGD by default above
def test_pairs_average_at_their_points_and_all_four_at_the_global_one(tiny_data, tmp_path):
    """{2: 2, 4: 8} with 4 workers, 4 steps each per epoch, 2 epochs: after steps 2, 4 and 6 the pairs (0, 1) and
    (2, 3) are each equal and differ from each other; after step 8 all four are equal; between points none is."""
    settings = ["strategy=model_averaging", "workers=4", "strategy.group_periods={2:2,4:8}", *TINY, *PLAIN]
    cfg = compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *settings)
    cfg.trainer.max_epochs = 2
    train(cfg, tmp_path / "run", callbacks=[Checksums(tmp_path), Updates(tmp_path)])
    assert_hand_computed(tmp_path, 4, lambda step: 4 if step % 8 == 0 else 2 if step % 2 == 0 else 0)
    sums = [[float(x) for x in (tmp_path / str(r)).read_text().split()] for r in range(4)]
    for step, (a, b, c, d) in enumerate(zip(*sums, strict=True), start=1):
        if step % 8 == 0:
            assert a == b == c == d, step
        elif step % 2 == 0:
            assert a == b and c == d and a != c, step
        else:
            assert len({a, b, c, d}) == 4, step
