"""Training samples/s per strategy and worker count, one thread per worker, measured side by side.

    python benchmarks/throughput.py --data-root ../shared/data --workers 1 2 --strategies ddp model_averaging

Each measurement is one `train.py` run in a fresh process tree (1 epoch of MNIST with the lab CNN by
default); runs are interleaved across configurations (A B A B ...) and the median of `--repeats` is
reported with the speedup over the same strategy's 1-worker figure. Figures come from each run's
metrics.json (`samples_per_s`: training only, validation and process start excluded), and so does
where the lost speed went: `sync %`, the share of the training time the workers synchronised (DDP's
wait for the gradient all-reduce, periodic averaging's averaging, locked HogWild's wait for the lock;
the sweep report's column). Results also go to benchmarks/results/<name>.json and .md.

HogWild runs with mnist_hogwild's SGD (lr 0.01, momentum 0.5), as compare.py's: psgd's default SGD is too
aggressive for several workers writing into one model (train.py overrides given here come after and win).
A run that fails is said in its row and the others go on; the results are written, and the exit status is 1.
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import (  # noqa: E402
    HOGWILD_SGD,
    RunFailed,
    exit_unless_writable,
    exit_without_data,
    positive,
    results_arguments,
    run,
    write_results,
)

from psgd.report import sync_share  # noqa: E402

VARIANTS = {
    "hogwild": ["strategy=hogwild", *HOGWILD_SGD],
    "hogwild_locked": ["strategy=hogwild", "strategy.lock=true", *HOGWILD_SGD],
}


def run_once(strategy: str, workers: int, args: argparse.Namespace, out: Path) -> tuple[float, float | None]:
    """One run's samples/s and its share of training time synchronising (None where nothing waits);
    RunFailed with its last line where it failed."""
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        *VARIANTS.get(strategy, [f"strategy={strategy}"]),
        f"workers={workers}",
        "threads_per_worker=1",
        f"trainer.max_epochs={args.epochs}",
        f"data.root={args.data_root}",
        f"data.batch_size={args.batch_size}",
        "trainer.limit_val_batches=0",
        "quiet=true",
        f"hydra.run.dir={out}",
        *args.overrides,
    ]
    try:
        run(cmd)
    except RunFailed as e:  # its last line, named by its row
        raise RunFailed(f"{strategy} workers={workers}: {e}") from None
    metrics = json.loads((out / "metrics.json").read_text())
    return metrics["samples_per_s"], sync_share(metrics)


def measure(strategies: list[str], workers_list: list[int], repeats: int, args: argparse.Namespace):
    """Interleaved runs of every (strategy, workers); returns the rows and their markdown table lines.
    `args` needs data_root, epochs, batch_size and overrides (train.py extras). A run that fails is
    reported in its row (`failed`) and the others go on."""
    configs = [(s, w) for s in strategies for w in workers_list]
    samples: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    shares: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    failed: dict[tuple[str, int], list[str]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for i, (strategy, workers) in enumerate(configs):  # interleaved: A B A B ...
                run = f"rep {rep + 1}/{repeats} {strategy:16s} workers={workers}"
                try:
                    rate, share = run_once(strategy, workers, args, Path(tmp) / f"{rep}-{i}")
                except RunFailed as e:
                    failed[(strategy, workers)].append(str(e))
                    print(f"  {run}: failed: {e}", flush=True)
                    continue
                samples[(strategy, workers)].append(rate)
                shares[(strategy, workers)] += [] if share is None else [share]
                sync = "" if share is None else f", {share:.1%} synchronising"
                print(f"  {run}: {rate:9.1f} samples/s{sync}", flush=True)

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    rows = []
    for strategy, workers in configs:
        rate, base = median(samples[(strategy, workers)]), median(samples.get((strategy, 1), []))
        share = median(shares[(strategy, workers)])
        rows.append(
            {
                "strategy": strategy,
                "workers": workers,
                "samples_per_s": None if rate is None else round(rate, 1),
                "runs": samples[(strategy, workers)],
                "speedup_vs_1_worker": round(rate / base, 3) if rate is not None and base else None,
                "sync_share": None if share is None else round(share, 4),
                "failed": failed[(strategy, workers)],
            }
        )
    header = "| strategy | workers | samples/s (median) | speedup vs 1 worker | sync % (median) |"
    lines = [header, "|---|---|---|---|---|"]
    for r in rows:
        rate = "all runs failed" if r["samples_per_s"] is None else f"{r['samples_per_s']:.0f}"
        rate += f" ({len(r['failed'])} of {repeats} failed)" if r["failed"] and r["runs"] else ""
        speedup = "" if r["speedup_vs_1_worker"] is None else r["speedup_vs_1_worker"]
        share = "" if r["sync_share"] is None else f"{r['sync_share']:.1%}"
        lines.append(f"| {r['strategy']} | {r['workers']} | {rate} | {speedup} | {share} |")
    return rows, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    strategies = ["ddp", "model_averaging", "hogwild", "hogwild_locked"]
    parser.add_argument("--strategies", nargs="+", choices=strategies, default=strategies)
    parser.add_argument("--workers", nargs="+", type=positive, default=[1, 2])
    parser.add_argument("--epochs", type=positive, default=1)
    parser.add_argument("--batch-size", type=positive, default=128)
    parser.add_argument("--repeats", type=positive, default=3)
    results_arguments(parser, "throughput")
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides, e.g. model=singa_cnn")
    args = parser.parse_args()
    data = [o.split("=", 1)[1] for o in args.overrides if o.startswith("data=")]
    exit_without_data(args.data_root, (data[-1] if data else "mnist",))
    exit_unless_writable(args.results)

    rows, lines = measure(args.strategies, args.workers, args.repeats, args)
    print("\n".join(lines))
    record = json.dumps({"args": vars(args), "rows": rows}, indent=2, default=str) + "\n"
    write_results(args.results, args.name, record, "\n".join(lines) + "\n")
    failures = [f for r in rows for f in r["failed"]]
    if failures:  # written with the rest; the exit status says some figures are missing
        raise SystemExit(f"throughput.py: {len(failures)} run(s) failed, the first: {failures[0]}")


if __name__ == "__main__":
    main()
