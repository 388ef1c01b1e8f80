"""What psgd tells a user of a run's outcome beside its result: the class label-skewed shards left behind, what
ended training. Imports no other psgd module."""

STOPPERS = {
    "early_stop": "early_stop.target_acc",
    "max_steps": "trainer.max_steps",
    "max_time": "trainer.max_time",
    "fast_dev_run": "trainer.fast_dev_run",
}


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
