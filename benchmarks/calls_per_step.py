"""How many Python function calls each training loop makes per step: the loop's own work, counted
exactly, so that a change to it shows without timing noise.

    python benchmarks/calls_per_step.py --data-root ../shared/data   # ~1 min; results/calls_per_step.{json,md}

The lab CNN at batch 128 on psgd's data path (compare.py's setup), counted with sys.setprofile over
--steps training steps after --skip warm-up steps (psgd counts its training metrics every 32
batches: the default 64 steps hold two of those), in
- the minimal vanilla loop (fetch the batch, zero_grad, forward, loss, backward, SGD step);
- the leanest LightningModule (that step verbatim in training_step, manual optimization) and the
  smallest one a user writes (forward + loss, automatic optimization), in the leanest Trainer;
- psgd's run (train.py's default config), and the same run without psgd.hooks.skip_unused_hooks,
  which takes the hooks nobody implements out of Lightning's per-step dispatch.
A Python call costs ~0.5 us here after a lab-CNN step has evicted the loop's code from the caches
(benchmarks/README.md): compare.py's paired overhead measures what the calls cost in time.
"""

import argparse
import logging
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import pytorch_lightning as L

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402


class Calls:
    """Counts Python ('call') and C ('c_call') function calls while on, and the steps counted."""

    def __init__(self):
        self.python = Counter()
        self.c = 0
        self.steps = 0

    def _event(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            self.python[f"{Path(code.co_filename).name}:{code.co_name}"] += 1
        elif event == "c_call":
            self.c += 1

    def start(self):
        sys.setprofile(self._event)

    def stop(self):
        sys.setprofile(None)


class CountSteps(L.Callback):
    """Counts the calls of training steps skip .. skip + steps - 1 of the first epoch."""

    def __init__(self, skip: int, steps: int):
        self.calls, self.skip, self.steps = Calls(), skip, steps

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.current_epoch == 0 and batch_idx == self.skip:
            self.calls.start()
        elif trainer.current_epoch == 0 and batch_idx == self.skip + self.steps:
            self.calls.stop()
            self.calls.steps = self.steps

    def on_train_epoch_end(self, trainer, module):
        self.calls.stop()  # the epoch was shorter than skip + steps: main() reports it


def vanilla(data_root: str, skip: int, steps: int, overrides=()) -> Calls:
    cfg, net, data = compare.lab_cnn_setup(data_root, 1, overrides)
    data.prepare_data()
    data.setup("fit")
    step = compare.vanilla_step(net, compare.sgd(cfg, net.parameters()))
    calls = Calls()
    for i, (x, y) in enumerate(data.train_dataloader()):
        if i == skip:
            calls.start()
        elif i == skip + steps:
            calls.stop()
            calls.steps = steps
            break
        step(x, y)
    calls.stop()
    return calls


def lightning(data_root: str, skip: int, steps: int, module: str, overrides=()) -> Calls:
    counter = CountSteps(skip, steps)
    _, fit = compare.lightning_loop(module, data_root, 1, 1, overrides)
    fit([counter], limit_train_batches=skip + steps + 1)
    return counter.calls


def psgd(data_root: str, skip: int, steps: int, overrides=(), skip_hooks: bool = True) -> Calls:
    from psgd.run import train

    counter = CountSteps(skip, steps)
    over = [f"trainer.limit_train_batches={skip + steps + 1}", *overrides]
    cfg = compare.psgd_overhead_cfg(data_root, 1, 1, over)
    with nullcontext() if skip_hooks else compare.every_hook_dispatched(), tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", callbacks=[counter])
    return counter.calls


def loops(a: argparse.Namespace) -> dict[str, Callable[[], Calls]]:
    """Each loop counted, with the command line's settings."""
    common, over = (a.data_root, a.skip, a.steps), [f"data.batch_size={a.batch_size}"]
    return {
        "vanilla loop": lambda: vanilla(*common, over),
        "leanest LightningModule": lambda: lightning(*common, "lean", over),
        "smallest LightningModule": lambda: lightning(*common, "bare", over),
        "psgd's run, every hook dispatched": lambda: psgd(*common, over, skip_hooks=False),
        "psgd's run": lambda: psgd(*common, over),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--skip", type=compare.non_negative, default=8, help="warm-up steps before counting")
    parser.add_argument("--steps", type=compare.positive, default=64, help="steps counted")
    parser.add_argument("--batch-size", type=compare.positive, default=128)
    parser.add_argument("--top", type=compare.positive, default=15, help="functions listed: psgd's run's most called")
    compare.results_arguments(parser)
    args = parser.parse_args()
    compare.exit_without_data(args.data_root)
    compare.exit_unless_writable(args.results)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")  # Lightning's advice (workers, val_dataloader) is not the subject here

    counted = {name: count() for name, count in loops(args).items()}
    short = [name for name, c in counted.items() if c.steps != args.steps]
    if short:
        sys.exit(
            f"calls_per_step: an epoch has fewer than --skip + --steps = {args.skip + args.steps} + 1 batches "
            f"({', '.join(short)}); lower --skip or --steps"
        )
    per_step = {
        name: {"python": sum(c.python.values()) / args.steps, "c": c.c / args.steps} for name, c in counted.items()
    }
    base = per_step["vanilla loop"]["python"]
    date = time.strftime("%Y-%m-%d")
    md = [
        f"Function calls per training step, lab CNN, batch {args.batch_size}, {args.steps} steps after {args.skip} "
        f"({date})",
        "",
        "| loop | Python calls/step | C calls/step | Python calls + vs the vanilla loop |",
        "|---|---|---|---|",
    ]
    md += [f"| {n} | {v['python']:.1f} | {v['c']:.1f} | {v['python'] - base:.1f} |" for n, v in per_step.items()]
    top = counted["psgd's run"].python.most_common(args.top)
    md += ["", f"psgd's run, its {args.top} most called Python functions (calls/step):", ""]
    md += [f"- {name}: {n / args.steps:.1f}" for name, n in top]
    compare.report(args, "calls_per_step", date, md, per_step=per_step)


if __name__ == "__main__":
    main()
