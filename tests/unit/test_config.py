import os
import re
import shlex
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import CONF, compose_cfg
from omegaconf import OmegaConf

from psgd.choices import AUGMENTATIONS
from psgd.config import ConfigError, check, check_values
from psgd.run import build_model

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())


@pytest.mark.parametrize("group,choice", [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))])
def test_every_config_group_choice_composes_and_checks(group, choice):
    cfg = compose_cfg(f"{group}={choice}")
    OmegaConf.resolve(cfg)
    if group == "model" and choice in ("singa_cnn", "mlp"):
        cfg.data.name = "mnist"
    plan = check(cfg)
    assert plan.workers >= 1 and plan.threads_per_worker >= 1


def test_the_default_config_is_the_lab_cnn_on_mnist_with_one_worker():
    cfg = compose_cfg()
    assert (cfg.model.name, cfg.data.name, cfg.workers, cfg.strategy.name) == ("lab_cnn", "mnist", 1, "ddp")


def test_devices_follow_workers_unless_set():
    assert check(compose_cfg("workers=3")).workers == 3
    assert check(compose_cfg("trainer.devices=4")).workers == 4
    with pytest.raises(ConfigError, match="disagree"):
        check(compose_cfg("workers=2", "trainer.devices=4"))


@pytest.mark.parametrize(
    "devices,way",
    [
        # Lightning's way to choose GPUs: psgd's is to make only those visible
        ("[0,1]", "CUDA_VISIBLE_DEVICES=0,1 python train.py trainer.accelerator=gpu workers=2"),
        ("'2,3'", "CUDA_VISIBLE_DEVICES=2,3 python train.py trainer.accelerator=gpu workers=2"),
        ("[1]", "CUDA_VISIBLE_DEVICES=1 python train.py trainer.accelerator=gpu workers=1"),
        # Lightning's "every device": psgd asks how many
        ("auto", "Lightning's 'every device' is not taken: say how many workers with workers=N"),
        ("-1", "Lightning's 'every device' is not taken: say how many workers with workers=N"),
    ],
)
def test_lightnings_other_ways_to_give_devices_are_refused_naming_psgds_way(devices, way):
    with pytest.raises(ConfigError) as e:
        check(compose_cfg(f"trainer.devices={devices}"))
    message = str(e.value)
    assert message.startswith("trainer.devices=") and " is invalid: must be an integer >= 1" in message
    assert message.endswith(way) and "\n" not in message


def test_threads_default_to_cores_over_workers_at_least_one(monkeypatch):
    import psgd.config.rules

    monkeypatch.setattr(psgd.config.rules, "cpu_count", lambda: 2)
    assert check(compose_cfg("workers=1")).threads_per_worker == 2
    assert check(compose_cfg("workers=4")).threads_per_worker == 1
    assert check(compose_cfg("workers=4", "threads_per_worker=3")).threads_per_worker == 3


def test_more_threads_than_cores_is_warned_about(monkeypatch, capsys):
    monkeypatch.setattr("psgd.config.rules.cpu_count", lambda: 2)
    for fine in (["workers=2"], ["workers=5", "threads_per_worker=1"], ["threads_per_worker=2"]):
        check(compose_cfg(*fine))
        assert capsys.readouterr().err == "", fine
    assert check(compose_cfg("workers=2", "threads_per_worker=2")).threads_per_worker == 2  # a warning only
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "psgd: warning: threads_per_worker=2 x 2 worker(s) is 4 threads on 2 cores: oversubscribed, every step "
        "waits on threads sharing a core (much slower); threads_per_worker=null uses cores // workers"
    ]


def test_gpu_only_switches_on_cpu_are_warned_about(capsys):
    """`data.on_device=true` or `trainer.benchmark=true` on CPU ran exactly as without them, and nothing said so."""
    for fine in (["trainer.accelerator=cpu"], ["trainer.accelerator=cpu", "trainer.benchmark=false"]):
        check(compose_cfg(*fine))
        assert capsys.readouterr().err == "", fine
    check(compose_cfg("trainer.accelerator=cpu", "data.on_device=true", "trainer.benchmark=true"))
    assert capsys.readouterr().err.strip().splitlines() == [
        "psgd: warning: data.on_device=true has no effect on CPU: it keeps the dataset on the GPU and makes batches "
        "there (on CPU it is in memory already)",
        "psgd: warning: trainer.benchmark=true has no effect on CPU: it runs cuDNN's autotuner for the GPU's "
        "convolutions",
    ]


def test_a_setting_whose_moment_never_comes_in_the_run_is_warned_about(capsys):
    """`scheduler.decay=step` on the default run (8 epochs, step_size 30) trained at a constant lr, and an
    early_stop.patience longer than the run's validations never stopped it; nothing said so."""

    def said(*overrides: str) -> list[str]:
        check(compose_cfg("trainer.accelerator=cpu", *overrides))
        return capsys.readouterr().err.strip().splitlines()

    assert said("scheduler.decay=step") == [
        "psgd: warning: scheduler.step_size=30 never comes: the step decay's first step is after epoch 30, and "
        "trainer.max_epochs=8 ends training first, so the lr is never decayed (as with scheduler.decay=none); use "
        "scheduler.step_size<=7"
    ]
    assert said("scheduler.decay=step", "scheduler.step_size=7") == []  # the last epoch runs at lr x gamma
    warm = ["scheduler=warmup", "scheduler.start_factor=0.1", "scheduler.decay=step", "trainer.max_epochs=5"]
    assert said(*warm, "scheduler.warmup_epochs=2", "scheduler.step_size=2") == []
    assert said(*warm, "scheduler.warmup_epochs=2", "scheduler.step_size=3")[0].endswith(
        "after epoch 5 (warm-up 2 + step_size 3), and trainer.max_epochs=5 ends training first, so the lr is never "
        "decayed (as with scheduler.decay=none); use scheduler.step_size<=2"
    )
    assert said(*warm, "scheduler.warmup_epochs=4.5", "scheduler.interval=step", "scheduler.step_size=1")[0].endswith(
        "after epoch 5.5 (warm-up 4.5 + step_size 1), and trainer.max_epochs=5 ends training first, so the lr is "
        "never decayed (as with scheduler.decay=none); use a longer trainer.max_epochs"
    )
    assert said("scheduler=none", "scheduler.decay=step") == []  # a constant lr anyway (the command line says it)
    assert said("scheduler.decay=step", "trainer.fast_dev_run=true") == []

    stop = ["early_stop.target_acc=0.9", "trainer.max_epochs=2"]
    assert said(*stop, "early_stop.patience=2") == []
    assert said(*stop, "early_stop.patience=3") == [
        "psgd: warning: early_stop.patience=3 never comes: trainer.max_epochs=2 validates 2 time(s), fewer than "
        "the 3 in a row at early_stop.target_acc=0.9 it waits for, so the run never stops early (time_to_target_s "
        "is still recorded); use early_stop.patience<=2"
    ]
    every = ["early_stop.target_acc=0.9", "trainer.max_epochs=4", "trainer.check_val_every_n_epoch=3"]
    assert (
        "validates 1 time(s) (trainer.check_val_every_n_epoch=3), fewer than the 2"
        in said(*every, "early_stop.patience=2")[0]
    )
    # several validations per epoch: how many depends on the data; not judged here
    assert said(*stop, "early_stop.patience=3", "trainer.val_check_interval=0.5") == []
    assert said("early_stop.patience=30") == []  # no target: the command line says patience is not read


def test_scheduler_none_is_a_constant_lr_whatever_the_schedule_settings_say():
    """`sweep.py -m scheduler=none,warmup scheduler.warmup_epochs=1`: the none jobs warmed up too, and the sweep
    compared one schedule under two names; and with warmup_epochs longer than the run, the none jobs were refused."""
    from psgd.config import schedule

    none = compose_cfg("scheduler=none", "scheduler.warmup_epochs=5", "scheduler.decay=cosine", "trainer.max_epochs=3")
    assert schedule(none.scheduler) == {**none.scheduler, "warmup_epochs": 0, "decay": "none", "interval": "epoch"}
    check(none)  # its warm-up is no warm-up: not longer than the run
    cosine = compose_cfg("scheduler=cosine", "scheduler.warmup_epochs=1")  # a warm-up, then the cosine decay
    assert schedule(cosine.scheduler) == dict(cosine.scheduler)
    with pytest.raises(ConfigError, match="scheduler.warmup_epochs=5 is invalid with trainer.max_epochs=3"):
        check(compose_cfg("scheduler=warmup", "scheduler.warmup_epochs=5", "trainer.max_epochs=3"))


def test_a_setting_no_job_reads_is_warned_about_once(monkeypatch, capsys):
    """`workers=2 data.partition_sizes=[0.7,0.3]` without data.partition=sizes trained iid shards, and
    nothing said so; in a sweep, only a setting that no job reads is warned about."""
    from conftest import CONF

    from psgd.command_line import command_line_problem
    from psgd.config import values_problem

    def warnings(*argv):
        script = "sweep" if "-m" in argv else "train"
        assert command_line_problem(script, list(argv), CONF, job_check=lambda j: values_problem(j, True)) is None
        return capsys.readouterr().err.splitlines()

    assert warnings("workers=2", "data.partition_sizes=[0.7,0.3]") == [
        "psgd: warning: data.partition_sizes=[0.7, 0.3] has no effect with data.partition=iid: it is read with "
        "data.partition=sizes"
    ]
    assert warnings("workers=2", "data.partition=by_label", "data.dirichlet_alpha=0.5") == [
        "psgd: warning: data.dirichlet_alpha=0.5 has no effect with data.partition=by_label: it is read with "
        "data.partition=dirichlet"
    ]
    assert warnings("lr_reference_batch=256") == [  # the lr stays optimizer.lr
        "psgd: warning: lr_reference_batch=256 has no effect with lr_scaling=none: it is read with lr_scaling=linear "
        "or sqrt, which scale optimizer.lr by the samples per update / lr_reference_batch"
    ]
    assert warnings("scheduler.start_factor=0.1") == [  # the default scheduler (cosine) has no warm-up
        "psgd: warning: scheduler.start_factor=0.1 has no effect with scheduler.warmup_epochs=0: it is read with "
        "a warm-up (scheduler=warmup, scheduler.warmup_epochs > 0)"
    ]
    assert warnings("scheduler=none", "scheduler.warmup_epochs=2", "scheduler.decay=cosine") == [
        "psgd: warning: scheduler.warmup_epochs=2 has no effect with scheduler=none: it is read with a schedule "
        "(scheduler=warmup or cosine): scheduler=none keeps optimizer.lr constant",
        "psgd: warning: scheduler.decay=cosine has no effect with scheduler=none: it is read with a schedule "
        "(scheduler=warmup or cosine): scheduler=none keeps optimizer.lr constant",
    ]
    assert warnings("early_stop.patience=3") == [  # no early stop
        "psgd: warning: early_stop.patience=3 has no effect with early_stop.target_acc=null: it is read with "
        "early_stop.target_acc=<an accuracy>, whose validations in a row it counts"
    ]
    assert warnings("-m", "early_stop.target_acc=null,0.9", "early_stop.patience=2") == []
    assert warnings("data.val_split=0.1", "trainer.limit_val_batches=0") == [
        "psgd: warning: data.val_split=0.1 holds out training samples for validation, and "
        "trainer.limit_val_batches=0 runs none: they are neither trained nor validated on; data.val_split=0 trains "
        "on them"
    ]
    assert warnings("-m", "data.val_split=0.1", "trainer.limit_val_batches=0,null") == []  # some job validates
    assert warnings("data.val_split=0.1") == warnings("trainer.limit_val_batches=0") == []
    assert warnings("scheduler.gamma=0.5") == [  # the default cosine decay
        "psgd: warning: scheduler.gamma=0.5 has no effect with scheduler.decay=cosine: it is read with "
        "scheduler.decay=step (x gamma every step_size)"
    ]
    # a constant lr from the warm-up or cosine preset: nothing to step after every optimizer step
    assert warnings("scheduler=warmup", "scheduler.warmup_epochs=0", "scheduler.interval=step") == [
        "psgd: warning: scheduler.interval=step has no effect with scheduler.warmup_epochs=0 scheduler.decay=none: it "
        "is read with a warm-up or a decay: a constant lr has no steps to count"
    ]
    # said once, by scheduler=none's row, whatever the other settings say
    assert warnings(
        "scheduler=none", "scheduler.interval=step", "scheduler.warmup_epochs=2", "scheduler.gamma=0.5"
    ) == [
        f"psgd: warning: scheduler.{setting} has no effect with scheduler=none: it is read with a schedule "
        "(scheduler=warmup or cosine): scheduler=none keeps optimizer.lr constant"
        for setting in ("warmup_epochs=2", "interval=step", "gamma=0.5")
    ]
    for read in (
        ["scheduler.interval=step"],  # the default cosine decay
        [
            "-m",
            "scheduler=warmup",
            "scheduler.warmup_epochs=0,1",
            "scheduler.interval=step",
            "workers=2",
        ],  # its warm-up
        ["scheduler=warmup", "scheduler.warmup_epochs=1", "scheduler.decay=step", "scheduler.step_size=2", "workers=2"],
        ["-m", "scheduler=none,warmup", "scheduler.warmup_epochs=1", "workers=2"],  # for the warm-up's jobs
        ["scheduler.warmup_epochs=1", "workers=2"],  # the default cosine decay, after a warm-up
        ["workers=2", "data.partition=sizes", "data.partition_sizes=[0.7,0.3]"],
        ["workers=2", "data.partition=dirichlet", "data.dirichlet_alpha=0.5"],
        ["scheduler=warmup", "scheduler.start_factor=0.1", "trainer.max_epochs=8"],
        ["lr_scaling=linear", "lr_reference_batch=256"],
        ["-m", "lr_scaling=none,linear", "lr_reference_batch=128"],  # compares unscaled and scaled runs
        ["-m", "workers=2", "data.partition=iid,sizes", "data.partition_sizes=[0.7,0.3]"],
        ["-m", "experiment=dist_tuto"],  # its partition_sizes are for its data.partition=sizes jobs
        ["experiment=dist_tuto"],  # a preset's setting: one job of its sweep, iid, is not the user's mistake
    ):
        assert warnings(*read) == [], read
    # strategy settings that act between workers, given a run of one (workers defaults to 1)
    assert warnings("strategy=model_averaging", "strategy.period=4") == [
        "psgd: warning: strategy.period=4 has no effect with workers=1: it is read by strategy=model_averaging with "
        "more than one worker (one worker has no other replica to average with)"
    ]
    assert warnings("strategy=hogwild", "strategy.lock=true", "trainer.devices=1") == [
        "psgd: warning: strategy.lock=true has no effect with workers=1: it is read by strategy=hogwild with more "
        "than one worker (one worker has no other worker's updates to take turns with)"
    ]
    assert warnings("strategy.bucket_cap_mb=1", "strategy.find_unused_parameters=false") == [
        f"psgd: warning: strategy.{setting} has no effect with workers=1: it is read by strategy=ddp with more than "
        "one worker or strategy.ddp_for_one_worker=true (one worker alone trains without DDP)"
        for setting in ("find_unused_parameters=false", "bucket_cap_mb=1")
    ]
    assert warnings("-m", "strategy=ddp,model_averaging", "++strategy.period=4") == [  # no job has 2 workers
        "psgd: warning: strategy.period=4 has no effect with strategy=ddp, workers=1: it is read by "
        "strategy=model_averaging with more than one worker"
    ]
    # the factors that default to the worker count are 1 with one worker: these runs train as without them
    flat = (
        "psgd: warning: the warm-up (scheduler=warmup, scheduler.warmup_epochs=5) has no effect with workers=1: it "
        "starts at optimizer.lr x scheduler.start_factor, and start_factor=null is 1/workers = 1, so the lr is "
        "constant through it; set scheduler.start_factor (e.g. 0.1) to warm one worker up"
    )
    assert warnings("scheduler=warmup") == [flat]
    assert warnings("-m", "scheduler=none,warmup") == [flat]  # one schedule under two names
    assert warnings("scheduler.warmup_epochs=1")[0].startswith(
        "psgd: warning: the warm-up (scheduler=cosine, scheduler.warmup_epochs=1) has no effect with workers=1"
    )
    assert warnings("-m", "lr_scaling=none,linear") == [
        "psgd: warning: lr_scaling=linear has no effect with workers=1: with lr_reference_batch=null it scales "
        "optimizer.lr by the workers, 1 here; lr_reference_batch=<samples> scales it by the samples per update "
        "instead"
    ]
    # HogWild's P workers already take about P times one worker's step: scaling the lr by P on top diverged
    assert warnings("-m", "workers=1,2,3,4,5", "strategy=hogwild", "lr_scaling=linear") == [
        "psgd: warning: lr_scaling=linear scales optimizer.lr by the workers under strategy=hogwild too (workers=5: "
        "lr 0.1), whose workers' updates already all land on the one shared model, about 5 times one worker's step: "
        "lr_scaling=none, or lr_reference_batch=<samples>, which scales by an update's samples (one worker's batch "
        "under HogWild)"
    ]
    assert warnings("strategy=hogwild", "workers=4", "lr_scaling=sqrt")[0].startswith(
        "psgd: warning: lr_scaling=sqrt scales optimizer.lr by the workers under strategy=hogwild too (workers=4: lr "
        "0.04)"
    )
    for read in (
        ["strategy=hogwild", "workers=4", "lr_scaling=linear", "lr_reference_batch=128"],  # by the batch: x1
        ["-m", "strategy=ddp,model_averaging", "workers=4", "lr_scaling=linear"],
        ["strategy=hogwild", "workers=4"],
    ):
        assert warnings(*read) == [], read
    for read in (
        ["-m", "workers=1,2", "scheduler=warmup"],  # the 1-worker job is the baseline of the others
        ["scheduler=warmup", "scheduler.start_factor=0.1"],
        ["scheduler=warmup", "scheduler.start_factor=1"],  # flat by choice: the warning's reason is not its
        ["scheduler=warmup", "trainer.devices=2"],
        ["scheduler=warmup", "workers=2", "trainer.num_nodes=2"],
        ["-m", "scheduler=warmup", "scheduler.start_factor=null,0.1"],
        ["lr_scaling=sqrt", "workers=4"],
        ["lr_scaling=linear", "lr_reference_batch=64"],  # scales by the batch: 128/64 with the default batch
        ["-m", "lr_scaling=linear", "workers=1,2"],
    ):
        assert warnings(*read) == [], read
    assert warnings("data.partition=by_label") == [  # workers=2 forgotten: no label skew
        "psgd: warning: data.partition=by_label has no effect with workers=1: it is read with more than one worker "
        "(one worker's shard is the whole training set: no label skew, only another order)"
    ]
    for read in (
        ["data.partition=iid"],  # the default: one worker's whole set
        ["data.partition=dirichlet", "data.dirichlet_alpha=0.5", "workers=2", "strategy=hogwild"],
        ["-m", "workers=1,2", "data.partition=by_label"],  # the 1-worker job is the sweep's baseline
        ["strategy=model_averaging", "workers=2", "strategy.period=4", "strategy.average_buffers=false"],
        ["strategy=model_averaging", "trainer.devices=2", "strategy.average_optimizer_state=true"],
        ["strategy=hogwild", "workers=3", "strategy.lock=true"],
        ["strategy.bucket_cap_mb=1", "strategy.ddp_for_one_worker=true"],  # DDP's cost measured on one worker
        ["strategy.find_unused_parameters=true", "trainer.num_nodes=2"],  # one worker on each of 2 machines
        ["-m", "workers=1,2", "strategy=model_averaging", "strategy.period=4"],  # a sweep's 2-worker job reads it
        ["-m", "workers=2", "strategy=ddp,model_averaging", "++strategy.period=4"],
    ):
        assert warnings(*read) == [], read
    assert warnings("-m", "workers=2", "data.partition=iid,by_label", "data.partition_sizes=[0.7,0.3]") == [
        "psgd: warning: data.partition_sizes=[0.7, 0.3] has no effect with data.partition=iid,by_label: it is "
        "read with data.partition=sizes"
    ]
    # where torchrun or srun started each worker as a train.py process, the first one says it
    for env, said in (({"RANK": "1"}, False), ({"SLURM_PROCID": "2"}, False), ({"RANK": "0"}, True)):
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            assert bool(warnings("workers=2", "data.partition_sizes=[0.7,0.3]")) is said, env


BAD = [
    (["workers=0"], "workers=0"),
    (["workers=-2"], "workers=-2"),
    (["trainer.devices=0"], "trainer.devices=0"),
    (["data.batch_size=-1"], "data.batch_size=-1"),
    (["data.batch_size=0"], "data.batch_size=0"),
    (["optimizer.lr=0"], "optimizer.lr=0"),
    (["optimizer.lr=-0.1"], "optimizer.lr=-0.1"),
    (["optimizer.momentum=1.0"], "optimizer.momentum=1.0"),
    (["optimizer.momentum=-0.5"], "optimizer.momentum=-0.5"),
    (["scheduler=warmup", "scheduler.warmup_epochs=-1"], "scheduler.warmup_epochs=-1"),
    (
        ["scheduler=warmup", "scheduler.warmup_epochs=0.5"],  # a fraction of an epoch: only when stepping per step
        "scheduler.warmup_epochs=0.5 is invalid: must be an integer >= 0 (fractions of an epoch need "
        "scheduler.interval=step)",
    ),
    (["scheduler.interval=batch"], "scheduler.interval='batch' is invalid: allowed: epoch, step"),
    (["data.eval_batch_size=null"], "data.eval_batch_size=null is invalid: must be an integer >= 1"),  # not None
    (["trainer.val_check_interval=1.5"], "trainer.val_check_interval=1.5 is invalid: must be a fraction"),
    (
        ["strategy=model_averaging", "workers=2", "trainer.val_check_interval=0.5"],
        "trainer.val_check_interval=0.5 is invalid with strategy=model_averaging and 2 workers",
    ),
    (["scheduler.interval=step", "scheduler.warmup_epochs=-0.5"], "scheduler.warmup_epochs=-0.5"),
    (
        ["scheduler=warmup", "trainer.max_epochs=3"],  # the preset's 5 warm-up epochs
        "scheduler.warmup_epochs=5 is invalid with trainer.max_epochs=3: the warm-up would not end before "
        "training does; use warmup_epochs<=3",
    ),
    (
        ["workers=2", "data.partition=sizes", "data.partition_sizes=[0.5,0.4]"],
        "fractions must sum to 1 (they sum to 0.9)",
    ),
    (["workers=3", "data.partition=sizes", "data.partition_sizes=[0.5,0.5]"], "one fraction per worker (3)"),
    (["workers=2", "data.partition=sizes", "data.partition_sizes=[1.0,0]"], "fractions > 0"),
    (["workers=11", "data.partition=by_label"], "only 10 classes"),
    (["workers=2", "data.partition=dirichlet", "data.dirichlet_alpha=0"], "data.dirichlet_alpha=0"),
    (  # the default null: the line says what the partition needs
        ["workers=2", "data.partition=dirichlet"],
        "data.dirichlet_alpha=null is invalid: data.partition=dirichlet needs a number > 0 (the label skew: "
        "smaller = more skewed, e.g. 0.5)",
    ),
    (
        ["workers=2", "data.partition=sizes"],
        "data.partition_sizes=null is invalid: data.partition=sizes needs one fraction per worker (2), summing to 1",
    ),
    (["data.partition=random"], "allowed: iid, sizes, by_label, dirichlet"),
    (["trainer.max_epochs=0"], "trainer.max_epochs=0 is invalid: must be an integer >= 1"),
    (
        ["trainer.max_epochs=-1", "trainer.max_steps=100"],  # Lightning's "no epoch limit": max_steps decides
        "trainer.max_epochs=-1 is invalid: must be an integer >= 1; Lightning's -1 or null, no limit, is not "
        "taken: psgd's lr schedules and records count epochs; to let trainer.max_steps or max_time end "
        "training, set max_epochs above the epochs they reach",
    ),
    (["early_stop.target_acc=1.5"], "early_stop.target_acc=1.5"),
    (["early_stop.target_acc=0"], "early_stop.target_acc=0"),
    (["early_stop.patience=0"], "early_stop.patience=0"),
    (["lr_scaling=cubic"], "allowed: none, linear, sqrt"),
    (["lr_scaling=linear", "lr_reference_batch=0"], "lr_reference_batch=0 is invalid: must be an integer >= 1"),
    (["lr_scaling=sqrt", "lr_reference_batch=1.5"], "lr_reference_batch=1.5 is invalid"),
    (["trainer.sync_batchnorm=true", "trainer.accelerator=cpu"], "sync_batchnorm"),
    (["data.augment=mixup"], "allowed: none, cifar, pad_crop_flip"),
    (["trainer.accelerator=mps"], "trainer.accelerator='mps' is invalid: allowed: auto, cpu, gpu, cuda"),
    (["data.val_split=1.0"], "data.val_split=1.0"),
    (["threads_per_worker=0"], "threads_per_worker=0"),
    (["model.dropout=1.0"], "model.dropout=1.0"),
    (["seed=-1"], "seed=-1"),
    (["strategy=model_averaging", "strategy.period=0"], "strategy.period=0"),
    (["strategy=hogwild", "trainer.num_nodes=2"], "trainer.num_nodes=2"),
    # without torchrun / srun nobody starts the other node's workers: psgd's waited for them for 30 min
    (["workers=2", "trainer.num_nodes=2"], "trainer.num_nodes=2 needs a launcher that starts the workers on every"),
    (["flush_denormal=maybe"], "flush_denormal='maybe'"),
    (["data.on_device=yes"], "data.on_device='yes' is invalid: must be true or false"),
    (["data.drop_last=1"], "data.drop_last=1 is invalid: must be true or false"),
    (["strategy.ddp_for_one_worker=2"], "strategy.ddp_for_one_worker=2 is invalid: must be true or false"),
    (["channels_last=1"], "channels_last=1"),
    # torch.compile's own error came from the first batch, inside a worker; `ture` is not true
    (
        ["compile=ture"],
        "compile='ture' is invalid: allowed: false, true (torch.compile's default mode), reduce-overhead",
    ),
    (["compile=1"], "compile=1 is invalid: allowed: false, true"),
    # on CPU, cudagraphs were skipped with a warning in a log: the run was not what was asked
    (
        ["compile=reduce-overhead", "trainer.accelerator=cpu"],
        "compile=reduce-overhead is invalid on CPU: it replays CUDA graphs, which need a GPU; use compile=true",
    ),
    # text where a number belongs: before, a TypeError traceback from the comparison
    (["optimizer.weight_decay=abc"], "optimizer.weight_decay='abc' is invalid: must be a number >= 0"),
    (["model.dropout=abc"], "model.dropout='abc' is invalid: must be a number in [0, 1)"),
    # was the model's "'<' not supported"
    (["model.dropout=null"], "model.dropout=null is invalid: must be a number in [0, 1)"),
    # the MLP's param groups set each layer's decay: the optimizer's would be ignored, silently
    (
        ["model=mlp", "optimizer.weight_decay=0.1"],
        "optimizer.weight_decay=0.1 would have no effect with model=mlp, which sets each layer's decay itself: "
        "use model.weight_decay_hidden and model.weight_decay_output",
    ),
    (["scheduler=warmup", "scheduler.start_factor=abc"], "scheduler.start_factor='abc' is invalid"),
    (["trainer.log_every_n_steps=abc"], "trainer.log_every_n_steps='abc' is invalid: must be an integer >= 1"),
    (["model.name=[1,2]"], "model.name=[1, 2] is invalid: must be a name"),
    # the label of another built-in model: the lab CNN trained, recorded as the WideResNet
    (["model.name=wide_resnet"], "model.name=wide_resnet is only the run's label and the model is still psgd.models"),
    # strategy.name set without choosing the group: failed on a setting the group lacks ("Key 'lock' is not in
    # struct", a traceback in error.log), also from a preset that wrote `strategy: {name: ...}`
    (
        ["strategy.name=hogwild"],
        "strategy.name=hogwild alone does not choose a strategy: the settings are still strategy=ddp's (no "
        "strategy.lock); use strategy=hogwild",
    ),
    (
        ["strategy=hogwild", "strategy.name=model_averaging"],
        "the settings are still strategy=hogwild's (no strategy.period)",
    ),
    (
        ["strategy=model_averaging", "strategy.name=ddp"],
        "use strategy=ddp (in a preset's defaults: - override /strategy: ddp)",
    ),
    # a class that cannot be imported: Hydra logged three ERROR lines, and the line said only "Are you
    # sure that module 'nope' is installed?"
    (
        ["optimizer._target_=nope.Opt"],
        "optimizer._target_=nope.Opt cannot be imported (ModuleNotFoundError: No module named 'nope')",
    ),
    (
        ["optimizer._target_=torch.optim.Nope"],
        "optimizer._target_=torch.optim.Nope cannot be imported (module torch.optim has no Nope)",
    ),
    (["optimizer._target_=5"], "optimizer._target_=5 is invalid: must name a class as module.Class"),  # the schema
    # what the optimizer's own constructor refuses: before, a traceback from inside fit
    (
        ["optimizer=novograd", "optimizer.betas=[2,3]"],
        "optimizer settings are invalid: torch_optimizer.NovoGrad refuses them (Invalid beta parameter at index "
        "0: 2); the settings were: lr=0.1 betas=[2, 3] eps=1e-08 weight_decay=0.0 grad_averaging=True amsgrad=False",
    ),
    (
        ["optimizer.nesterov=true", "optimizer.momentum=0"],
        "torch.optim.SGD refuses them (Nesterov momentum requires a momentum and zero dampening)",
    ),
    # a setting the optimizer has no argument for: named with what it takes, not its TypeError; a preset's
    # setting for SGD stayed when the optimizer was swapped (the workshop preset's momentum 0 under NovoGrad)
    (
        ["+optimizer.foo=1"],
        "optimizer.foo=1 is not a setting of torch.optim.SGD (it takes: lr, momentum, dampening, weight_decay,",
    ),
    (  # every such key at once, not one per attempt
        ["+optimizer.foo=1", "+optimizer.bar=2"],
        "optimizer.foo=1 and optimizer.bar=2 are not settings of torch.optim.SGD (it takes: lr, momentum,",
    ),
    (
        ["experiment=dli_fashion", "optimizer=novograd"],
        "optimizer.momentum=0.0 is not a setting of torch_optimizer.NovoGrad (it takes: lr, betas, eps, "
        "weight_decay, grad_averaging, amsgrad); leave it out (where a preset set it for another optimizer, "
        "drop it with ~optimizer.momentum)",
    ),
    # a typo in a switch used to be read as true ("flase" is a non-empty string); a list failed in a worker
    (["workers=2", "strategy=model_averaging", "strategy.same_init=flase"], "strategy.same_init='flase' is invalid"),
    (["workers=2", "strategy=hogwild", "strategy.lock=[1,2]"], "strategy.lock=[1, 2] is invalid: must be true or"),
    # how workers start and talk: before, Lightning's or torch's error from inside a worker
    (
        ["workers=2", "strategy.start_method=spwan"],
        "strategy.start_method='spwan' is invalid: allowed: forkserver, spawn, or null",
    ),
    # fork hung once the launcher had run a torch operation on several threads (GNU OpenMP)
    (
        ["workers=2", "strategy.start_method=fork"],
        "'fork' is invalid: allowed: forkserver, spawn, or null; a forked worker hangs once the launcher",
    ),
    # popen re-ran the command for each worker: in a sweep the sweep, which was killed; in a run two results
    (
        ["workers=2", "strategy.start_method=popen"],
        "strategy.start_method='popen' is invalid: allowed: forkserver, spawn, or null; Lightning's popen runs the "
        "whole command again for each worker",
    ),
    (["workers=2", "strategy=hogwild", "strategy.start_method=spawn"], "strategy=hogwild always uses forkserver"),
    (["workers=2", "strategy.backend=glo"], "strategy.backend='glo' is invalid: allowed: gloo, nccl, mpi, or null"),
    (["workers=2", "trainer.accelerator=cpu", "strategy.backend=nccl"], "strategy.backend=nccl is invalid on CPU"),
    # read only by the step decay: before, a traceback once the step came (or never, for gamma)
    (["scheduler.decay=step", "scheduler.step_size=0"], "scheduler.step_size=0 is invalid: must be an integer >= 1"),
    (["scheduler.decay=step", "scheduler.gamma=abc"], "scheduler.gamma='abc' is invalid: must be a number > 0"),
    # true is not a number (Python's bool is an int: these were accepted, lr as 1.0)
    (["optimizer.lr=true"], "optimizer.lr=True is invalid: must be a number > 0"),
    (["workers=2", "strategy.bucket_cap_mb=true"], "strategy.bucket_cap_mb=True is invalid"),
    (["early_stop.target_acc=true"], "early_stop.target_acc=True is invalid"),
    # any optimizer's settings, by the defaults of its constructor: numbers and switches
    (
        ["optimizer=adam", "+optimizer.eps=true"],
        "optimizer.eps=True is invalid: must be a number (the default is 1e-08)",
    ),
    (["+optimizer.maximize=flase"], "optimizer.maximize='flase' is invalid: must be true or false"),
    # not a path: before, a TypeError traceback
    (
        ["data.partition=sizes", "workers=2", "data.partition_sizes=3"],
        "data.partition_sizes=3 is invalid: must be a list of fractions > 0",
    ),
    (["data.partition=sizes", "workers=2", "data.partition_sizes=ab"], "data.partition_sizes='ab' is invalid"),
    (["ckpt_path=3"], "ckpt_path=3 is invalid: must be a checkpoint file or run dir"),
    (["ckpt_path="], "ckpt_path='' is invalid: must be a checkpoint file or run dir (a path; null, the default, "),
    (["init_weights=3"], "init_weights=3 is invalid: must be an earlier run's dir, a .ckpt file or a weights file"),
    (["init_weights="], "init_weights='' is invalid: must be an earlier run's dir"),
    (
        ["strategy=model_averaging", "workers=2", "strategy.same_init=false", "init_weights=runs/a"],
        "init_weights=runs/a is invalid with strategy.same_init=false: each worker would draw weights of its own",
    ),
    (["data.root=[1,2]"], "data.root=[1, 2] is invalid: must be a folder"),
    # Lightning reads these as "skip training" / "no clipping": an untrained model reported as completed
    (["trainer.limit_train_batches=0"], "trainer.limit_train_batches=0 is invalid: must be a number > 0"),
    (["trainer.limit_train_batches=-0.5"], "trainer.limit_train_batches=-0.5 is invalid"),
    (["trainer.limit_val_batches=-1"], "trainer.limit_val_batches=-1 is invalid: must be a number >= 0"),
    (["trainer.limit_test_batches=abc"], "trainer.limit_test_batches='abc' is invalid: must be a number > 0"),
    # a ValueError traceback after training: every run ends with its test
    (["trainer.limit_test_batches=0"], "trainer.limit_test_batches=0 is invalid: must be a number > 0"),
    # trained to max_epochs without a word: the target is judged on validation
    (
        ["trainer.limit_val_batches=0", "early_stop.target_acc=0.9"],
        "early_stop.target_acc=0.9 needs validation, and trainer.limit_val_batches=0 runs none",
    ),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val=-1 is invalid: must be a number >= 0, or null"),
    (["trainer.gradient_clip_val=abc"], "trainer.gradient_clip_val='abc' is invalid"),
    # arguments psgd passes the Trainer itself: Lightning's "got multiple values for keyword argument"
    (
        ["+trainer.logger=false"],
        "trainer.logger cannot be set: psgd decides it (every run logs to TensorBoard in its run",
    ),
    (["+trainer.strategy=ddp_spawn"], "trainer.strategy cannot be set: psgd decides it (choose it with strategy=ddp,"),
    (
        ["+trainer.enable_checkpointing=false"],
        "trainer.enable_checkpointing cannot be set: psgd decides it (every run keeps",
    ),
    (["trainer.check_val_every_n_epoch=0"], "trainer.check_val_every_n_epoch=0 is invalid: must be an integer >= 1"),
    # Lightning's Timer: a collective after every batch, which uneven shards left waiting until the timeout
    (
        ["strategy=model_averaging", "workers=2", "trainer.max_time=00:00:01:00"],
        "trainer.max_time=00:00:01:00 is invalid with strategy=model_averaging and 2 workers: Lightning decides it",
    ),
    (["strategy=hogwild", "workers=2", "trainer.max_time={minutes: 1}"], "trainer.max_time={'minutes': 1} is invalid"),
    # a zero or unreadable duration: nothing trained and the run said completed at chance accuracy, or
    # Lightning's own refusal came only once a sweep's job started
    (["trainer.max_time=00:00:00:00"], "trainer.max_time='00:00:00:00' is invalid: must be a duration longer than 0"),
    (["trainer.max_time=1:00:00"], "trainer.max_time='1:00:00' is invalid: must be a duration longer than 0, as DD:"),
    (["trainer.max_time={minutes: 0}"], "trainer.max_time={'minutes': 0} is invalid: must be a duration"),
    (["trainer.max_time={mins: 1}"], "trainer.max_time={'mins': 1} is invalid: must be a duration"),
    (["trainer.max_steps=0"], "trainer.max_steps=0 is invalid: must be an integer >= 1, or -1 for no limit"),
    (["trainer.max_steps=3.5"], "trainer.max_steps=3.5 is invalid: must be an integer >= 1, or -1 for no limit"),
    # each worker stopped at its own step: the others waited for it at their epoch's end until the timeout
    (
        ["strategy=model_averaging", "workers=2", "trainer.max_steps=30"],
        "trainer.max_steps=30 is invalid with strategy=model_averaging and 2 workers: each worker counts its own",
    ),
    (
        ["strategy=hogwild", "workers=2", "trainer.max_steps=30"],
        "trainer.max_steps=30 is invalid with strategy=hogwild",
    ),
    (
        ["early_stop.target_acc=0.9", "trainer.max_epochs=2", "trainer.check_val_every_n_epoch=3"],
        "early_stop.target_acc=0.9 needs validation, and trainer.check_val_every_n_epoch=3 runs none in "
        "trainer.max_epochs=2: use check_val_every_n_epoch<=2",
    ),
    (["trainer.num_sanity_val_steps=-5"], "trainer.num_sanity_val_steps=-5 is invalid: must be an integer >= 0, or -1"),
    (["trainer.deterministic=abc"], "trainer.deterministic='abc' is invalid: allowed: true, false, warn"),
    # Lightning refused text with "invalid literal for int() with base 10", naming no key
    (["trainer.fast_dev_run=abc"], "trainer.fast_dev_run='abc' is invalid: allowed: true, false, or a number of"),
    (["trainer.fast_dev_run=-1"], "trainer.fast_dev_run=-1 is invalid"),
    (["trainer.benchmark=flase"], "trainer.benchmark='flase' is invalid: allowed: true, false, or null"),
    # 0 was read as 1 (the default) and trained without a word
    (["trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches=0 is invalid: must be an integer >= 1"),
    (["strategy=nonsense"], None),
]


# judged only with torch loaded, on the machine that runs the job (check, not check_values)
NEEDS_THE_MACHINE = {
    "trainer.sync_batchnorm=true trainer.accelerator=cpu",
    "compile=reduce-overhead trainer.accelerator=cpu",
    "workers=2 trainer.accelerator=cpu strategy.backend=nccl",
    "optimizer=novograd optimizer.betas=[2,3]",
    "optimizer.nesterov=true optimizer.momentum=0",
    "+optimizer.foo=1",
    "experiment=dli_fashion optimizer=novograd",
    "+optimizer.foo=1 +optimizer.bar=2",
    "optimizer=adam +optimizer.eps=true",
    "+optimizer.maximize=flase",
    "workers=2 trainer.num_nodes=2",  # the launcher (torchrun, srun) is the machine's
    # the optimizer's class is imported with torch, at the job's start
    "optimizer._target_=nope.Opt",
    "optimizer._target_=torch.optim.Nope",
}


@pytest.mark.parametrize("overrides,fragment", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_values_are_one_clear_line(overrides, fragment):
    """check() at a job's start; check_values(), which the scripts run before torch loads, finds the
    same line, unless the value is one only the machine can judge."""
    if fragment is None:  # an unknown group choice: Hydra refuses it and lists the choices
        with pytest.raises(Exception, match="Available options"):
            compose_cfg(*overrides)
        return
    with pytest.raises(ConfigError) as e:
        check(compose_cfg(*overrides))
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)
    if " ".join(overrides) in NEEDS_THE_MACHINE:
        assert check_values(compose_cfg(*overrides)) >= 1
    else:
        with pytest.raises(ConfigError) as early:
            check_values(compose_cfg(*overrides))
        assert str(early.value) == str(e.value)


@pytest.mark.parametrize("optimizer,cls", [("sgd", "SGD"), ("novograd", "NovoGrad")])
def test_dropping_a_presets_optimizer_setting_as_the_error_says_runs_either_optimizer(optimizer, cls):
    """The way out the line above gives works for a sweep over both: SGD without the key is torch's
    momentum 0 (what the preset meant), NovoGrad has nothing left it refuses."""
    from hydra.utils import instantiate

    cfg = compose_cfg("experiment=dli_fashion", f"optimizer={optimizer}", "~optimizer.momentum")
    check(cfg)
    opt = instantiate(cfg.optimizer, _convert_="all")([torch.zeros(1, requires_grad=True)])
    assert type(opt).__name__ == cls and opt.defaults["lr"] == 0.01
    assert opt.defaults.get("momentum", 0) == 0


def test_the_value_checks_the_scripts_run_first_load_no_torch():
    code = "import sys, psgd.config; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'torchvision'}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_the_augmentations_the_config_allows_are_the_ones_implemented():
    from psgd.data.augment import PRESETS

    assert tuple(PRESETS) == AUGMENTATIONS


@pytest.mark.parametrize(
    "override",
    [
        "trainer.deterministic=warn",
        "trainer.benchmark=true",
        "trainer.num_sanity_val_steps=-1",
        "trainer.check_val_every_n_epoch=null",
        "trainer.gradient_clip_val=0",
        "trainer.limit_train_batches=0.5",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=0",
        "trainer.fast_dev_run=true",
        "trainer.fast_dev_run=3",
        "trainer.fast_dev_run=0",
    ],
)
def test_trainer_values_psgd_checks_still_take_everything_lightning_means_by_them(override):
    check(compose_cfg(override))


def test_more_workers_than_visible_gpus_is_one_clear_line(monkeypatch):
    # the check reads only how many CUDA devices torch sees: a machine with one GPU, stood in for here
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    assert check(compose_cfg("trainer.accelerator=gpu")).accelerator == "gpu"  # one worker, one GPU
    for strategy in ("ddp", "model_averaging"):
        with pytest.raises(ConfigError) as e:
            check(compose_cfg(f"strategy={strategy}", "workers=2", "trainer.accelerator=gpu"))
        assert str(e.value) == (
            "workers=2 is invalid on GPU: 1 CUDA device visible and each worker needs its own; "
            "use workers<=1, or trainer.accelerator=cpu"
        )
    with pytest.raises(ConfigError) as e:  # the key the user set is the one named
        check(compose_cfg("trainer.devices=3", "trainer.accelerator=gpu"))
    assert str(e.value).startswith("trainer.devices=3 is invalid on GPU") and "use trainer.devices<=1" in str(e.value)


@pytest.mark.parametrize("model,data", [("singa_cnn", "cifar10"), ("mlp", "cifar10")])
def test_model_data_pairings_that_cannot_work_are_config_errors(model, data):
    """Refused by `check` (before any worker, and before any job of a sweep) and by build_model."""
    cfg = compose_cfg(f"model={model}", f"data={data}")
    line = f"model={model} needs 28x28 inputs but data={data} has 32x32 images; allowed data for {model}: mnist, "
    for refuses in (check, lambda cfg: build_model(cfg.model, cfg.data.name)):
        with pytest.raises(ConfigError) as e:
            refuses(cfg)
        assert str(e.value) == line + "fashion_mnist"


@pytest.mark.parametrize(
    "overrides,line",
    [
        (["+model.foo=1"], "model.foo=1 is not a setting of model=lab_cnn (psgd.models.LabCNN takes: dropout, "),
        (  # a typo of a setting another model has: named with what this one takes
            ["model=wide_resnet", "+model.hidden=64", "+model.widen=2"],
            "model.hidden=64 and model.widen=2 are not settings of model=wide_resnet (psgd.models.WideResNet takes: ",
        ),
    ],
)
def test_a_setting_the_model_has_no_argument_for_is_refused_by_check_with_what_it_takes(overrides, line):
    """It used to be found when the network was built: in a sweep, when that job's turn came."""
    with pytest.raises(ConfigError) as e:
        check(compose_cfg(*overrides))
    assert str(e.value).startswith(line) and str(e.value).endswith(" out") and "\n" not in str(e.value)
    check(compose_cfg("model=mlp", "model.hidden=64"))  # the model's own settings pass


@pytest.mark.parametrize(
    "target,message",
    [
        ("nope.Net", "model._target_=nope.Net cannot be imported (ModuleNotFoundError: No module named 'nope')"),
        ("psgd.models.Nope", "model._target_=psgd.models.Nope cannot be imported (module psgd.models has no Nope)"),
        (
            "psgd.run.build_model",
            "model._target_=psgd.run.build_model is invalid: Located non-class of type 'function'",
        ),
    ],
)
def test_a_model_class_that_cannot_be_imported_is_one_line(target, message, caplog):
    """A user's own model (model._target_=...) misspelt or not installed: Hydra logged three ERROR lines and
    the run's line said "ImportError: Are you sure that module 'nope' is installed?" with a traceback file."""
    cfg = compose_cfg(f"model._target_={target}", "model.name=mine")
    with pytest.raises(ConfigError) as e:
        build_model(cfg.model, "mnist")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_model_module_in_the_current_folder_but_not_on_the_path_is_said_so(tmp_path, monkeypatch):
    """`python train.py` puts train.py's folder on Python's path, not the current one, where a user's
    models.py often lies: the line says how to run it."""
    (tmp_path / "usermodels_here.py").write_text("class Net: ...\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    cfg = compose_cfg("model._target_=usermodels_here.Net", "model.name=mine")
    with pytest.raises(ConfigError) as e:
        build_model(cfg.model, "mnist")
    assert str(e.value) == (
        "model._target_=usermodels_here.Net cannot be imported (ModuleNotFoundError: No module named "
        "'usermodels_here'; usermodels_here is in the current folder, which is not on Python's path: run with "
        "PYTHONPATH=.)"
    )


@pytest.mark.parametrize(
    "override,message",
    [
        # before: an MLP of 0 hidden units trained; text gave a traceback from inside torch or fit
        ("model.hidden=0", "model.hidden=0 is invalid: must be an integer >= 1 (hidden units)"),
        ("model.hidden=abc", "model.hidden='abc' is invalid: must be an integer >= 1 (hidden units)"),
        ("model.weight_decay_hidden=abc", "model.weight_decay_hidden='abc' is invalid: must be a number >= 0"),
        ("model.weight_decay_output=-1", "model.weight_decay_output=-1 is invalid: must be a number >= 0"),
    ],
)
def test_the_mlps_settings_are_checked_by_check_and_when_it_is_built(override, message):
    """By its constructor, which `check` runs on the meta device: a sweep refuses the job before any runs."""
    cfg = compose_cfg("model=mlp", override)
    for refuses in (check, lambda cfg: build_model(cfg.model, "mnist")):
        with pytest.raises(ConfigError) as e:
            refuses(cfg)
        assert str(e.value) == message


USER_MODELS = """
import torch.nn as nn


class Fixed28(nn.Module):  # written for MNIST's 28x28 images
    def __init__(self, in_channels=1, num_classes=10):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, 4, 3)
        self.fc = nn.Linear(4 * 26 * 26, num_classes)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


class ReadsAValue(nn.Module):  # .item() in its forward: meta tensors cannot run it, the CPU can
    def __init__(self, in_channels=1, num_classes=10):
        super().__init__()
        self.fc = nn.LazyLinear(num_classes)

    def forward(self, x):
        return self.fc(x.flatten(1) / (x.abs().max().item() + 1))


class SparseEmbedding(nn.Module):  # pixel values looked up in a table whose gradients are sparse
    def __init__(self, in_channels=1, num_classes=10):
        super().__init__()
        self.table = nn.Embedding(256, 2, sparse=True)
        self.fc = nn.Linear(2, num_classes)

    def forward(self, x):
        return self.fc(self.table((x.flatten(1) * 255).long().clamp(0, 255)).mean(1))
"""


@pytest.fixture
def user_model(tmp_path, monkeypatch):
    """USER_MODELS importable (as psgd_test_user_models); gives the overrides that choose one of its classes."""
    (tmp_path / "psgd_test_user_models.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))

    def choose(cls: str) -> list[str]:
        return [f"model._target_=psgd_test_user_models.{cls}", "model.name=mine", "~model.dropout", "~model.batch_norm"]

    return choose


def test_fused_updates_with_a_model_that_makes_sparse_gradients_are_one_line_before_anything_runs(user_model):
    """torch's fused SGD refuses sparse gradients ("`_fused_sgd` does not support sparse gradients") at the
    first step, in every worker. optimizer.fused=true (the default) is refused with such a model, naming the
    module and the way out; fused=false runs torch's loop, which takes them."""
    mine = user_model("SparseEmbedding")
    with pytest.raises(ConfigError) as e:
        check(compose_cfg(*mine))
    assert str(e.value) == (
        "optimizer.fused=true is invalid with model=mine: its table (Embedding, sparse=True) makes sparse "
        "gradients, which the fused update refuses; set optimizer.fused=false"
    )
    check(compose_cfg(*mine, "optimizer.fused=false"))
    net, _ = build_model(compose_cfg(*mine).model, "mnist")
    F.cross_entropy(net(torch.rand(4, 1, 28, 28)), torch.arange(4)).backward()
    assert net.table.weight.grad.is_sparse  # what the check is about
    torch.optim.SGD(net.parameters(), lr=0.1, fused=False).step()  # the loop takes them
    with pytest.raises(RuntimeError, match="sparse"):
        torch.optim.SGD(net.parameters(), lr=0.1, fused=True).step()


@pytest.mark.parametrize(
    "optimizer,target,name",
    [("adam", "torch.optim.Adam", "Adam"), ("novograd", "torch_optimizer.NovoGrad", "NovoGrad")],
)
def test_an_optimizer_that_refuses_sparse_gradients_is_named_with_the_one_that_takes_them(
    user_model, optimizer, target, name
):
    """Adam and NovoGrad refuse sparse gradients fused or not ("Adam does not support sparse gradients,
    please consider SparseAdam instead", at the first step in every worker): optimizer.fused=false, the
    line's advice before, would not have helped them."""
    from hydra.utils import instantiate

    over = [*user_model("SparseEmbedding"), f"optimizer={optimizer}"]
    ways = [[], ["optimizer.fused=false"]] if optimizer == "adam" else [[]]  # (NovoGrad has no fused)
    for way in ways:
        with pytest.raises(ConfigError) as e:
            check(compose_cfg(*over, *way))
        assert str(e.value) == (
            f"optimizer._target_={target} is invalid with model=mine: its table (Embedding, sparse=True) makes "
            f"sparse gradients, which {name} refuses; use optimizer=sgd optimizer.fused=false, whose per-tensor "
            "update takes them"
        )
    cfg = compose_cfg(*over, *ways[-1])
    net, _ = build_model(cfg.model, "mnist")
    F.cross_entropy(net(torch.rand(4, 1, 28, 28)), torch.arange(4)).backward()
    with pytest.raises(RuntimeError, match=f"{name} does not support sparse gradients"):  # what the run met
        instantiate(cfg.optimizer, _convert_="all")(net.parameters()).step()


def test_a_model_of_the_users_that_does_not_fit_a_jobs_images_is_refused_by_check(user_model):
    """check runs the network on the dataset's image shape (meta device): a model for 28x28 images failed
    the CIFAR10 jobs of `sweep.py -m data=mnist,cifar10` only as each started. What meta tensors cannot
    run is judged on the CPU, as the job will: it is not refused for that."""

    def cfg(cls: str, data: str):
        return compose_cfg(*user_model(cls), f"data={data}")

    torch.manual_seed(0)
    state = torch.get_rng_state()
    check(cfg("Fixed28", "mnist"))
    with pytest.raises(ConfigError) as by_check:
        check(cfg("Fixed28", "cifar10"))
    check(cfg("ReadsAValue", "cifar10"))  # runs on the CPU, where .item() works
    assert torch.equal(state, torch.get_rng_state())  # the run's seeded initial weights stay the same
    with pytest.raises(ConfigError) as by_the_job:
        build_model(cfg("Fixed28", "cifar10").model, "cifar10")
    assert str(by_check.value) == str(by_the_job.value)
    assert str(by_check.value).startswith("model=mine does not fit data=cifar10 (3x32x32): mat1 and mat2 shapes")
    # and a sweep says it naming the job, before its first job
    from psgd.command_line import command_line_problem
    from psgd.config import sweep_values_problem

    line = ["-m", "model._target_=psgd_test_user_models.Fixed28", "model.name=mine", "~model.dropout"]
    problem = command_line_problem(
        "sweep", [*line, "~model.batch_norm", "data=mnist,cifar10"], CONF, job_check=sweep_values_problem
    )
    assert problem.startswith("model=mine does not fit data=cifar10") and problem.endswith(
        "(in the job data=cifar10; no job was started)"
    )


@pytest.mark.parametrize("model", ["lab_cnn", "wide_resnet", "mlp", "singa_cnn"])
def test_check_builds_the_network_without_drawing_from_torchs_random_numbers(model):
    """check's network is built on the meta device: the run's seeded initial weights stay the same."""
    torch.manual_seed(0)
    state = torch.get_rng_state()
    check(compose_cfg(f"model={model}"))
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize(
    "model,data,size",
    [
        ("lab_cnn", "mnist", 32),
        ("lab_cnn", "cifar10", 32),
        ("singa_cnn", "fashion_mnist", 28),
        ("wide_resnet", "cifar10", 32),
        ("wide_resnet", "mnist", 28),
        ("mlp", "mnist", 28),
    ],
)
def test_pairings_that_work_give_the_input_size(model, data, size):
    cfg = compose_cfg(f"model={model}", f"data={data}")
    assert build_model(cfg.model, cfg.data.name)[1] == size


TORCHRUN_2X2 = {"RANK": "1", "GROUP_RANK": "0", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}


def test_under_torchrun_the_counts_must_match_torchruns(monkeypatch):
    for k, v in {**TORCHRUN_2X2, "TORCHELASTIC_RUN_ID": "none"}.items():
        monkeypatch.setenv(k, v)
    assert check(compose_cfg("workers=2", "trainer.num_nodes=2")).launcher == "torchrun"
    with pytest.raises(ConfigError, match=r"use workers=2 trainer.num_nodes=2"):
        check(compose_cfg("workers=4"))
    with pytest.raises(ConfigError, match="strategy=hogwild is invalid under torchrun"):
        check(compose_cfg("strategy=hogwild", "workers=2", "trainer.num_nodes=1"))


def test_under_srun_the_tasks_must_match_the_workers(monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    with pytest.raises(ConfigError, match="SLURM_NTASKS=8 tasks but workers x trainer.num_nodes = 2"):
        check(compose_cfg("workers=2"))
    assert check(compose_cfg("workers=4", "trainer.num_nodes=2")).launcher == "srun"


def test_every_process_of_a_torchrun_or_srun_job_names_the_same_run_dir(monkeypatch):
    from psgd.outputs import run_name

    assert run_name() != run_name()  # a plain run: date/time with microseconds
    for k, v in {**TORCHRUN_2X2, "TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    assert run_name() == run_name() and run_name().endswith("/torchrun-port29500")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    assert run_name().endswith("/torchrun-job7")
    # one machine with a fixed --master-port: the port would name every such job of the day alike;
    # the workers' parent (torchrun, which also restarts them) names the job instead
    one_machine = {**os.environ, "LOCAL_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "none", "RANK": "0"}
    name = [sys.executable, "-c", "from psgd.outputs import run_name; print(run_name())"]
    restarts = [subprocess.run(name, env=one_machine, capture_output=True, text=True, check=True).stdout for _ in "ab"]
    another = subprocess.run(["sh", "-c", f"{shlex.join(name)}; true"], env=one_machine, capture_output=True, text=True)
    assert restarts[0] == restarts[1]
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d/\d\d-\d\d-\d\d-torchrun{os.getpid()}\n", restarts[0])
    assert another.stdout.endswith("\n") and another.stdout != restarts[0]
    for k in [*TORCHRUN_2X2, "TORCHELASTIC_RUN_ID"]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    assert run_name() != run_name()  # one task (a batch script's `python train.py` lines): a run of its own
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert run_name() == run_name() and run_name().endswith("/slurm-4242.0")


def test_a_torchrun_or_srun_job_keeps_the_date_it_started_on_after_midnight(monkeypatch):
    """A job started before midnight whose workers start, or are restarted by torchrun, after it: every
    worker files the run under the job's start date. With today's date a worker restarted after midnight
    looked for the run's checkpoint under the next day's dir, found none and began again from epoch 0."""
    import psgd.outputs as command_line

    evening = datetime(2026, 11, 26, 23, 59, 58)
    monkeypatch.setattr(command_line, "process_start", lambda pid: evening if pid == os.getppid() else None)
    for k, v in {**TORCHRUN_2X2, "TORCHELASTIC_RUN_ID": "job7"}.items():
        monkeypatch.setenv(k, v)
    assert command_line.run_name() == "2026-11-26/torchrun-job7"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # across machines, a static rendezvous
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert command_line.run_name() == "2026-11-26/torchrun-port29500"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])  # one machine: named by torchrun's start
    assert command_line.run_name() == f"2026-11-26/23-59-58-torchrun{os.getppid()}"
    monkeypatch.setattr(command_line, "process_start", lambda pid: None)  # no /proc: today's date, as before
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    assert command_line.run_name() == datetime.now().strftime("%Y-%m-%d/torchrun-job7")
    for k in [*TORCHRUN_2X2, "TORCHELASTIC_RUN_ID", "MASTER_PORT"]:
        monkeypatch.delenv(k, raising=False)
    for k, v in {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURM_JOB_START_TIME", str(int(evening.timestamp())))  # the same on every node
    assert command_line.run_name() == "2026-11-26/slurm-4242.0"
    monkeypatch.setenv("SLURM_JOB_START_TIME", "")  # an older Slurm's, unset: today's date
    assert command_line.run_name() == datetime.now().strftime("%Y-%m-%d/slurm-4242.0")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_process_start_time_is_read_to_the_second():
    from psgd.outputs import process_start

    before = datetime.now()
    with subprocess.Popen(["sleep", "30"]) as p:
        started = process_start(p.pid)
        p.kill()
    # /proc/stat's btime is the boot time in whole seconds (truncated), so the start read can come up to
    # 1 s early, and the clock's own step since boot adds to that: 2 s early is allowed (1 s flaked)
    assert before - timedelta(seconds=2) <= started <= datetime.now() + timedelta(seconds=1)
    assert process_start(2**22 + 1) is None  # above Linux's pid limit: no such process


@pytest.mark.parametrize("launcher", ["submitit_slurm", "psgd_slurm"])
def test_slurm_sweep_launcher_composes(launcher):
    from hydra import compose, initialize_config_dir

    overrides = [f"hydra/launcher={launcher}", "hydra.launcher.partition=gpu", "hydra.launcher.nodes=2"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="sweep", overrides=[*overrides, "trainer.num_nodes=2"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (cfg.hydra.launcher.partition, cfg.hydra.launcher.nodes, cfg.trainer.num_nodes) == ("gpu", 2, 2)
    assert "psgd_report" in cfg.hydra.callbacks  # the report is still written when the jobs ran on SLURM
    if launcher == "psgd_slurm":
        assert (cfg.hydra.launcher.tasks_per_node, cfg.hydra.launcher.cpus_per_task) == (1, 8)


def _switches(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _switches(value, f"{prefix}{key}.")
        elif isinstance(value, bool):
            yield f"{prefix}{key}"


def _first_choice_per_switch() -> list[tuple[str, str]]:
    """Every true/false setting of every config file, with a group choice that has it (trainer.* goes
    to Lightning, which checks its own; `_partial_` is Hydra's)."""
    found: dict[str, str] = {}
    for group, choice in [("strategy", "ddp")] + [
        (g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))
    ]:
        if group in ("experiment", "hydra", "trainer"):
            continue
        for key in _switches(OmegaConf.to_container(compose_cfg(f"{group}={choice}"), resolve=False)):
            # (compile is false, true or one of torch.compile's modes: its bad values are in BAD)
            if not key.startswith(("trainer.", "hydra.")) and not key.endswith("._partial_") and key != "compile":
                found.setdefault(key, f"{group}={choice}")
    return sorted((choice, key) for key, choice in found.items())


SWITCH_CASES = _first_choice_per_switch()


@pytest.mark.parametrize("choice,key", SWITCH_CASES, ids=[f"{c} {k}" for c, k in SWITCH_CASES])
def test_every_switch_takes_only_true_or_false(choice, key):
    base = [choice, "data.name=mnist"] + (["workers=2"] if choice.startswith("strategy=") else [])
    check(compose_cfg(*base, f"{key}=false"))
    for bad in ("flase", "1", "[1,2]"):
        with pytest.raises(ConfigError, match=f"^{key}=.* is invalid: must be true or false$"):
            check(compose_cfg(*base, f"{key}={bad}"))


def test_every_model_choice_is_a_builtin_with_its_class():
    from psgd.models import BUILTIN

    choices = {p.stem: OmegaConf.load(p) for p in (CONF / "model").glob("*.yaml")}
    assert {name: str(c._target_) for name, c in choices.items()} == BUILTIN
    assert all(c.name == name for name, c in choices.items())


def test_every_key_of_the_config_files_is_in_the_schema_with_a_description():
    """The yaml files hold the defaults, the schema the rest: a key of theirs without a field would be
    neither checked nor listed by --help. (A model's or optimizer's other keys are its constructor's.)"""
    from psgd.config import describe

    described = {key: (allowed, meaning) for key, allowed, meaning in describe()}
    assert all(allowed and meaning for allowed, meaning in described.values())
    keys = {k for k, v in OmegaConf.load(CONF / "train.yaml").items() if k not in ("defaults", "hydra")}
    keys |= {f"early_stop.{k}" for k in OmegaConf.load(CONF / "train.yaml").early_stop}
    keys |= {k for k in OmegaConf.load(CONF / "sweep.yaml") if k not in ("defaults", "hydra")}
    for group in ("data", "scheduler", "strategy", "trainer"):
        for path in (CONF / group).glob("*.yaml"):
            keys |= {f"{group}.{k}" for k in OmegaConf.load(path)}
    keys -= {"early_stop"}
    assert sorted(keys - set(described)) == []
