"""Reading back what a run left on disk, as a user (or TensorBoard) would."""

import csv
import json
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def training_data(run_dir: Path) -> list[dict]:
    with open(run_dir / "training_data.csv") as f:
        return list(csv.DictReader(f))


def tensorboard(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(acc: EventAccumulator, tag: str) -> list[float]:
    return [e.value for e in acc.Scalars(tag)]
