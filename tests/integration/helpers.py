"""Reading back what a run left on disk, as a user (or TensorBoard) would."""

import csv
import json
import re
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData


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


ROOT = Path(__file__).resolve().parents[2]


def hparam_columns(acc: EventAccumulator) -> set[str]:
    """The metric columns of a run's HParams tab."""
    experiment = HParamsPluginData.FromString(acc.PluginTagToContent("hparams")["_hparams_/experiment"]).experiment
    return {i.name.tag for i in experiment.metric_infos}


def documentation_files() -> list[Path]:
    """The user documentation: README.md and docs/*.md (not the sweep reports kept under docs/results/)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documentation() -> str:
    """The text of README.md and docs/*.md, one file after the other."""
    return "\n\n".join(f.read_text() for f in documentation_files())


def metrics_json_section(docs: str) -> str:
    """The documentation's `## metrics.json` section, up to the next heading of level 1 or 2."""
    found = re.search(r"^## `?metrics\.json`?\n(.*?)(?=^#{1,2} |\Z)", docs, re.MULTILINE | re.DOTALL)
    assert found, "the documentation has no '## metrics.json' section"
    return found.group(1)


def undocumented(run_dir: Path) -> list[str]:
    """What a run wrote that the documentation does not name: each metrics.json key (top level and `history`'s)
    missing from the `## metrics.json` section, and each TensorBoard scalar tag named nowhere in README.md and
    docs/*.md (a rank or a class in a tag is the documentation's `<rank>` or `<label>_<name>`)."""
    docs = documentation()
    section = metrics_json_section(docs)
    m = metrics(run_dir)
    keys = set(m).union(*(set(h) for h in m["history"]))
    missing = sorted(f"metrics.json: {k}" for k in keys - set(re.findall(r"`(\w+)`", section)))
    named = set(re.findall(r"`([^`\s]+)`", docs))
    for tag in tensorboard(run_dir).Tags()["scalars"]:
        shown = re.sub(r"^test/acc_class/\d+$", "test/acc_class/<label>", re.sub(r"/\d+/", "/<rank>/", tag))
        if shown not in named:
            missing.append(f"tensorboard: {tag}")
    return missing


def unnamed_columns(csv_file: Path) -> list[str]:
    """The columns of a sweep's report.csv or summary.csv that README.md and docs/*.md name nowhere."""
    with open(csv_file) as f:
        columns = next(csv.reader(f))
    docs = documentation()
    return [c for c in columns if f"`{c}`" not in docs]
