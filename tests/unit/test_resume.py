"""psgd.run.resolve_ckpt_path: what a checkpoint must match before a run resumes from it; psgd.run.init_weights:
what a run may start its weights from."""

from functools import partial

import pytest
import torch
from conftest import compose_cfg
from omegaconf import OmegaConf
from torch_optimizer import NovoGrad

from psgd.config import ConfigError, check_values
from psgd.models import MLP, LabCNN
from psgd.module import OPTIMIZER_KEY, Classifier
from psgd.resume import init_weights, resolve_ckpt_path, sample_settings


def save(path, module, **extra):
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), **extra}, path)
    return str(path)


def on(**data):
    """A Classifier whose run trains on the samples that `data` and `seed` decide."""
    seed = data.pop("seed", 0)
    data = {"name": "mnist", "val_split": 0, "partition": "iid", "partition_sizes": None, **data}
    return Classifier(
        LabCNN(),
        partial(torch.optim.SGD),
        lr=0.02,
        samples=sample_settings(OmegaConf.create({"seed": seed, "data": data})),
    )


def test_a_checkpoint_of_each_workers_state_needs_as_many_workers(tmp_path):
    module = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02, workers=2, max_epochs=2)
    mid_run = save(tmp_path / "mid.ckpt", module, replicas=[{}, {}], averaged=False)
    assert resolve_ckpt_path(mid_run, module, world_size=2) == mid_run
    for world_size in (1, 3):  # refused before any worker starts
        with pytest.raises(ConfigError, match=rf"holds 2 workers' own state but this run has {world_size} workers?;"):
            resolve_ckpt_path(mid_run, module, world_size=world_size)
    # the final checkpoint of model averaging holds the averaged model: any number of workers starts from it
    final = save(tmp_path / "final.ckpt", module, replicas=[{}, {}], averaged=True)
    assert resolve_ckpt_path(final, module, world_size=3) == final


def strategy_of(name: str):
    """The checked config of strategy=`name` (its defaults)."""
    return check_values(compose_cfg(f"strategy={name}")).strategy


def test_replicas_not_yet_averaged_resume_only_under_model_averaging(tmp_path):
    """Another strategy went on from worker 0's replica and dropped the others without a word."""
    module = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02, workers=2, max_epochs=2)
    weights = [{"state_dict": module.state_dict()}, {"state_dict": module.state_dict()}]
    mid_run = save(tmp_path / "mid.ckpt", module, replicas=weights, averaged=False)
    assert resolve_ckpt_path(mid_run, module, world_size=2, strategy=strategy_of("model_averaging")) == mid_run
    for strategy in ("ddp", "hogwild"):
        with pytest.raises(ConfigError) as e:
            resolve_ckpt_path(mid_run, module, world_size=2, strategy=strategy_of(strategy))
        assert str(e.value) == (
            f"ckpt_path={mid_run!r} holds 2 replicas that model averaging had not averaged yet, and "
            f"strategy={strategy} would go on from worker 0's alone: resume with strategy=model_averaging (or "
            "from the run's final checkpoint, which holds their average)"
        )
    # the final one holds the average; HogWild's hold one shared model and each worker's optimizer
    final = save(tmp_path / "final.ckpt", module, replicas=weights, averaged=True)
    hogwild = save(tmp_path / "hogwild.ckpt", module, replicas=[{"optimizer_states": []}] * 2, averaged=False)
    for path in (final, hogwild):
        assert resolve_ckpt_path(path, module, world_size=2, strategy=strategy_of("ddp")) == path


def test_a_checkpoint_with_another_lr_schedule_is_refused(tmp_path):
    saved = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02, max_epochs=1, scheduler={"decay": "cosine"})
    path = save(tmp_path / "last.ckpt", saved)
    same = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02, max_epochs=1, scheduler={"decay": "cosine"})
    assert resolve_ckpt_path(path, same) == path
    longer = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02, max_epochs=3, scheduler={"decay": "cosine"})
    with pytest.raises(ConfigError, match=r"cannot be resumed with trainer.max_epochs=3 under a cosine decay"):
        resolve_ckpt_path(path, longer)


def test_a_checkpoint_trained_on_another_dataset_is_refused(tmp_path):
    """MNIST and FashionMNIST give the same shapes: a resume that forgot data=fashion_mnist went on training
    the FashionMNIST run's weights, epochs and schedule on MNIST without a word."""
    path = save(tmp_path / "last.ckpt", on(name="fashion_mnist"))
    assert resolve_ckpt_path(path, on(name="fashion_mnist")) == path
    with pytest.raises(ConfigError) as e:
        resolve_ckpt_path(path, on(name="mnist"))
    assert str(e.value) == (
        f"ckpt_path={path!r} was trained with data=fashion_mnist and this run has data=mnist: it would go on with "
        "other samples than its run trained and validated on; resume with data=fashion_mnist"
    )
    # a checkpoint of a Classifier made in code, without the settings: nothing to compare
    older = save(tmp_path / "older.ckpt", Classifier(LabCNN(), partial(torch.optim.SGD), lr=0.02))
    assert resolve_ckpt_path(older, on(name="mnist")) == older


def test_a_resume_holding_out_other_validation_samples_is_refused(tmp_path):
    """data.val_split's samples are drawn with the seed: resuming with another val_split or seed validated
    on samples the checkpoint had trained on, without a word (a validation accuracy too good to be true)."""
    path = save(tmp_path / "last.ckpt", on(val_split=0.1))
    assert resolve_ckpt_path(path, on(val_split=0.1)) == path
    for other, said in [(on(val_split=0.1, seed=1), "data.val_split=0.1 seed=1"), (on(), "data.val_split=0")]:
        with pytest.raises(ConfigError) as e:
            resolve_ckpt_path(path, other)
        assert str(e.value) == (
            f"ckpt_path={path!r} was trained with data.val_split=0.1 seed=0 and this run has {said}: it would go "
            "on with other samples than its run trained and validated on; resume with data.val_split=0.1 seed=0"
        )
    # a run that held out nothing, resumed with a hold-out: its validation samples were all trained on
    nothing = save(tmp_path / "nothing.ckpt", on())
    with pytest.raises(ConfigError, match=r"trained with data.val_split=0 and .* resume with data.val_split=0$"):
        resolve_ckpt_path(nothing, on(val_split=0.2))


def test_a_resume_dealing_the_samples_otherwise_is_refused(tmp_path):
    """A label-skewed or sized run resumed with another data.partition (or sizes, alpha, or the seed that
    fixes their membership) went on with other shards, and its record named the new partition only."""
    path = save(tmp_path / "last.ckpt", on(partition="sizes", partition_sizes=[0.7, 0.3]))
    assert resolve_ckpt_path(path, on(partition="sizes", partition_sizes=[0.7, 0.3])) == path
    for other, said in [
        ({"partition": "iid"}, "data.partition=iid"),
        (
            {"partition": "sizes", "partition_sizes": [0.6, 0.4]},
            "data.partition=sizes data.partition_sizes=[0.6,0.4] seed=0",
        ),
        (
            {"partition": "sizes", "partition_sizes": [0.7, 0.3], "seed": 1},
            "data.partition=sizes data.partition_sizes=[0.7,0.3] seed=1",
        ),
    ]:
        with pytest.raises(ConfigError) as e:
            resolve_ckpt_path(path, on(**other))
        assert str(e.value) == (
            f"ckpt_path={path!r} was trained with data.partition=sizes data.partition_sizes=[0.7,0.3] seed=0 and "
            f"this run has {said}: it would go on with other samples than its run trained and validated on; "
            "resume with data.partition=sizes data.partition_sizes=[0.7,0.3] seed=0"
        )
    # iid shards are dealt anew every epoch from the seed: another seed deals them alike
    iid = save(tmp_path / "iid.ckpt", on(partition="iid"))
    assert resolve_ckpt_path(iid, on(partition="iid", seed=3)) == iid
    # a checkpoint of a Classifier made in code, without the settings: nothing to compare
    unknown = save(tmp_path / "unknown.ckpt", Classifier(LabCNN(), partial(torch.optim.SGD), lr=0.02))
    assert resolve_ckpt_path(unknown, on(partition="by_label")) == unknown
    dirichlet = save(tmp_path / "dirichlet.ckpt", on(partition="dirichlet", dirichlet_alpha=0.5))
    with pytest.raises(
        ConfigError, match=r"with data.partition=dirichlet data.dirichlet_alpha=0.5 seed=0 and this run has "
    ):
        resolve_ckpt_path(dirichlet, on(partition="dirichlet", dirichlet_alpha=0.3))


def test_a_checkpoint_of_another_model_or_no_checkpoint_is_refused(tmp_path, monkeypatch):
    mlp = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02)
    path = save(tmp_path / "last.ckpt", mlp)
    lab_cnn = Classifier(LabCNN(), partial(torch.optim.SGD), lr=0.02)
    with pytest.raises(ConfigError, match=r"does not fit this run's model: net\.\S+ is missing in the checkpoint"):
        resolve_ckpt_path(path, lab_cnn)
    garbage = tmp_path / "garbage.ckpt"  # e.g. report.md given by mistake: torch's text was about weights_only
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"garbage.ckpt' is not a checkpoint file \(give a .ckpt file or a run dir\)"):
        resolve_ckpt_path(str(garbage), mlp)
    code = tmp_path / "code.ckpt"  # a torch file that would run code when loaded
    torch.save({"state_dict": {}, "hook": partial(print)}, code)
    with pytest.raises(ConfigError, match=r"is not a psgd checkpoint loadable as weights only \(UnpicklingError"):
        resolve_ckpt_path(str(code), mlp)
    sweep = tmp_path / "sweep"  # a sweep's dir: its jobs' dirs are the runs
    for job in ("0", "1", "10"):
        (sweep / job / "checkpoints").mkdir(parents=True)
        save(sweep / job / "checkpoints" / "last.ckpt", mlp)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    with pytest.raises(ConfigError, match=rf"is a sweep's dir: give one job's run dir, e\.g\. {sweep / '0'}$"):
        resolve_ckpt_path(str(sweep), mlp)
    with pytest.raises(ConfigError, match=r"no checkpoint at .*nowhere \(give a .ckpt file or a run dir\)"):
        resolve_ckpt_path(str(tmp_path / "nowhere"), mlp)
    # a run dir stands for its last checkpoint
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"no checkpoint at .*run/checkpoints/last.ckpt"):
        resolve_ckpt_path(str(run_dir), mlp)
    last = save(run_dir / "checkpoints" / "last.ckpt", mlp)
    assert resolve_ckpt_path(str(run_dir), mlp) == last
    assert resolve_ckpt_path(str(run_dir / "checkpoints"), mlp) == last  # so does its checkpoints/ folder
    # ~ is the home folder, as in data.root
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_ckpt_path("~/run", mlp) == last


def save_trained(path, module):
    """A checkpoint as psgd writes it, with its optimizer's state."""
    optimizer = module.build_optimizer()
    extra = {"optimizer_states": [optimizer.state_dict()]}
    extra[OPTIMIZER_KEY] = type(optimizer).__name__
    return save(path, module, **extra)


def test_simulated_replicas_not_yet_averaged_resume_only_under_a_strategy_that_keeps_them_apart(tmp_path):
    """Simulated workers' parameters are stacked rows: where they differ, DDP would train them on apart."""
    from psgd.strategies.simulated import REPLICAS_KEY, SIMULATED_KEY

    module = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02, workers=2, max_epochs=2)
    rows = [torch.stack([p.detach(), p.detach()]) for p in module.parameters()]
    apart = [r.clone() for r in rows]
    apart[0][1] += 1  # worker 1's own first weight
    for replicas, refused in ((rows, False), (apart, True)):
        path = save(tmp_path / f"{refused}.ckpt", module, **{REPLICAS_KEY: replicas, SIMULATED_KEY: {"workers": 2}})
        ma = resolve_ckpt_path(path, module, world_size=2, strategy=strategy_of("model_averaging"), simulate=True)
        assert ma == path
        if not refused:
            assert resolve_ckpt_path(path, module, world_size=2, strategy=strategy_of("ddp"), simulate=True) == path
            continue
        with pytest.raises(ConfigError, match=r"holds 2 replicas that model averaging had not averaged yet, and st"):
            resolve_ckpt_path(path, module, world_size=2, strategy=strategy_of("ddp"), simulate=True)


def test_a_checkpoint_with_other_optimizer_settings_or_another_optimizer_is_refused(tmp_path):
    """Lightning restores the checkpoint's optimizer with its settings: a resume with momentum 0 went on
    with the checkpoint's 0.9 without a word, and one with optimizer=novograd failed in its first step
    with KeyError: 'exp_avg'."""
    sgd = partial(torch.optim.SGD, momentum=0.9)
    path = save_trained(tmp_path / "last.ckpt", Classifier(LabCNN(), sgd, lr=0.02))
    assert resolve_ckpt_path(path, Classifier(LabCNN(), sgd, lr=0.02)) == path
    changed = [
        (partial(torch.optim.SGD, momentum=0.0), r"optimizer\.momentum=0\.0 \(the checkpoint's run had 0\.9\)"),
        (partial(sgd, nesterov=True), r"optimizer\.nesterov=true \(the checkpoint's run had false\)"),
        (partial(NovoGrad), r"optimizer NovoGrad \(the checkpoint's run used SGD\)"),
        (partial(torch.optim.Adam), r"optimizer Adam \(the checkpoint's run used SGD\)"),
    ]
    for factory, message in changed:
        with pytest.raises(ConfigError, match=rf"cannot be resumed with {message}: resuming restores its optimizer"):
            resolve_ckpt_path(path, Classifier(LabCNN(), factory, lr=0.02))
    # the MLP's per-layer weight decay is a param group's setting
    path = save_trained(tmp_path / "mlp.ckpt", Classifier(MLP(), sgd, lr=0.02))
    decayed = Classifier(MLP(weight_decay_hidden=0.1), sgd, lr=0.02)
    with pytest.raises(ConfigError, match=r"optimizer\.weight_decay=0\.1 in its parameter group 0 \(.* had 0\.01\)"):
        resolve_ckpt_path(path, decayed)
    # the MLP's undecayed biases
    biases = Classifier(MLP(), sgd, lr=0.02)
    biases.net.param_groups = lambda: [
        *MLP.param_groups(biases.net)[:2],
        {"params": [biases.net.hidden.bias, biases.net.output.bias], "weight_decay": 0.5},
    ]
    with pytest.raises(ConfigError, match=r"with optimizer\.weight_decay=0\.5 in its parameter group 2 \("):
        resolve_ckpt_path(path, biases)


def job_dir(root, record: dict | None, checkpoint: bool, *other: str):
    """A sweep job's dir as a stopped attempt left it, with what Hydra has just written for the new one."""
    import json

    (root / ".hydra").mkdir(parents=True)
    (root / "sweep.log").write_text("hydra's log")
    if record is not None:
        (root / "metrics.json").write_text(json.dumps(record))
    if checkpoint:
        (root / "checkpoints").mkdir()
        (root / "checkpoints" / "last.ckpt").write_bytes(b"ckpt")
    for name in other:
        (root / name).write_text(name)
    return root


def same_weights(a: Classifier, b: Classifier) -> bool:
    return all(torch.equal(x, b.state_dict()[k]) for k, x in a.state_dict().items())


def test_init_weights_start_from_a_checkpoint_a_workers_weights_file_or_a_networks_state_dict(tmp_path):
    torch.manual_seed(1)
    trained = Classifier(LabCNN(), partial(torch.optim.SGD), lr=0.02, max_epochs=2, samples=["data=mnist"])
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    save(run_dir / "checkpoints" / "last.ckpt", trained)
    weights = tmp_path / "rank1.pt"  # record_weights' file: the module's state_dict
    torch.save(trained.state_dict(), weights)
    plain = tmp_path / "net.pt"  # the network alone, as torch.save(model.state_dict()) writes it
    torch.save(trained.net.state_dict(), plain)
    # none of resume's checks: another schedule, optimizer and dataset are what a new run from the weights is for
    for given, loaded in [(run_dir, run_dir / "checkpoints" / "last.ckpt"), (weights, weights), (plain, plain)]:
        torch.manual_seed(2)
        fresh = Classifier(LabCNN(), partial(torch.optim.Adam), lr=0.001, max_epochs=5, samples=["data=fashion_mnist"])
        assert not same_weights(fresh, trained)
        assert init_weights(str(given), fresh) == str(loaded)
        assert same_weights(fresh, trained)
    assert init_weights(None, fresh) is None


def test_init_weights_that_do_not_fit_or_are_not_weights_are_refused(tmp_path):
    mlp = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02)
    lab_cnn = Classifier(LabCNN(), partial(torch.optim.SGD), lr=0.02)
    path = save(tmp_path / "mlp.ckpt", mlp)
    with pytest.raises(ConfigError, match=r"^init_weights='\S+mlp.ckpt' does not fit this run's model: net\.\S+ is"):
        init_weights(path, lab_cnn)
    before = {k: v.clone() for k, v in lab_cnn.state_dict().items()}
    torch.save({"net.features.0.weight": torch.zeros(3)}, tmp_path / "one.pt")  # left untouched when refused
    with pytest.raises(ConfigError, match=r"net.features.0.weight is shape \(3,\) in the checkpoint, the model needs"):
        init_weights(str(tmp_path / "one.pt"), lab_cnn)
    assert all(torch.equal(before[k], v) for k, v in lab_cnn.state_dict().items())
    torch.save({"epoch": 3}, tmp_path / "nothing.pt")
    with pytest.raises(ConfigError, match=r"nothing.pt' holds no weights \(a checkpoint or a state_dict of tensors\)"):
        init_weights(str(tmp_path / "nothing.pt"), lab_cnn)
    (tmp_path / "report.md").write_text("# a sweep report\n")
    with pytest.raises(ConfigError, match=r"report.md' is not a checkpoint file \(give a run dir, a .ckpt file or a"):
        init_weights(str(tmp_path / "report.md"), lab_cnn)
    with pytest.raises(ConfigError, match=r"is invalid: no checkpoint at \S+nowhere \(give a run dir"):
        init_weights(str(tmp_path / "nowhere"), lab_cnn)
    # model averaging stopped before it averaged: which replica? the line says what to give instead
    replicas = [{"state_dict": mlp.state_dict()}, {"state_dict": mlp.state_dict()}]
    mid_run = save(tmp_path / "mid.ckpt", mlp, replicas=replicas, averaged=False)
    with pytest.raises(ConfigError, match=r"holds 2 replicas that model averaging had not averaged yet: give the fini"):
        init_weights(mid_run, mlp)
    final = save(tmp_path / "final.ckpt", mlp, replicas=replicas, averaged=True)
    assert init_weights(final, mlp) == final


def test_only_the_final_checkpoint_keeps_the_strategys_end_figures(tmp_path):
    """A resume with nothing left to train reports the figures of the training that made its weights, read
    from the final checkpoint; a run that trains on from there must not write those old figures into its own
    checkpoints before it has averaged again."""
    import torch.distributed as dist

    from psgd.strategies.model_averaging import ModelAveragingStrategy

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        strategy = ModelAveragingStrategy()
        strategy.report = {"replica_distance": 0.25, "worker_test_acc": [0.9]}
        strategy.save_checkpoint({"state_dict": {}}, tmp_path / "mid.ckpt")  # not averaged yet
        strategy._ended = True  # save_final_checkpoint's mark
        strategy.save_checkpoint({"state_dict": {}}, tmp_path / "final.ckpt")
    finally:
        dist.destroy_process_group()
    assert "psgd_strategy_report" not in torch.load(tmp_path / "mid.ckpt", weights_only=True)
    resumed = ModelAveragingStrategy()
    resumed.load_checkpoint(tmp_path / "final.ckpt", weights_only=True)
    assert resumed.report == {"replica_distance": 0.25, "worker_test_acc": [0.9]}
    resumed = ModelAveragingStrategy()
    resumed.load_checkpoint(tmp_path / "mid.ckpt", weights_only=True)
    assert resumed.report == {}


@pytest.mark.parametrize(
    ("saved", "workers", "simulate", "said"),
    [
        (None, 4, True, "was trained by worker processes and simulate=true would hold its workers in one process"),
        (
            4,
            4,
            False,
            "holds 4 simulated workers and this run has worker processes; resume with simulate=true workers=4",
        ),
        (4, 8, True, "holds 4 simulated workers and this run has 8; resume with simulate=true workers=4"),
        (4, 4, True, None),
        (None, 4, False, None),
    ],
)
def test_a_simulated_runs_checkpoint_is_resumed_by_a_simulated_run_of_as_many_workers_alone(
    saved, workers, simulate, said
):
    from psgd.resume import check_simulated
    from psgd.strategies.simulated import SIMULATED_KEY

    checkpoint = {SIMULATED_KEY: {"workers": saved}} if saved else {}
    if said is None:
        check_simulated("run", checkpoint, workers, simulate)
        return
    with pytest.raises(ConfigError) as e:
        check_simulated("run", checkpoint, workers, simulate)
    assert said in str(e.value) and "\n" not in str(e.value)
