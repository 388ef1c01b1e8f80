"""psgd against the scripts users write by hand, and where psgd's own time goes, measured side by side.

    python benchmarks/compare.py --data-root ../shared/data            # everything, 3 repeats
    python benchmarks/compare.py --data-root ../shared/data --only references   # the 1.5x target, ~10 min

Sections (each a table; all results also go to benchmarks/results/compare.json and compare.md):
  references  psgd vs faithful re-implementations of the reference scripts (benchmarks/references/:
              a torch DDP script with torchvision MNIST + PIL transforms + DistributedSampler, and
              pytorch/examples' mnist_hogwild), same model (lab CNN), batch 128, one thread per
              worker, 1 epoch; runs interleaved (A B A B ...) in fresh processes, medians reported.
  overhead    psgd's step time over a minimal torch loop's (zero_grad, forward, loss, backward, SGD step)
              on the same data path, model, optimizer and threads, measured paired: chunks of 25
              psgd steps alternate with 25 minimal-loop steps inside one psgd run, so the machine's
              drift hits both alike; beside it, the smallest LightningModule measured the same way
              (what Lightning's own loop costs); and the data path: chunks of minimal-loop steps on
              psgd's loader alternating with as many on one fixed in-memory batch. Targets ≤ 1.05.
  flops       the lab CNN's training FLOPs per sample (torch's FlopCounterMode) times psgd's samples/s
              (default run, epoch 2), against a fp32 matmul peak measured on the same cores.
  workers     samples/s of ddp, model_averaging and hogwild for workers 1..5, one thread per
              worker (benchmarks/throughput.py's runs; --workers-repeats 1 for a quicker pass).
  target      time to 99.0 % MNIST test accuracy with the lab CNN on all cores (psgd train.py with
              early_stop.target_acc=0.99), one run per seed (--target-seeds, default 0 1 2), median.

psgd's HogWild runs with mnist_hogwild's SGD (lr 0.01, momentum 0.5), as the reference script does. A run
that fails (a diverged one, a refused override) is said where its figure would be, the rest is measured
and written, and the exit status is 1 with the first failure's line.
"""

import argparse
import copy
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import (
    HOGWILD_SGD,
    ROOT,
    RunFailed,
    exit_unless_writable,
    exit_without_data,
    interleaved,
    medians,
    non_negative,
    positive,
    psgd_run,
    results_arguments,
    run,
    sample_rows,
    shown,
    table,
    write_results,
)

REFS = ROOT / "benchmarks" / "references"


SECTIONS = ["references", "overhead", "flops", "workers", "target"]


def writable_mnist(data_root: str, tmp: Path) -> Path:
    """torchvision's MNIST extracts the .gz files next to themselves: give it a writable copy of links."""
    raw = tmp / "refdata" / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for f in (Path(data_root) / "MNIST" / "raw").glob("*.gz"):
        if not (raw / f.name).exists():
            os.symlink(f.resolve(), raw / f.name)
    return tmp / "refdata"


# ---------------------------------------------------------------------------------------------- references
def reference_configs(args, tmp: Path) -> dict[str, callable]:
    ref_root = writable_mnist(args.data_root, tmp)
    one_epoch = ["trainer.max_epochs=1", "trainer.limit_val_batches=0", "threads_per_worker=1"]

    def ref(script: str, workers: int, extra: list[str] = ()):
        def go(i: int) -> float:
            out = tmp / f"ref-{script}-{workers}-{i}.json"
            cmd = [sys.executable, str(REFS / script), f"--data-root={ref_root}", f"--workers={workers}"]
            run([*cmd, "--threads=1", "--epochs=1", f"--result-file={out}", *extra])
            return json.loads(out.read_text())["samples_per_s"]

        return go

    def ours(strategy: str, workers: int):
        sgd = HOGWILD_SGD if strategy == "hogwild" else []  # as mnist_hogwild's; DDP's script runs psgd's defaults

        def go(i: int) -> float:
            out = tmp / f"psgd-{strategy}-{workers}-{i}"
            over = [f"strategy={strategy}", f"workers={workers}", *sgd, *one_epoch]
            return psgd_run(out, over, args)["samples_per_s"]

        return go

    return {
        "reference DDP script, 1 worker": ref("ddp_mnist.py", 1),
        "psgd ddp, 1 worker": ours("ddp", 1),
        "reference DDP script, 2 workers": ref("ddp_mnist.py", 2),
        "psgd ddp, 2 workers": ours("ddp", 2),
        "reference mnist_hogwild, 2 workers": ref("hogwild_mnist.py", 2),
        "psgd hogwild, 1 worker": ours("hogwild", 1),
        "psgd hogwild, 2 workers": ours("hogwild", 2),
        "psgd model_averaging, 1 worker": ours("model_averaging", 1),
        "psgd model_averaging, 2 workers": ours("model_averaging", 2),
    }


REFERENCE_RATIOS = [  # (what, numerator, denominator, target)
    ("psgd DDP / reference DDP, 1 worker", "psgd ddp, 1 worker", "reference DDP script, 1 worker", None),
    ("psgd DDP / reference DDP, 2 workers", "psgd ddp, 2 workers", "reference DDP script, 2 workers", 1.5),
    ("psgd HogWild / reference mnist_hogwild, 2 workers", "psgd hogwild, 2 workers",
     "reference mnist_hogwild, 2 workers", 1.5),
    ("psgd model averaging / reference DDP, 2 workers", "psgd model_averaging, 2 workers",
     "reference DDP script, 2 workers", None),
    ("psgd HogWild 2 workers / 1 worker", "psgd hogwild, 2 workers", "psgd hogwild, 1 worker", 1.8),
    ("psgd model averaging 2 workers / 1 worker", "psgd model_averaging, 2 workers",
     "psgd model_averaging, 1 worker", 1.8),
]  # fmt: skip


def reference_ratios(samples: dict[str, list[float | None]]) -> list[dict]:
    """Each REFERENCE_RATIOS row from interleaved samples: the ratio of the medians (the verdict's
    figure) and, beside it, the median of the per-round ratios: the numerator's and the denominator's
    runs of one round ran minutes apart, so a slow stretch of the machine that hits one round moves
    that round's ratio less than it moves one side's median. A failed run (None) leaves its round out
    of the paired figure; a side whose runs all failed leaves both figures None."""
    rows = []
    med = medians(samples)
    for what, a, b, target in REFERENCE_RATIOS:
        of_medians = med[a] / med[b] if a in med and b in med else None
        rounds = [x / y for x, y in zip(samples[a], samples[b], strict=True) if x is not None and y is not None]
        paired = statistics.median(rounds) if rounds else None
        rows.append({"what": what, "ratio": of_medians, "paired": paired, "target": target})
    return rows


def train_cfg(overrides=()):
    """train.py's config (conf/train.yaml) composed with `overrides`, as a run of `python train.py ...` gets it,
    on all the training samples as the reference scripts (data.val_split=0)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="train", overrides=["data.val_split=0", *overrides])


# ---------------------------------------------------------------------------------------------- overhead
def lab_cnn_setup(data_root: str, threads: int, overrides=()):
    """What the minimal loop and the smallest LightningModule share with psgd's default run: the composed
    default config (plus `overrides`), `threads` torch threads, denormals flushed, the lab CNN
    (channels_last) and psgd's datamodule."""
    import torch

    from psgd.config import build_model
    from psgd.data import ClassificationData

    cfg = train_cfg([f"data.root={data_root}", *overrides])
    torch.set_num_threads(threads)
    torch.set_flush_denormal(cfg.flush_denormal)  # as psgd's WorkerSetup does in every worker
    torch.manual_seed(0)
    net, size = build_model(cfg.model, cfg.data.name)
    net = net.to(memory_format=torch.channels_last)
    data = ClassificationData(root=data_root, batch_size=cfg.data.batch_size, image_size=size, channels_last=True)
    return cfg, net, data


def sgd(cfg, params):
    """The optimizer of every loop here: the default config's SGD (fused, as psgd's: the loops compared,
    not the optimizers)."""
    import torch

    return torch.optim.SGD(
        params, lr=cfg.optimizer.lr, momentum=cfg.optimizer.momentum, fused=cfg.optimizer.get("fused")
    )


def vanilla_step(net, opt):
    """The minimal loop's step as a function of (x, y): zero_grad, forward, loss, backward, SGD step."""
    import torch.nn.functional as F

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()

    return step


def paired_data_path(data_root: str, threads: int, chunk: int = 25, epochs: int = 3, overrides=()) -> dict:
    """The data path measured paired, in one process: the minimal loop takes `chunk` steps on psgd's
    batches (the loader, as in an epoch), then as many steps on one batch already in memory, and so
    on through `epochs` epochs after a warm-up epoch. Each epoch's start (its sampler permutation, the
    loader's iterator) is timed in its first chunk, so the summed loader time is the epochs' time.
    Returns the per-pair ratios loader / fixed batch, their median, and the ratio of the summed times
    (epoch time / the same steps on one fixed batch: the target's figure)."""
    cfg, net, data = lab_cnn_setup(data_root, threads, overrides)
    data.prepare_data()
    data.setup("fit")
    loader = data.train_dataloader()
    step = vanilla_step(net, sgd(cfg, net.parameters()))
    for x, y in loader:  # warm-up: the allocator, oneDNN's kernels
        step(x, y)
    fixed = next(iter(loader))
    pairs: list[tuple[float, float]] = []
    for epoch in range(1, epochs + 1):
        loader.sampler.set_epoch(epoch)
        start = time.perf_counter()
        batches = iter(loader)
        while True:
            taken = 0
            for x, y in itertools.islice(batches, chunk):
                step(x, y)
                taken += 1
            if not taken:
                break
            mid = time.perf_counter()
            for _ in range(taken):
                step(*fixed)
            end = time.perf_counter()
            pairs.append((mid - start, end - mid))
            start = time.perf_counter()
    return paired_figures(pairs, chunk)


def paired_figures(pairs: list[tuple[float, float]], chunk: int) -> dict:
    """Per-pair ratios of the (measured, reference) chunk times, their median and the ratio of the sums."""
    if not pairs:  # a small dataset: one line rather than statistics' "no median for empty data"
        raise SystemExit(f"compare.py: no pair of {chunk}-step chunks was timed: an epoch has fewer than {chunk} steps")
    ratios = [a / b for a, b in pairs]
    return {
        "chunk": chunk,
        "pairs": len(pairs),
        "ratios": ratios,
        "median": statistics.median(ratios),
        "sum_ratio": sum(a for a, _ in pairs) / sum(b for _, b in pairs),
    }


def bare_module(cfg, net):
    """The smallest LightningModule, as a user writes it: forward, loss, SGD."""
    import pytorch_lightning as L
    import torch.nn.functional as F

    class Bare(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return sgd(cfg, self.parameters())

    return Bare()


class VanillaSide:
    """The minimal loop run beside a Lightning run, in its process and thread: a copy of the module's
    (warmed-up) net, its own SGD and its own pass over the datamodule's training batches."""

    def __init__(self, cfg, module, datamodule):
        self.net = copy.deepcopy(module.net)
        self.opt = sgd(cfg, self.net.parameters())
        self.step = vanilla_step(self.net, self.opt)
        self.loader = datamodule.train_dataloader()
        self.batches = iter(())

    def next_batch(self):
        for b in self.batches:
            return b
        self.batches = iter(self.loader)
        return next(self.batches)


class PairedChunks:
    """A Lightning run from epoch 1 on (epoch 0 is warm-up) in chunks of `chunk` steps, each followed by as
    many minimal-loop steps (VanillaSide) in the same process and thread; mixed into an `L.Callback`
    where Lightning is imported. `rows` keeps ((epoch, first batch), Lightning seconds, minimal-loop
    seconds) per timed chunk, in order. An epoch's last chunk is timed only when the next epoch's first
    starts, so a chunk the epoch's end cut short, or the epoch's last whole one, is not."""

    def __init__(self, cfg, chunk: int):
        self.cfg, self.chunk = cfg, chunk
        self.rows: list[tuple] = []
        self.label = None

    def on_train_epoch_start(self, trainer, module):
        self.on = trainer.current_epoch >= 1
        self.start, self.vanilla_s = None, 0.0
        if trainer.current_epoch == 1:
            self.side = VanillaSide(self.cfg, module, trainer.datamodule)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.on and batch_idx % self.chunk == 0:
            now = time.perf_counter()
            if self.start is not None:  # the chunk up to here, less the minimal loop's chunk in it
                self.rows.append((self.label, now - self.start - self.vanilla_s, self.vanilla_s))
            self.start = now
            self.label = (trainer.current_epoch, batch_idx)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.on and self.start is not None and (batch_idx + 1) % self.chunk == 0:
            start = time.perf_counter()
            for _ in range(self.chunk):
                self.side.step(*self.side.next_batch())
            self.vanilla_s = time.perf_counter() - start


def lightning_loop(loop: str, data_root: str, threads: int, epochs: int, overrides=()):
    """One of the Lightning loops the overhead is measured in, not yet run: its composed config and a
    function that fits it with the given callbacks. `loop` "psgd": psgd's real run (train.py's default
    config, no validation); "bare": the smallest LightningModule (bare_module) in a Trainer with nothing
    of its own (no logger, checkpoints, progress bar, summary or validation)."""
    if loop == "bare":
        import pytorch_lightning as L

        cfg, net, data = lab_cnn_setup(data_root, threads, overrides)
        module = bare_module(cfg, net)

        def fit(callbacks: list) -> None:
            trainer = L.Trainer(
                max_epochs=epochs,
                accelerator="cpu",
                devices=1,
                logger=False,
                callbacks=callbacks,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                limit_val_batches=0,
            )
            trainer.fit(module, datamodule=data)

        return cfg, fit

    from psgd.run import train

    cfg = train_cfg([f"data.root={data_root}", "quiet=true", *psgd_overhead_overrides(threads, epochs), *overrides])

    def fit(callbacks: list) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            train(cfg, Path(tmp) / "run", callbacks=callbacks)

    return cfg, fit


def paired_overhead(
    data_root: str, threads: int, chunk: int = 25, epochs: int = 3, overrides=(), loop: str = "psgd"
) -> dict:
    """A Lightning run with the minimal loop interleaved in it: after every `chunk` Lightning steps,
    `chunk` minimal-loop steps (a copy of the model and its own SGD, its own pass over the same
    datamodule's batches) run in the same process and thread. Each pair of chunks is timed back to back,
    so the machine's drift, which moves whole runs by several per cent, hits both sides of a pair alike.
    `loop`: "psgd" or "bare", as in lightning_loop. Epoch 0 is warm-up; `epochs` more are measured
    (`overrides`: more train.py overrides, for short test runs). Returns the per-pair step-time ratios
    Lightning / minimal loop, their median, the ratio of the summed times, and which chunk each pair
    timed ("chunks": [epoch, first batch])."""
    import pytorch_lightning as L

    class Paired(PairedChunks, L.Callback):
        pass

    cfg, fit = lightning_loop(loop, data_root, threads, epochs + 1, overrides)
    paired = Paired(cfg, chunk)
    fit([paired])
    figures = paired_figures([(ours, theirs) for _, ours, theirs in paired.rows], chunk)
    return {**figures, "chunks": [list(label) for label, _, _ in paired.rows]}


def psgd_overhead_overrides(threads: int, epochs: int = 2) -> list[str]:
    """psgd's run in the overhead and FLOP/s figures: the default run, `epochs` epochs, no validation,
    `threads` torch threads."""
    return [f"trainer.max_epochs={epochs}", "trainer.limit_val_batches=0", f"threads_per_worker={threads}"]


def overhead_section(args, failed: list[str]) -> tuple[dict, list[str]]:
    """The overhead section: psgd's loop, the smallest LightningModule's and the data path, each paired
    with the minimal loop in a fresh process of its own (compare.py --inner paired-<loop>). A measurement
    that fails is `failed` in its row, its line goes to `failed`, and the others are measured."""
    paired: dict[str, dict | None] = {}
    for loop in ("psgd", "bare", "data"):
        cmd = [sys.executable, __file__, "--data-root", args.data_root, "--threads", str(args.threads)]
        what = "loader / one fixed batch" if loop == "data" else f"{loop} / vanilla"
        try:
            paired[loop] = json.loads(run([*cmd, "--inner", f"paired-{loop}"]).stdout.strip().splitlines()[-1])
        except RunFailed as e:
            paired[loop] = None
            failed.append(f"paired {what}: {e}")
            print(f"  paired chunks: {what} failed: {e}", flush=True)
            continue
        print(f"  paired chunks: {what} median {paired[loop]['median']:.3f} over {paired[loop]['pairs']}", flush=True)

    def pair(loop: str, first: str, second: str) -> str:
        p = paired[loop]
        return "failed" if p is None else f"{p[first]:.3f}; {p[second]:.3f}"

    def chunks(loop: str) -> str:
        p = paired[loop]
        return "chunks" if p is None else f"{p['pairs']} chunks of {p['chunk']}"

    def judged(loop: str, key: str) -> str:
        return "" if paired[loop] is None else verdict(paired[loop][key], 1.05, False)

    ratios = [
        [
            f"framework overhead: {chunks('psgd')} psgd steps, each followed by as many minimal-loop steps in "
            "the same process (median; ratio of sums)",
            pair("psgd", "median", "sum_ratio"),
            judged("psgd", "median"),
        ],
        [
            "  Lightning's loop, paired the same way: smallest LightningModule / minimal loop",
            pair("bare", "median", "sum_ratio"),
            "",
        ],
        [
            f"data path: {chunks('data')} minimal-loop steps on psgd's loader, each followed by as many on one "
            "fixed batch, 3 epochs in one process (ratio of sums: the epochs' time / the fixed batch's; median "
            "of the pairs)",
            pair("data", "sum_ratio", "median"),
            judged("data", "sum_ratio"),
        ],
    ]
    return {"paired": paired}, [table(ratios, ["ratio", "value", "target"]), ""]


# ---------------------------------------------------------------------------------------------- flops
def flop_per_sample(net, x, y) -> float:
    """FLOP of one training sample (forward, cross-entropy, backward) of `net` on the batch (x, y),
    counted by torch's FlopCounterMode; the gradients it leaves are cleared."""
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(net(x), y).backward()
    net.zero_grad(set_to_none=True)
    return counter.get_total_flops() / len(x)


def flops(threads: int) -> dict:
    """The lab CNN's training FLOP per sample and a fp32 matmul's FLOP/s on `threads` threads (the peak)."""
    import torch

    from psgd.models import LabCNN

    torch.set_num_threads(threads)
    net = LabCNN().to(memory_format=torch.channels_last)
    x = torch.randn(128, 1, 32, 32).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (128,))
    per_sample = flop_per_sample(net, x, y)
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    peak = 2 * n**3 / min(times)
    return {"train_flops_per_sample": per_sample, "matmul_peak_flops": peak, "threads": threads}


def flops_section(args, tmp: Path, failed: list[str]) -> tuple[dict, list[str]]:
    """psgd's default run on `args.threads` threads (samples/s of its second epoch, median of
    `args.repeats`) times the lab CNN's FLOP per sample, against the matmul peak."""

    def ours(i: int) -> float:
        return psgd_run(tmp / f"flops-{i}", psgd_overhead_overrides(args.threads), args)["history"][-1]["samples_per_s"]

    samples = interleaved({"psgd": ours}, args.repeats, failed)
    rate = medians(samples).get("psgd")
    if rate is None:
        return {"samples": samples}, ["not measured: every psgd run failed", ""]
    f = flops(args.threads)
    achieved = f["train_flops_per_sample"] * rate
    fraction = achieved / f["matmul_peak_flops"]
    f.update(samples=samples, samples_per_s=rate, achieved_flops=achieved, fraction_of_peak=fraction)
    rows = [
        ["lab CNN training FLOPs per sample", f"{f['train_flops_per_sample'] / 1e6:.2f} MFLOP", ""],
        [f"matmul peak, {args.threads} threads", f"{f['matmul_peak_flops'] / 1e9:.0f} GFLOP/s", ""],
        [f"psgd lab CNN training ({rate:.0f} samples/s)", f"{achieved / 1e9:.1f} GFLOP/s", ""],
        ["fraction of peak", f"{fraction:.1%}", verdict(fraction, 0.25)],
    ]  # fmt: skip
    return f, [table(rows, ["what", "value", "target"]), ""]


# ---------------------------------------------------------------------------------------------- target
def median_time(times: list[float | None]) -> float | None:
    """The median time to the target over runs, a run that never reached it counting as slower than
    any that did; None when at least half of the runs did not reach it."""
    med = statistics.median(math.inf if t is None else t for t in times)
    return None if math.isinf(med) else med


def time_to_target(args, tmp: Path) -> tuple[dict, list[str]]:
    """One psgd run per seed (`args.target_seeds`) with early_stop.target_acc and `args.target_overrides`;
    whether a run reaches 99.0 % within its epochs and at which epoch moves with the seed, so a single
    run says little. Returns the runs and their median (see median_time) and the markdown lines."""
    over = [f"early_stop.target_acc={args.target_acc}", "early_stop.patience=1", *args.target_overrides]
    runs = []
    for seed in args.target_seeds:
        try:
            m = psgd_run(tmp / f"target-{seed}", [*over, f"seed={seed}"], args)
        except RunFailed as e:  # said in its row; the median is over the runs that completed
            print(f"  target seed={seed}: failed: {e}", flush=True)
            runs.append({"seed": seed, "failed": str(e)})
            continue
        kept = {k: m.get(k) for k in ("time_to_target_s", "epoch_to_target", "test_acc")}
        runs.append({"seed": seed, **kept, "epoch_s": [h["epoch_s"] for h in m["history"]]})
    completed = [r for r in runs if not r.get("failed")]
    med = median_time([r["time_to_target_s"] for r in completed]) if completed else None
    reached = sum(r["time_to_target_s"] is not None for r in completed)

    def took(t, epoch=None):
        return "not reached" if t is None else f"{t:.1f} s" + (f" (epoch {epoch})" if epoch else "")

    rows = [
        [f"seed={r['seed']}", f"failed: {r['failed']}", "", "", ""] if r.get("failed") else
        [f"seed={r['seed']}", took(r["time_to_target_s"], r["epoch_to_target"]), f"{r['test_acc']:.2%}",
         " ".join(f"{e:.1f}" for e in r["epoch_s"]), ""]
        for r in runs
    ]  # fmt: skip
    target = verdict(math.inf if med is None else med, 20.0, False) if completed else ""  # not reached: missed
    failures = f", {len(runs) - len(completed)} failed" if len(completed) < len(runs) else ""
    median = took(med) if completed else "no run completed"
    rows.append([f"**median of {len(completed)}** ({reached} reached{failures})", f"**{median}**", "", "", target])
    header = ["run", "time to target", "test acc", "training seconds per epoch", "target"]
    lines = [f"`train.py {' '.join(over)} seed=S`", "", table(rows, header), ""]
    return {"overrides": over, "runs": runs, "median_s": med, "reached": reached}, lines


def verdict(value: float | None, target: float | None, higher_is_better: bool = True) -> str:
    if target is None or value is None:  # no target, or not measured (its runs failed: said in its row)
        return ""
    ok = value >= target if higher_is_better else value <= target
    return f"{'met' if ok else 'MISSED'} (target {'≥' if higher_is_better else '≤'} {target})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--repeats", type=positive, default=3)
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=SECTIONS)
    parser.add_argument(
        "--workers-repeats", type=positive, default=None, help="repeats for the workers section (default --repeats)"
    )
    parser.add_argument("--workers-list", nargs="+", type=positive, default=[1, 2, 3, 4, 5])
    parser.add_argument("--threads", type=positive, default=os.cpu_count() or 1, help="threads for overhead/flops")
    results_arguments(parser, "compare")
    parser.add_argument(
        "--target-overrides",
        nargs="*",
        default=["trainer.max_epochs=3", "model.dropout=0.1", "optimizer.lr=0.03", "trainer.val_check_interval=0.25"],
        help="train.py overrides for the time-to-99 %% runs",
    )
    parser.add_argument(
        "--target-seeds", nargs="+", type=non_negative, default=[0, 1, 2], help="one time-to-99 %% run each"
    )
    parser.add_argument("--target-acc", type=float, default=0.99, help=argparse.SUPPRESS)  # short test runs
    parser.add_argument("--inner", choices=["paired-psgd", "paired-bare", "paired-data"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner == "paired-data":
        print(json.dumps(paired_data_path(args.data_root, args.threads)))
        return
    if args.inner:
        print(json.dumps(paired_overhead(args.data_root, args.threads, loop=args.inner.removeprefix("paired-"))))
        return
    exit_without_data(args.data_root)
    exit_unless_writable(args.results)

    out: dict = {"args": vars(args), "date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count()}
    md: list[str] = []
    failed: list[str] = []  # each failed run's line: said where its figure would be, and in the exit status
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if "references" in args.only:
            print("== psgd vs the reference scripts (samples/s, 1 epoch, 1 thread per worker)", flush=True)
            samples = interleaved(reference_configs(args, tmp), args.repeats, failed)
            figures = reference_ratios(samples)
            ratios = [
                [r["what"], shown(r["ratio"], ".2f"), shown(r["paired"], ".2f"), verdict(r["ratio"], r["target"])]
                for r in figures
            ]
            out["references"] = {"samples": samples, "median": medians(samples)}
            out["reference_ratios"] = {r["what"]: r["ratio"] for r in figures}
            out["reference_ratios_paired"] = {r["what"]: r["paired"] for r in figures}
            rows = sample_rows(samples)
            md += ["### psgd vs the reference scripts", "", table(rows, ["run", "samples/s (median)", "runs"]), ""]
            header = ["ratio", "ratio of medians", "median of per-round ratios", "target (on the ratio of medians)"]
            md += [table(ratios, header), ""]
        if "overhead" in args.only:
            print(f"== framework overhead and data path ({args.threads} threads, paired in one process)", flush=True)
            out["overhead"], lines = overhead_section(args, failed)
            md += ["### Framework overhead and data path", "", *lines]
        if "flops" in args.only:
            print(f"== achieved FLOP/s ({args.threads} threads, epoch 2)", flush=True)
            out["flops"], lines = flops_section(args, tmp, failed)
            md += ["### Achieved FLOP/s", "", *lines]
        if "workers" in args.only:
            import throughput

            counts = args.workers_list
            print(f"== samples/s for workers {counts} per strategy (one thread per worker, 1 epoch)", flush=True)
            reps = args.workers_repeats or args.repeats
            targs = argparse.Namespace(data_root=args.data_root, epochs=1, batch_size=128, overrides=[])
            rows, lines = throughput.measure(["ddp", "model_averaging", "hogwild"], counts, reps, targs)
            failed += [f for r in rows for f in r["failed"]]
            out["workers"] = {"repeats": reps, "rows": rows}
            md += [f"### Samples/s per worker count (one thread per worker, medians of {reps})", "", *lines, ""]
        if "target" in args.only:
            print(f"== time to {args.target_acc:.1%} test accuracy (lab CNN, MNIST, all cores)", flush=True)
            out["target"], lines = time_to_target(args, tmp)
            failed += [f"target seed={r['seed']}: {r['failed']}" for r in out["target"]["runs"] if r.get("failed")]
            md += [f"### Time to {args.target_acc:.1%} test accuracy", "", *lines]
    out["failed"] = failed
    text = "\n".join(md) + "\n"
    print("\n" + text)
    write_results(args.results, args.name, json.dumps(out, indent=2, default=str) + "\n", text)
    if failed:  # written with the rest; the exit status says some figures are missing
        raise SystemExit(f"compare.py: {len(failed)} run(s) failed, the first: {failed[0]}")


if __name__ == "__main__":
    main()
