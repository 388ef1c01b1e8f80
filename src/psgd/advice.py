"""What psgd tells a user of a run's outcome: steps too large (it diverged or learned nothing) and the lr to
set, the class label-skewed shards left behind, what ended training. Imports no other psgd module."""

import math
from typing import Any

STOPPERS = {
    "early_stop": "early_stop.target_acc",
    "max_steps": "trainer.max_steps",
    "max_time": "trainer.max_time",
    "fast_dev_run": "trainer.fast_dev_run",
}


def hogwild_workers(strategy: str | None, workers: int | None) -> int | None:
    """The worker count of a HogWild run where several write into the one shared model, else None."""
    return workers if strategy == "hogwild" and workers is not None and workers > 1 else None


def scales_by_workers(settings: Any) -> bool:
    """Whether lr_scaling multiplied optimizer.lr by the worker count (a run's config or its record)."""
    return settings.get("lr_scaling") not in (None, "none") and settings.get("lr_reference_batch") is None


def step_advice(lr=None, hogwild_workers: int | str | None = None, optimizer_lr=None, by_workers: bool = False) -> str:
    """What to change when a run's steps were too large: a lower lr or a warm-up; under HogWild's P workers
    (`hogwild_workers`: P, or "P" for several runs) one worker's lr / P, with lr_scaling=none where lr_scaling
    scaled `optimizer_lr` by the workers (`by_workers`) into the run's `lr` (where known)."""
    scaled = bool(lr and optimizer_lr and not math.isclose(lr, optimizer_lr, rel_tol=1e-6))
    base = optimizer_lr if scaled else lr
    said = f"the run's lr is {lr:g}" if lr else ""
    if scaled:
        said += f": lr_scaling's {lr / base:.3g} x optimizer.lr {base:g}"
    p = hogwild_workers
    if p is None:
        return f"lower optimizer.lr{f' ({said})' if said else ''} or warm up (scheduler=warmup)"
    if lr and isinstance(p, int):
        to = f"optimizer.lr={float(f'{base / p:.3g}'):g}"
        if scaled and by_workers:
            said += f", by the workers; so lr_scaling=none {to}"
        else:
            said += f"{'; so ' if scaled else ': '}{to}"
    return (
        f"under HogWild the {p} workers' updates all land on the one shared model, about {p} times one worker's "
        f"steps: lower optimizer.lr about {p}-fold{f' ({said})' if said else ''} or optimizer.momentum "
        "(mnist_hogwild's lr 0.01 and momentum 0.5 are experiment=hogwild_lab's)"
    )


def worst_class(accs: list[float | None] | None, names: list[str] | None) -> tuple[str, float] | None:
    """The class the final model knows least (its name, else its label) and its test accuracy, if any."""
    known = [(a, c) for c, a in enumerate(accs or []) if a is not None]
    if not known:
        return None
    acc, label = min(known)
    return (names[label] if names and label < len(names) else str(label)), round(acc, 4)


def skew_note(record: dict) -> str:
    """' (worst class 3 - three at 0.0396)' for a run on label-skewed shards (partition not iid), else ''."""
    worst = worst_class(record.get("test_acc_per_class"), record.get("test_classes"))
    if worst is None or record.get("partition", "iid") == "iid":
        return ""
    return f" (worst class {worst[0]} at {worst[1]:.4f})"


def stop_note(record: dict) -> str:
    """' (trainer.max_time ended training in epoch 30 of 500)' where not max_epochs ended training, else ''."""
    stopper = STOPPERS.get(record.get("stopped_by"))
    if stopper is None:
        return ""
    of = f" of {record['max_epochs']}" if record.get("max_epochs") else ""
    return f" ({stopper} ended training in epoch {record.get('epochs')}{of})"


def learned_nothing(job: Any) -> bool:
    """A completed run (not a fast_dev_run) whose last epoch's training loss is no lower than a uniform
    guess's, ln(classes), and whose test accuracy is under twice chance."""
    history = job.get("history") or []
    last = history[-1] if history and isinstance(history[-1], dict) else {}
    classes = len(job.get("test_acc_per_class") or job.get("test_classes") or [])
    loss, acc = last.get("train_loss"), job.get("test_acc")
    if job.get("status") != "completed" or job.get("stopped_by") == "fast_dev_run" or classes < 2:
        return False
    numbers = all(isinstance(v, int | float) for v in (loss, acc))
    return numbers and loss >= math.log(classes) and acc < 2 / classes


def learned_nothing_line(accs: str, hogwild_workers, lr=None, optimizer_lr=None, by_workers=False) -> str:
    """What learning nothing says, and what to change (step_advice)."""
    advice = step_advice(lr, hogwild_workers, optimizer_lr, by_workers)
    return (
        f"learned nothing (test accuracy {accs}, about chance; the last epoch's training loss no lower than a "
        f"uniform guess's): most often the steps were too large; {advice}"
    )
