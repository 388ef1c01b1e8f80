"""What the benchmark scripts share: their arguments (--results, --name), the checks before any measurement
(data found, results writable), running train.py and the reference scripts, interleaved repeats and their
medians, and the tables they print and write."""

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


RESULTS = ROOT / "benchmarks" / "results"


# psgd's HogWild runs with mnist_hogwild's SGD (lr 0.01, momentum 0.5, the reference script's): its workers all
# write into one model, and psgd's default SGD is too aggressive for several writers at once
HOGWILD_SGD = ["optimizer.lr=0.01", "optimizer.momentum=0.5"]


def positive(text: str) -> int:
    """argparse type: an integer >= 1 (a count of repeats, workers, steps ...)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return int(text)


def result_name(text: str) -> str:
    """argparse type: the name of a run's result files (<name>.json and <name>.md in the results folder)."""
    if not re.fullmatch(r"\w[\w.-]*", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a file name (letters, digits, '_', '.', '-'); --results names the folder"
        )
    return text


def results_arguments(parser: argparse.ArgumentParser, name: str | None = None) -> None:
    """--results, the folder the result files go to, and, when `name` is given, --name (their name)."""
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for the result files (.json, .md)")
    if name is not None:
        parser.add_argument("--name", type=result_name, default=name, help="the result files' name (%(default)s)")


def exit_unless_writable(folder: Path) -> None:
    """Before any measurement: `folder` made and writable, or one line and exit code 2, so that minutes
    of measurements never end in a traceback when their results are written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        print(
            f"{Path(sys.argv[0]).name}: error: cannot write results into {folder} ({e.strerror or e}); "
            "pass --results <a writable folder>",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def write_results(folder: Path, name: str, data: str, md: str) -> None:
    """<name>.json (`data`) and <name>.md into `folder`, each whole or not at all."""
    from psgd.io import write_atomic

    write_atomic(folder / f"{name}.json", data)
    write_atomic(folder / f"{name}.md", md)


def non_negative(text: str) -> int:
    """argparse type: an integer >= 0 (a seed, a number of steps skipped)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 0")
    return int(text)


def exit_without_data(data_root: str, names: tuple[str, ...] = ("mnist",)) -> None:
    """Before any measurement: the datasets found under `data_root` (downloaded if they are not, as
    train.py does), or one line saying why not and exit code 2, rather than a traceback from deep
    inside the first measured run."""
    from psgd.data.datasets import load_split
    from psgd.errors import DataError

    try:
        for name in names:
            load_split(name, data_root, train=True)
    except DataError as e:
        why = str(e).replace("set data.root=<dir> or PSGD_DATA=<dir>", "pass --data-root <dir>")  # train.py's words
        print(f"{Path(sys.argv[0]).name}: error: {why}", file=sys.stderr)
        raise SystemExit(2) from None


class RunFailed(Exception):
    """A benchmark's run (train.py, a reference script, an inner loop) that exited non-zero; its message is the
    run's last line (a diverged run's, a refused override's). The benchmark says it where the figure would
    be and measures the rest."""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RunFailed((proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1])
    return proc


def psgd_run(out: Path, overrides: list[str], args) -> dict:
    """A train.py run into `out` on all the training samples, as the reference scripts train (data.val_split=0);
    returns its metrics.json."""
    cmd = [sys.executable, str(ROOT / "train.py"), f"data.root={args.data_root}", "data.val_split=0", "quiet=true"]
    run([*cmd, f"hydra.run.dir={out}", *overrides])
    return json.loads((out / "metrics.json").read_text())


def interleaved(configs: dict, repeats: int, failed: list[str] | None = None) -> dict[str, list[float | None]]:
    """`repeats` rounds of every config's run, in turn. A run that fails (RunFailed) is None in its
    round, its line goes to `failed`, and the others go on."""
    samples: dict[str, list[float | None]] = {name: [] for name in configs}
    for rep in range(repeats):
        for name, go in configs.items():  # A B A B ...: drifts of the machine hit every config alike
            try:
                samples[name].append(go(rep))
            except RunFailed as e:
                samples[name].append(None)
                if failed is not None:
                    failed.append(f"{name}: {e}")
                print(f"  rep {rep + 1}/{repeats}  {name:40s} failed: {e}", flush=True)
                continue
            print(f"  rep {rep + 1}/{repeats}  {name:40s} {samples[name][-1]:9.1f} samples/s", flush=True)
    return samples


def medians(samples: dict) -> dict:
    """Each config's median over its runs that did not fail; a config whose runs all failed has none."""
    return {k: statistics.median(ok) for k, v in samples.items() if (ok := [x for x in v if x is not None])}


def sample_rows(samples: dict) -> list[list]:
    """The table rows of interleaved samples: each config's median and its runs, a failed one as `failed`."""
    med = medians(samples)
    runs = {k: " ".join("failed" if x is None else f"{x:.0f}" for x in v) for k, v in samples.items()}
    return [[k, f"{med[k]:.0f}" if k in med else "all runs failed", runs[k]] for k in samples]


# ---------------------------------------------------------------------------------------------- report
def table(rows: list[list], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def shown(value: float | None, spec: str) -> str:
    """A figure as the tables show it; `failed` where its runs failed (None)."""
    return "failed" if value is None else format(value, spec)
