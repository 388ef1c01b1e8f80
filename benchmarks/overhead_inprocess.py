"""Framework overhead measured in one process: vanilla loop, bare and leanest LightningModule and psgd.

    python benchmarks/overhead_inprocess.py --data-root ../shared/data --repeats 4

compare.py's overhead section starts a fresh process per run; on a 2-core machine that adds a few
per cent of run-to-run spread. Here the four loops (the same ones as in compare.py: same data path,
model, optimizer, threads; epoch 2 timed) alternate A B C D A B C D ... inside one process, so they see
the same allocator, caches and clock. Prints samples/s per run, medians and the step-time ratios, and
for the vanilla loop and the leanest LightningModule (whose training_step is the vanilla step
verbatim) how much of a step is that step body and how much is the loop around it.
"""

import argparse
import logging
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare  # noqa: E402  (the same loops as compare.py's overhead section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--repeats", type=compare.positive, default=4)
    parser.add_argument("--threads", type=compare.positive, default=os.cpu_count() or 1)
    args = parser.parse_args()
    compare.exit_without_data(args.data_root)

    import tempfile

    from psgd.run import train

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    cfg = compare.psgd_overhead_cfg(args.data_root, args.threads)
    bodies: dict[str, list[float]] = {"vanilla loop": [], "leanest LightningModule": []}
    with tempfile.TemporaryDirectory() as tmp:
        configs = {
            "vanilla loop": lambda i: compare.vanilla(
                args.data_root, args.threads, fixed_batch=False, bodies=bodies["vanilla loop"]
            ),
            "bare LightningModule": lambda i: compare.bare_lightning(args.data_root, args.threads),
            "leanest LightningModule": lambda i: compare.lean_lightning(
                args.data_root, args.threads, bodies=bodies["leanest LightningModule"]
            ),
            "psgd (Lightning)": lambda i: train(cfg, Path(tmp) / f"psgd{i}")["history"][-1]["samples_per_s"],
        }
        runs = compare.interleaved(configs, args.repeats)  # A B C A B C ..., as in compare.py
    med = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in runs.items():
        print(f"{k:24s} {med[k]:8.0f} samples/s (median; runs {' '.join(f'{x:.0f}' for x in v)})")
    vanilla, bare, psgd = med["vanilla loop"], med["bare LightningModule"], med["psgd (Lightning)"]
    print(f"framework overhead, psgd step time / vanilla:     {vanilla / psgd:.3f} (target <= 1.05)")
    print(f"  Lightning's loop, bare LightningModule / vanilla: {vanilla / bare:.3f}")
    print(f"  psgd on top of it, psgd / bare LightningModule:   {bare / psgd:.3f}")
    print(f"Lightning's floor, leanest LightningModule / vanilla: {vanilla / med['leanest LightningModule']:.3f}")
    # Where the floor's time goes: the same step body (zero_grad .. optimizer step) in both loops, timed
    # per step; everything else is the loop's own (fetching the batch, hooks, bookkeeping).
    batch = cfg.data.batch_size
    print("per step, epoch 2 (us; means over all runs): step time = body (zero_grad .. opt.step) + the loop's own")
    for name, times in bodies.items():
        step_us = statistics.mean(batch / v for v in runs[name]) * 1e6
        body_us = statistics.mean(times) * 1e6
        print(f"  {name:24s} step {step_us:7.0f} = body {body_us:7.0f} + loop {step_us - body_us:5.0f}")


if __name__ == "__main__":
    main()
