"""What one training step costs on the GPU, with no framework and no data path: the ceiling that
benchmarks/gpu.py's psgd runs are read against.

    python benchmarks/gpu_step.py                      # needs CUDA; ~1 min on one H200
    python benchmarks/gpu_step.py --device cpu --steps 3 --models "lab CNN"   # a smoke test of the script

For the lab CNN and the WideResNet (psgd's own models, channels_last, 1x28x28 inputs as on MNIST and
FashionMNIST) and psgd's default SGD, a bare loop (zero_grad, forward, cross-entropy, backward, SGD
step) trains on one batch already on the device; samples/s over `--steps` steps after a warm-up, with
the device synchronised before and after. Variants: fp32 and bf16 autocast, cuDNN's autotuner
(torch.backends.cudnn.benchmark) off and on, and batch 128 (gpu.py's) and 1024: a step that takes as
long at 1024 as at 128 is bound by launching kernels from Python, not by the GPU. FLOP per sample are
counted with torch.utils.flop_counter (forward and backward), so each row also gives the TFLOP/s the
step achieved. Results go to benchmarks/results/<name>.json and .md.

`--modes` adds ways of running the same step, to see what launching kernels costs: `compile` (the
network through torch.compile, as psgd's `compile=true`: fused kernels, still launched one by one),
`reduce-overhead` (torch.compile replaying its forward and backward as CUDA graphs, as psgd's
`compile=reduce-overhead`) and `cuda-graph` (the whole step, optimizer included, captured once as one
CUDA graph and replayed: no Python and no launches per kernel, the ceiling of any framework).

    python benchmarks/gpu_step.py --models "lab CNN" --modes eager compile reduce-overhead cuda-graph
"""

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (  # noqa: E402
    exit_unless_writable,
    flop_per_sample,
    positive,
    results_arguments,
    table,
    train_cfg,
    write_results,
)

MODELS = {"lab CNN": ("lab_cnn", "mnist"), "WideResNet": ("wide_resnet", "fashion_mnist")}
MODES = ("eager", "compile", "reduce-overhead", "cuda-graph")


def build(model: str, overrides=()):
    """The composed config of `model` on its dataset (plus `overrides`), the network and its image size."""
    from psgd.run import build_model

    name, data = MODELS[model]
    cfg = train_cfg([f"model={name}", f"data={data}", *overrides])
    net, size = build_model(cfg.model, cfg.data.name)
    return cfg, net, size


def resident(model: str, batch: int, device: str, overrides=()):
    """The bare step's pieces: psgd's network (channels_last, in training mode) on `device`, the config's
    optimizer (the default SGD, or what `overrides` make it, built as psgd builds it), and one random batch
    (x, y) of `batch` samples resident there."""
    import torch
    from hydra.utils import instantiate

    torch.manual_seed(0)
    cfg, net, size = build(model, overrides)
    net = net.to(device, memory_format=torch.channels_last).train()
    x = torch.randn(batch, 1, size, size, device=device).contiguous(memory_format=torch.channels_last)
    optimizer = instantiate(cfg.optimizer, _convert_="all")(net.parameters())
    return net, optimizer, x, torch.randint(0, 10, (batch,), device=device)


def measure(model: str, batch: int, bf16: bool, autotune: bool, steps: int, device: str, mode: str = "eager") -> dict:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = autotune
    net, opt, x, y = resident(model, batch, device)
    flop = flop_per_sample(net, x, y)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    # (a CUDA graph's capture must not keep autocast's casts cached from outside it)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=bf16, cache_enabled=mode != "cuda-graph")
    if mode in ("compile", "reduce-overhead"):
        net.compile(mode=None if mode == "compile" else mode)  # in place: as psgd's compile=... does

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()

    started = time.perf_counter()
    if mode == "cuda-graph":  # warm up on a side stream, then capture the whole step once
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(3, steps // 10)):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            with autocast:
                loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
        step = graph.replay  # the gradients are overwritten (not accumulated) in each replay
    for _ in range(max(3, steps // 10)):  # warm-up: compilation, the autotuner's trials, the allocator
        step()
    sync()
    warm_up_s = time.perf_counter() - started
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    seconds = time.perf_counter() - start
    per_s = steps * batch / seconds
    return {
        "model": model,
        "batch": batch,
        "precision": "bf16 autocast" if bf16 else "fp32",
        "cudnn.benchmark": autotune,
        "mode": mode,
        "warm_up_s": round(warm_up_s, 1),
        "samples_per_s": round(per_s, 1),
        "ms_per_step": round(1000 * seconds / steps, 3),
        "gflop_per_sample": round(flop / 1e9, 4),
        "tflop_per_s": round(per_s * flop / 1e12, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--steps", type=positive, default=100, help="timed steps per row")
    parser.add_argument("--batches", type=positive, nargs="+", default=[128, 1024])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument(
        "--modes", nargs="+", choices=MODES, default=["eager"], help="see above; CUDA only but for eager and compile"
    )
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    parser.add_argument("--autotune", nargs="+", choices=["off", "on"], default=["off", "on"], help="cuDNN's autotuner")
    results_arguments(parser, "gpu_step")
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "gpu_step.py: error: --device cuda, but torch sees no CUDA device here; pass --device cpu "
                    "to smoke-test the script\n")  # fmt: skip
    if args.device == "cpu" and {"reduce-overhead", "cuda-graph"} & set(args.modes):
        parser.exit(2, "gpu_step.py: error: --modes reduce-overhead and cuda-graph capture CUDA graphs: they need "
                    "--device cuda\n")  # fmt: skip
    exit_unless_writable(args.results)
    from gpu import device_name

    rows = []
    grid = itertools.product(
        args.models,
        args.batches,
        [p == "bf16" for p in args.precisions],
        [a == "on" for a in args.autotune],
        args.modes,
    )
    for model, batch, bf16, autotune, mode in grid:
        rows.append(measure(model, batch, bf16, autotune, args.steps, args.device, mode))
        print(json.dumps(rows[-1]), flush=True)
    device = device_name("gpu" if args.device == "cuda" else "cpu")
    keys = ["model", "batch", "precision", "cudnn.benchmark", "mode", "samples_per_s", "ms_per_step", "tflop_per_s"]
    title = f"### {device}, {time.strftime('%Y-%m-%d')}: a bare training step on one resident batch"
    md = [title, "", table([[str(r[k]) for k in keys] for r in rows], keys), ""]
    flop = {r["model"]: r["gflop_per_sample"] for r in rows}
    md += ["; ".join(f"{m}: {g} GFLOP per training sample (forward and backward)" for m, g in flop.items()), ""]
    print("\n".join(md))
    out = {"date": time.strftime("%Y-%m-%d"), "device": device, "steps": args.steps, "rows": rows}
    write_results(args.results, args.name, json.dumps(out, indent=2) + "\n", "\n".join(md))


if __name__ == "__main__":
    main()
