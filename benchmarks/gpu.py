"""The GPU figures: lab CNN and WideResNet samples/s with the dataset resident on the GPU
(`data.on_device=true`) against host batches, fp32 against bf16 autocast
(`trainer.precision=bf16-mixed`), and DDP over NCCL on the one GPU (`strategy.ddp_for_one_worker=true`,
a one-process group) against the same run without DDP, psgd's fused SGD update (`optimizer.fused=true`,
the default) against torch's per-tensor loop, and cuDNN's autotuner (`trainer.benchmark=true`)
against bf16 without it, and, on request (--variants), the network through torch.compile
(`compile=true`; `compile=reduce-overhead`: its forward and backward replayed as CUDA graphs) against
eager.

    python benchmarks/gpu.py --data-root ../shared/data                   # needs CUDA; ~17 min on one H200 (estimated)
    python benchmarks/gpu.py --data-root DIR --accelerator cpu --epochs 1 --limit-batches 5 --repeats 1
                                                                          # the same runs on CPU: a smoke test
    python benchmarks/gpu.py --data-root ../shared/data --accelerator cpu --models "lab CNN" --name cpu_bf16
                                                                          # the CPU's own figures, ~4.5 min
On CPU, data.on_device has no effect (that ratio is ~1) and the one-process DDP group is gloo; the
bf16 ratio is the CPU's own: on CPUs with AMX or AVX512-BF16, autocast runs the convolutions in bf16.

Each run is one `train.py` job in a fresh process: lab CNN on MNIST, WideResNet on FashionMNIST, batch
128, `--epochs` epochs without validation; its last epoch's samples/s (metrics.json, training only) is
the figure. Runs are interleaved (A B C ... A B C ...), medians of `--repeats`. Results go to
benchmarks/results/<name>.json and .md, with the device and the date.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
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

MODELS = {"lab CNN": ["model=lab_cnn", "data=mnist"], "WideResNet": ["model=wide_resnet", "data=fashion_mnist"]}
VARIANTS = {  # name: train.py overrides
    "host batches, fp32": ["data.on_device=false"],
    "on device, fp32": ["data.on_device=true"],
    "on device, bf16 autocast": ["data.on_device=true", "trainer.precision=bf16-mixed"],
    "on device, bf16 autocast, cuDNN autotuner": [
        "data.on_device=true",
        "trainer.precision=bf16-mixed",
        "trainer.benchmark=true",
    ],
    "on device, fp32, per-tensor SGD": ["data.on_device=true", "optimizer.fused=false"],
    "on device, fp32, DDP (1 process)": ["data.on_device=true", "strategy.ddp_for_one_worker=true"],
    "on device, fp32, compile=true": ["data.on_device=true", "compile=true"],
    "on device, fp32, compile=reduce-overhead": ["data.on_device=true", "compile=reduce-overhead"],
    "on device, bf16 autocast, compile=reduce-overhead": [
        "data.on_device=true",
        "trainer.precision=bf16-mixed",
        "compile=reduce-overhead",
    ],
}
RATIOS = [  # (what, numerator variant, denominator variant)
    ("dataset on the device / batches made on the host", "on device, fp32", "host batches, fp32"),
    ("bf16 autocast / fp32", "on device, bf16 autocast", "on device, fp32"),
    ("fused update / torch's per-tensor SGD (fp32)", "on device, fp32", "on device, fp32, per-tensor SGD"),
    ("DDP (one process) / no DDP", "on device, fp32, DDP (1 process)", "on device, fp32"),
    ("cuDNN autotuner / without (bf16)", "on device, bf16 autocast, cuDNN autotuner", "on device, bf16 autocast"),
    ("compile=true / eager (fp32)", "on device, fp32, compile=true", "on device, fp32"),
    ("compile=reduce-overhead / eager (fp32)", "on device, fp32, compile=reduce-overhead", "on device, fp32"),
    ("compile=reduce-overhead / eager (bf16)", "on device, bf16 autocast, compile=reduce-overhead",
     "on device, bf16 autocast"),
]  # fmt: skip


def device_name(accelerator: str) -> str:
    import torch

    from psgd.environment import device_description  # as every run's metrics.json names its device

    cuda = f", CUDA {torch.version.cuda}" if accelerator == "gpu" else ""
    return f"{device_description(accelerator)}{cuda}, torch {torch.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--accelerator", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--epochs", type=positive, default=2, help="the last one is measured")
    parser.add_argument("--limit-batches", type=positive, default=None, help="training batches per epoch (default all)")
    parser.add_argument("--repeats", type=positive, default=3)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        metavar="RUN",
        help="the runs of each model (default all but the compiled ones, measured for the lab CNN only): "
        + "; ".join(VARIANTS),
    )
    results_arguments(parser, "gpu")
    args = parser.parse_args()
    # the compiled runs on request (each compiles for ~20-40 s; on CPU compile=reduce-overhead is refused)
    args.variants = args.variants or [v for v in VARIANTS if "compile" not in v]
    if args.accelerator == "gpu":
        import torch

        if not torch.cuda.is_available():
            parser.exit(2, "gpu.py: error: --accelerator gpu, but torch sees no CUDA device here; run it on a GPU "
                        "machine, or pass --accelerator cpu to smoke-test the runs\n")  # fmt: skip
    exit_without_data(args.data_root, tuple(dict.fromkeys(MODELS[m][1].split("=")[1] for m in args.models)))
    exit_unless_writable(args.results)

    common = [
        f"trainer.accelerator={args.accelerator}",
        f"trainer.max_epochs={args.epochs}",
        "trainer.limit_val_batches=0",
        "data.batch_size=128",
    ]
    if args.limit_batches is not None:
        common.append(f"trainer.limit_train_batches={args.limit_batches}")
    configs = {(m, v): [*MODELS[m], *VARIANTS[v], *common] for m in args.models for v in args.variants}
    failed: list[str] = []  # a failed run is said in its row and the exit status; the others are measured

    def measured(tmp: str, i: int, config: tuple[str, str], overrides: list[str]):
        def go(rep: int) -> float:
            m = psgd_run(Path(tmp) / f"{rep}-{i}", overrides, args)
            want = "DDPStrategy" if "DDP" in config[1] else "auto"
            if m["lightning_strategy"] != want:  # the run must be what its row says
                raise SystemExit(f"gpu.py: {config} ran with {m['lightning_strategy']}, not {want}")
            return m["history"][-1]["samples_per_s"]

        return go

    with tempfile.TemporaryDirectory() as tmp:  # interleaved: A B C ... A B C ...
        named = {", ".join(c): c for c in configs}  # (interleaved prints and keys its runs by name)
        by_name = interleaved(
            {name: measured(tmp, i, c, configs[c]) for i, (name, c) in enumerate(named.items())}, args.repeats, failed
        )
    samples = {c: by_name[name] for name, c in named.items()}
    med = medians(samples)
    rows = [[*config, median, runs] for config, median, runs in sample_rows(samples)]  # (model, run) keys
    ratios = [
        [m, what, shown(med[(m, a)] / med[(m, b)] if (m, a) in med and (m, b) in med else None, ".2f")]
        for m in args.models
        for what, a, b in RATIOS
        if a in args.variants and b in args.variants
    ]
    device = device_name(args.accelerator)
    title = f"### {device}, {time.strftime('%Y-%m-%d')}: samples/s, batch 128, epoch {args.epochs} of {args.epochs}"
    md = [title, "", table(rows, ["model", "run", "samples/s (median)", "runs"]), ""]
    md += [table(ratios, ["model", "ratio", "value"]), ""]
    print("\n".join(md))
    out = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "date": time.strftime("%Y-%m-%d"),
        "device": device,
        "samples": {f"{m} | {v}": s for (m, v), s in samples.items()},
        "median": {f"{m} | {v}": s for (m, v), s in med.items()},
        "ratios": {f"{r[0]} | {r[1]}": None if r[2] == "failed" else float(r[2]) for r in ratios},
        "failed": failed,
    }
    write_results(args.results, args.name, json.dumps(out, indent=2) + "\n", "\n".join(md))
    if failed:  # written with the rest; the exit status says some figures are missing
        raise SystemExit(f"gpu.py: {len(failed)} run(s) failed, the first: {failed[0]}")


if __name__ == "__main__":
    main()
