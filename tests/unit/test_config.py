import os
import re
import shlex
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import get_args

import pytest
import torch
from conftest import CONF, compose_cfg
from omegaconf import OmegaConf

from psgd.config import ConfigError, build_model, check, check_values

GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir())


@pytest.mark.parametrize("group,choice", [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))])
def test_every_config_group_choice_composes_and_checks(group, choice):
    # conf/exchange/ is no default's group: experiment=communication appends one of it per job, with 2 workers
    cfg = compose_cfg(f"+{group}={choice}", "workers=2") if group == "exchange" else compose_cfg(f"{group}={choice}")
    OmegaConf.resolve(cfg)
    if group == "model" and choice in ("singa_cnn", "mlp"):
        cfg.data.name = "mnist"
    plan = check(cfg)
    assert plan.run.workers_per_node >= 1 and plan.threads_per_worker >= 1


def test_the_default_config_is_the_lab_cnn_on_mnist_with_one_worker():
    cfg = compose_cfg()
    assert (cfg.model.name, cfg.data.name, cfg.workers, cfg.strategy.name) == ("lab_cnn", "mnist", 1, "ddp")


def test_devices_follow_workers_unless_set():
    assert check(compose_cfg("workers=3")).run.workers_per_node == 3
    assert check(compose_cfg("trainer.devices=4")).run.workers_per_node == 4
    with pytest.raises(ConfigError, match="disagree"):
        check(compose_cfg("workers=2", "trainer.devices=4"))


@pytest.mark.parametrize("devices", ["[0,1]", "'2,3'", "auto", "-1"])
def test_lightnings_other_ways_to_give_devices_are_one_line(devices):
    """A list of GPU ids, "auto" or -1 (Lightning's ways) are refused: psgd takes a count of workers."""
    with pytest.raises(ConfigError) as e:
        check(compose_cfg(f"trainer.devices={devices}"))
    assert str(e.value).startswith("trainer.devices=") and " is invalid: Input should be" in str(e.value)


@pytest.mark.parametrize("key", ["workers", "trainer.devices"])
def test_more_workers_than_visible_gpus_is_one_line_naming_the_key(monkeypatch, key):
    """On a machine with one CUDA device (stood in), two workers psgd would start are refused by the key
    that set them; one worker is fine. (tests/integration/test_gpu.py runs it on a real GPU.)"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert check(compose_cfg("trainer.accelerator=gpu", f"{key}=1")).run.workers_per_node == 1
    with pytest.raises(ConfigError) as e:
        check(compose_cfg("trainer.accelerator=gpu", f"{key}=2"))
    assert str(e.value).startswith(f"{key}=2 is invalid on GPU: 1 CUDA device visible")


def test_threads_default_to_cores_over_workers_at_least_one(monkeypatch):
    import psgd.config.rules

    monkeypatch.setattr(psgd.config.rules, "cpu_count", lambda: 2)
    assert check(compose_cfg("workers=1")).threads_per_worker == 2
    assert check(compose_cfg("workers=4")).threads_per_worker == 1
    assert check(compose_cfg("workers=4", "threads_per_worker=3")).threads_per_worker == 3


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
    (["scheduler.interval=batch"], "scheduler.interval='batch' is invalid: Input should be 'epoch' or 'step'"),
    (
        ["data.eval_batch_size=null"],
        "data.eval_batch_size=null is invalid: Input should be a valid integer",
    ),  # not None
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
        "data.partition_sizes=[0.5, 0.4] is invalid: data.partition=sizes needs one fraction per worker (2), which "
        "must sum to 1",
    ),
    (["workers=3", "data.partition=sizes", "data.partition_sizes=[0.5,0.5]"], "one fraction per worker (3)"),
    (
        ["workers=2", "data.partition=sizes", "data.partition_sizes=[1.0,0]"],
        "data.partition_sizes=[1.0, 0] is invalid: ",
    ),
    (["workers=11", "data.partition=by_label"], "only 10 classes"),
    (["workers=2", "data.partition=dirichlet", "data.dirichlet_alpha=0"], "data.dirichlet_alpha=0"),
    (  # the default null: the line says what the partition needs
        ["workers=2", "data.partition=dirichlet"],
        "data.dirichlet_alpha=null is invalid: data.partition=dirichlet needs a number > 0 (the label skew: "
        "smaller = more skewed, e.g. 0.5)",
    ),
    (
        ["workers=2", "data.partition=sizes"],
        "data.partition_sizes=null is invalid: data.partition=sizes needs one fraction per worker (2), which must sum "
        "to 1",
    ),
    (
        ["data.partition=random"],
        "data.partition='random' is invalid: Input should be 'iid', 'sizes', 'by_label' or 'dirichlet'",
    ),
    (["trainer.max_epochs=0"], "trainer.max_epochs=0 is invalid: Input should be greater than or equal to 1"),
    (
        ["trainer.max_epochs=-1", "trainer.max_steps=100"],
        "trainer.max_epochs=-1 is invalid: Input should be greater than or equal to 1",
    ),
    (["early_stop.target_acc=1.5"], "early_stop.target_acc=1.5"),
    (["early_stop.target_acc=0"], "early_stop.target_acc=0"),
    (["early_stop.patience=0"], "early_stop.patience=0"),
    (["lr_scaling=cubic"], "lr_scaling='cubic' is invalid: Input should be 'none', 'linear' or 'sqrt'"),
    (
        ["lr_scaling=linear", "lr_reference_batch=0"],
        "lr_reference_batch=0 is invalid: Input should be greater than or equal to 1",
    ),
    (["lr_scaling=sqrt", "lr_reference_batch=1.5"], "lr_reference_batch=1.5 is invalid"),
    (["data.augment=mixup"], "data.augment='mixup' is invalid: Input should be 'none', 'cifar' or 'pad_crop_flip'"),
    (
        ["trainer.accelerator=mps"],
        "trainer.accelerator='mps' is invalid: Input should be 'auto', 'cpu', 'gpu' or 'cuda'",
    ),
    (
        ["data.val_split=1.0"],
        "data.val_split=1.0 is invalid: must be a fraction below 1 (0.1) or a whole number of samples (5000)",
    ),
    (["threads_per_worker=0"], "threads_per_worker=0"),
    (["model.dropout=1.0"], "model.dropout=1.0"),
    (["seed=-1"], "seed=-1"),
    (["strategy=model_averaging", "strategy.period=0"], "strategy.period=0"),
    (["strategy=hogwild", "trainer.num_nodes=2"], "trainer.num_nodes=2 needs a launcher"),
    # without torchrun / srun nobody starts the other node's workers: psgd's waited for them for 30 min
    (["workers=2", "trainer.num_nodes=2"], "trainer.num_nodes=2 needs a launcher that starts the workers on every"),
    (["flush_denormal=maybe"], "flush_denormal='maybe'"),
    (["data.on_device=yes"], "data.on_device='yes' is invalid: Input should be a valid boolean"),
    (["data.drop_last=1"], "data.drop_last=1 is invalid: Input should be a valid boolean"),
    (["strategy.ddp_for_one_worker=2"], "strategy.ddp_for_one_worker=2 is invalid: Input should be a valid boolean"),
    (["channels_last=1"], "channels_last=1"),
    # torch.compile's own error came from the first batch, inside a worker; `ture` is not true
    (
        ["compile=ture"],
        "compile='ture' is invalid: Input should be False, True, 'default', 'reduce-overhead'",
    ),
    # text where a number belongs: before, a TypeError traceback from the comparison
    (["optimizer.weight_decay=abc"], "optimizer.weight_decay='abc' is invalid: Input should be a valid number"),
    (["model.dropout=abc"], "model.dropout='abc' is invalid: Input should be a valid number"),
    # was the model's "'<' not supported"
    (["model.dropout=null"], "model.dropout=null is invalid: Input should be a valid number"),
    (["scheduler=warmup", "scheduler.start_factor=abc"], "scheduler.start_factor='abc' is invalid"),
    (["trainer.log_every_n_steps=abc"], "trainer.log_every_n_steps='abc' is invalid: Input should be a valid integer"),
    (["model.name=[1,2]"], "model.name=[1, 2] is invalid: Input should be a valid string"),
    # strategy.name set without choosing the group (also by a preset that wrote `strategy: {name: ...}`): the
    # group's config class (strategy._target_) reads the section, and its name is not a choice
    (
        ["strategy.name=hogwild"],
        "strategy.name='hogwild' is invalid: the section is strategy=ddp's; a strategy is chosen by its config group; "
        "use strategy=hogwild",
    ),
    (
        ["strategy=hogwild", "strategy.name=model_averaging"],
        "strategy.name='model_averaging' is invalid: the section is strategy=hogwild's; a strategy is chosen by its "
        "config group; use strategy=model_averaging",
    ),
    (
        ["strategy=model_averaging", "strategy.name=nope"],
        "strategy.name='nope' is invalid: the section is strategy=model_averaging's",
    ),
    # a class that cannot be imported: Hydra logged three ERROR lines, and the line said only "Are you
    # sure that module 'nope' is installed?"
    (["optimizer._target_=nope.Opt"], "optimizer._target_=nope.Opt cannot be imported (No module named 'nope')"),
    (
        ["optimizer._target_=torch.optim.Nope"],
        "optimizer._target_=torch.optim.Nope cannot be imported (No module named 'torch.optim.Nope')",
    ),
    (["optimizer._target_=5"], "optimizer._target_=5 is invalid: Input should be a valid string"),  # the schema
    # what the optimizer's own constructor refuses: before, a traceback from inside fit
    (
        ["optimizer.nesterov=true", "optimizer.momentum=0"],
        "optimizer settings are invalid: torch.optim.SGD refuses them (Nesterov momentum requires a momentum and "
        "zero dampening); the settings were: lr=0.02 momentum=0.0 weight_decay=0.0 nesterov=True fused=True",
    ),
    # stragglers: every worker's factor, each >= 1, a delay >= 0 from a distribution psgd draws
    (
        ["workers=2", "stragglers.slowdown=[1,1,3]"],
        "stragglers.slowdown=[1, 1, 3] is invalid with 2 workers: it takes one factor per worker (2), e.g. [1, 3]",
    ),
    (
        ["workers=2", "stragglers.slowdown=[1,0.5]"],
        "stragglers.slowdown=[1, 0.5] is invalid: slowdown takes a list of one factor >= 1 per worker, e.g. [1, 3]",
    ),
    (["stragglers.slowdown=3"], "stragglers.slowdown=3 is invalid: slowdown takes a list of one factor >= 1 per"),
    (["stragglers.delay_s=-0.1"], "stragglers.delay_s=-0.1 is invalid: Input should be greater than or equal to 0"),
    (
        ["stragglers.distribution=gamma"],
        "stragglers.distribution='gamma' is invalid: Input should be 'none', 'fixed' or 'exponential'",
    ),
    (
        ["workers=2", "strategy=hogwild", "strategy.shared_queue=true", "scheduler=warmup", "scheduler.interval=step"],
        "scheduler.interval=step is invalid with strategy.shared_queue=true: each worker takes as many",
    ),
    (
        ["workers=2", "strategy=hogwild", "strategy.shared_queue=true", "trainer.limit_train_batches=0.5"],
        "trainer.limit_train_batches=0.5 is invalid with strategy.shared_queue=true: each worker takes as many",
    ),
    # the schema's word, not the optimizer's: NovoGrad said "(list index out of range)"
    (
        ["optimizer=novograd", "optimizer.betas=[0.9]"],
        "optimizer.betas=[0.9] is invalid: betas takes two numbers in [0, 1), e.g. [0.9, 0.999]",
    ),
    (["optimizer=adam", "+optimizer.betas=[2,3]"], "optimizer.betas=[2, 3] is invalid: betas takes two numbers"),
    # a setting the optimizer has no argument for: its constructor's TypeError, in one line; a preset's
    # setting for SGD stayed when the optimizer was swapped (the workshop preset's momentum 0 under NovoGrad)
    (
        ["+optimizer.foo=1"],
        "torch.optim.SGD refuses them (SGD.__init__() got an unexpected keyword argument 'foo')",
    ),
    (
        ["+optimizer.foo=1", "+optimizer.bar=2"],
        "torch.optim.SGD refuses them (SGD.__init__() got an unexpected keyword argument 'foo')",
    ),
    (
        ["experiment=dli_fashion", "optimizer=novograd"],
        "torch_optimizer.NovoGrad refuses them (NovoGrad.__init__() got an unexpected keyword argument 'momentum')",
    ),
    # a typo in a switch used to be read as true ("flase" is a non-empty string); a list failed in a worker
    (["workers=2", "strategy=model_averaging", "strategy.same_init=flase"], "strategy.same_init='flase' is invalid"),
    (
        ["workers=2", "strategy=hogwild", "strategy.lock=[1,2]"],
        "strategy.lock=[1, 2] is invalid: Input should be a valid boolean",
    ),
    # how workers start and talk: before, Lightning's or torch's error from inside a worker
    (
        ["workers=2", "strategy.start_method=spwan"],
        "strategy.start_method='spwan' is invalid: Input should be 'forkserver' or 'spawn'",
    ),
    # fork hung once the launcher had run a torch operation on several threads (GNU OpenMP)
    (
        ["workers=2", "strategy.start_method=fork"],
        "strategy.start_method='fork' is invalid: Input should be 'forkserver' or 'spawn'",
    ),
    # popen re-ran the command for each worker: in a sweep the sweep, which was killed; in a run two results
    (
        ["workers=2", "strategy.start_method=popen"],
        "strategy.start_method='popen' is invalid: Input should be 'forkserver' or 'spawn'",
    ),
    (
        ["workers=2", "strategy=hogwild", "strategy.start_method=spawn"],
        "strategy.start_method='spawn' is invalid: Input should be 'forkserver'",
    ),
    (
        ["workers=2", "strategy.backend=glo"],
        "strategy.backend='glo' is invalid: Input should be 'gloo', 'nccl' or 'mpi'",
    ),
    # read only by the step decay: before, a traceback once the step came (or never, for gamma)
    (
        ["scheduler.decay=step", "scheduler.step_size=0"],
        "scheduler.step_size=0 is invalid: Input should be greater than or equal to 1",
    ),
    (
        ["scheduler.decay=step", "scheduler.gamma=abc"],
        "scheduler.gamma='abc' is invalid: Input should be a valid number",
    ),
    # true is not a number (Python's bool is an int: these were accepted, lr as 1.0)
    (["optimizer.lr=true"], "optimizer.lr=True is invalid: Input should be a valid number"),
    (["workers=2", "strategy.bucket_cap_mb=true"], "strategy.bucket_cap_mb=True is invalid"),
    (["early_stop.target_acc=true"], "early_stop.target_acc=True is invalid"),
    # any optimizer's settings, by the defaults of its constructor: numbers and switches
    (["optimizer=adam", "+optimizer.eps=true"], "optimizer.eps=True is invalid: Input should be a valid number"),
    (["+optimizer.maximize=flase"], "optimizer.maximize='flase' is invalid: Input should be a valid boolean"),
    # not a path: before, a TypeError traceback
    (
        ["data.partition=sizes", "workers=2", "data.partition_sizes=3"],
        "data.partition_sizes=3 is invalid: Input should be a valid list",
    ),
    (["data.partition=sizes", "workers=2", "data.partition_sizes=ab"], "data.partition_sizes='ab' is invalid"),
    (["ckpt_path=3"], "ckpt_path=3 is invalid: Input should be a valid string"),
    (["ckpt_path="], "ckpt_path='' is invalid: String should have at least 1 character"),
    (["init_weights=3"], "init_weights=3 is invalid: Input should be a valid string"),
    (["init_weights="], "init_weights='' is invalid: String should have at least 1 character"),
    (["data.root=[1,2]"], "data.root=[1, 2] is invalid: Input should be a valid string"),
    # Lightning reads these as "skip training" / "no clipping": an untrained model reported as completed
    (["trainer.limit_train_batches=0"], "trainer.limit_train_batches=0 is invalid: Input should be greater than 0"),
    (["trainer.limit_train_batches=-0.5"], "trainer.limit_train_batches=-0.5 is invalid"),
    (
        ["trainer.limit_val_batches=-1"],
        "trainer.limit_val_batches=-1 is invalid: Input should be greater than or equal to 0",
    ),
    (
        ["trainer.limit_test_batches=abc"],  # a number of batches or a fraction of them
        "trainer.limit_test_batches='abc' is invalid: Input should be a valid integer, or Input should be a valid "
        "number",
    ),
    # a ValueError traceback after training: every run ends with its test
    (["trainer.limit_test_batches=0"], "trainer.limit_test_batches=0 is invalid: Input should be greater than 0"),
    (
        ["trainer.gradient_clip_val=-1"],
        "trainer.gradient_clip_val=-1 is invalid: Input should be greater than or equal to 0",
    ),
    (["trainer.gradient_clip_val=abc"], "trainer.gradient_clip_val='abc' is invalid"),
    (
        ["trainer.check_val_every_n_epoch=0"],
        "trainer.check_val_every_n_epoch=0 is invalid: Input should be greater than or equal to 1",
    ),
    # Lightning's Timer: a collective after every batch, which uneven shards left waiting until the timeout
    (
        ["strategy=model_averaging", "workers=2", "trainer.max_time=00:00:01:00"],
        "trainer.max_time=00:00:01:00 is invalid with strategy=model_averaging and 2 workers: each worker takes",
    ),
    (["strategy=hogwild", "workers=2", "trainer.max_time={minutes: 1}"], "trainer.max_time={'minutes': 1} is invalid"),
    # a zero or unreadable duration: nothing trained and the run said completed at chance accuracy, or
    # Lightning's own refusal came only once a sweep's job started
    (["trainer.max_time=00:00:00:00"], "trainer.max_time='00:00:00:00' is invalid: must be a duration longer than 0"),
    (["trainer.max_time=1:00:00"], "trainer.max_time='1:00:00' is invalid: must be a duration longer than 0, as DD:"),
    (["trainer.max_time={minutes: 0}"], "trainer.max_time={'minutes': 0} is invalid: must be a duration"),
    (["trainer.max_time={mins: 1}"], "trainer.max_time={'mins': 1} is invalid: must be a duration"),
    (
        ["trainer.max_steps=0"],
        "trainer.max_steps=0 is invalid: Input should be -1, or Input should be greater than or equal to 1",
    ),
    (
        ["trainer.max_steps=3.5"],
        "trainer.max_steps=3.5 is invalid: Input should be -1, or Input should be a valid integer",
    ),
    # each worker stopped at its own step: the others waited for it at their epoch's end until the timeout
    (
        ["strategy=model_averaging", "workers=2", "trainer.max_steps=30"],
        "trainer.max_steps=30 is invalid with strategy=model_averaging and 2 workers: each worker takes",
    ),
    (
        ["strategy=hogwild", "workers=2", "trainer.max_steps=30"],
        "trainer.max_steps=30 is invalid with strategy=hogwild",
    ),
    (
        ["trainer.num_sanity_val_steps=-5"],
        "trainer.num_sanity_val_steps=-5 is invalid: Input should be greater than or equal to -1",
    ),
    (
        ["trainer.deterministic=abc"],
        "trainer.deterministic='abc' is invalid: Input should be a valid boolean, or Input should be 'warn'",
    ),
    # Lightning refused text with "invalid literal for int() with base 10", naming no key
    (
        ["trainer.fast_dev_run=abc"],
        "trainer.fast_dev_run='abc' is invalid: Input should be a valid boolean, or Input should be a valid integer",
    ),
    (["trainer.benchmark=flase"], "trainer.benchmark='flase' is invalid: Input should be a valid boolean"),
    # 0 was read as 1 (the default) and trained without a word
    (
        ["trainer.accumulate_grad_batches=0"],
        "trainer.accumulate_grad_batches=0 is invalid: Input should be greater than or equal to 1",
    ),
    (["strategy=nonsense"], None),
    # gradient compression: every refusal before a worker starts
    (
        ["strategy.compression=zip"],
        "strategy.compression='zip' is invalid: Input should be 'none', 'fp16', 'bf16', 'powersgd', 'topk', 'sign' "
        "or 'qsgd'",
    ),
    (
        ["strategy.compression=topk", "strategy.topk_ratio=0"],
        "strategy.topk_ratio=0 is invalid: Input should be greater",
    ),
    (
        ["strategy.compression=topk", "strategy.topk_ratio=1.5"],
        "strategy.topk_ratio=1.5 is invalid: Input should be less",
    ),
    (["strategy.compression=powersgd", "strategy.powersgd_rank=0"], "strategy.powersgd_rank=0 is invalid"),
    (["strategy.compression=powersgd", "strategy.powersgd_start_step=1"], "strategy.powersgd_start_step=1 is invalid"),
    (["strategy.compression=qsgd", "strategy.qsgd_levels=1"], "strategy.qsgd_levels=1 is invalid"),
    (
        ["strategy.topk_ratio=0.1"],
        "strategy.topk_ratio=0.1 is invalid with strategy.compression=none: it is compression=topk's; use "
        "strategy.compression=topk or leave it out",
    ),
    (
        ["strategy.compression=sign", "strategy.qsgd_levels=4"],
        "strategy.qsgd_levels=4 is invalid with strategy.compression=sign",
    ),
    (
        ["strategy=model_averaging", "+strategy.compression=topk"],
        "strategy.compression='topk' is invalid with strategy=model_averaging: it is a key of strategy=ddp and "
        "decentralized; use strategy=ddp or leave it out",
    ),
    (["strategy=hogwild", "+strategy.topk_ratio=0.5"], "strategy.topk_ratio=0.5 is invalid with strategy=hogwild"),
    # the local-SGD family: post-local SGD, DiLoCo, hierarchical averaging, EASGD
    (["strategy=model_averaging", "strategy.sync_steps=-1"], "strategy.sync_steps=-1 is invalid: Input should be"),
    (["strategy=diloco", "strategy.period=0"], "strategy.period=0 is invalid"),
    (
        ["strategy=ddp", "+strategy.sync_steps=5"],
        "strategy.sync_steps=5 is invalid with strategy=ddp: it is a key of strategy=model_averaging and diloco; use "
        "strategy=model_averaging or leave it out",
    ),
    (["strategy=ddp", "+strategy.period=0"], "strategy.period=0 is invalid with strategy=ddp: it is a key of"),
    (
        ["strategy=ddp", "++strategy.perod=8"],
        "strategy.perod=8 is invalid with strategy=ddp: strategy=ddp has no such key",
    ),
    (
        ["strategy=hogwild", "+strategy.outer_optimizer={_target_:torch.optim.SGD,lr:1}"],
        "strategy.outer_optimizer={'_target_': 'torch.optim.SGD', 'lr': 1} is invalid with strategy=hogwild",
    ),
    (
        ["strategy=model_averaging", "workers=4", "strategy.group_periods={3:4,4:16}"],
        "strategy.group_periods={3: 4, 4: 16} is invalid with 4 workers: group sizes must nest (each divides the "
        "next) and the largest must be all 4 workers, e.g. {2: 4, 4: 16}",
    ),
    (["strategy=model_averaging", "workers=4", "strategy.group_periods={2:4}"], "the largest must be all 4 workers"),
    (
        ["strategy=model_averaging", "workers=2", "strategy.group_periods={2:4}", "strategy.period=3"],
        "strategy.period=3 is invalid with strategy.group_periods: the groups' periods are the schedule",
    ),
    (["strategy=elastic_averaging", "strategy.tau=0"], "strategy.tau=0 is invalid: Input should be greater than"),
    (["strategy=elastic_averaging", "strategy.alpha=0"], "strategy.alpha=0 is invalid: Input should be greater than 0"),
    (
        ["strategy=elastic_averaging", "workers=4", "strategy.alpha=0.3"],
        "strategy.alpha=0.3 is invalid with 4 workers: the elastic pull must be in (0, 1/workers] = (0, 0.25]",
    ),
    (
        ["strategy=diloco", "strategy.outer_optimizer.momentum=0"],
        "strategy.outer_optimizer settings are invalid: torch.optim.SGD refuses them (Nesterov momentum requires",
    ),
]


# judged only with torch loaded, on the machine that runs the job (check, not check_values)
NEEDS_THE_MACHINE = {
    "optimizer.nesterov=true optimizer.momentum=0",
    "+optimizer.foo=1",
    "experiment=dli_fashion optimizer=novograd",
    "+optimizer.foo=1 +optimizer.bar=2",
    "workers=2 trainer.num_nodes=2",  # the launcher (torchrun, srun) is the machine's
    "strategy=hogwild trainer.num_nodes=2",
    # the optimizer's class is imported with torch, at the job's start
    "optimizer._target_=nope.Opt",
    "optimizer._target_=torch.optim.Nope",
    "strategy=diloco strategy.outer_optimizer.momentum=0",
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
        assert check_values(compose_cfg(*overrides)).world_size >= 1
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
    from psgd.config.schema import Data
    from psgd.data.augment import PRESETS

    assert get_args(Data.model_fields["augment"].annotation) == tuple(PRESETS)


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


@pytest.mark.parametrize("model,data", [("singa_cnn", "cifar10"), ("mlp", "cifar10")])
def test_model_data_pairings_that_cannot_work_are_config_errors(model, data):
    """Refused by `check` (before any worker, and before any job of a sweep) and by build_model."""
    cfg = compose_cfg(f"model={model}", f"data={data}")
    for refuses in (check, lambda cfg: build_model(cfg.model, cfg.data.name)):
        with pytest.raises(ConfigError) as e:
            refuses(cfg)
        assert str(e.value).startswith(f"model={model} does not fit data={data} (3x32x32): ")
        assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides,line",
    [
        (["+model.foo=1"], "model=lab_cnn: LabCNN.__init__() got an unexpected keyword argument 'foo'"),
        (
            ["model=wide_resnet", "+model.hidden=64"],
            "model=wide_resnet: WideResNet.__init__() got an unexpected keyword argument 'hidden'",
        ),
    ],
)
def test_a_setting_the_model_has_no_argument_for_is_refused_by_check(overrides, line):
    """Found before any job of a sweep starts, not when that job's turn came."""
    with pytest.raises(ConfigError) as e:
        check(compose_cfg(*overrides))
    assert str(e.value) == line
    check(compose_cfg("model=mlp", "model.hidden=64"))  # the model's own settings pass


@pytest.mark.parametrize(
    "target,message",
    [
        ("nope.Net", "model._target_=nope.Net cannot be imported (No module named 'nope')"),
        ("psgd.models.Nope", "model._target_=psgd.models.Nope cannot be imported (No module named 'psgd.models.Nope')"),
        (
            "psgd.config.build_model",
            "model._target_=psgd.config.build_model is invalid: Located non-class of type 'function'",
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
"""


@pytest.fixture
def user_model(tmp_path, monkeypatch):
    """USER_MODELS importable (as psgd_test_user_models); gives the overrides that choose one of its classes."""
    (tmp_path / "psgd_test_user_models.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))

    def choose(cls: str) -> list[str]:
        return [f"model._target_=psgd_test_user_models.{cls}", "model.name=mine", "~model.dropout", "~model.batch_norm"]

    return choose


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
        if group in ("experiment", "exchange", "hydra", "trainer"):  # (exchange: experiment=communication's, no switch)
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
        with pytest.raises(ConfigError, match=f"^{key}=.* is invalid: Input should be a valid boolean$"):
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

    rows = describe()
    described = {key: (allowed, meaning) for key, allowed, meaning in rows}
    assert len(set(rows)) == len(rows)  # each row once (the strategy section's were listed twice)
    # a key listed again is one strategies have with other values or meanings, each row naming its strategies
    again = sorted({key for key, _, _ in rows if [k for k, _, _ in rows].count(key) > 1})
    assert again == ["strategy.compression", "strategy.topk_ratio"]
    assert all(meaning.startswith("[strategy=") for key, _, meaning in rows if key in again)
    assert all(allowed and meaning for allowed, meaning in described.values())
    keys = {k for k, v in OmegaConf.load(CONF / "train.yaml").items() if k not in ("defaults", "hydra")}
    keys |= {f"early_stop.{k}" for k in OmegaConf.load(CONF / "train.yaml").early_stop}
    keys |= {f"stragglers.{k}" for k in OmegaConf.load(CONF / "train.yaml").stragglers}
    keys |= {f"network.{k}" for k in OmegaConf.load(CONF / "train.yaml").network}
    keys |= {k for k in OmegaConf.load(CONF / "sweep.yaml") if k not in ("defaults", "hydra")}
    for group in ("data", "scheduler", "strategy", "trainer"):
        for path in (CONF / group).glob("*.yaml"):
            keys |= {f"{group}.{k}" for k in OmegaConf.load(path) if k != "defaults"}  # (a preset's base choice)
    keys -= {"early_stop", "stragglers", "network"}
    assert sorted(keys - set(described)) == []
    # what each takes, in the words --help prints
    assert described["optimizer.lr"][0] == "float > 0"
    assert described["data.partition"][0] == "iid, sizes, by_label, dirichlet"
    assert described["strategy.period"][0] == "int or null >= 1"
