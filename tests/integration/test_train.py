"""Single-worker runs through train.py exactly as a user starts them."""

import contextlib
import errno
import logging
import os
import re
import socket
import stat
import threading
import warnings

import pytest
import pytorch_lightning as L
import torch
from conftest import ROOT, compose_cfg, make_mnist_like, run_cli
from helpers import metrics, scalars, tensorboard, training_data, undocumented
from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

import psgd.callbacks
import psgd.io
from psgd.callbacks import denormals_flushed
from psgd.cli import say_result
from psgd.config import ConfigError, check_values
from psgd.data.datasets import MNIST
from psgd.process import alive
from psgd.run import train
from psgd.run_checks import build_datamodule

TINY = ["quiet=true", "data.batch_size=32", "data.eval_batch_size=64"]


@pytest.fixture(scope="module")
def single_run(tiny_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single") / "run"
    overrides = [
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=3",
        f"hydra.run.dir={run_dir}",
        *TINY,
        "quiet=false",
    ]
    overrides.append("+trainer.profiler=simple")  # a profiler the user asks for (test_a_profiler_...)
    proc = run_cli("train.py", *overrides, env={"PYTHONWARNINGS": "default"})  # warnings shown, as to a user
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc


def test_output_into_a_file_is_a_line_per_epoch_not_progress_bars(single_run):
    """stdout is a pipe here, as under SLURM or `> log`: tqdm's bars would be carriage-return noise."""
    run_dir, proc = single_run
    assert "\r" not in proc.stdout + proc.stderr and "Epoch 0:" not in proc.stdout
    # Lightning's advice to lower log_every_n_steps "to see logs for the training epoch" (16 batches here,
    # fewer than 50) is wrong for psgd, which logs every epoch: shown only with a per-step lr schedule
    assert "smaller than the logging interval" not in proc.stderr
    # Lightning's banner stays (a non-quiet run), without its advert for a cloud logger
    assert "GPU available: " in proc.stderr and "litlogger" not in proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("psgd: epoch ")]
    history = metrics(run_dir)["history"]
    assert len(lines) == 3
    for line, h in zip(lines, history, strict=True):
        assert line.startswith(f"psgd: epoch {h['epoch']}/3 train_loss={h['train_loss']:.4f} ")
        assert f" val_acc={h['val_acc']:.4f} epoch_s={h['epoch_s']:.1f} samples_per_s={h['samples_per_s']:.1f}" in line


def in_a_terminal(*args: str, timeout: float = 300) -> str:
    """What a command prints to a terminal (a pty 160 columns wide) and its exit code 0 asserted."""
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    with contextlib.suppress(OSError):  # EIO once the command has exited
        while chunk := os.read(master, 65536):
            out += chunk
    os.close(master)
    assert proc.wait(timeout) == 0, out[-3000:]
    return out.decode(errors="replace")


def test_a_terminals_progress_bar_counts_epochs_from_one_and_shows_the_loss_and_accuracy(tiny_data, tmp_path):
    """Lightning's bar counted epochs from 0 (psgd's lines and metrics.json from 1) and showed only batches and
    it/s: an 8-epoch run said nothing of its accuracy until its last line."""
    text = in_a_terminal(
        str(ROOT / "train.py"),
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    bars = [line for line in text.replace("\r", "\n").splitlines() if line.startswith("Epoch ")]
    assert {line.split(":")[0] for line in bars} == {"Epoch 1/2", "Epoch 2/2"}, bars[-3:]
    last = metrics(tmp_path / "run")["history"][-1]  # the last epoch's figures, in the bar as it ends
    shown = {key: Tqdm.format_num(last[key.replace("/", "_")]) for key in ("val/acc", "train/loss")}  # as tqdm does
    assert all(f"{key}={value}" in bars[-1] for key, value in shown.items()), (bars[-1], shown)


def test_what_a_run_writes_is_named_in_the_readme(single_run):
    """Each metrics.json key and TensorBoard tag a run writes is in the documentation (the DDP, model averaging
    and HogWild runs' tests check theirs)."""
    assert undocumented(single_run[0]) == []


def test_run_learns_and_reports_its_test_accuracy(single_run, tiny_data):
    run_dir, proc = single_run
    m = metrics(run_dir)
    assert m["status"] == "completed"
    assert m["test_acc"] > 0.5  # chance is 0.1: the network really learned the generated classes
    # each class's accuracy, which weighted by the class's test samples makes up test_acc
    per_class = torch.bincount(MNIST(str(tiny_data), train=False).targets, minlength=10)
    assert len(m["test_acc_per_class"]) == 10 and None not in m["test_acc_per_class"]
    weighted = sum(a * n for a, n in zip(m["test_acc_per_class"], per_class.tolist(), strict=True))
    assert weighted / per_class.sum().item() == pytest.approx(m["test_acc"], abs=1e-5)
    assert f"test_acc={m['test_acc']:.4f} train_time_s=" in proc.stdout  # iid shards: no worst class named
    assert " ended training in epoch" not in proc.stdout  # trainer.max_epochs ended it, as asked
    assert (m["epochs"], m["max_epochs"], m["stopped_by"]) == (3, 3, "max_epochs")
    assert (m["epochs"], m["world_size"], m["workers"], m["strategy"]) == (3, 1, 1, "ddp")
    assert m["threads_per_worker"] >= 1 and m["versions"]["torch"] == torch.__version__
    assert m["device"].startswith("cpu") and m["time_to_target_s"] is None and m["precision"] == "32-true"
    assert m["train_time_s"] > 0 and m["samples_per_s"] > 0
    assert [h["samples"] for h in m["history"]] == [512, 512, 512]  # every sample once per epoch
    assert m["train_time_s"] == pytest.approx(sum(h["epoch_s"] for h in m["history"]), abs=1e-3)
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    # the process that trained (a report rebuilt mid-sweep tells a live job from a killed one by it): gone now
    assert m["process"]["host"] == socket.gethostname() and m["process"]["pid"] > 0 and not alive(m["process"])


def test_by_default_a_run_validates_on_5000_held_out_training_samples_and_tests_once_at_the_end(tmp_path):
    # validating on the test split tuned early stopping and every choice made from the curves on the test set
    root = make_mnist_like(tmp_path / "data", "MNIST", n_train=5512, n_test=256)
    cfg = compose_cfg(f"data.root={root}", "trainer.max_epochs=2", *TINY)
    assert cfg.data.val_split == 5000  # the default (conf/data/mnist.yaml)
    train(cfg, tmp_path / "run")
    m = metrics(tmp_path / "run")
    assert [h["samples"] for h in m["history"]] == [512, 512]  # 5,000 of the 5,512 held out of training
    assert m["history"][-1]["val_loss"] != m["test_loss"]  # the last epoch's model, on two different sets
    held = build_datamodule(check_values(cfg))
    held.setup("fit")
    assert (len(held.val_set[1]), len(held.train_set[1]), len(held.test_set[1])) == (5000, 512, 256)


def test_a_finished_run_resumed_from_relative_paths_tests_the_same_weights(single_run, tiny_data, tmp_path):
    """data.root and ckpt_path typed relative to the shell's folder; the checkpoint had trained every epoch."""
    run_dir, _ = single_run
    again = tmp_path / "again"
    relative = {"data.root": os.path.relpath(tiny_data, tmp_path), "ckpt_path": os.path.relpath(run_dir, tmp_path)}
    assert not any(os.path.isabs(p) for p in relative.values())
    overrides = [*(f"{k}={v}" for k, v in relative.items()), "data.val_split=0", "trainer.max_epochs=3"]
    overrides.append(f"hydra.run.dir={again}")
    proc = run_cli("train.py", *overrides, *TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert metrics(again)["test_acc"] == metrics(run_dir)["test_acc"]
    assert metrics(again)["history"] == metrics(run_dir)["history"]


def test_training_data_csv_has_the_workshops_columns(single_run):
    run_dir, _ = single_run
    rows = training_data(run_dir)
    m = metrics(run_dir)
    assert list(rows[0]) == ["time", "val_accuracy"] and len(rows) == 3
    assert [float(r["time"]) for r in rows] == pytest.approx([h["time"] for h in m["history"]])
    assert float(rows[-1]["val_accuracy"]) == pytest.approx(m["val_acc"])
    times = [float(r["time"]) for r in rows]
    assert times == sorted(times)


def test_tensorboard_events_hold_curves_hparams_and_test_metrics(single_run):
    run_dir, _ = single_run
    acc = tensorboard(run_dir)
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "train/loss",
        "train/acc",
        "val/loss",
        "val/acc",
        "time/epoch_s",
        "time/samples_per_s",
        "time/cumulative_s",
        "lr",
        "test/acc",
        "test/loss",
    ):
        assert tag in tags, tag
    m = metrics(run_dir)
    assert scalars(acc, "val/acc") == pytest.approx([h["val_acc"] for h in m["history"]], abs=1e-6)
    assert scalars(acc, "test/acc") == pytest.approx([m["test_acc"]], abs=1e-6)
    assert len(m["test_acc_per_class"]) == 10
    assert m["test_classes"] == MNIST.classes  # torchvision's names: '0 - zero', ...
    for label, class_acc in enumerate(m["test_acc_per_class"]):  # each class's, beside test/acc
        assert scalars(acc, f"test/acc_class/{label}") == pytest.approx([class_acc], abs=1e-6)
    # the default cosine decay, 3 epochs of 16 steps: each epoch's lr where the epoch starts
    assert {e.step: e.value for e in acc.Scalars("lr")} == pytest.approx({0: 0.02, 16: 0.015, 32: 0.005})
    # the loss within the epochs, every trainer.log_every_n_steps (50) batches and at each epoch's end:
    # here each epoch's 16 steps are one point at its last step, the epoch's own figure
    assert {e.step: e.value for e in acc.Scalars("train/loss_step")} == pytest.approx(
        {e.step: e.value for e in acc.Scalars("train/loss")}, rel=1e-5
    )
    assert [e.step for e in acc.Scalars("train/acc_step")] == [15, 31, 47]
    plugins = acc.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in plugins and "_hparams_/experiment" in plugins
    assert b"optimizer.lr" in plugins["_hparams_/session_start_info"]


@pytest.mark.distributed
def test_a_run_started_from_an_earlier_runs_weights_trains_on_from_them_in_every_worker(
    single_run, tiny_data, tmp_path, capsys
):
    """init_weights: another strategy, worker count, optimizer and schedule, from the finished run's weights; the
    run says which weights it starts from."""
    run_dir, _ = single_run
    ended = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    after = tmp_path / "after"
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        f"init_weights={run_dir}",
        "strategy=model_averaging",
        "workers=2",
        "trainer.max_epochs=1",
        "optimizer.lr=1e-9",  # a step too small to move the weights away from where the workers started
        "record_weights=true",
        *TINY,
        "quiet=false",
    )
    train(cfg, after)
    said = f"psgd: starting from the weights in {run_dir / 'checkpoints' / 'last.ckpt'} (init_weights)"
    assert said in capsys.readouterr().out.splitlines()
    for rank in (0, 1):  # each worker started from them (a fresh start differs by ~0.01 and more)
        own = torch.load(after / "weights" / f"rank{rank}.pt", weights_only=True)
        assert all(torch.allclose(own[k].float(), ended[k].float(), atol=1e-6) for k in ended), rank
    m = metrics(after)
    assert m["init_weights"] == str(run_dir / "checkpoints" / "last.ckpt") and m["epochs"] == 1
    assert m["test_acc"] == pytest.approx(metrics(run_dir)["test_acc"], abs=0.01)


@pytest.mark.distributed
def test_a_run_dir_says_when_and_what_ran_so_tensorboard_runs_read_apart(tiny_data, tmp_path):
    """outputs/<date>/<time>_<strategy>_x<workers>: the Scalars tab named runs by their time alone."""
    env = {"PSGD_OUTPUTS": str(tmp_path)}
    overrides = [
        "strategy=model_averaging",
        "trainer.devices=2",
        "trainer.fast_dev_run=true",
        f"data.root={tiny_data}",
        "data.val_split=0",
    ]
    proc = run_cli("train.py", *overrides, *TINY, env=env)  # trainer.devices: the knob that wins over workers
    assert proc.returncode == 0, proc.stderr
    (run,) = tmp_path.glob("*/*/tensorboard")
    name = str(run.parent.relative_to(tmp_path))
    assert re.fullmatch(r"\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-\d{6}_model_averaging_x2", name), name


class EvalBatchSizes(L.Callback):
    """The size of every validation batch a fit ran."""

    def __init__(self):
        self.sizes = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.sizes.append(len(batch[1]))


def test_a_smoke_run_evaluates_batches_no_larger_than_its_training_batches(tiny_data, tmp_path):
    """trainer.fast_dev_run validated and tested one batch of data.eval_batch_size (1,000): two thirds of a
    WideResNet smoke run's 51 s on 2 cores (docs/performance.md, Start-up)."""
    sizes = EvalBatchSizes()
    cfg = compose_cfg(
        f"data.root={tiny_data}", "data.val_split=0", "trainer.fast_dev_run=true", *TINY, "data.eval_batch_size=1000"
    )
    train(cfg, tmp_path / "run", callbacks=[sizes])
    assert sizes.sizes == [32]  # TINY's data.batch_size
    cfg.trainer.fast_dev_run = False  # a real run keeps its evaluation batches
    assert build_datamodule(check_values(cfg)).eval_batch_size == 1000


def test_lightnings_overfit_batches_trains_on_the_same_batches_every_epoch(tiny_data, tmp_path):
    """trainer.overfit_batches trains on the same first batches every epoch, without Lightning's warning
    that it turned a loader's shuffling off (psgd's loaders are its own)."""
    cfg = compose_cfg(
        f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=3", "+trainer.overfit_batches=2", *TINY
    )
    cfg.record_shards = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(cfg, tmp_path / "run")
    assert not [w for w in caught if "dataloader shuffling" in str(w.message)]
    seen = [torch.load(tmp_path / "run" / "shards" / f"epoch{e}_rank0.pt", weights_only=True) for e in range(3)]
    assert len(seen[0]) == 2 * 32  # two batches of 32
    assert torch.equal(seen[0], seen[1]) and torch.equal(seen[0], seen[2])


def test_validation_every_n_batches_across_epochs_as_lightning_advises(tiny_data, tmp_path):
    """trainer.check_val_every_n_epoch=null reaches Lightning (not dropped as unset): its setting for an
    integer val_check_interval longer than an epoch."""
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=3",
        "trainer.val_check_interval=24",  # 16 batches an epoch: validations at batches 24 and 48
        "trainer.check_val_every_n_epoch=null",
        *TINY,
    )
    m = train(cfg, tmp_path / "run")
    assert [h["val_acc"] is not None for h in m["history"]] == [False, True, True]


def test_same_seed_gives_the_same_weights_and_another_seed_does_not(tiny_data, tmp_path):
    def weights(seed: int, name: str) -> dict:
        cfg = compose_cfg(f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=1", f"seed={seed}", *TINY)
        train(cfg, tmp_path / name)
        return torch.load(tmp_path / name / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]

    flushed = denormals_flushed()
    level, env = logging.getLogger("pytorch_lightning").level, os.environ.get("PSGD_QUIET")
    a, b, c = weights(7, "a"), weights(7, "b"), weights(8, "c")  # quiet runs (TINY)
    # runs in this process leave its numerics, Lightning's log level and the environment as they were
    assert denormals_flushed() == flushed
    assert (logging.getLogger("pytorch_lightning").level, os.environ.get("PSGD_QUIET")) == (level, env)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def last_weights(run_dir) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


class OptimizerSeen(L.Callback):
    def on_train_start(self, trainer, pl_module):  # (after a resume has loaded the optimizer's state)
        self.defaults = dict(trainer.optimizers[0].defaults)
        self.group = {k: v for k, v in trainer.optimizers[0].param_groups[0].items() if k != "params"}


class MomentumSeen(L.Callback):
    def on_train_epoch_start(self, trainer, pl_module):  # (after the module's on_train_start)
        if not hasattr(self, "buffers"):
            optimizer = trainer.optimizers[0]
            self.buffers = [optimizer.state[p]["momentum_buffer"].clone() for p in pl_module.parameters()]


def test_a_finished_cosine_run_extended_with_a_restart_keeps_its_momentum_under_a_new_schedule(tiny_data, tmp_path):
    # a finished cosine run (lr 0 at its end) resumed for more epochs was refused; its weights alone
    # (init_weights) lose the optimizer's state
    base = [f"data.root={tiny_data}", "data.val_split=0", "scheduler=cosine", "optimizer.momentum=0.9", *TINY]
    train(compose_cfg(*base, "trainer.max_epochs=2", "optimizer.lr=0.02"), tmp_path / "first")
    saved = torch.load(tmp_path / "first" / "checkpoints" / "last.ckpt", weights_only=True)["optimizer_states"][0]
    longer = [f"ckpt_path={tmp_path / 'first'}", "trainer.max_epochs=4", "optimizer.lr=0.05"]
    with pytest.raises(ConfigError, match="add scheduler.restart=true to go on from its weights and optimizer state"):
        train(compose_cfg(*base, *longer), tmp_path / "refused")
    m = train(
        compose_cfg(*base, *longer, "scheduler.restart=true"), tmp_path / "longer", callbacks=[seen := MomentumSeen()]
    )
    assert [h["epoch"] for h in m["history"]][-2:] == [3, 4] and m["status"] == "completed"
    # a new cosine over epochs 3 and 4 from the new lr (0.05, then halfway to 0), not the checkpoint's lr 0
    assert [h["lr"] for h in m["history"]][-2:] == pytest.approx([0.05, 0.025])
    assert all(torch.equal(a, saved["state"][i]["momentum_buffer"]) for i, a in enumerate(seen.buffers))
    with pytest.raises(ConfigError, match=r"^scheduler.restart=true is invalid without ckpt_path: "):
        train(compose_cfg(*base, "scheduler.restart=true"), tmp_path / "no_checkpoint")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_update_is_fused_by_default_trains_as_torchs_loop_and_a_resume_runs_its_own_choice(
    tiny_data, tmp_path, optimizer
):
    """optimizer.fused (SGD's and Adam's, true by default): the update is torch's fused kernel, which rounds
    differently from torch's per-tensor loop (fused=false) and trains to the same weights within that
    rounding. How torch runs the update is the resumed run's choice, not the checkpoint's (Lightning restores
    the param groups wholesale), also from a checkpoint written before fused was the default (fused None)."""
    base = [f"data.root={tiny_data}", "data.val_split=0", f"optimizer={optimizer}", "trainer.max_epochs=2", *TINY]
    weights, seen = {}, {}
    for fused in (True, False):
        more = [f"optimizer.fused={fused}", "checkpoint_every_epoch=true"]
        train(compose_cfg(*base, *more), tmp_path / str(fused), callbacks=[opt := OptimizerSeen()])
        seen[fused] = opt.defaults["fused"]
        weights[fused] = last_weights(tmp_path / str(fused))
    assert seen == {True: True, False: False}
    assert (
        compose_cfg(f"data.root={tiny_data}", "data.val_split=0", f"optimizer={optimizer}").optimizer.fused is True
    )  # the default
    for k in weights[True]:
        torch.testing.assert_close(weights[True][k], weights[False][k], rtol=1e-4, atol=1e-5)
    first = tmp_path / "True" / "checkpoints" / "epoch0.ckpt"
    saved = torch.load(first, weights_only=True)
    assert saved["optimizer_states"][0]["param_groups"][0]["fused"] is True
    older = tmp_path / "older.ckpt"  # as written before fused was the default
    for group in saved["optimizer_states"][0]["param_groups"]:
        group["fused"] = None
    torch.save(saved, older)
    for ckpt, over, fused in ((first, ["optimizer.fused=false"], False), (older, [], True)):
        run_dir = tmp_path / f"resumed_{fused}"
        train(compose_cfg(*base, *over, f"ckpt_path={ckpt}"), run_dir, callbacks=[opt := OptimizerSeen()])
        assert opt.group["fused"] is fused, (ckpt.name, opt.group)
        assert metrics(run_dir)["epochs"] == 2
        # the resumed run's momentum / moments are the checkpoint's: it went on, it did not start over
        resumed = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
        assert resumed["optimizer_states"][0]["param_groups"][0]["fused"] is fused
        assert resumed["epoch"] == 1


def test_early_stop_after_patience_epochs_at_target(tiny_data, tmp_path, capsys):
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=30",
        "early_stop.target_acc=0.3",
        "early_stop.patience=2",
        *TINY,
    )
    m = train(cfg, tmp_path / "run")
    say_result(m, tmp_path / "run")
    accs = [h["val_acc"] for h in m["history"]]
    first = next(i for i, a in enumerate(accs) if a >= 0.3)
    assert m["epoch_to_target"] == first + 1
    assert m["step_to_target"] == m["history"][first]["step"]  # validated at that epoch's end
    # the training time up to that epoch's validation: its end
    assert m["time_to_target_s"] == pytest.approx(m["history"][first]["time"], abs=0.01)
    # stopped at the first epoch that closes a run of 2 at-target epochs, long before max_epochs
    stop = next(i for i in range(1, len(accs)) if accs[i] >= 0.3 and accs[i - 1] >= 0.3)
    assert m["epochs"] == stop + 1 < 30
    # the record and the last line say what ended training before max_epochs
    assert (m["stopped_by"], m["max_epochs"]) == ("early_stop", 30)
    assert f"(early_stop.target_acc ended training in epoch {stop + 1} of 30) results in" in capsys.readouterr().out


@pytest.mark.parametrize(
    "setting,stopped_by,epochs",
    [
        ("trainer.max_steps=20", "max_steps", 2),  # 16 steps an epoch: inside the second
        ("trainer.max_steps=32", "max_epochs", 2),  # both ran out at the last batch: nothing was cut short
        ("trainer.fast_dev_run=2", "fast_dev_run", 1),  # (Lightning's max_steps=2 underneath)
    ],
)
def test_the_record_says_what_ended_training(tiny_data, tmp_path, setting, stopped_by, epochs):
    cfg = compose_cfg(f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=2", setting, *TINY)
    m = train(cfg, tmp_path / "run")
    assert (m["stopped_by"], m["epochs"], m["status"]) == (stopped_by, epochs, "completed")


def test_a_run_that_max_steps_stopped_inside_an_epoch_resumes_with_sane_times(tiny_data, tmp_path):
    """A run cut inside an epoch resumes from its last whole epoch's checkpoint and trains the cut epoch
    again from its start: one record per epoch, with sane times. Resumed with the same max_steps, it
    trains the cut part again, to the same figures."""
    common = [f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=4", *TINY]  # 16 steps an epoch
    first = train(compose_cfg(*common, "trainer.max_steps=20"), tmp_path / "first")
    assert [h["step"] for h in first["history"]] == [16, 20]
    same = train(compose_cfg(*common, "trainer.max_steps=20", f"ckpt_path={tmp_path / 'first'}"), tmp_path / "same")
    figures = ("epoch", "step", "samples", "train_loss", "train_acc", "val_acc")
    assert [[h[k] for k in figures] for h in same["history"]] == [[h[k] for k in figures] for h in first["history"]]
    assert same["test_acc"] == first["test_acc"]
    m = train(compose_cfg(*common, "trainer.max_steps=40", f"ckpt_path={tmp_path / 'first'}"), tmp_path / "again")
    epochs = [h["epoch"] for h in m["history"]]
    assert epochs == sorted(set(epochs)) and m["epochs"] == len(epochs) and m["history"][-1]["step"] == 40
    assert m["train_time_s"] < 10 and all(h["epoch_s"] < 5 for h in m["history"]), m["history"]
    assert m["history"][1]["samples"] == 16 * 32  # epoch 2: its 4 steps before the stop and 12 after
    # metrics.json says where the earlier epochs came from; a run that resumed nothing says null
    assert m["resumed_from"] == str(tmp_path / "first" / "checkpoints" / "last.ckpt") and first["resumed_from"] is None


@pytest.mark.parametrize(
    "both,cut,resumed_with",
    [
        ([], "trainer.max_steps=20", []),  # 16 steps an epoch: inside the second; resumed to max_epochs
        ([], "trainer.max_steps=20", ["trainer.max_steps=40"]),  # (Lightning resumes inside the epoch itself)
        ([], "early_stop.target_acc=0.05 early_stop.patience=3", []),  # stopped half-way through epoch 2
        (["data.augment=pad_crop_flip"], "trainer.max_steps=20", []),  # the augmentations' draws too
        # a per-step warm-up (it sets the training data up early): the cut epoch keeps the lr it started with
        (["scheduler=warmup", "scheduler.interval=step", "scheduler.warmup_epochs=2"], "trainer.max_steps=20", []),
        # slow (~16 s each, the default run's 8 minutes): a cut inside an epoch is the loop's and the workers'
        # reseeding, the same for every strategy; each has its own resume test (test_model_averaging, test_hogwild)
        pytest.param(["strategy=model_averaging"], "trainer.max_steps=20", [], marks=pytest.mark.slow),
        pytest.param(["strategy=hogwild"], "trainer.max_steps=20", [], marks=pytest.mark.slow),
    ],
    ids=[
        "max_steps-then-max_epochs",
        "max_steps-then-more-steps",
        "early-stop-then-none",
        "augmented",
        "per-step-lr-schedule",
        "model-averaging",
        "hogwild",
    ],
)
def test_a_run_cut_inside_an_epoch_resumes_to_the_uninterrupted_runs_weights(
    tiny_data, tmp_path, both, cut, resumed_with
):
    """A run cut inside an epoch resumes from its last whole epoch's checkpoint and trains the cut epoch
    again from its start, each worker's random stream reseeded as the uninterrupted run's was (dropout and
    augmentation are on)."""
    common = [
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=3",
        "trainer.val_check_interval=0.5",
        *both,
        *TINY,
    ]
    straight = train(compose_cfg(*common, *resumed_with), tmp_path / "straight")
    first = train(compose_cfg(*common, *cut.split()), tmp_path / "first")
    steps = int(cut.split("=")[1]) if "max_steps" in cut else 24  # the early stop: after 8 of epoch 2's 16
    assert first["history"][-1]["step"] == steps and steps % 16
    resumed = train(compose_cfg(*common, *resumed_with, f"ckpt_path={tmp_path / 'first'}"), tmp_path / "resumed")
    a, b = last_weights(tmp_path / "straight"), last_weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # one record per epoch: the cut one's samples, loss, accuracy and lr are the whole epoch's
    for key in ("epoch", "step", "samples", "lr", "train_loss", "train_acc", "val_acc"):
        assert [h[key] for h in resumed["history"]] == pytest.approx([h[key] for h in straight["history"]], abs=2e-6)
    assert resumed["train_time_s"] < 10 and all(h["epoch_s"] < 5 for h in resumed["history"]), resumed["history"]
    # metrics.json says where the earlier epochs came from; a run that resumed nothing says null
    assert resumed["resumed_from"] == str(tmp_path / "first" / "checkpoints" / "last.ckpt")
    assert first["resumed_from"] is None
    assert (resumed["test_acc"], resumed["stopped_by"]) == (straight["test_acc"], straight["stopped_by"])
    # TensorBoard too: the resumed run's epoch values from the cut one on are the uninterrupted run's
    for tag in ("train/loss", "train/acc"):
        after = scalars(tensorboard(tmp_path / "resumed"), tag)
        assert after == pytest.approx(scalars(tensorboard(tmp_path / "straight"), tag)[-len(after) :], abs=1e-6)


def test_a_run_cut_inside_its_first_epoch_writes_no_checkpoint(tiny_data, tmp_path):
    """Only whole epochs are written, also with checkpoint_every_epoch=true (whose last.ckpt Lightning's
    save_last wrote at the end of a fit that had written none)."""
    cut = compose_cfg(
        f"data.root={tiny_data}", "data.val_split=0", "trainer.max_steps=4", "checkpoint_every_epoch=true", *TINY
    )
    assert train(cut, tmp_path / "run")["stopped_by"] == "max_steps"
    assert not list((tmp_path / "run").glob("checkpoints/*.ckpt"))


# At the default lr 0.02 the tiny data's training diverges (nan) in epoch 29, which a fast machine reached
# within max_time (the resume test below failed so); at 0.005 all 300 epochs train
MAX_TIME_LR = "optimizer.lr=0.005"


def max_time_run(tiny_data, run_dir, *more: str, max_time: str = "00:00:00:01") -> dict:
    """A run of at most 300 epochs that trainer.max_time ends (`more`: other settings), its result line said."""
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=300",
        f"trainer.max_time={max_time}",
        MAX_TIME_LR,
        *TINY,
        *more,
    )
    m = train(cfg, run_dir)
    say_result(m, run_dir)
    return m


def test_a_run_that_trainer_max_time_stopped_says_so(tiny_data, tmp_path, capsys):
    """trainer.max_time ends training early, as Lightning's Timer does, and the run is complete; the
    record and the last line say it was max_time and not max_epochs that ended it."""
    m = max_time_run(tiny_data, tmp_path / "run")
    assert m["status"] == "completed" and m["test_acc"] is not None
    assert (m["stopped_by"], m["max_epochs"]) == ("max_time", 300) and 1 <= m["epochs"] < 300
    assert f"(trainer.max_time ended training in epoch {m['epochs']} of 300) results in" in capsys.readouterr().out


@pytest.mark.slow  # three runs; the one above is the default suite's
def test_a_run_that_trainer_max_time_stopped_resumes_with_the_time_it_used(tiny_data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    m = max_time_run(tiny_data, run_dir)
    capsys.readouterr()
    # resumed from its last whole epoch, the Timer goes on counting the run's time: what is left of it trains
    resumed = max_time_run(tiny_data, tmp_path / "same", f"ckpt_path={run_dir}")
    finished = m["epochs"] - 1  # the last epoch was cut by the time
    assert resumed["history"][:finished] == m["history"][:finished] and resumed["epochs"] >= finished
    assert (resumed["stopped_by"], resumed["max_epochs"]) == ("max_time", 300)
    assert f"(trainer.max_time ended training in epoch {resumed['epochs']} of 300)" in capsys.readouterr().out
    # a longer one trains on
    resumed = max_time_run(tiny_data, tmp_path / "longer", f"ckpt_path={run_dir}", max_time="{seconds: 2}")
    assert "nothing is left" not in capsys.readouterr().out and m["epochs"] < resumed["epochs"] < 300
    assert resumed["stopped_by"] == "max_time"


def test_a_run_that_stopped_early_resumes_as_over_unless_the_target_changes(tiny_data, tmp_path, capsys):
    """Resumed with the same target, a run its target stopped is over; with another target (or none) it
    trains on, and its record times that target, not the checkpoint's; without one, Lightning does not ask
    for the early-stop callback back."""
    common = [f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=3", "scheduler=none", *TINY]
    stopped = train(compose_cfg(*common, "early_stop.target_acc=0.05"), tmp_path / "stopped")
    assert stopped["epochs"] == 1 and stopped["epoch_to_target"] == 1  # chance (10 %) passes 5 %
    capsys.readouterr()
    again = train(
        compose_cfg(*common, "early_stop.target_acc=0.05", f"ckpt_path={tmp_path / 'stopped'}"), tmp_path / "a"
    )
    assert again["history"] == stopped["history"] and again["test_acc"] == stopped["test_acc"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        on = train(compose_cfg(*common, f"ckpt_path={tmp_path / 'stopped'}"), tmp_path / "b")
    assert not [w for w in caught if "callbacks used to create the checkpoint" in str(w.message)]
    assert on["epochs"] == 3 and on["time_to_target_s"] is None and on["epoch_to_target"] is None
    higher = train(
        compose_cfg(*common, "early_stop.target_acc=0.5", f"ckpt_path={tmp_path / 'stopped'}"), tmp_path / "c"
    )
    accs = [h["val_acc"] for h in higher["history"]]
    first = next((epoch for epoch, acc in enumerate(accs, 1) if acc >= 0.5), None)
    assert accs[0] < 0.5 and higher["epoch_to_target"] == first  # not the checkpoint's epoch 1 at 5 %
    assert higher["epochs"] == (first or 3)  # trained on, and stopped there


def test_the_step_at_target_is_that_of_the_first_validation_at_target_inside_an_epoch(tiny_data, tmp_path):
    """Validated after each half epoch (8 of 16 steps) and stopped only after 3 checks at the target:
    epoch_to_target says epoch 1, step_to_target the half of it where the target was first reached."""
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=3",
        "early_stop.target_acc=0.05",
        "early_stop.patience=3",
        "trainer.val_check_interval=0.5",
        *TINY,
    )
    m = train(cfg, tmp_path / "run")
    assert (m["epoch_to_target"], m["step_to_target"]) == (1, 8)
    assert m["history"][-1]["step"] > 8  # trained on after it


def test_early_stop_inside_an_epoch_times_the_target_there_and_keeps_the_partial_epochs_numbers(tiny_data, tmp_path):
    """trainer.val_check_interval=0.5: validation after half of each epoch; chance (10 %) already
    passes a 5 % target there, so the run stops after 8 of epoch 1's 16 batches."""
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=3",
        "early_stop.target_acc=0.05",
        "trainer.val_check_interval=0.5",
        *TINY,
    )
    m = train(cfg, tmp_path / "run")
    (epoch,) = m["history"]
    assert (m["epochs"], m["epoch_to_target"], epoch["step"], epoch["samples"]) == (1, 1, 8, 256)
    assert m["step_to_target"] == 8
    assert 0 < m["time_to_target_s"] <= epoch["time"] + 1e-3
    # the stopped epoch's training accuracy and loss are reported like a whole epoch's
    assert epoch["train_loss"] is not None and 0 <= epoch["train_acc"] <= 1


def test_an_epoch_without_validation_records_none_not_the_last_validations_figures(tiny_data, tmp_path):
    """trainer.check_val_every_n_epoch=2 over 3 epochs: epoch 2 alone is validated. Lightning keeps
    that validation's figures through epoch 3; psgd's record of epoch 3 has none, and the run's val_acc,
    curve and csv are epoch 2's."""
    cfg = compose_cfg(
        f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=3", "trainer.check_val_every_n_epoch=2", *TINY
    )
    m = train(cfg, tmp_path / "run")
    assert [h["val_acc"] is None for h in m["history"]] == [True, False, True]
    assert [h["val_loss"] is None for h in m["history"]] == [True, False, True]
    assert m["val_acc"] == m["history"][1]["val_acc"] is not None
    assert [float(r["val_accuracy"]) for r in training_data(tmp_path / "run")] == [m["val_acc"]]
    assert scalars(tensorboard(tmp_path / "run"), "val/acc") == pytest.approx([m["val_acc"]], abs=1e-6)


def test_a_profiler_the_user_asks_for_replaces_psgds_free_one_and_the_summary_shows_sizes_and_flops(single_run):
    _, proc = single_run
    report = proc.stdout + proc.stderr
    assert "FIT Profiler Report" in report and "run_training_epoch" in report
    # the model summary at the start of fit: the lab CNN's input (one 28x28 image resized to its 32x32)
    # and output sizes, and its forward FLOPs per image (FlopCounterMode; 0 without an example input)
    net_row = next(line for line in report.splitlines() if "| net " in line)
    assert "LabCNN" in net_row and "[1, 1, 32, 32]" in net_row and "[1, 10]" in net_row, net_row
    total = re.search(r"^\s*([\d.]+ ?[KMGB]?)\s+Total Flops", report, re.MULTILINE)
    assert total and total.group(1).strip() not in ("0", ""), report[-2000:]


@pytest.mark.distributed
def test_a_callers_callbacks_see_every_training_batch(tiny_data, tmp_path):
    class Count(L.Callback):
        def __init__(self):
            self.seen = []
            self.steps = 0

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.seen.append((trainer.current_epoch, batch_idx, trainer.num_training_batches))

        def on_before_optimizer_step(self, trainer, module, optimizer):
            self.steps += 1

    count = Count()
    cfg = compose_cfg(f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=2", *TINY)
    m = train(cfg, tmp_path / "run", callbacks=[count])
    per_epoch = count.seen[0][2]
    assert m["epochs"] == 2 and per_epoch > 1
    assert [(e, b) for e, b, _ in count.seen] == [(e, b) for e in range(2) for b in range(per_epoch)]
    assert count.steps == 2 * per_epoch


class HoldsALock(L.Callback):
    def __init__(self):
        self.lock = threading.Lock()


def test_a_callback_the_workers_cannot_get_fails_the_run_and_one_worker_runs_it(tiny_data, tmp_path):
    """With workers > 1 the caller's callbacks are pickled into every worker: one holding a lock fails the run
    as the workers start, with pickle's own error; one worker runs in this process, where nothing is pickled."""
    cfg = compose_cfg(f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=1", "workers=2", *TINY)
    with pytest.raises(TypeError, match="cannot pickle '_thread.lock' object"):
        train(cfg, tmp_path / "run", callbacks=[L.Callback(), HoldsALock()])
    one = train(
        compose_cfg(f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=1", *TINY),
        tmp_path / "one",
        [HoldsALock()],
    )
    assert one["status"] == "completed"


class Lrs(L.Callback):
    """The lr of every optimizer step, with its epoch."""

    def __init__(self):
        self.seen = []

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.seen.append((trainer.current_epoch, optimizer.param_groups[0]["lr"]))


@pytest.mark.parametrize("rule,lr", [("linear", 0.08), ("sqrt", 0.04)])
def test_the_lr_follows_the_samples_per_update_with_a_reference_batch(tiny_data, tmp_path, rule, lr):
    """lr_reference_batch=16: optimizer.lr (0.02) is the lr for 16 samples per update; an update here
    averages 2 accumulated batches of 32 (parallel_batches=2), 64 samples, so every step runs at 0.02 x 4
    (linear) or 0.02 x 2 (sqrt), and metrics.json records it."""
    lrs = Lrs()
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=1",
        "parallel_batches=2",
        "scheduler=none",
        f"lr_scaling={rule}",
        "lr_reference_batch=16",
        *TINY,
    )
    m = train(cfg, tmp_path / "run", callbacks=[lrs])
    assert [x for _, x in lrs.seen] == pytest.approx([lr] * 8)  # 16 batches of 32, two per step
    assert (m["lr"], m["lr_reference_batch"]) == (pytest.approx(lr), 16)


def test_an_update_longer_than_an_epoch_steps_at_the_epochs_end(tiny_data, tmp_path):
    """trainer.accumulate_grad_batches=40 with 16 batches per epoch: Lightning steps once per epoch, after
    16 batches (metrics.json still records the 40 asked for)."""
    lrs = Lrs()
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=2",
        "trainer.accumulate_grad_batches=40",
        *TINY,
    )
    m = train(cfg, tmp_path / "run", callbacks=[lrs])
    assert len(lrs.seen) == 2 and [h["step"] for h in m["history"]] == [1, 2]


def test_scheduler_none_trains_at_a_constant_lr_whatever_a_sweep_gives_the_warm_up(tiny_data, tmp_path):
    """The none job of `sweep.py -m scheduler=none,warmup scheduler.warmup_epochs=1 scheduler.decay=cosine`: it
    warmed up and decayed as the warm-up's job did, and the sweep compared one schedule under two names."""
    lrs = Lrs()
    settings = ["scheduler.warmup_epochs=1", "scheduler.start_factor=0.1", "scheduler.decay=cosine"]
    settings += ["scheduler.interval=step", "checkpoint_every_epoch=true"]
    cfg_args = [
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=2",
        "scheduler=none",
        *settings,
        *TINY,
    ]
    train(compose_cfg(*cfg_args), tmp_path / "none", callbacks=[lrs])
    assert len(lrs.seen) == 32 and {lr for _, lr in lrs.seen} == {0.02}
    acc = tensorboard(tmp_path / "none")
    assert [e.value for e in acc.Scalars("lr")] == pytest.approx([0.02, 0.02])
    start = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = HParamsPluginData.FromString(start).session_start_info.hparams  # the HParams tab: what it trained with
    assert hparams["scheduler.warmup_epochs"].number_value == 0 and hparams["scheduler.decay"].string_value == "none"
    # no per-step schedule either: a resume with other optimizer steps per epoch is no change to a constant lr
    cut = tmp_path / "none" / "checkpoints" / "epoch0.ckpt"
    resumed = compose_cfg(*cfg_args, "parallel_batches=2", f"ckpt_path={cut}")
    assert train(resumed, tmp_path / "resumed")["status"] == "completed"


@pytest.mark.parametrize("interval", ["step", "epoch"])
def test_a_per_step_warm_up_moves_the_lr_at_every_optimizer_step(tiny_data, tmp_path, interval):
    """scheduler.interval=step: the lr rises at every optimizer step, and a one-epoch warm-up ends with
    the epoch's last optimizer step, counted after gradient accumulation (parallel_batches=2: 8 steps
    of 2 batches per epoch); per epoch, it stays put within each epoch."""
    lrs = Lrs()
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=2",
        "parallel_batches=2",
        "scheduler=warmup",
        "scheduler.warmup_epochs=1",
        "scheduler.start_factor=0.1",
        f"scheduler.interval={interval}",
        "trainer.log_every_n_steps=2",
        *TINY,
    )
    train(cfg, tmp_path / "run", callbacks=[lrs])
    first = [lr for e, lr in lrs.seen if e == 0]
    second = [lr for e, lr in lrs.seen if e == 1]
    assert len(first) == len(second) == 8  # 16 batches of 32, two per step
    assert second == pytest.approx([0.02] * 8)  # the warm-up is over when epoch 1 starts
    if interval == "step":
        assert first == pytest.approx([0.002 + 0.018 * i / 8 for i in range(8)])
    else:
        assert first == pytest.approx([0.002] * 8)
    # TensorBoard: a per-step schedule's lr every log_every_n_steps optimizer steps (Lightning's
    # LearningRateMonitor logs each micro-batch of an accumulated step, at that step: the same point)
    tags = tensorboard(tmp_path / "run").Tags()["scalars"]
    if interval == "step":
        logged = {e.step: e.value for e in tensorboard(tmp_path / "run").Scalars("lr_step")}
        assert logged == pytest.approx({n: 0.002 + 0.018 * min(n, 8) / 8 for n in range(1, 16, 2)})
    else:
        assert "lr_step" not in tags and "lr" in tags
    assert undocumented(tmp_path / "run") == []  # lr_step too
    # metrics.json: each epoch's lr as it started (a warm-up reads there without TensorBoard)
    assert [h["lr"] for h in metrics(tmp_path / "run")["history"]] == pytest.approx([0.002, 0.02])


def test_a_per_step_schedule_resumes_on_its_steps(tiny_data, tmp_path):
    """A per-step schedule is restored in the checkpoint's optimizer steps and goes on exactly as the
    straight run did."""
    common = [
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=2",
        "scheduler=warmup",
        "scheduler.warmup_epochs=1.5",
        "scheduler.start_factor=0.1",
        "scheduler.interval=step",
        *TINY,
    ]
    straight = Lrs()
    train(
        compose_cfg(*common, "parallel_batches=2", "checkpoint_every_epoch=true"), tmp_path / "a", callbacks=[straight]
    )
    epoch0 = tmp_path / "a" / "checkpoints" / "epoch0.ckpt"
    resumed = Lrs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(compose_cfg(*common, "parallel_batches=2", f"ckpt_path={epoch0}"), tmp_path / "b", callbacks=[resumed])
    # resuming into a new run dir is the usual resume: Lightning's ModelCheckpoint warned about it every time
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    second = [lr for e, lr in straight.seen if e == 1]
    assert second[0] == pytest.approx(0.002 + 0.018 * 8 / 12)  # the warm-up ends half-way through epoch 1
    assert [lr for _, lr in resumed.seen] == pytest.approx(second)


def test_a_constant_lr_counts_no_steps_whatever_its_interval_says(tiny_data, tmp_path):
    """scheduler.interval=step with a constant lr (the warm-up preset with warmup_epochs=0, decay none)
    has no schedule to step: a resume with another batch size goes on, no stray `lr-SGD` tag beside `lr`, and
    no advice about epochs shorter than log_every_n_steps."""
    common = [
        f"data.root={tiny_data}",
        "data.val_split=0",
        "scheduler=warmup",
        "scheduler.warmup_epochs=0",
        "scheduler.interval=step",
    ]
    first = [*common, *TINY, "trainer.max_epochs=1"]
    train(compose_cfg(*first, "trainer.log_every_n_steps=1"), tmp_path / "a")
    tags = tensorboard(tmp_path / "a").Tags()["scalars"]
    assert "lr" in tags and not [t for t in tags if t.startswith("lr") and t != "lr"], tags
    assert undocumented(tmp_path / "a") == []  # (lr-SGD was not)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = train(
            compose_cfg(
                *first, "trainer.max_epochs=2", "data.batch_size=64", "quiet=false", f"ckpt_path={tmp_path / 'a'}"
            ),
            tmp_path / "b",
        )
    assert resumed["status"] == "completed" and [h["lr"] for h in resumed["history"]] == pytest.approx([0.02, 0.02])
    # nor is Lightning's advice to lower log_every_n_steps (50) "to see logs" of 8-batch epochs shown
    assert not [w for w in caught if "smaller than the logging interval" in str(w.message)]


@pytest.mark.parametrize("optimizer", ["novograd", "adam"])
def test_every_optimizer_resumes_to_the_uninterrupted_weights(optimizer, tiny_data, tmp_path):
    """A list in the optimizer's config (NovoGrad's betas; Adam's given on the command line) reached the
    optimizer as an OmegaConf ListConfig, which its state_dict kept: the checkpoint then did not load
    with weights_only=True, so the run could not be resumed (nor a torchrun elastic restart)."""
    base = [f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=2", *TINY]
    chosen, other, name, betas = {
        "novograd": (["optimizer=novograd"], ["optimizer=adam", "optimizer.lr=0.1"], "NovoGrad", [0.95, 0.98]),
        "adam": (
            ["optimizer=adam", "+optimizer.betas=[0.8,0.99]"],
            ["optimizer=novograd", "optimizer.lr=0.001", "optimizer.betas=[0.8,0.99]"],
            "Adam",
            [0.8, 0.99],
        ),
    }[optimizer]
    train(compose_cfg(*base, *chosen, "checkpoint_every_epoch=true"), tmp_path / "straight")
    epoch0 = tmp_path / "straight" / "checkpoints" / "epoch0.ckpt"
    mid = torch.load(epoch0, weights_only=True)
    assert list(mid["optimizer_states"][0]["param_groups"][0]["betas"]) == betas
    assert mid["psgd_optimizer"] == name
    # another optimizer or setting is refused before training (the other optimizer failed in its first
    # step with KeyError: 'exp_avg'; another weight decay went on with the checkpoint's, unsaid)
    for change, said in (
        (other, "optimizer [A-Za-z]+ "),
        ([*chosen, "optimizer.weight_decay=0.001"], "optimizer.weight_decay=0.001 "),
    ):
        with pytest.raises(
            ConfigError, match=rf"cannot be resumed with {said}\(the checkpoint's run (used {name}|had 0\.0)\)"
        ):
            train(compose_cfg(*base, *change, f"ckpt_path={epoch0}"), tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    with warnings.catch_warnings(record=True) as caught:  # resumed without checkpoint_every_epoch=true:
        warnings.simplefilter("always")  # Lightning had said to add the epoch checkpoint callback back
        train(compose_cfg(*base, *chosen, f"ckpt_path={epoch0}"), tmp_path / "again")
    assert not [w for w in caught if "callbacks used to create the checkpoint" in str(w.message)]
    a, b = (torch.load(tmp_path / n / "checkpoints" / "last.ckpt", weights_only=True) for n in ("straight", "again"))
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert b["epoch"] == 1 and metrics(tmp_path / "again")["epochs"] == 2


def test_the_record_says_the_precision_that_ran(tiny_data, tmp_path):
    """On CPU Lightning runs trainer.precision=16-mixed as bf16-mixed (with a warning, once): the run's
    record keeps what ran, which is what its samples/s were measured with."""
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.precision=16-mixed",
        "trainer.fast_dev_run=true",
        "quiet=true",
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = train(cfg, tmp_path / "run")
    assert result["status"] == "completed" and result["precision"] == "bf16-mixed"
    assert metrics(tmp_path / "run")["precision"] == "bf16-mixed"
    assert len([w for w in seen if "AMP with fp16 is not supported on CPU" in str(w.message)]) == 1


def test_a_checkpoint_the_disk_has_no_room_for_leaves_the_previous_one_whole(tiny_data, tmp_path, monkeypatch):
    """The disk fills up while epoch 2's checkpoint is written (half of it fits). last.ckpt stays epoch
    1's, whole, so the run can be resumed; no temp file is left; the record says failed. Result files get
    the permissions open() gives."""
    binary = []

    class HalfFits:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    def half_fits_open(file, mode="r", *args, **kwargs):  # psgd's atomic writes: checkpoints are the binary ones
        f = open(file, mode, *args, **kwargs)
        if "b" in mode:
            binary.append(mode)
            return HalfFits(f) if len(binary) == 2 else f
        return f

    monkeypatch.setattr(psgd.io, "open", half_fits_open, raising=False)  # the name psgd.io's writes call
    run_dir = tmp_path / "run"
    with pytest.raises(OSError) as e:
        train(compose_cfg(f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=2", *TINY), run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(last))
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]  # no temp file
    assert torch.load(last, weights_only=True)["epoch"] == 0  # epoch 1's, loadable
    assert metrics(run_dir)["status"] == "failed"
    mask = os.umask(0o022)
    os.umask(mask)
    for path in (last, run_dir / "metrics.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, path  # mkstemp's were owner-only
