"""Is psgd's GPU step bound by the GPU or by the host, and what does psgd launch that a bare step does
not? For each model and precision, psgd's real run (psgd.run.train, the dataset on the GPU, batch 128)
and benchmarks/gpu_step.py's bare step (zero_grad, forward, cross-entropy, backward, the optimizer's step
on one resident batch; the config's optimizer, SGD by default, as psgd's run has) each give, per step:

  wall      ms between two steps, timed over `--steps` steps after `--warm-up` (no profiler running);
  GPU busy  ms of the GPU's own kernels, memory copies and sets (torch.profiler, over `--profiled`
            more steps);
  kernels   the GPU work items launched.

  update    the optimizer and how torch runs its update (fused, foreach, torch's default or its
            per-tensor loop), read from the optimizer each step ran: what --overrides changed.

A step whose wall time is at its GPU busy time is bound by the GPU; one above it waits on the host
(Python, Lightning, the kernel launches), and psgd's `compile=reduce-overhead` (CUDA graphs) is the
lever. The kernels psgd runs more often or longer than the bare step are listed, the largest first.

    python benchmarks/gpu_profile.py --data-root ../shared/data     # WideResNet, bf16 and fp32; ~40 s on one H200
    python benchmarks/gpu_profile.py --data-root DIR --device cpu --models "lab CNN" --precisions fp32
                                                                      # a smoke test: no GPU figures on CPU
Results go to benchmarks/results/<name>.json and .md, with the device and the date.
"""

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (  # noqa: E402
    exit_unless_writable,
    exit_without_data,
    positive,
    results_arguments,
    table,
    train_cfg,
    write_results,
)
from gpu_step import MODELS, resident  # noqa: E402

BATCH = 128


def device_work(prof, steps: int) -> dict[str, list[float]]:
    """{name: [launches per step, us per step]} of the GPU's work items in a profile (kernels, memory
    copies and sets; not the ranges that record_function marks on the GPU's timeline)."""
    import torch

    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation:
            work = out[e.name[:100]]
            work[0] += 1 / steps
            work[1] += e.time_range.elapsed_us() / steps
    return dict(out)


class Timed:
    """Times steps [warm_up, warm_up + steps) with the device synchronised at both ends, then profiles
    the next `profiled` steps. step_started(i) is called at the start of step i."""

    def __init__(self, device: str, warm_up: int, steps: int, profiled: int):
        import torch

        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        self.device, self.warm_up, self.steps, self.profiled = device, warm_up, steps, profiled
        self.total = warm_up + steps + profiled
        self.wall_ms: float | None = None
        self.work: dict | None = None
        self.update: str | None = None  # update_kind of the optimizer the steps ran

    def step_started(self, i: int) -> None:
        import torch

        if i == self.warm_up:
            self.sync()
            self.start = time.perf_counter()
        elif i == self.warm_up + self.steps:
            self.sync()
            self.wall_ms = (time.perf_counter() - self.start) * 1000 / self.steps
            kinds = torch.profiler.ProfilerActivity
            self.prof = torch.profiler.profile(activities=[kinds.CPU, *([kinds.CUDA] if self.device == "cuda" else [])])
            self.prof.__enter__()
        elif i == self.total:
            self.sync()
            self.prof.__exit__(None, None, None)
            self.work = device_work(self.prof, self.profiled)


def update_kind(optimizer) -> str:
    """The optimizer's class and how torch runs its update: "SGD, fused", "Adam, foreach", "SGD, torch's
    default" (foreach None: foreach on CUDA, the per-tensor loop on CPU) or "NovoGrad, per-tensor loop"."""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        how = "fused"
    elif group.get("foreach"):
        how = "foreach"
    elif "foreach" in group and group["foreach"] is None:
        how = "torch's default"
    else:
        how = "per-tensor loop"
    return f"{type(optimizer).__name__}, {how}"


def bare(model: str, bf16: bool, device: str, timed: Timed, overrides=()) -> None:
    import torch
    import torch.nn.functional as F

    net, opt, x, y = resident(model, BATCH, device, overrides)
    timed.update = update_kind(opt)
    for i in range(timed.total + 1):
        timed.step_started(i)
        if i == timed.total:
            break
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()


def psgd_overrides(model: str, bf16: bool, device: str, data_root: str, batches: int, overrides=()) -> list[str]:
    """train.py's overrides of psgd's run: `batches` training batches of `model`, then `overrides`."""
    name, data = MODELS[model]
    return [
        f"model={name}",
        f"data={data}",
        f"data.root={data_root}",
        f"data.batch_size={BATCH}",
        f"data.on_device={device == 'cuda'}",
        f"trainer.accelerator={'gpu' if device == 'cuda' else 'cpu'}",
        "trainer.max_epochs=1",
        f"trainer.limit_train_batches={batches}",
        "trainer.limit_val_batches=0",
        "trainer.limit_test_batches=1",
        "quiet=true",
        *(["trainer.precision=bf16-mixed"] if bf16 else []),
        *overrides,
    ]


def psgd(model: str, bf16: bool, device: str, data_root: str, timed: Timed, overrides=()) -> None:
    import pytorch_lightning as L

    from psgd.run import train

    class Steps(L.Callback):
        def on_train_start(self, trainer, module):
            timed.update = update_kind(trainer.optimizers[0])

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            timed.step_started(batch_idx)

    over = psgd_overrides(model, bf16, device, data_root, timed.total + 1, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        train(train_cfg(over), Path(tmp) / "run", callbacks=[Steps()])
    if timed.work is None:
        raise SystemExit(f"gpu_profile.py: psgd's {model} run ended before step {timed.total}: fewer batches in an "
                         "epoch")  # fmt: skip


def differences(bare_work: dict, psgd_work: dict, top: int) -> list[dict]:
    """The `top` kernels whose time per step differs most between psgd and the bare step."""
    none = [0.0, 0.0]
    rows = [
        {"kernel": k, "extra_us": round(psgd_work.get(k, none)[1] - bare_work.get(k, none)[1], 1),
         "bare": [round(v, 2) for v in bare_work.get(k, none)], "psgd": [round(v, 2) for v in psgd_work.get(k, none)]}
        for k in set(bare_work) | set(psgd_work)
    ]  # fmt: skip
    return sorted(rows, key=lambda r: -abs(r["extra_us"]))[:top]


def summary(timed: Timed) -> dict:
    busy = kernels = None
    if timed.device == "cuda":
        busy = round(sum(w[1] for w in timed.work.values()) / 1000, 3)
        kernels = round(sum(w[0] for w in timed.work.values()), 1)
    return {"wall_ms": round(timed.wall_ms, 3), "gpu_busy_ms": busy, "kernels": kernels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", default="data")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["WideResNet"])
    parser.add_argument("--precisions", nargs="+", choices=["bf16", "fp32"], default=["bf16", "fp32"])
    parser.add_argument("--warm-up", type=positive, default=15, help="steps before the timed ones")
    parser.add_argument("--steps", type=positive, default=30, help="timed steps")
    parser.add_argument("--profiled", type=positive, default=10, help="profiled steps, after the timed ones")
    parser.add_argument("--top", type=positive, default=12, help="kernels listed per row")
    parser.add_argument("--overrides", nargs="+", default=[], metavar="KEY=VALUE",
                        help="train.py overrides for both steps, e.g. optimizer.fused=false")  # fmt: skip
    results_arguments(parser, "gpu_profile")
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "gpu_profile.py: error: --device cuda, but torch sees no CUDA device here; run it on a GPU "
                    "machine, or pass --device cpu to smoke-test it\n")  # fmt: skip
    exit_without_data(args.data_root, tuple(dict.fromkeys(MODELS[m][1] for m in args.models)))
    if args.overrides:  # refused here in one line, as train.py refuses them, not after the first model's runs
        from hydra.errors import HydraException

        from psgd.config import ConfigError, check

        for model in args.models:
            for precision in args.precisions:
                over = psgd_overrides(model, precision == "bf16", args.device, args.data_root, 1, args.overrides)
                try:
                    check(train_cfg(over))
                except (ConfigError, HydraException) as e:
                    parser.exit(2, f"gpu_profile.py: error: --overrides {' '.join(args.overrides)}: "
                                f"{str(e).strip().splitlines()[0]}\n")  # fmt: skip
    exit_unless_writable(args.results)

    rows, extra, md_extra = [], {}, []
    for model in args.models:
        for precision in args.precisions:
            bf16 = precision == "bf16"
            b = Timed(args.device, args.warm_up, args.steps, args.profiled)
            bare(model, bf16, args.device, b, args.overrides)
            p = Timed(args.device, args.warm_up, args.steps, args.profiled)
            psgd(model, bf16, args.device, args.data_root, p, args.overrides)
            row = {"model": model, "precision": precision, "bare": summary(b), "psgd": summary(p)}
            row["psgd_speed_of_bare"] = round(b.wall_ms / p.wall_ms, 3)
            row["update"] = {"bare": b.update, "psgd": p.update}
            rows.append(row)
            if args.device == "cuda":
                diff = differences(b.work, p.work, args.top)
                extra[f"{model} | {precision}"] = diff
                md_extra += [
                    f"{model}, {precision}: psgd's GPU work against the bare step's, per step, largest first",
                    "",
                    table(
                        [
                            [f"{d['extra_us']:+.1f}", f"{d['psgd'][0]:.1f} / {d['bare'][0]:.1f}", f"`{d['kernel']}`"]
                            for d in diff
                        ],
                        ["us more in psgd", "launches psgd / bare", "kernel"],
                    ),
                    "",
                ]

    from gpu import device_name

    device = device_name("gpu" if args.device == "cuda" else "cpu")
    head = ["model", "precision", "bare: wall ms", "GPU busy ms", "kernels", "psgd: wall ms", "GPU busy ms", "kernels",
            "psgd / bare speed", "update"]  # fmt: skip

    def updates(u: dict) -> str:
        return u["bare"] if u["bare"] == u["psgd"] else f"bare: {u['bare']}; psgd: {u['psgd']}"

    cells = [
        [
            r["model"],
            r["precision"],
            *r["bare"].values(),
            *r["psgd"].values(),
            r["psgd_speed_of_bare"],
            updates(r["update"]),
        ]
        for r in rows
    ]
    title = f"### {device}, {time.strftime('%Y-%m-%d')}: one training step at batch {BATCH}, psgd against the bare step"
    if args.overrides:
        title += f", both with {' '.join(args.overrides)}"
    md = [title, "", table([[("n/a" if c is None else c) for c in r] for r in cells], head), "", *md_extra]
    print("\n".join(md))
    out = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "date": time.strftime(
        "%Y-%m-%d"), "device": device, "rows": rows, "psgd_extra_work": extra}  # fmt: skip
    write_results(args.results, args.name, json.dumps(out, indent=2) + "\n", "\n".join(md))


if __name__ == "__main__":
    main()
