import math

import pytest
import torch

from psgd.choices import DECAYS
from psgd.config import schedule
from psgd.optim import build_scheduler, scaled_lr, schedule_read


def lrs_per_epoch(scheduler, optimizer, epochs):
    out = []
    for _ in range(epochs):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def sgd(lr):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


@pytest.mark.parametrize("rule,expected", [("none", 0.1), ("linear", 0.4), ("sqrt", 0.2)])
def test_lr_scaling_by_workers(rule, expected):
    assert scaled_lr(0.1, 4, rule) == pytest.approx(expected)


@pytest.mark.parametrize("rule,expected", [("none", 0.1), ("linear", 0.8), ("sqrt", 0.1 * math.sqrt(8))])
def test_lr_scaling_by_samples_per_update_against_a_reference_batch(rule, expected):
    """With lr_reference_batch the ratio is the update's samples over it (here 1024 / 128), whatever the
    worker count: a batch-size sweep is scaled too, and the worker count alone no longer decides it."""
    assert scaled_lr(0.1, 4, rule, samples_per_update=1024, reference_batch=128) == pytest.approx(expected)
    assert scaled_lr(0.1, 1, rule, samples_per_update=128, reference_batch=128) == pytest.approx(0.1)


def test_warmup_goes_linearly_from_lr_over_workers_to_lr():
    opt = sgd(0.4)
    sched = build_scheduler(opt, workers=4, max_epochs=8, warmup_epochs=3)
    assert lrs_per_epoch(sched, opt, 6) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])


def test_warmup_with_linear_scaling_reaches_the_scaled_lr():
    lr = scaled_lr(0.05, 2, "linear")
    opt = sgd(lr)
    sched = build_scheduler(opt, workers=2, max_epochs=4, warmup_epochs=2)
    assert lrs_per_epoch(sched, opt, 4) == pytest.approx([0.05, 0.075, 0.1, 0.1])


def test_warmup_then_cosine_decays_to_zero_at_max_epochs():
    opt = sgd(1.0)
    sched = build_scheduler(opt, workers=2, max_epochs=6, warmup_epochs=2, decay="cosine")
    lrs = lrs_per_epoch(sched, opt, 7)
    assert lrs[:3] == pytest.approx([0.5, 0.75, 1.0])
    assert lrs[3] == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lrs[6] == pytest.approx(0.0, abs=1e-12)


def test_step_decay_and_explicit_start_factor():
    opt = sgd(1.0)
    sched = build_scheduler(
        opt, workers=8, max_epochs=10, warmup_epochs=1, start_factor=0.5, decay="step", step_size=2, gamma=0.1
    )
    assert lrs_per_epoch(sched, opt, 5) == pytest.approx([0.5, 1.0, 1.0, 0.1, 0.1])


def test_a_per_step_schedule_ramps_within_epochs_and_meets_the_per_epoch_one_at_their_starts():
    # 4 optimizer steps per epoch: a half-epoch warm-up (2 steps) from lr/2, then cosine to 0 at the
    # end of epoch 3
    opt = sgd(1.0)
    sched = build_scheduler(opt, workers=2, max_epochs=3, warmup_epochs=0.5, decay="cosine", steps_per_epoch=4)
    lrs = lrs_per_epoch(sched, opt, 13)
    assert lrs[:3] == pytest.approx([0.5, 0.75, 1.0])
    assert lrs[3] == pytest.approx(0.5 * (1 + math.cos(math.pi / 10)))  # 1 of the cosine's 10 steps
    assert all(a > b for a, b in zip(lrs[2:12], lrs[3:12]))  # decays at every step
    assert lrs[12] == pytest.approx(0.0, abs=1e-12)
    # whole-epoch lengths: at each epoch's first step the per-step schedule has the per-epoch one's lr
    opt = sgd(1.0)
    per_epoch = lrs_per_epoch(build_scheduler(opt, 2, 4, 2, decay="cosine"), opt, 5)
    opt = sgd(1.0)
    per_step = lrs_per_epoch(build_scheduler(opt, 2, 4, 2, decay="cosine", steps_per_epoch=3), opt, 13)
    assert per_step[::3] == pytest.approx(per_epoch)
    assert per_step[1] == pytest.approx(0.5 + 0.5 / 6)  # and between them, a step's share of the change


def test_a_per_step_step_decay_keeps_its_epochs():
    opt = sgd(1.0)
    sched = build_scheduler(opt, workers=1, max_epochs=5, decay="step", step_size=2, gamma=0.1, steps_per_epoch=3)
    assert lrs_per_epoch(sched, opt, 7) == pytest.approx([1.0] * 6 + [0.1])


def test_no_schedule_when_nothing_asked():
    assert build_scheduler(sgd(0.1), workers=4, max_epochs=3) is None


# a grid of scheduler settings as a user gives them (the presets' keys), and another value for each key
SCHEDULE_GRID = [
    {"name": n, "warmup_epochs": w, "start_factor": f, "decay": d, "step_size": z, "gamma": 0.1, "interval": i}
    for n in ("none", "warmup", "cosine")
    for w in (0, 1, 2)
    for f in (None, 0.25)
    for d in DECAYS
    for z in (1, 2)
    for i in ("epoch", "step")
]
OTHER_VALUE = {
    "warmup_epochs": lambda v: 2 if v == 0 else 0,
    "start_factor": lambda v: 0.25 if v is None else None,
    "decay": lambda v: DECAYS[(DECAYS.index(v) + 1) % len(DECAYS)],
    "step_size": lambda v: 3 - v,
    "gamma": lambda v: 0.5,
    "interval": lambda v: "step" if v == "epoch" else "epoch",
}


def lr_of_each_step(settings, workers=2, epochs=6, steps=3):
    """The lr of every optimizer step of a run with these scheduler settings, built from all of them (not
    only those schedule_read keeps) and stepped per epoch or per step as the module's interval says."""
    cfg = {k: v for k, v in schedule(settings).items() if k != "name"}
    interval = cfg.pop("interval")
    optimizer = sgd(0.1)
    scheduler = build_scheduler(optimizer, workers, epochs, steps_per_epoch=steps if interval == "step" else 1, **cfg)
    lrs = []
    for _ in range(epochs):
        for _ in range(steps):
            lrs.append(round(optimizer.param_groups[0]["lr"], 12))
            optimizer.step()
            if scheduler is not None and interval == "step":
                scheduler.step()
        if scheduler is not None and interval == "epoch":
            scheduler.step()
    return lrs


def test_the_settings_a_schedule_reads_are_those_that_change_its_lr():
    """schedule_read (resume's check, the module) is checked against the lrs build_scheduler gives: a
    setting it leaves out never changes the lr (or a resume would go on with another schedule unnoticed),
    one it keeps changes it (or a resume would be refused for nothing)."""

    for settings in SCHEDULE_GRID:
        lrs, read = lr_of_each_step(settings), schedule_read(schedule(settings))
        for key, other_value in OTHER_VALUE.items():
            changed = {**settings, key: other_value(settings[key])}
            reads_it = schedule_read(schedule(changed)) != read
            moves = lr_of_each_step(changed) != lrs
            # (interval is read wherever the lr moves, also where both give the same lrs, a step decay
            # alone: it is the unit the scheduler counts in, and a checkpoint's scheduler state counts in it)
            assert moves == reads_it or (key == "interval" and reads_it and len(set(lrs)) > 1), (
                f"{key} {'is read for nothing' if reads_it else 'changes the lr unread'}: {settings}"
            )


def test_a_resume_that_changes_the_lr_schedule_is_named():
    from psgd.resume import schedule_change

    cosine = {"name": "cosine", "warmup_epochs": 0, "start_factor": None, "decay": "cosine", "step_size": 30}
    constant = {**cosine, "name": "none", "decay": "none"}
    saved = {"lr": 0.02, "max_epochs": 1, "scheduler": cosine}
    assert schedule_change(saved, dict(saved)) is None
    assert schedule_change({}, saved) is None  # not a psgd checkpoint's hyper-parameters: not judged
    assert schedule_change(saved, {**saved, "max_epochs": 2}).startswith("trainer.max_epochs=2 under a cosine")
    assert schedule_change(saved, {**saved, "lr": 0.04}).startswith("lr 0.04 ")
    assert schedule_change(saved, {**saved, "scheduler": {**cosine, "warmup_epochs": 2}}).startswith(
        "scheduler.warmup_epochs=2 (the checkpoint's run had 0)"
    )
    # the default warm-up starts at lr/workers, which the restored scheduler keeps
    warmup = {**constant, "name": "warmup", "warmup_epochs": 2}
    at_2 = {**saved, "workers": 2, "scheduler": warmup}
    assert schedule_change(at_2, {**at_2, "workers": 4}).startswith("workers=4 under a warm-up from 1/workers")
    # workers is per node: 2 nodes of 2 warm up from lr/4 (a checkpoint without num_nodes ran on one node)
    assert schedule_change(at_2, {**at_2, "num_nodes": 2}) == (
        "workers=2 x trainer.num_nodes=2 under a warm-up from 1/workers of the lr (the checkpoint's run had "
        "workers=2: its warm-up starts at lr/2)"
    )
    assert schedule_change({**at_2, "workers": 4}, {**at_2, "num_nodes": 2}) is None  # 4 workers either way
    assert schedule_change({**at_2, "num_nodes": 2}, {**at_2, "num_nodes": 2}) is None
    assert (
        schedule_change(
            {**at_2, "scheduler": {**warmup, "start_factor": 0.1}},
            {**at_2, "workers": 4, "scheduler": {**warmup, "start_factor": 0.1}},
        )
        is None
    )  # a fixed start: no matter
    assert schedule_change({**saved, "workers": 2}, {**saved, "workers": 4}) is None  # no warm-up: no matter
    # a checkpoint from before scheduler.interval existed stepped per epoch
    assert schedule_change(saved, {**saved, "scheduler": {**cosine, "interval": "epoch"}}) is None
    assert schedule_change(saved, {**saved, "scheduler": {**cosine, "interval": "step"}}).startswith(
        "scheduler.interval=step (the checkpoint's run had epoch)"
    )
    # a constant lr does not depend on the number of epochs: such a run may be resumed to train longer
    assert schedule_change({**saved, "scheduler": constant}, {**saved, "scheduler": constant, "max_epochs": 5}) is None
    # settings the schedule does not read are no change to it: start_factor without a warm-up, step_size and
    # gamma without the step decay, interval with a constant lr (scheduler=none with interval=step, kept in its
    # checkpoints before scheduler=none ignored it)
    assert schedule_change(saved, {**saved, "scheduler": {**cosine, "start_factor": 0.5, "step_size": 10}}) is None
    assert (
        schedule_change({**saved, "scheduler": {**constant, "interval": "step"}}, {**saved, "scheduler": constant})
        is None
    )
    step = {**cosine, "decay": "step"}
    assert schedule_change({**saved, "scheduler": step}, {**saved, "scheduler": {**step, "step_size": 10}}).startswith(
        "scheduler.step_size=10 (the checkpoint's run had 30)"
    )
