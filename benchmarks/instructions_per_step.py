"""Machine instructions per training step, psgd's run (or a Lightning floor) against the minimal loop,
counted by valgrind's callgrind: a figure without timing noise, for where the framework's overhead goes.

    python benchmarks/instructions_per_step.py --data-root ../shared/data   # ~25 min; needs valgrind
    python benchmarks/instructions_per_step.py --data-root ../shared/data --loop lean

The paired measurement of compare.py, counted instead of timed: a Lightning run of the lab CNN with,
after every --chunk of its steps, --chunk steps of the minimal vanilla loop in the same process (a
copy of the warmed-up net, its own SGD and pass over the same batches). The run executes under
callgrind with its counting off until epoch 2 starts; from there a marker (a call of os.getppid,
which callgrind is told to dump its counters before) closes each stretch: the Lightning chunk, the
vanilla chunk, and the gap from the end of the vanilla chunk to the next Lightning step (Lightning's
end-of-batch work), which belongs to the Lightning side. One thread (OMP_NUM_THREADS=1 and a passive
OpenMP wait): with two, the instructions an idle OpenMP thread spins for vary from chunk to chunk.

Under valgrind, oneDNN picks the kernels of the CPU valgrind presents (AVX2, not AVX-512), so the
convolutions' instruction count is not the native one; the difference between the two loops, the
framework's own instructions, is the figure. Figures are the medians over the chunks after the first
(the vanilla loop's first steps also build its state).

--loop: psgd (train.py's default run, no validation, a one-batch test), lean (the leanest LightningModule,
Lightning's floor) or bare (the smallest LightningModule a user writes), as in compare.py.
"""

import argparse
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402

LOOPS = ("psgd", "lean", "bare")


def inner(args: argparse.Namespace) -> None:
    """Runs under callgrind: the Lightning run with the markers."""
    import pytorch_lightning as L

    chunk = args.chunk

    class Marks(L.Callback):
        def on_train_epoch_start(self, trainer, module):
            self.on = trainer.current_epoch >= 1
            if trainer.current_epoch == 1:
                ctl = subprocess.Popen(["callgrind_control", "-i", "on", str(os.getpid())], stdout=subprocess.DEVNULL)
                while ctl.poll() is None:  # callgrind takes the command while this process runs code
                    sum(range(1000))
                self.side = compare.VanillaSide(cfg, module, trainer.datamodule)
                os.getppid()  # marker: the warm-up ends

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if self.on and batch_idx % chunk == 0:
                os.getppid()  # marker: the gap (Lightning's end of the last step) ends, its chunk begins

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if self.on and (batch_idx + 1) % chunk == 0:
                os.getppid()  # marker: the Lightning chunk ends
                for _ in range(chunk):
                    self.side.step(*self.side.next_batch())
                os.getppid()  # marker: the vanilla chunk ends

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    steps = chunk * (args.chunks + 1)  # and one chunk that is not counted
    over = [f"data.batch_size={args.batch_size}", f"trainer.limit_train_batches={steps}"]
    if args.loop == "psgd":
        over.append("trainer.limit_test_batches=1")
    cfg, fit = compare.lightning_loop(args.loop, args.data_root, 1, 2, over)
    fit([Marks()], limit_train_batches=steps)


def dumps(folder: Path) -> list[int]:
    """The instruction count of each dump callgrind wrote to `folder`, in the order written."""
    counts = []
    for f in folder.iterdir():
        found = re.fullmatch(r"cg\.\d+\.(\d+)", f.name)  # the dumps; the file without a number is the exit's
        summary = re.search(r"^summary: (\d+)", f.read_text(errors="replace"), re.M)
        if found and summary:
            counts.append((int(found.group(1)), int(summary.group(1))))
    return [n for _, n in sorted(counts)]


def chunks(counts: list[int], chunk: int) -> dict:
    """Per-step instructions of each side from the dumps: [warm-up, epoch start] then per chunk
    [Lightning chunk, vanilla chunk, gap], the gap counted to the Lightning side; the first chunk
    left out."""
    cycles = counts[2:]
    pairs = [((cycles[i] + cycles[i + 2]) / chunk, cycles[i + 1] / chunk) for i in range(0, len(cycles) - 2, 3)][1:]
    if not pairs:
        return {}
    ours, theirs = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    return {"chunks": len(pairs), "lightning": ours, "vanilla": theirs, "extra": ours - theirs, "ratio": ours / theirs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--loop", choices=LOOPS, default="psgd")
    parser.add_argument("--batch-size", type=compare.positive, default=16)
    parser.add_argument("--chunk", type=compare.positive, default=5, help="steps per counted chunk")
    parser.add_argument("--chunks", type=compare.positive, default=3, help="chunks counted, after one more")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    compare.results_arguments(parser)
    args = parser.parse_args()
    compare.exit_without_data(args.data_root)
    if args.inner:
        return inner(args)
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        sys.exit("instructions_per_step: needs valgrind (callgrind and callgrind_control) on the PATH")
    compare.exit_unless_writable(args.results)
    python = os.path.realpath(sys.executable)  # the interpreter itself, not a shim that would run it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-before=os_getppid",
            f"--callgrind-out-file={tmp}/cg.%p", python, __file__, "--inner", "--data-root", args.data_root,
            "--loop", args.loop, "--batch-size", str(args.batch_size), "--chunk", str(args.chunk),
            "--chunks", str(args.chunks),
        ]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = proc.stderr[-2000:]
            sys.exit(f"instructions_per_step: the run under valgrind failed ({proc.returncode}):\n{tail}")
        out = chunks(dumps(Path(tmp)), args.chunk)
    if not out:
        sys.exit("instructions_per_step: no chunk was counted (did callgrind dump at os_getppid?)")
    name = {"psgd": "psgd's run", "lean": "leanest LightningModule", "bare": "smallest LightningModule"}[args.loop]
    date = time.strftime("%Y-%m-%d")
    md = [
        f"Instructions per lab-CNN training step under callgrind, batch {args.batch_size}, 1 thread, medians of "
        f"{out['chunks']} chunks of {args.chunk} steps ({date}, {time.perf_counter() - started:.0f} s)",
        "",
        "| loop | instructions per step | the minimal loop's | extra per step | ratio |",
        "|---|---|---|---|---|",
        f"| {name} | {out['lightning'] / 1e6:.3f} M | {out['vanilla'] / 1e6:.3f} M | {out['extra'] / 1e6:.3f} M "
        f"| {out['ratio']:.4f} |",
    ]
    compare.report(args, f"instructions_{args.loop}_b{args.batch_size}", date, md, **out)


if __name__ == "__main__":
    main()
