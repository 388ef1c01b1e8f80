"""What an optimizer's update costs per training step, by how torch runs it: its per-tensor loop (torch's
default on CPU), `foreach` (a few multi-tensor ops) and `fused` (one kernel; psgd's default for SGD and
Adam, `optimizer.fused`). The update alone, on the lab CNN's parameters with gradients set, psgd's
default settings of each optimizer, one thread; the best of `--repeats` timings of `--steps` steps.
On a GPU (`--device cuda`) each timing waits for the GPU to finish its updates.

    python benchmarks/optimizer_step.py                      # ~10 s
    python benchmarks/optimizer_step.py --models "lab CNN" WideResNet --threads 2
    python benchmarks/optimizer_step.py --device cuda --models "lab CNN" WideResNet

Results go to benchmarks/results/<name>.json and .md.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import exit_unless_writable, positive, results_arguments, table, write_results  # noqa: E402
from gpu_step import MODELS, build  # noqa: E402

OPTIMIZERS = ("sgd", "adam")
WAYS = {"per-tensor loop": {"foreach": False, "fused": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def timed_update(model: str, optimizer: str, way: str, steps: int, repeats: int, device: str = "cpu") -> float:
    """us per update: the best of `repeats` runs of `steps` updates, after as many to warm up."""
    import torch
    from hydra.utils import instantiate

    cfg, net, _ = build(model, [f"optimizer={optimizer}"])
    net = net.to(device)
    done = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    settings = {k: v for k, v in cfg.optimizer.items() if k not in ("fused", "foreach")}
    opt = instantiate(settings)(net.parameters(), **WAYS[way])
    for _ in range(steps):
        opt.step()
    best = float("inf")
    for _ in range(repeats):
        done()
        start = time.perf_counter()
        for _ in range(steps):
            opt.step()
        done()
        best = min(best, (time.perf_counter() - start) / steps)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["lab CNN"])
    parser.add_argument("--optimizers", nargs="+", choices=OPTIMIZERS, default=list(OPTIMIZERS))
    parser.add_argument("--steps", type=positive, default=200, help="updates per timing")
    parser.add_argument("--repeats", type=positive, default=5, help="timings; the best is kept")
    parser.add_argument("--threads", type=positive, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    results_arguments(parser, "optimizer_step")
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "optimizer_step.py: error: --device cuda, but torch sees no CUDA device here\n")
    exit_unless_writable(args.results)

    torch.set_num_threads(args.threads)
    rows, out = [], []
    for model in args.models:
        for optimizer in args.optimizers:
            us = {way: timed_update(model, optimizer, way, args.steps, args.repeats, args.device) for way in WAYS}
            loop = us["per-tensor loop"]
            rows.append([model, optimizer, *(f"{v:.1f}" for v in us.values()), f"{loop / us['fused']:.2f}"])
            speedup = loop / us["fused"]
            out.append({"model": model, "optimizer": optimizer, "us_per_update": us, "fused_speedup": speedup})
    head = ["model", "optimizer", *(f"{w}, us" for w in WAYS), "fused / loop speed"]
    from gpu import device_name

    where = device_name("gpu") if args.device == "cuda" else f"{args.threads} thread(s), torch {torch.__version__}"
    date, timings = time.strftime("%Y-%m-%d"), f"best of {args.repeats} x {args.steps} updates"
    title = f"### One optimizer update, {where}, {date}: {timings}"
    md = "\n".join([title, "", table(rows, head), ""])
    print(md)
    data = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "rows": out}
    write_results(args.results, args.name, json.dumps(data, indent=2) + "\n", md)


if __name__ == "__main__":
    main()
