"""Reading back what a run left on disk, as a user (or TensorBoard) would."""

import csv
import json
import re
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


README = Path(__file__).resolve().parents[2] / "README.md"


def undocumented(run_dir: Path) -> list[str]:
    """What a run wrote that the README does not name: each metrics.json key (top level and `history`'s)
    missing from the Outputs table's metrics.json row, and each TensorBoard scalar tag named nowhere in
    the README (a rank or a class in a tag is the README's `<rank>` or `<label>_<name>`)."""
    readme = README.read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `metrics.json` |"))
    m = metrics(run_dir)
    keys = set(m).union(*(set(h) for h in m["history"]))
    missing = sorted(f"metrics.json: {k}" for k in keys - set(re.findall(r"`(\w+)`", row)))
    named = set(re.findall(r"`([^`\s]+)`", readme))
    for tag in tensorboard(run_dir).Tags()["scalars"]:
        shown = re.sub(r"^test/acc_class/.+", "test/acc_class/<label>_<name>", re.sub(r"/\d+/", "/<rank>/", tag))
        if shown not in named:
            missing.append(f"tensorboard: {tag}")
    return missing


def unnamed_columns(csv_file: Path) -> list[str]:
    """The columns of a sweep's report.csv or summary.csv that the README names nowhere."""
    with open(csv_file) as f:
        columns = next(csv.reader(f))
    readme = README.read_text()
    return [c for c in columns if f"`{c}`" not in readme]
