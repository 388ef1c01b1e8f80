"""A finished run's TensorBoard summary: its settings for the HParams tab and its final test metrics."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summary

from psgd.config import Run, schedule
from psgd.strategies.records import FIGURES

# the HParams tab's columns every run has: each run's last value of these tags
HPARAM_METRICS = ("test/acc", "test/loss", "val/acc", "val/loss", "time/samples_per_s", "time/cumulative_s")


def hparam_metrics(metrics: dict[str, Any]) -> list[str]:
    """The HParams tab's columns of a run: HPARAM_METRICS, its strategy's own figures as far as the run wrote
    them (its history's FIGURES), with stragglers their sleep, and a model-averaging run's averaged model."""
    history = metrics.get("history") or [{}]
    own = [FIGURES[key][0] for key in history[-1] if key in FIGURES]
    own += ["stragglers/wait_s"] if "straggler_wait_s" in history[-1] else []
    averaged = ["averaged/test_acc", "averaged/val_acc"] if metrics.get("worker_test_acc") else []
    return [*HPARAM_METRICS, *own, *averaged]


def flat_hparams(run: Run) -> dict[str, Any]:
    """The config as TensorBoard hparams: dotted keys, scalars only; the lr schedule as the run trained with it."""

    def flat(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        if not isinstance(node, dict):
            yield prefix[:-1], node if isinstance(node, int | float | str | bool) else str(node)
            return
        for k, v in node.items():
            if not str(k).startswith("_"):  # _target_, _partial_
                yield from flat(v, f"{prefix}{k}.")

    settings = run.model_dump(by_alias=True, exclude_unset=True)  # the keys the config gave
    if isinstance(settings.get("scheduler"), dict):  # scheduler=none: a constant lr, whatever its keys say
        settings["scheduler"] = schedule(settings["scheduler"])
    return dict(flat(settings, ""))


def write_tensorboard_summary(log_dir: Path, run: Run, metrics: dict[str, Any], step: int) -> None:
    """Write the HParams tab's row of the run (hparam_metrics' columns) and its final test metrics at `step`, each
    class's accuracy as test/acc_class/<label> (metrics.json's test_classes names the labels), a model-averaging
    run's also as averaged/test_acc and averaged/test_loss."""
    final = {"test/acc": metrics["test_acc"], "test/loss": metrics["test_loss"]}
    final |= {f"test/acc_class/{label}": acc for label, acc in enumerate(metrics["test_acc_per_class"])}
    if metrics.get("worker_test_acc"):  # model averaging: the test figures are the averaged model's
        final |= {"averaged/test_acc": metrics["test_acc"], "averaged/test_loss": metrics["test_loss"]}
    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for key, value in final.items():
            if value is not None:
                writer.add_scalar(key, value, step)
        exp, ssi, sei = hparams_summary(flat_hparams(run), dict.fromkeys(hparam_metrics(metrics), 0.0))
        for summary in (exp, ssi, sei):
            writer.file_writer.add_summary(summary)
    finally:
        writer.close()
