"""psgd.run.resolve_ckpt_path: what a checkpoint must match before a run resumes from it."""

from functools import partial

import pytest
import torch

from psgd.config import ConfigError
from psgd.models import MLP, LabCNN
from psgd.module import Classifier
from psgd.run import resolve_ckpt_path


def save(path, module, **extra):
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams), **extra}, path)
    return str(path)


def test_a_checkpoint_of_each_workers_state_needs_as_many_workers(tmp_path):
    module = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02, workers=2, max_epochs=2)
    mid_run = save(tmp_path / "mid.ckpt", module, replicas=[{}, {}], averaged=False)
    assert resolve_ckpt_path(mid_run, module, world_size=2) == mid_run
    for world_size in (1, 3):  # before, each worker failed with a RuntimeError once started
        with pytest.raises(ConfigError, match=rf"holds 2 workers' own state but this run has {world_size} workers"):
            resolve_ckpt_path(mid_run, module, world_size=world_size)
    # the final checkpoint of model averaging holds the averaged model: any number of workers starts from it
    final = save(tmp_path / "final.ckpt", module, replicas=[{}, {}], averaged=True)
    assert resolve_ckpt_path(final, module, world_size=3) == final


def test_a_checkpoint_with_another_lr_schedule_is_refused(tmp_path):
    saved = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02, max_epochs=1, scheduler={"decay": "cosine"})
    path = save(tmp_path / "last.ckpt", saved)
    same = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02, max_epochs=1, scheduler={"decay": "cosine"})
    assert resolve_ckpt_path(path, same) == path
    longer = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02, max_epochs=3, scheduler={"decay": "cosine"})
    with pytest.raises(ConfigError, match=r"cannot be resumed with trainer.max_epochs=3 under a cosine decay"):
        resolve_ckpt_path(path, longer)


def test_a_checkpoint_of_another_model_or_no_checkpoint_is_refused(tmp_path):
    mlp = Classifier(MLP(), partial(torch.optim.SGD), lr=0.02)
    path = save(tmp_path / "last.ckpt", mlp)
    lab_cnn = Classifier(LabCNN(), partial(torch.optim.SGD), lr=0.02)
    with pytest.raises(ConfigError, match=r"does not fit this run's model: net\.\S+ is missing in the checkpoint"):
        resolve_ckpt_path(path, lab_cnn)
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"is not a psgd checkpoint loadable as weights only \(UnpicklingError"):
        resolve_ckpt_path(str(garbage), mlp)
    with pytest.raises(ConfigError, match=r"no checkpoint at .*nowhere \(give a .ckpt file or a run dir\)"):
        resolve_ckpt_path(str(tmp_path / "nowhere"), mlp)
    # a run dir stands for its last checkpoint
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"no checkpoint at .*run/checkpoints/last.ckpt"):
        resolve_ckpt_path(str(run_dir), mlp)
    last = save(run_dir / "checkpoints" / "last.ckpt", mlp)
    assert resolve_ckpt_path(str(run_dir), mlp) == last
