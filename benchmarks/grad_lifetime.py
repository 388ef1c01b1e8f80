"""When a step's gradients are freed, and what it costs a lab-CNN step on the CPU.

    python benchmarks/grad_lifetime.py --data-root ../shared/data   # ~8 min; results/grad_lifetime.{json,md}

Lightning's automatic optimization zeroes the gradients inside each step's closure, after that
step's forward; a hand-written loop zeroes them before it. So under Lightning the last step's
gradients stay allocated through the forward, and zero_grad runs right after the forward's
convolutions. psgd's Classifier zeroes them at the end of each batch that stepped the optimizer and
leaves Lightning's zeroing nothing to do (psgd.module, optimizer_step). Two measurements, each in one
process and thread:

- minimal loop: the vanilla step (compare.vanilla_step) beside two variants of it, chunks of --chunk
  steps in rotation (A B C, then C B A, ...), each variant with its own copy of the lab CNN and its own
  pass over psgd's batches: zero_grad(set_to_none) after the forward (Lightning's place), and
  zero_grad(set_to_none=False) before it (the gradients kept and zeroed in place). Each variant's
  chunk time over the vanilla step's next to it, the median over --pairs rotations;
- psgd's run (train.py's default config, no validation) with its zeroing and Lightning's in turn,
  switched every --chunk steps (LightningModule's own optimizer_step and optimizer_zero_grad on the
  module), each chunk followed by --chunk minimal-loop steps as in compare.py's paired overhead:
  psgd's paired overhead with each zeroing, the median over its chunks, over --epochs after one of
  warm-up.

Medians over --repeats runs of each. The runs: benchmarks/README.md, "Where zero_grad frees the gradients".
"""

import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytorch_lightning as L
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402

VARIANTS = {
    "zero_grad before the forward (the minimal loop)": "before",
    "zero_grad after the forward (Lightning's place)": "after",
    "zero_grad in place (set_to_none=False) before the forward": "in place",
}


def variant_step(net, opt, where: str):
    """The minimal loop's step with its zero_grad `where` ("before", "after", "in place")."""
    if where == "before":
        return compare.vanilla_step(net, opt)

    def step(x, y):
        if where == "in place":
            opt.zero_grad(set_to_none=False)
            F.cross_entropy(net(x), y).backward()
        else:
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
        opt.step()

    return step


def minimal_loop(data_root: str, threads: int, chunk: int, pairs: int, overrides=()) -> dict:
    """The three variants in rotation; each variant's median chunk-time ratio to the minimal loop's."""
    cfg, net, data = compare.lab_cnn_setup(data_root, threads, overrides)
    data.prepare_data()
    data.setup("fit")
    loader = data.train_dataloader()
    sides = {}
    for name, where in VARIANTS.items():
        own = copy.deepcopy(net)
        sides[name] = {"step": variant_step(own, compare.sgd(cfg, own.parameters()), where), "batches": iter(())}

    def next_batch(side):
        for batch in side["batches"]:
            return batch
        side["batches"] = iter(loader)
        return next(side["batches"])

    def run_chunk(side) -> float:
        start = time.perf_counter()
        for _ in range(chunk):
            side["step"](*next_batch(side))
        return time.perf_counter() - start

    names = list(VARIANTS)
    for _ in range(2):  # warm-up: allocator, oneDNN kernels
        for name in names:
            run_chunk(sides[name])
    ratios = {name: [] for name in names[1:]}
    seconds = {name: 0.0 for name in names}
    for i in range(pairs):
        took = {name: run_chunk(sides[name]) for name in (names if i % 2 == 0 else names[::-1])}
        for name in names:
            seconds[name] += took[name]
        for name in names[1:]:
            ratios[name].append(took[name] / took[names[0]])
    out = {names[0]: {"median": 1.0, "sum_ratio": 1.0, "us_per_step": seconds[names[0]] / pairs / chunk * 1e6}}
    for name in names[1:]:
        out[name] = {
            "median": statistics.median(ratios[name]),
            "sum_ratio": seconds[name] / seconds[names[0]],
            "us_per_step": seconds[name] / pairs / chunk * 1e6,
        }
    return out


def lightnings_zeroing(module: L.LightningModule) -> dict:
    """The module's instance attributes that give it Lightning's own zeroing: LightningModule's
    optimizer_step (no zeroing after it, so psgd's on_train_batch_end has none to do) and
    optimizer_zero_grad (zero_grad inside the closure, after the forward)."""
    return {
        "optimizer_step": L.LightningModule.optimizer_step.__get__(module),
        "optimizer_zero_grad": L.LightningModule.optimizer_zero_grad.__get__(module),
    }


class Toggled(compare.PairedChunks, L.Callback):
    """psgd's run with its own zeroing in even chunks and Lightning's in odd ones; after every chunk, as
    many minimal-loop steps. Keeps (psgd's zeroing, psgd seconds, minimal-loop seconds) per chunk."""

    psgds_zeroing = True

    def set_up(self, trainer, module):
        self.lightnings = lightnings_zeroing(module)

    def switch(self, trainer, module, batch_idx):
        self.psgds_zeroing = (batch_idx // self.chunk) % 2 == 0
        for name, hook in self.lightnings.items():  # Lightning calls the instance's attribute
            if self.psgds_zeroing:
                vars(module).pop(name, None)  # psgd's own, from its class
            else:
                setattr(module, name, hook)
        return self.psgds_zeroing


PSGD_ROWS = {
    True: "psgd as it is (gradients zeroed at the end of the batch that stepped)",
    False: "psgd with Lightning's zeroing (after the next forward)",
}


def psgd_run(data_root: str, threads: int, chunk: int, epochs: int, overrides=()) -> dict:
    """psgd's paired overhead with its zeroing and Lightning's: per-chunk ratio medians and ratios of sums."""
    from psgd.run import train

    cfg = compare.psgd_overhead_cfg(data_root, threads, epochs + 1, overrides)
    toggled = Toggled(cfg, chunk)
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", callbacks=[toggled])
    out = {}
    for psgds, name in PSGD_ROWS.items():
        rows = [(ours, theirs) for f, ours, theirs in toggled.rows if f == psgds]
        if not rows:
            sys.exit(f"grad_lifetime: no chunk was timed; an epoch needs at least 3 x --chunk={chunk} batches")
        out[name] = {
            "median": statistics.median(ours / theirs for ours, theirs in rows),
            "sum_ratio": sum(o for o, _ in rows) / sum(t for _, t in rows),
            "chunks": len(rows),
        }
    return out


def main() -> None:
    parser = compare.chunked_arguments(__doc__, epochs=4, repeats=2)
    parser.add_argument("--pairs", type=compare.positive, default=100, help="rotations of the minimal-loop variants")
    args = compare.parse_chunked(parser)

    over = [f"data.batch_size={args.batch_size}"]
    loops, psgds = [], []
    for _ in range(args.repeats):
        loops.append(minimal_loop(args.data_root, args.threads, args.chunk, args.pairs, over))
        psgds.append(psgd_run(args.data_root, args.threads, args.chunk, args.epochs, over))
    date = time.strftime("%Y-%m-%d")
    md = [
        f"When a lab-CNN step's gradients are freed: batch {args.batch_size}, {args.threads} threads, chunks of "
        f"{args.chunk} steps; medians of {args.repeats} runs, each run's figure in brackets ({date})",
        "",
        "| loop | step time ÷ the minimal loop's (median of pairs) | ratio of sums |",
        "|---|---|---|",
    ]

    def row(name: str, runs: list[dict]) -> str:
        med = [r[name]["median"] for r in runs]
        sums = [r[name]["sum_ratio"] for r in runs]
        each = ", ".join(f"{m:.3f}" for m in med)
        return f"| {name} | **{statistics.median(med):.3f}** ({each}) | {statistics.median(sums):.3f} |"

    md += [row(name, loops) for name in VARIANTS]
    md += [row(name, psgds) for name in PSGD_ROWS.values()]
    compare.report(args, "grad_lifetime", date, md, minimal_loop=loops, psgd=psgds)


if __name__ == "__main__":
    main()
