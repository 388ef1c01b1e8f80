"""The training accuracy and loss a run reports are those of every sample it trained on."""

from functools import partial

import pytest
import pytorch_lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from psgd.module import Classifier


def fit_one_epoch(limit_train_batches=None, count_every=None):
    torch.manual_seed(0)
    x, y = torch.randn(100, 6), torch.randint(0, 4, (100,))
    net = nn.Linear(6, 4)
    # lr 0: the weights stay as they are, so the epoch's numbers can be recomputed afterwards
    module = Classifier(net, partial(torch.optim.SGD), lr=0.0, num_classes=4)
    if count_every is not None:
        module.count_every = count_every
    loader = DataLoader(TensorDataset(x, y), batch_size=32)  # 32 + 32 + 32 + 4: a short last batch
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=limit_train_batches,
    )
    trainer.fit(module, train_dataloaders=loader)
    return trainer.callback_metrics, net, x, y


@pytest.mark.parametrize("batches", [None, 2], ids=["whole epoch", "limit_train_batches=2"])
@pytest.mark.parametrize("count_every", [None, 1, 3], ids=["default", "counted every batch", "counted every 3"])
def test_train_metrics_count_every_sample_of_the_epoch(batches, count_every):
    """Also when the kept batches are counted within the epoch (every 3: after batch 3, then the
    short last one at the epoch's end)."""
    metrics, net, x, y = fit_one_epoch(batches, count_every)
    n = 100 if batches is None else 64
    with torch.no_grad():
        out = net(x[:n])
    assert float(metrics["train/acc"]) == pytest.approx((out.argmax(1) == y[:n]).float().mean().item(), abs=1e-6)
    assert float(metrics["train/loss"]) == pytest.approx(F.cross_entropy(out, y[:n]).item(), rel=1e-5)
