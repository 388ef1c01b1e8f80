"""Simulated workers (simulate=true) against real ones, side by side in one run:

- speed: the samples/s of P simulated workers (every worker's samples per second of this machine, --workers, 64 by
  default) beside one real worker's at the same per-worker batch, interleaved; the target is 0.9x or more;
- time: each real run's measured epoch time (DDP and local SGD at P = 2 and 4) beside the same run simulated on the
  network benchmarks/network.py fitted to gloo here (results/network.json: α, B), its replicas computed with a real
  worker's threads (threads_per_worker = cores // P, at least 1) and network.compute_scale = cores / (P x threads)
  (the share of a core each real worker's thread gets: 4 workers on 2 cores time-share them), so that the
  model's projection can be read against what the processes took.

    python benchmarks/simulated.py --data-root ../shared/data          # ~7 min on 2 cores

Every run trains on all 60,000 samples (data.val_split=0), without validation, its final test cut to one batch.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    RESULTS,
    RunFailed,
    exit_unless_writable,
    exit_without_data,
    interleaved,
    medians,
    positive,
    psgd_run,
    results_arguments,
    sample_rows,
    shown,
    table,
    write_results,
)

QUICK = ["trainer.limit_val_batches=0", "trainer.limit_test_batches=1", "trainer.max_epochs=1"]
STRATEGIES = {"ddp": ["strategy=ddp"], "local SGD (H=16)": ["strategy=model_averaging", "strategy.period=16"]}


def network_settings(results: Path) -> tuple[list[str], str]:
    """network.* as benchmarks/network.py fitted them (its results in `results`, else psgd's defaults), and where
    they came from."""
    fitted = results / "network.json"
    if not fitted.is_file():
        fitted = RESULTS / "network.json"
    if not fitted.is_file():
        return [], "psgd's default network (no benchmarks/results/network.json)"
    data = json.loads(fitted.read_text())
    gbps, ms = data["bandwidth_bytes_per_s"] * 8 / 1e9, data["alpha_s"] * 1e3
    return [f"network.bandwidth_gbps={gbps:.4g}", f"network.latency_ms={ms:.4g}"], f"fitted to gloo ({fitted.name})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=os.environ.get("PSGD_DATA", "data"))
    parser.add_argument("--workers", type=positive, default=64, help="simulated workers of the speed test")
    parser.add_argument("--batch", type=positive, default=32, help="samples per batch, per worker")
    parser.add_argument("--steps", type=positive, default=300, help="the real worker's steps per speed run")
    parser.add_argument("--repeats", type=positive, default=3)
    parser.add_argument("--calibrate", type=positive, nargs="*", default=[2, 4], help="real worker counts timed")
    parser.add_argument("--batches", type=positive, default=200, help="each worker's steps per timed run")
    parser.add_argument("--parts", nargs="+", choices=["speed", "time"], default=["speed", "time"])
    results_arguments(parser, "simulated")
    args = parser.parse_args(argv)
    exit_unless_writable(args.results)
    exit_without_data(args.data_root)
    batch = [f"data.batch_size={args.batch}", *QUICK]

    with tempfile.TemporaryDirectory() as tmp:
        runs = iter(range(10**6))

        def speed(overrides: list[str]):
            return lambda rep: psgd_run(Path(tmp) / str(next(runs)), [*batch, *overrides], args)["samples_per_s"]

        if "speed" in args.parts:
            print(f"speed: {args.workers} simulated workers against one real worker, batch {args.batch}", flush=True)
        configs = {
            "1 real worker": speed([f"trainer.limit_train_batches={args.steps}"]),
            **{
                f"{args.workers} simulated, {name}": speed(["simulate=true", f"workers={args.workers}", *overrides])
                for name, overrides in STRATEGIES.items()
            },
        }
        failed: list[str] = []
        samples = interleaved(configs if "speed" in args.parts else {}, args.repeats, failed)
        med = medians(samples)
        base = med.get("1 real worker")
        speed_rows = [[*row, shown(med[row[0]] / base if base and row[0] in med else None, ".2f")]
                      for row in sample_rows(samples)]  # fmt: skip

        network, source = network_settings(args.results)
        cores = os.cpu_count() or 1
        print(f"time: real runs against simulated ones on the network {source}", flush=True)
        time_rows = []
        for workers in args.calibrate if "time" in args.parts else []:
            common = [*batch, f"workers={workers}", f"trainer.limit_train_batches={args.batches}"]
            threads = max(1, cores // workers)  # a real worker's (psgd's default)
            scale = min(1.0, cores / (workers * threads))
            simulated = ["simulate=true", *network, f"threads_per_worker={threads}"]
            simulated.append(f"network.compute_scale={scale:.4g}")
            for name, overrides in STRATEGIES.items():
                try:
                    real = psgd_run(Path(tmp) / str(next(runs)), [*common, *overrides], args)["history"][0]
                    sim = psgd_run(Path(tmp) / str(next(runs)), [*common, *overrides, *simulated], args)["history"][0]
                except RunFailed as e:
                    failed.append(f"{name} x{workers}: {e}")
                    time_rows.append([name, workers, "failed", "failed", "failed"])
                    continue
                ratio = sim["sim_epoch_s"] / real["epoch_s"]
                time_rows.append([name, workers, f"{real['epoch_s']:.2f}", f"{sim['sim_epoch_s']:.2f}", f"{ratio:.2f}"])
                print(f"  {name} x{workers}: measured {real['epoch_s']:.2f} s, simulated {sim['sim_epoch_s']:.2f} s",
                      flush=True)  # fmt: skip

    speed_table = table(speed_rows, ["run", "median samples/s", "runs", "x one real worker"])
    header = ["strategy", "workers", "measured epoch s", "simulated epoch s", "simulated / measured"]
    time_table = table(time_rows, header)
    print("\n" + speed_table + "\n\n" + time_table)
    for line in failed:
        print(f"failed: {line}")
    md = (
        f"# Simulated workers against real ones\n\nSpeed: batch {args.batch} per worker, {args.repeats} interleaved "
        f"runs, the real worker {args.steps} steps, the simulated ones an epoch of 60,000 samples.\n\n{speed_table}\n\n"
        f"Time: {args.batches} steps a worker, network {source}, the replicas computed with a real worker's threads, "
        f"compute_scale = cores / (workers x threads) ({cores} cores)."
        f"\n\n{time_table}\n"
    )
    data = {"speed": samples, "medians": med, "time": time_rows, "network": network, "failed": failed}
    write_results(args.results, args.name, json.dumps(data, indent=1), md)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
