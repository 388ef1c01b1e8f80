"""The experiment presets (conf/experiment/): each composes, every job of its sweep passes the config
check, and each runs end to end with trainer.fast_dev_run=true. Between them they run every model
(WideResNet on FashionMNIST and CIFAR10 with augmentation), NovoGrad and warm-up, and every strategy."""

import itertools

import pytest
from conftest import CONF, compose_cfg
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from psgd.config import check
from psgd.run import train

PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
WIDE_RESNET_ON_CPU = ["data.batch_size=4", "data.eval_batch_size=8"]  # one step of the real batch takes minutes


def sweep_jobs(preset: str) -> list[list[str]]:
    """The overrides of every job `sweep.py -m experiment=<preset>` launches (its hydra.sweeper.params)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="sweep", overrides=[f"experiment={preset}"], return_hydra_config=True)
        params = cfg.hydra.sweeper.params
        if not params:
            return [[]]
        loader = GlobalHydra.instance().config_loader()  # a glob() over a config group lists its choices
        parsed = OverridesParser.create(config_loader=loader).parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] for o in parsed]
    return [list(combo) for combo in itertools.product(*axes)]


def test_the_reference_presets_exist():
    expected = {"psgd_lab", "hogwild_lab", "dli_fashion", "dli_cifar", "dist_tuto", "singa", "threadpool_mlp"}
    assert expected <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_job_of_a_preset_sweep_passes_the_config_check(preset):
    jobs = sweep_jobs(preset)
    for overrides in jobs:
        check(compose_cfg(f"experiment={preset}", *overrides))
    if preset == "communication":  # DDP with every compression, local SGD at 3 periods and one-shot
        assert len(jobs) == 11 and ["+exchange=ddp_topk"] in jobs and ["+exchange=averaging_oneshot"] in jobs
    if preset == "topologies":  # 5 decentralized runs, DDP and local SGD, at 4 and 8 workers
        runs = [check(compose_cfg(f"experiment={preset}", *o)).run for o in jobs]
        gossip = [
            (r.world_size, r.strategy.topology, r.strategy.compression) for r in runs if hasattr(r.strategy, "topology")
        ]
        assert (
            len(jobs) == 14
            and len(gossip) == 10
            and (8, "ring", "topk") in gossip
            and (4, "complete", "none") in gossip
        )
    if preset in ("psgd_lab", "hogwild_lab"):
        assert [o[0] for o in jobs] == [f"workers={p}" for p in range(1, 6)]
    if preset == "threadpool_mlp":
        accumulations = {tuple(o): check(compose_cfg(f"experiment={preset}", *o)).accumulate_grad_batches for o in jobs}
        assert accumulations["workers=4", "parallel_batches=16"] == 4
        assert accumulations["workers=1", "parallel_batches=8"] == 8


def test_presets_set_what_their_reference_used():
    singa = compose_cfg("experiment=singa")
    assert (singa.model.name, singa.optimizer.lr, singa.optimizer.weight_decay, singa.data.batch_size) == (
        "singa_cnn",
        0.005,
        1e-5,
        64,
    )
    assert singa.data.augment == "pad_crop_flip" and singa.trainer.max_epochs == 10
    fashion = compose_cfg("experiment=dli_fashion")
    assert (fashion.model.name, fashion.data.name, fashion.strategy.name) == ("wide_resnet", "fashion_mnist", "ddp")
    assert (fashion.early_stop.target_acc, fashion.early_stop.patience, fashion.data.batch_size) == (0.85, 2, 32)
    cifar = compose_cfg("experiment=dli_cifar")
    assert cifar.optimizer._target_ == "torch_optimizer.NovoGrad" and cifar.optimizer.lr == 0.15
    assert (cifar.data.augment, cifar.data.batch_size, cifar.scheduler.name) == ("cifar", 256, "warmup")
    tuto = compose_cfg("experiment=dist_tuto")
    assert (tuto.workers, tuto.optimizer.lr, tuto.optimizer.momentum) == (2, 0.01, 0.5)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_with_fast_dev_run(preset, tiny_data, tmp_path):
    extra = WIDE_RESNET_ON_CPU if compose_cfg(f"experiment={preset}").model.name == "wide_resnet" else []
    cfg = compose_cfg(
        f"experiment={preset}",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "data.verify_md5=false",
        "trainer.fast_dev_run=true",
        "quiet=true",
        *extra,
    )
    result = train(cfg, tmp_path)
    assert result["status"] == "completed"
    assert 0.0 <= result["test_acc"] <= 1.0
    assert (result["strategy"], result["workers"]) == (cfg.strategy.name, cfg.workers)
    assert result["epochs"] == 1 and result["history"][0]["samples"] == cfg.data.batch_size * cfg.workers
