"""Where a lab-CNN step's time goes, phase by phase, in psgd's run and in the minimal vanilla loop.

    python benchmarks/step_phases.py --data-root ../shared/data   # ~2 min; results/step_phases.{json,md}

compare.py's paired overhead measurement with each step cut into phases: psgd's real run (train.py's
default config, no validation) with, after every --chunk of its steps, --chunk steps of the vanilla
loop in the same process and thread (a copy of the warmed-up net, its own SGD and pass over the same
batches). psgd's phases are timed from Lightning's own hooks, the vanilla loop's inline:

- next batch + loop: psgd from one step's on_train_batch_end to the next step's training_step, which
  holds Lightning's end-of-batch bookkeeping, the fetch of the next batch (prefetched), the batch
  hooks and the automatic-optimization set-up (closure, LightningOptimizer.step, the precision
  plugin); vanilla: the loader's next batch;
- forward + loss: inside training_step (psgd: the module's forward, the loss, the training-metric
  counting);
- zero_grad: psgd from training_step's end to on_before_backward (the closure's result, zero_grad
  through the module hook, the backward dispatch);
- backward: on_before_backward to on_after_backward;
- optimizer step: psgd from on_after_backward to on_train_batch_end (the optimizer step inside
  LightningOptimizer.step, the gradient-clipping check, the loop's step counters).

The timing hooks are four more per-step hook calls in psgd's run, so its total here is a little above
its paired overhead. Epoch 1 is warm-up; means per step over the --epochs after it, medians over
--repeats runs.
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytorch_lightning as L
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402

PHASES = ["next batch + loop", "forward + loss", "zero_grad", "backward", "optimizer step"]


class Phases(L.Callback):
    """Times psgd's steps phase by phase and, after every `chunk` of them, `chunk` vanilla steps."""

    def __init__(self, cfg, chunk: int):
        self.cfg, self.chunk = cfg, chunk
        self.psgd = {p: [] for p in PHASES}
        self.vanilla = {p: [] for p in PHASES}
        self.t: dict[str, float] = {}
        self.on, self.end = False, None

    def on_train_epoch_start(self, trainer, module):
        self.on, self.end = trainer.current_epoch >= 1, None
        if trainer.current_epoch == 1:
            self.side = compare.VanillaSide(self.cfg, module, trainer.datamodule)
            training_step, t = module.training_step, self.t

            def timed_training_step(*args, **kwargs):
                t["forward"] = time.perf_counter()
                out = training_step(*args, **kwargs)
                t["forward end"] = time.perf_counter()
                return out

            module.training_step = timed_training_step  # Lightning calls the instance's attribute

    def on_before_backward(self, trainer, module, loss):
        self.t["backward"] = time.perf_counter()

    def on_after_backward(self, trainer, module):
        self.t["step"] = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        now, t = time.perf_counter(), self.t
        if not self.on:
            return
        if self.end is not None:  # every step of the epoch but its first
            seconds = [t["forward"] - self.end, t["forward end"] - t["forward"]]
            seconds += [t["backward"] - t["forward end"], t["step"] - t["backward"], now - t["step"]]
            for phase, s in zip(PHASES, seconds, strict=True):
                self.psgd[phase].append(s)
        if (batch_idx + 1) % self.chunk == 0:
            self.vanilla_chunk()
        self.end = time.perf_counter()  # after a vanilla chunk: the rest of Lightning's step counts as psgd's

    def vanilla_chunk(self):
        """compare.vanilla_step's ops, timed phase by phase, in Lightning's order (forward, zero_grad,
        backward, step; vanilla_step zeroes first: the order measured within the noise, benchmarks/README.md)."""
        side, clock = self.side, time.perf_counter
        for _ in range(self.chunk):
            a = clock()
            x, y = side.next_batch()
            b = clock()
            loss = F.cross_entropy(side.net(x), y)
            c = clock()
            side.opt.zero_grad(set_to_none=True)
            d = clock()
            loss.backward()
            e = clock()
            side.opt.step()
            f = clock()
            for phase, s in zip(PHASES, (b - a, c - b, d - c, e - d, f - e), strict=True):
                self.vanilla[phase].append(s)


def run(data_root: str, threads: int, chunk: int, epochs: int, overrides=()) -> dict:
    """One psgd run with its phases timed: mean microseconds per step of each phase, both loops."""
    from psgd.run import train

    cfg = compare.psgd_overhead_cfg(data_root, threads, epochs + 1, overrides)
    phases = Phases(cfg, chunk)
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", callbacks=[phases])
    means = {
        loop: {p: statistics.fmean(v) * 1e6 if v else float("nan") for p, v in times.items()}
        for loop, times in (("psgd", phases.psgd), ("vanilla", phases.vanilla))
    }
    return {"steps": {"psgd": len(phases.psgd[PHASES[0]]), "vanilla": len(phases.vanilla[PHASES[0]])}, **means}


def main() -> None:
    parser = compare.chunked_arguments(
        __doc__, epochs=2, repeats=3, chunk_help="psgd steps, then as many vanilla steps"
    )
    args = compare.parse_chunked(parser)

    over = [f"data.batch_size={args.batch_size}"]
    runs = [run(args.data_root, args.threads, args.chunk, args.epochs, over) for _ in range(args.repeats)]
    if any(min(r["steps"].values()) == 0 for r in runs):
        sys.exit(f"step_phases: no vanilla step was timed; an epoch needs at least --chunk={args.chunk} batches")
    med = {loop: {p: statistics.median(r[loop][p] for r in runs) for p in PHASES} for loop in ("psgd", "vanilla")}
    total = {loop: sum(med[loop].values()) for loop in med}
    date = time.strftime("%Y-%m-%d")
    md = [
        f"A lab-CNN step phase by phase, batch {args.batch_size}, {args.threads} threads: mean us per step, "
        f"medians of {args.repeats} runs ({date})",
        "",
        "| phase | psgd's run | vanilla loop | psgd − vanilla | share of the difference |",
        "|---|---|---|---|---|",
    ]
    gap = total["psgd"] - total["vanilla"]
    for p in PHASES:
        diff = med["psgd"][p] - med["vanilla"][p]
        md.append(f"| {p} | {med['psgd'][p]:.0f} | {med['vanilla'][p]:.0f} | {diff:+.0f} | {diff / gap:.0%} |")
    md.append(f"| **step** | **{total['psgd']:.0f}** | **{total['vanilla']:.0f}** | **{gap:+.0f}** | 100% |")
    md += ["", f"step time ratio psgd / vanilla: {total['psgd'] / total['vanilla']:.3f}"]
    compare.report(args, "step_phases", date, md, phases=PHASES, median_us=med, total_us=total, runs=runs)


if __name__ == "__main__":
    main()
