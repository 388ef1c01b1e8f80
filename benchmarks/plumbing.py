"""What Lightning's backward and optimizer-step plumbing costs psgd's run, toggled inside one run.

    python benchmarks/plumbing.py --data-root ../shared/data   # ~2 min a repeat of 8 epochs; results/plumbing.{json,md}

psgd's run (train.py's default config, no validation), its step switched every --chunk steps, in
rotation (A B C, then C B A, ...), between:

- psgd as it is: automatic optimization, with psgd.hooks.PlainPrecision (the backward and
  optimizer-step hooks nobody implements not dispatched);
- psgd with Lightning's own 32-true precision plugin (`Precision`: those hooks and the clipping call
  dispatched around every backward and update);
- the minimal loop's step (compare.vanilla_step on psgd's network and torch's optimizer) as psgd's
  training_step, in manual optimization: no strategy call, hook or Lightning optimizer at all, which
  bounds what any change to that plumbing could win. A measurement, not an option: psgd's strategies
  and its step counter are bypassed in those chunks.

After every chunk, as many minimal-loop steps run in the same process and thread (compare.VanillaSide,
as in compare.py's paired overhead), so each chunk's step time is taken over the minimal loop's next
to it. Per arm: the median of its chunks' ratios and the ratio of the summed times; per arm besides
psgd as it is, its ratio minus psgd's in the same rotation (median, and mean with its standard error),
which the machine's drift moves least. Medians over --repeats runs of --epochs each, after one epoch
of warm-up. The runs: benchmarks/README.md, "The backward and optimizer-step hooks nobody implements".
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytorch_lightning as L
from pytorch_lightning.plugins.precision import Precision

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402

ARMS = {
    "psgd": "psgd as it is (PlainPrecision)",
    "lightning": "psgd with Lightning's precision plugin",
    "raw": "the minimal loop's step as psgd's training_step (no plumbing)",
}


class Rotation(compare.PairedChunks, L.Callback):
    """psgd's run with its step switched between ARMS every `chunk` steps, each chunk followed by as many
    minimal-loop steps. Keeps ((rotation, arm), psgd seconds, minimal-loop seconds) per chunk, in order."""

    arm = "psgd"
    chunks = 0

    def set_up(self, trainer, module):
        self.plugins = {"lightning": Precision(), "own": trainer.strategy.precision_plugin}
        raw = compare.vanilla_step(module.net, trainer.optimizers[0])
        self.raw_step = lambda batch, batch_idx: raw(*batch)

    def switch(self, trainer, module, batch_idx):
        """The next arm, in rotation. Lightning reads the module's automatic_optimization and training_step,
        and the strategy's precision plugin, at every step."""
        arms = list(ARMS)
        turn, at = divmod(self.chunks, len(arms))
        self.arm = arms[at] if turn % 2 == 0 else arms[-1 - at]
        self.chunks += 1
        trainer.strategy.precision_plugin = self.plugins["lightning" if self.arm == "lightning" else "own"]
        module.automatic_optimization = self.arm != "raw"
        vars(module).pop("training_step", None)  # psgd's own, from its class
        if self.arm == "raw":
            module.training_step = self.raw_step
        return turn, self.arm


def figures(rows: list[tuple[int, str, float, float]]) -> dict:
    """Per arm: chunks, the median chunk ratio, the ratio of sums; besides psgd's own arm, its ratio minus
    psgd's in each rotation that timed every arm (median, mean, standard error of the mean)."""
    out = {}
    for arm in ARMS:
        mine = [(ours, theirs) for _, a, ours, theirs in rows if a == arm]
        if mine:
            out[arm] = {
                "chunks": len(mine),
                "median": statistics.median(ours / theirs for ours, theirs in mine),
                "sum_ratio": sum(o for o, _ in mine) / sum(t for _, t in mine),
            }
    turns: dict[int, dict[str, float]] = {}
    for turn, arm, ours, theirs in rows:
        turns.setdefault(turn, {})[arm] = ours / theirs
    whole = [t for t in turns.values() if len(t) == len(ARMS)]
    for arm in out:
        diffs = [t[arm] - t["psgd"] for t in whole]
        if arm != "psgd" and diffs:
            out[arm]["minus_psgd"] = {
                "rotations": len(diffs),
                "median": statistics.median(diffs),
                "mean": statistics.mean(diffs),
                "sem": statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan"),
            }
    return out


def psgd_run(data_root: str, threads: int, chunk: int, epochs: int, overrides=()) -> dict:
    """One psgd run with the arms in rotation: figures() of its chunks."""
    from psgd.run import train

    cfg = compare.psgd_overhead_cfg(data_root, threads, epochs + 1, overrides)
    rotation = Rotation(cfg, chunk)
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", callbacks=[rotation])
    out = figures([(*label, ours, theirs) for label, ours, theirs in rotation.rows])
    if set(out) != set(ARMS) or "minus_psgd" not in out["raw"]:
        sys.exit(f"plumbing: no rotation timed every arm; an epoch needs at least 4 x --chunk={chunk} batches")
    return out


def main() -> None:
    args = compare.parse_chunked(compare.chunked_arguments(__doc__, epochs=8, repeats=1))

    over = [f"data.batch_size={args.batch_size}"]
    runs = [psgd_run(args.data_root, args.threads, args.chunk, args.epochs, over) for _ in range(args.repeats)]
    date = time.strftime("%Y-%m-%d")
    md = [
        f"psgd's step and Lightning's plumbing, toggled inside one run: lab CNN, batch {args.batch_size}, "
        f"{args.threads} threads, chunks of {args.chunk} steps, {args.epochs} epochs; medians of {args.repeats} "
        f"runs, each run's figure in brackets ({date})",
        "",
        "| arm | step time ÷ the minimal loop's (median of chunks) | ratio of sums | minus psgd as it is, in each "
        "rotation: median; mean ± s.e. (points) |",
        "|---|---|---|---|",
    ]
    for arm, name in ARMS.items():
        med = [r[arm]["median"] for r in runs]
        each = ", ".join(f"{m:.3f}" for m in med)
        sums = statistics.median(r[arm]["sum_ratio"] for r in runs)
        diff = "–"
        if arm != "psgd":
            d = {k: 100 * statistics.median(r[arm]["minus_psgd"][k] for r in runs) for k in ("median", "mean", "sem")}
            diff = f"{d['median']:+.2f}; {d['mean']:+.2f} ± {d['sem']:.2f}"
        md.append(f"| {name} | **{statistics.median(med):.3f}** ({each}) | {sums:.3f} | {diff} |")
    compare.report(args, "plumbing", date, md, arms=ARMS, runs=runs)


if __name__ == "__main__":
    main()
