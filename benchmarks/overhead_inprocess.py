"""Framework overhead measured in one process: vanilla loop, bare LightningModule and psgd, interleaved.

    python benchmarks/overhead_inprocess.py --data-root ../shared/data --repeats 4

compare.py's overhead section starts a fresh process per run; on a 2-core machine that adds a few
per cent of run-to-run spread. Here the three loops (the same ones as in compare.py: same data path,
model, optimizer, threads; epoch 2 timed) alternate A B C A B C ... inside one process, so they see the
same allocator, caches and clock. Prints samples/s per run, medians and the step-time ratios.
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
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    import tempfile

    from hydra import compose, initialize_config_dir

    from psgd.run import train

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    over = [f"data.root={args.data_root}", "quiet=true", *compare.psgd_overhead_overrides(args.threads)]
    with initialize_config_dir(config_dir=str(compare.ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=over)
    with tempfile.TemporaryDirectory() as tmp:
        configs = {
            "vanilla loop": lambda i: compare.vanilla(args.data_root, args.threads, fixed_batch=False),
            "bare LightningModule": lambda i: compare.bare_lightning(args.data_root, args.threads),
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


if __name__ == "__main__":
    main()
