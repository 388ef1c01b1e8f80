"""What a training loop costs per step by itself, in microseconds: a model that costs nothing.

    python benchmarks/step_overhead.py     # ~40 s; results/step_overhead.{json,md}; --repeats, --steps

A one-layer model (8 -> 2) on batches already in memory, one thread, so that a step is almost all
loop: the minimal vanilla loop (zero_grad, forward, backward, SGD step), Lightning's loop with the
smallest LightningModule as a user would write it, the same with psgd's two per-step fixes
(psgd.profiler.NoProfiler, and Classifier's plain write of the `_current_fx_name` Lightning sets
around every hook call), psgd's Classifier itself (those fixes plus its training-metric counting),
and Lightning's manual optimization (the alternative to automatic optimization psgd did not adopt).
The lab CNN's real step takes ~9 ms on 2 threads (compare.py's overhead section): dividing the
extra microseconds by that gives the share of a real step each loop costs. Runs alternate
A B C ... and medians are printed; the figures vary little between runs (a few us).
"""

import argparse
import functools
import json
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

import pytorch_lightning as L
import torch
import torch.nn.functional as F

from psgd.hooks import PlainHookName
from psgd.module import Classifier
from psgd.profiler import NoProfiler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  (the same lean Trainer as compare.py's bare LightningModule)


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(steps)]


class Loader:
    def __init__(self, data):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self):
        return iter(self.data)


def sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def vanilla(data) -> float:
    net = torch.nn.Linear(8, 2)
    opt = sgd(net.parameters())
    for _ in range(2):  # the second pass is timed, as for the Lightning loops
        start = time.perf_counter()
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            opt.step()
    return (time.perf_counter() - start) / len(data) * 1e6


class Bare(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return sgd(self.parameters())


class BareFastAttr(PlainHookName, Bare):  # what psgd's Classifier does
    pass


class Manual(BareFastAttr):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        opt.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        opt.step()
        return loss


def lightning(data, module_factory, profiler=None) -> float:
    seconds, batches = compare.time_second_epoch(module_factory(), profiler, train_dataloaders=Loader(data))
    return seconds / batches * 1e6


def psgd_classifier() -> Classifier:
    return Classifier(torch.nn.Linear(8, 2), functools.partial(torch.optim.SGD, momentum=0.9), lr=0.01, num_classes=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=compare.positive, default=3000)
    parser.add_argument("--repeats", type=compare.positive, default=3)
    compare.results_arguments(parser)
    args = parser.parse_args()
    compare.exit_unless_writable(args.results)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*val_dataloader.*")  # Classifier has a validation_step; no val data here
    torch.set_num_threads(1)
    data = batches(args.steps)
    configs = {
        "vanilla loop": lambda: vanilla(data),
        "Lightning, smallest LightningModule": lambda: lightning(data, Bare),
        "  + psgd's NoProfiler": lambda: lightning(data, Bare, NoProfiler()),
        "  + plain _current_fx_name write": lambda: lightning(data, BareFastAttr, NoProfiler()),
        "psgd's Classifier (+ metric counting)": lambda: lightning(data, psgd_classifier, NoProfiler()),
        "manual optimization (not adopted)": lambda: lightning(data, Manual, NoProfiler()),
    }
    runs: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(args.repeats):  # A B C ... A B C ...
        for name, go in configs.items():
            runs[name].append(go())
    base = statistics.median(runs["vanilla loop"])
    rows = [(name, statistics.median(v), statistics.median(v) - base, v) for name, v in runs.items()]
    print(f"{'loop':40s} {'us/step':>8s} {'+us vs vanilla':>15s}   runs")
    for name, med, extra, v in rows:
        print(f"{name:40s} {med:8.1f} {extra:15.1f}   {' '.join(f'{x:.0f}' for x in v)}")
    results = args.results
    date = time.strftime("%Y-%m-%d")
    settings = {**vars(args), "results": str(results)}
    record = json.dumps({"date": date, "args": settings, "us_per_step": runs}, indent=2) + "\n"
    md = [f"Per-step loop cost, one-layer model, 1 thread, {args.steps} steps, medians of {args.repeats} ({date})", ""]
    md += ["| loop | us/step | + us vs vanilla |", "|---|---|---|"]
    md += [f"| {name.strip()} | {med:.1f} | {extra:.1f} |" for name, med, extra, _ in rows]
    compare.write_results(results, "step_overhead", record, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
