"""What manual optimization would save psgd, and where Lightning's floor lies: compare.py's paired
overhead measurement (vanilla chunks interleaved in the Lightning run) of
- psgd's real run, its Classifier as it is (Lightning's automatic optimization);
- the same run with every hook dispatched (without psgd.hooks.skip_unused_hooks, which takes the
  per-batch hooks nobody implements out of Lightning's dispatch);
- the same run with the training step rewritten for manual optimization (zero_grad, manual_backward,
  optimizer step through Lightning's optimizer wrapper, the same training-metric counting; the
  schedule stepped at each epoch's end, as Lightning does in automatic optimization);
- the same run with the minimal loop's step verbatim in training_step (the raw optimizer, no
  Lightning backward or optimizer call: no strategy hooks, and global_step stays 0, so a measurement
  only): the most any change to psgd's step could win;
- the smallest LightningModule a user writes (forward, loss; automatic optimization) in the leanest
  Trainer: what Lightning itself costs such a user;
- the leanest LightningModule there is (manual optimization; its training_step is the vanilla step
  verbatim on the raw optimizer, no Lightning backward or optimizer plumbing; psgd's two per-hook
  fixes; the leanest Trainer): Lightning's per-batch loop alone, its floor;
runs alternating A B C D E F A B C D E F.

    python benchmarks/overhead_manual.py --data-root ../shared/data   # ~17 min; --repeats 3

Manual optimization is not psgd's default: gradient accumulation, clipping, the schedulers' stepping
and every strategy hook psgd relies on would have to be written again in the module.
Results: results/overhead_manual.{json,md}.
"""

import argparse
import json
import logging
import os
import statistics
import sys
import warnings
from contextlib import contextmanager, nullcontext
from datetime import date
from functools import partial
from pathlib import Path

import torch.nn.functional as F

from psgd.module import Classifier

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402


def manual_training_step(self, batch, batch_idx):
    """Classifier.training_step for manual optimization: the same loss and counting, and the
    optimizer step (through psgd's strategy, as in automatic optimization) done here."""
    opt = self.optimizers()
    x, y = batch
    out = self(x)
    loss = F.cross_entropy(out, y)
    opt.zero_grad()
    self.manual_backward(loss)
    opt.step()
    self.count_train(out, y, loss, batch_idx)
    return loss


def raw_training_step(self, batch, batch_idx):
    """The minimal loop's step verbatim on the raw optimizer, with psgd's counting: none of Lightning's
    backward or optimizer plumbing (so none of the strategies' hooks; global_step is not advanced)."""
    opt = self.trainer.optimizers[0]
    x, y = batch
    out = self(x)
    loss = F.cross_entropy(out, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    self.count_train(out, y, loss, batch_idx)


def manual_epoch_end(self):
    scheduler = self.lr_schedulers()
    if scheduler is not None:
        scheduler.step()


@contextmanager
def manual_optimization(training_step=manual_training_step):
    """psgd's Classifier with manual optimization and `training_step`, for the runs started inside."""
    keys = ("automatic_optimization", "training_step", "on_train_epoch_end")
    saved = {k: Classifier.__dict__.get(k) for k in keys}
    Classifier.automatic_optimization = property(lambda self: False, lambda self, value: None)
    Classifier.training_step = training_step
    Classifier.on_train_epoch_end = manual_epoch_end
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                delattr(Classifier, k)
            else:
                setattr(Classifier, k, v)


ARMS = {  # name: (compare.paired_overhead's loop, the context its run starts in, what it is)
    "automatic (psgd)": ("psgd", nullcontext, "psgd's run as it is"),
    "every hook dispatched": ("psgd", compare.every_hook_dispatched, "psgd's run without skip_unused_hooks"),
    "manual": ("psgd", manual_optimization, "psgd's run, manual optimization"),
    "raw step": (
        "psgd",
        partial(manual_optimization, raw_training_step),
        "psgd's run, the vanilla step verbatim in training_step (no Lightning plumbing, no strategy hooks)",
    ),
    "smallest LightningModule": ("bare", nullcontext, "forward + loss, automatic optimization, leanest Trainer"),
    "leanest LightningModule": (
        "lean",
        nullcontext,
        "the vanilla step verbatim in training_step, leanest Trainer: Lightning's floor",
    ),
}


def measure(data_root: str, threads: int, repeats: int, overrides=(), **paired) -> dict[str, list[dict]]:
    """`repeats` paired runs of each arm, alternating."""
    runs: dict[str, list[dict]] = {name: [] for name in ARMS}
    for _ in range(repeats):
        for name, (loop, context, _) in ARMS.items():
            with context():
                runs[name].append(compare.paired_overhead(data_root, threads, overrides=overrides, loop=loop, **paired))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--repeats", type=compare.positive, default=3)
    parser.add_argument("--threads", type=compare.positive, default=os.cpu_count() or 1)
    compare.results_arguments(parser)
    args = parser.parse_args()
    compare.exit_without_data(args.data_root)
    compare.exit_unless_writable(args.results)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*val_dataloader.*")  # the bare and lean modules validate nothing

    runs = measure(args.data_root, args.threads, args.repeats)
    rows = [
        "| Lightning module | what | paired step-time ratio to the vanilla loop, median of each run | median |",
        "|---|---|---|---|",
    ]
    for name, results in runs.items():
        medians = [r["median"] for r in results]
        cells = f"{' '.join(f'{m:.3f}' for m in medians)} | {statistics.median(medians):.3f}"
        rows.append(f"| {name} | {ARMS[name][2]} | {cells} |")
    text = (
        "Framework overhead of psgd (automatic, every hook dispatched, manual optimization, raw step) and of "
        "Lightning, paired, "
        f"{args.threads} threads, {args.repeats} runs each alternating ({date.today()})\n\n" + "\n".join(rows) + "\n"
    )
    print(text)
    record = json.dumps({"date": str(date.today()), "runs": runs}, indent=1)
    compare.write_results(args.results, "overhead_manual", record, text)


if __name__ == "__main__":
    main()
