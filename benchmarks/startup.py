"""What a run costs besides training: start-up and exit, measured side by side.

    python benchmarks/startup.py --data-root ../shared/data

Each measurement is one `train.py` run in a fresh process (a few batches of MNIST with the lab CNN),
interleaved across worker counts (A B A B ...); medians over `--repeats`. Per run: the wall time to
its result line (`psgd: test_acc=...`: imports, workers started, a few steps, test) and the exit
after it (the process gone). Each worker count above one runs twice: with psgd's fork server (the
default on CPU: workers forked already loaded, psgd.forkserver) and with spawn (each worker imports
torch and Lightning itself). Beside them, a process that only imports torch and Lightning, timed
from its last line to its end with and without `gc.freeze()` before it exits (what train.py and
sweep.py do as their last exit handler, and psgd's launched workers at their teardown): the exit cost
the freeze saves. Results also go to benchmarks/results/<name>.json and .md.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from compare import exit_unless_writable, exit_without_data, positive, results_arguments, write_results  # noqa: E402

IMPORTS = "import torch, pytorch_lightning, gc, sys; {freeze}print('ready', flush=True)"


def timed(cmd: list[str], marker: str) -> tuple[float, float]:
    """(seconds to the first stdout line starting with `marker`, seconds from it to the process's end)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    seen = None
    for line in proc.stdout:
        if seen is None and line.startswith(marker):
            seen = time.perf_counter()
    err = proc.stderr.read()
    proc.wait()
    end = time.perf_counter()
    if proc.returncode != 0 or seen is None:
        raise SystemExit(f"benchmark run failed: {' '.join(cmd)}: {err.strip().splitlines()[-1:]}")
    return seen - start, end - seen


def train_cmd(workers: int, start_method: str | None, args: argparse.Namespace, out: Path) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "train.py"),
        f"strategy={args.strategy}",
        *([f"strategy.start_method={start_method}"] if start_method else []),
        f"workers={workers}",
        "threads_per_worker=1",
        "trainer.max_epochs=1",
        f"trainer.limit_train_batches={args.batches}",
        "trainer.limit_val_batches=0",
        f"trainer.limit_test_batches={args.batches}",
        f"data.root={args.data_root}",
        "quiet=true",
        f"hydra.run.dir={out}",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", required=True)
    p.add_argument("--workers", type=positive, nargs="+", default=[1, 2, 4])
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--batches", type=positive, default=5, help="training and test batches per run")
    p.add_argument("--repeats", type=positive, default=3)
    results_arguments(p, "startup")
    args = p.parse_args(argv)
    exit_without_data(args.data_root)
    exit_unless_writable(args.results)

    # each arm: (its command, given a fresh output dir; the stdout line that ends its work)
    arms = {f"train.py workers={w}": (partial(train_cmd, w, None, args), "psgd: test_acc=") for w in args.workers}
    spawned = [w for w in args.workers if w > 1 and args.strategy != "hogwild"]  # psgd's default: its fork server
    for w in spawned:
        spawn = partial(train_cmd, w, "spawn", args)
        arms[f"train.py workers={w} strategy.start_method=spawn"] = (spawn, "psgd: test_acc=")
    for arm, freeze in (("imports only", ""), ("imports only + gc.freeze()", "gc.freeze(); ")):
        arms[arm] = (lambda out, freeze=freeze: [sys.executable, "-c", IMPORTS.format(freeze=freeze)], "ready")
    times: dict[str, list[tuple[float, float]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for i, (arm, (command, marker)) in enumerate(arms.items()):  # interleaved: A B A B ...
                times[arm].append(timed(command(Path(tmp) / f"{rep}-{i}"), marker))
                to_line, exit_s = times[arm][-1]
                print(f"  rep {rep + 1}/{args.repeats} {arm:28s} {to_line:6.2f} s, exit {exit_s:5.2f} s", flush=True)

    rows = []
    for arm in arms:
        to_line = statistics.median(t for t, _ in times[arm])
        exit_s = statistics.median(e for _, e in times[arm])
        rows.append({"run": arm, "to_last_line_s": round(to_line, 2), "exit_s": round(exit_s, 2)})
    saved = rows[-2]["exit_s"] - rows[-1]["exit_s"]
    by_run = {r["run"]: r["to_last_line_s"] for r in rows}
    sooner = {
        w: round(by_run[f"train.py workers={w} strategy.start_method=spawn"] - by_run[f"train.py workers={w}"], 2)
        for w in spawned
    }
    lines = [
        f"Start-up and exit (medians of {args.repeats}, {args.strategy}, {args.batches} training and test batches; "
        "exit: from the last line to the process's end)",
        "",
        "| run | to its last line (s) | exit (s) |",
        "|---|---|---|",
        *[f"| {r['run']} | {r['to_last_line_s']:.2f} | {r['exit_s']:.2f} |" for r in rows],
        "",
        f"gc.freeze() before exit saves {saved:.2f} s per process that imported torch and Lightning.",
        *[
            f"psgd's fork server (the default on CPU) gets {w} workers to their result {s:.2f} s sooner than spawn."
            for w, s in sooner.items()
        ],
    ]
    print("\n".join(lines))
    result = {"rows": rows, "freeze_saves_s": round(saved, 2), "forkserver_sooner_than_spawn_s": sooner}
    write_results(args.results, args.name, json.dumps(result, indent=1), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
