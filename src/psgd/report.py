"""Sweep results -> tables and plots: one row per job, speedup and efficiency per strategy.

`python sweep.py -m ...` writes the report when the multirun ends; rebuild it from any sweep dir with

    python -m psgd.report multirun/2026-11-21/10-00-00-000000

Files written into the sweep dir:
    report.csv      one row per job: swept values, status (and error line), workers, strategy,
                    samples trained, train time, samples/s, test accuracy, per-worker accuracies,
                    replica distance (model averaging), staleness (HogWild), time to target, speedup
    summary.csv     one row per (group, workers): mean ± std over seeds, speedup S(P) = T(1)/T(P)
                    and efficiency S(P)/P, for the fixed epochs and for the time to target accuracy
    report.md       both tables in markdown
    speedup.png, efficiency.png, sync.png (the share of the training time spent synchronising, when
    workers are swept and a job has it), accuracy.png (when workers are swept), accuracy_vs_batch.png (when
    the batch size is swept), curves.png (validation accuracy per epoch and against training time,
    one line per setting)

A group is every job with the same strategy and the same values of the swept keys other than
workers and seed; T(1) is its 1-worker job (mean over seeds). For the fixed epochs, T is a job's
training time per sample it trained (all workers together): for jobs that trained the same samples
S(P) is exactly T(1)/T(P), and jobs that did not (trainer.limit_train_batches counts each worker's
batches; an early stop) still compare the same work, with a note in report.md saying so.
"""

import argparse
import math
import shlex
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from psgd.console import NOT_IN_DIR_NAMES, as_typed, override_key, shell_override
from psgd.results import (
    NO_ROOM,
    atomic_file,
    cores_of,
    failed_write,
    hogwild_workers,
    read_json,
    scales_by_workers,
    step_advice,
    write_atomic,
    write_csv,
)
from psgd.signals import still_running

WORKER_KEYS = ("workers", "trainer.devices")  # the key that sets P
SEED_KEYS = ("seed",)
BATCH_KEY = "data.batch_size"
PLOTS = ("speedup.png", "efficiency.png", "sync.png", "accuracy.png", "accuracy_vs_batch.png", "curves.png")
MAX_LEGEND = 16  # curves.png: more settings than this get no legend (the lines would be hidden by it)


@dataclass
class Job:
    """One job dir of a sweep, as found on disk."""

    num: int
    path: Path
    overrides: dict[str, str]
    status: str
    error: str | None
    strategy: str
    workers: int
    metrics: dict[str, Any] = field(default_factory=dict)
    partition: str = "iid"  # the job's data.partition (command line or preset)
    precision: str | None = None  # the job's trainer.precision as configured

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def get(self, key: str) -> Any:
        return self.metrics.get(key)

    @property
    def samples(self) -> int | None:
        """Training samples of the whole run, all workers together (its epochs' `samples`), or None
        for a record without them."""
        history = self.get("history") or []
        counts = [h.get("samples") for h in history if isinstance(h, dict)]
        if not counts or len(counts) != len(history) or not all(isinstance(n, int) and n > 0 for n in counts):
            return None
        return sum(counts)


@dataclass
class Report:
    jobs: list[Job]
    swept: list[str]
    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    plots: list[Path]
    notes: list[str]
    planned: int | None = None  # the jobs the sweep was to run (multirun.yaml), where that can be told

    @property
    def not_started(self) -> int:
        """The sweep's jobs without a dir: a sweep stopped before them (or still going)."""
        return max(0, (self.planned or 0) - len(self.jobs))

    @property
    def completed(self) -> list[Job]:
        return [j for j in self.jobs if j.ok]

    @property
    def failed(self) -> list[Job]:
        """Every job that did not complete: failed or interrupted (not one still running)."""
        return [j for j in self.jobs if not j.ok and j.status != "running"]

    @property
    def running(self) -> list[Job]:
        """Jobs still training (a report rebuilt while the sweep runs): their process is alive."""
        return [j for j in self.jobs if j.status == "running"]

    @property
    def interrupted(self) -> list[Job]:
        """Those of `failed` stopped by Ctrl-C or SIGTERM."""
        return [j for j in self.failed if j.status == "interrupted"]


def _parse_override(text: str) -> tuple[str, str]:
    text = as_typed(text)
    return override_key(text), text.partition("=")[2]


def load_job(path: Path) -> Job | None:
    """A job dir holds .hydra/ (always) and metrics.json (once it trained or failed)."""
    hydra_dir = path / ".hydra"
    if not (hydra_dir / "config.yaml").exists():
        return None
    unreadable = None
    try:
        overrides = dict(_parse_override(str(o)) for o in OmegaConf.load(hydra_dir / "overrides.yaml"))
        cfg = OmegaConf.load(hydra_dir / "config.yaml")
    except Exception as e:  # Hydra writes both whole before the job starts: edited or damaged by hand
        overrides, cfg = {}, OmegaConf.create()
        unreadable = f"its Hydra config in {hydra_dir} is unreadable ({type(e).__name__}: {str(e).splitlines()[0]})"
    record = path / "metrics.json"
    try:
        metrics = read_json(record) if record.exists() else {}
        if not isinstance(metrics, dict):
            raise ValueError(f"a JSON {type(metrics).__name__}, not a record")
    except (OSError, ValueError) as e:  # edited or damaged by hand (psgd writes it whole): the job failed
        metrics, unreadable = {}, unreadable or f"{record} is unreadable ({type(e).__name__}: {e})"
    status = "failed" if unreadable else metrics.get("status", "not finished")
    error = unreadable or metrics.get("error")
    if not unreadable and still_running(metrics):  # a sweep still at work
        status = "running"
    elif status in ("running", "trained"):  # the job process ended without writing its final status
        status, error = "failed", error or f"ended with status {status!r} (killed?)"
    workers = metrics.get("world_size") or _config_workers(cfg)
    precision = OmegaConf.select(cfg, "trainer.precision", default=None)  # 16 in YAML is an int
    return Job(
        num=_job_num(path),
        path=path,
        overrides=overrides,
        status=status,
        error=error,
        strategy=metrics.get("strategy") or str(OmegaConf.select(cfg, "strategy.name", default="?")),
        workers=int(workers),
        metrics=metrics,
        partition=str(OmegaConf.select(cfg, "data.partition", default="iid")),
        precision=None if precision is None else str(precision),
    )


def _config_workers(cfg) -> int:
    devices = OmegaConf.select(cfg, "trainer.devices", default=None)
    nodes = OmegaConf.select(cfg, "trainer.num_nodes", default=1) or 1
    workers = devices if isinstance(devices, int) else OmegaConf.select(cfg, "workers", default=1)
    try:
        return int(workers) * int(nodes)
    except (TypeError, ValueError):
        return 0


def load_jobs(sweep_dir: Path) -> list[Job]:
    """The jobs under `sweep_dir`: Hydra's <n>/, or in a sweep dir Hydra made (with its multirun.yaml)
    any folders a changed hydra.sweep.subdir named (`${hydra.job.override_dirname}`: workers=2,seed=0/,
    nested where a value has a /), in job order. (Only there is the whole tree searched: not a home
    folder given by mistake.)"""
    pattern = "**/.hydra/config.yaml" if (sweep_dir / "multirun.yaml").is_file() else "*/.hydra/config.yaml"
    found = sorted(f.parent.parent for f in sweep_dir.glob(pattern) if f.parent.parent != sweep_dir)
    jobs = [j for j in map(load_job, found) if j is not None]
    return sorted(jobs, key=lambda j: (j.num < 0, j.num, str(j.path)))


def _job_num(path: Path) -> int:
    """The job's number in its sweep: its dir's name (Hydra's <n>/), else what Hydra recorded; -1 if unknown."""
    if path.name.isdigit():
        return int(path.name)
    try:
        num = OmegaConf.load(path / ".hydra" / "hydra.yaml").hydra.job.num
        return int(num)
    except Exception:  # no hydra.yaml, damaged, or no number in it
        return -1


def swept_keys(jobs: list[Job]) -> list[str]:
    """Override keys that take more than one value across the jobs, in command-line order."""
    keys: list[str] = []
    for job in jobs:
        for key in job.overrides:
            if key not in keys:
                keys.append(key)
    return [k for k in keys if len({j.overrides.get(k) for j in jobs}) > 1]


def group_key(job: Job, swept: list[str]) -> tuple[str, ...]:
    """Jobs that differ only in workers and seed form one speedup curve."""
    rest = tuple(f"{k}={job.overrides.get(k)}" for k in swept if k not in (*WORKER_KEYS, *SEED_KEYS, "strategy"))
    return (job.strategy, *rest)


def worst_class(accs: list[float | None] | None, names: list[str] | None) -> tuple[str, float] | None:
    """The class the final model knows least and its test accuracy, from metrics.json's
    test_acc_per_class and test_classes (its label where a record has no names); None without a
    class that had test samples."""
    known = [(a, c) for c, a in enumerate(accs or []) if a is not None]
    if not known:
        return None
    acc, label = min(known)
    return (names[label] if names and label < len(names) else str(label)), round(acc, 4)


def skew_note(record: dict) -> str:
    """' (worst class 3 - three at 0.0396)' for a finished run whose shards were label-skewed
    (metrics.json's partition is not iid): the label its test_acc hides; '' otherwise."""
    worst = worst_class(record.get("test_acc_per_class"), record.get("test_classes"))
    if worst is None or record.get("partition", "iid") == "iid":
        return ""
    return f" (worst class {worst[0]} at {worst[1]:.4f})"


STOPPERS = {"early_stop": "early_stop.target_acc", "max_steps": "trainer.max_steps", "max_time": "trainer.max_time"}


def stop_note(record: dict) -> str:
    """' (trainer.max_time ended training in epoch 30 of 500)' for a run that something other than
    trainer.max_epochs stopped (metrics.json's stopped_by); '' otherwise."""
    if record.get("stopped_by") == "fast_dev_run":
        return " (trainer.fast_dev_run: a few batches only)"
    stopper = STOPPERS.get(record.get("stopped_by"))
    if stopper is None:
        return ""
    of = f" of {record['max_epochs']}" if record.get("max_epochs") else ""
    return f" ({stopper} ended training in epoch {record.get('epochs')}{of})"


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _std(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def sync_share(job: "Job | dict") -> float | None:
    """The share of a job's training time its workers synchronised: DDP's wait for the gradient
    all-reduce, periodic model averaging's time averaging, or locked HogWild's wait for the lock; None
    for none of them."""
    shares = (job.get("allreduce_wait_share"), job.get("averaging_share"), job.get("lock_wait_share"))
    return next((v for v in shares if v is not None), None)


def completed_by_group(jobs: list[Job], swept: list[str]) -> dict[tuple, dict[int, list[Job]]]:
    """The completed jobs of each speedup group, by worker count."""
    by_group: dict[tuple, dict[int, list[Job]]] = defaultdict(lambda: defaultdict(list))
    for job in jobs:
        if job.ok:
            by_group[group_key(job, swept)][job.workers].append(job)
    return by_group


def build_rows(jobs: list[Job], swept: list[str]) -> tuple[list[dict], list[dict]]:
    """Per-job rows and per-(group, P) summary rows with speedup and efficiency."""
    by_group = completed_by_group(jobs, swept)

    def mean_of(group: tuple, p: int, key: str) -> float | None:
        return _mean([j.get(key) for j in by_group[group].get(p, []) if j.get(key) is not None])

    # S(P) = T(1)/T(P) for the same work: each job's training time per sample it trained, so that a
    # group whose jobs trained different numbers of samples (trainer.limit_train_batches counts each
    # worker's batches; an early stop) still compares like with like. Equal work: exactly T(1)/T(P).
    per_sample = {g: all(j.samples for ps in per_p.values() for j in ps) for g, per_p in by_group.items()}

    def work_time(job: Job) -> float | None:
        t = job.get("train_time_s")
        if t is None or not job.ok:
            return None
        return t / job.samples if per_sample.get(group_key(job, swept)) else t

    def mean_work_time(group: tuple, p: int) -> float | None:
        return _mean([t for j in by_group[group].get(p, []) if (t := work_time(j)) is not None])

    rows = []
    for job in jobs:
        g = group_key(job, swept)
        t1, ttt1 = mean_work_time(g, 1), mean_of(g, 1, "time_to_target_s")
        speedup = _ratio(t1, work_time(job)) if job.ok else None
        speedup_t = _ratio(ttt1, job.get("time_to_target_s")) if job.ok else None
        worker_acc, history = job.get("worker_test_acc"), job.get("history") or []
        worst = worst_class(job.get("test_acc_per_class"), job.get("test_classes"))
        rows.append(
            {
                "job": job.num,
                **{k: job.overrides.get(k) for k in extra_columns(swept)},
                "status": job.status,
                "strategy": job.strategy,
                "workers": job.workers,
                "threads_per_worker": job.get("threads_per_worker"),
                "batch_size": job.get("batch_size"),
                "lr": job.get("lr"),  # after lr_scaling: what a batch-size or worker sweep ran each job at
                "epochs": job.get("epochs"),
                "stopped_by": job.get("stopped_by"),  # what ended its training (max_epochs, early_stop, max_time, ...)
                "samples": job.samples,
                "train_time_s": _r(job.get("train_time_s"), 2),
                "samples_per_s": job.get("samples_per_s"),
                "test_acc": job.get("test_acc"),
                "worker_test_acc": " ".join(f"{a:.4f}" for a in worker_acc) if worker_acc else None,
                # what parallelism did to the model: how far the averaged replicas had drifted apart (model
                # averaging), how many other workers' updates landed during each update (HogWild)
                "replica_distance": _r(job.get("replica_distance"), 4),
                # periodic model averaging: the averagings it made (0: its period never came)
                "periodic_averagings": job.get("periodic_averagings") if job.get("period") else None,
                "staleness": _r(_mean([h["staleness"] for h in history if h.get("staleness") is not None]), 3),
                # what synchronising cost: the time a DDP step stood waiting for the gradient all-reduce, and
                # the share of the training time the workers synchronised (sync_share: DDP's wait, periodic
                # averaging's time, locked HogWild's wait for the lock)
                "allreduce_wait_ms": job.get("allreduce_wait_ms"),
                "sync_share": sync_share(job),
                "worst_class_acc": worst and worst[1],  # the label the final model knows least
                "worst_class": worst and worst[0],
                "time_to_target_s": _r(job.get("time_to_target_s"), 2),
                "speedup": _r(speedup, 3),
                "efficiency": _r(_ratio(speedup, job.workers), 3),
                "speedup_to_target": _r(speedup_t, 3),
                "efficiency_to_target": _r(_ratio(speedup_t, job.workers), 3),
                "error": job.error,
                "dir": job.path.name,
            }
        )

    summary = []
    for g, per_p in by_group.items():
        t1, ttt1 = mean_work_time(g, 1), mean_of(g, 1, "time_to_target_s")
        for p in sorted(per_p):
            group_jobs = per_p[p]
            times = [j.get("train_time_s") for j in group_jobs]
            accs = [j.get("test_acc") for j in group_jobs]
            ttt = [j.get("time_to_target_s") for j in group_jobs if j.get("time_to_target_s") is not None]
            t_p, ttt_p = _mean(times), _mean(ttt)
            s, s_t = _ratio(t1, mean_work_time(g, p)), _ratio(ttt1, ttt_p)
            worker_accs = [a for j in group_jobs for a in (j.get("worker_test_acc") or [])]
            summary.append(
                {
                    "group": " ".join(g),
                    "strategy": g[0],
                    "workers": p,
                    "runs": len(group_jobs),
                    "test_acc_mean": _r(_mean(accs), 6),
                    "test_acc_std": _r(_std(accs), 6),
                    "worker_acc_mean": _r(_mean(worker_accs), 6),
                    "sync_share_mean": _r(_mean([v for j in group_jobs if (v := sync_share(j)) is not None]), 4),
                    "train_time_s_mean": _r(t_p, 2),
                    "train_time_s_std": _r(_std(times), 2),
                    "samples_per_s_mean": _r(_mean([j.get("samples_per_s") or 0.0 for j in group_jobs]), 1),
                    "speedup": _r(s, 3),
                    "efficiency": _r(_ratio(s, p), 3),
                    "reached_target": f"{len(ttt)}/{len(group_jobs)}",
                    "time_to_target_s_mean": _r(ttt_p, 2),
                    "speedup_to_target": _r(s_t, 3),
                    "efficiency_to_target": _r(_ratio(s_t, p), 3),
                }
            )
    return rows, summary


def unequal_work_notes(jobs: list[Job], swept: list[str]) -> list[str]:
    """A note per group whose completed jobs trained numbers of samples more than 1 % apart: their
    S(P) compares training time per sample, which a reader of T(1)/T(P) should know."""
    groups_by_counts: dict[str, list[str]] = defaultdict(list)  # groups with the same counts: one note
    for g, by_p in completed_by_group(jobs, swept).items():
        per_p = {p: {j.samples for j in group if j.samples} for p, group in by_p.items()}
        per_p = {p: ns for p, ns in per_p.items() if ns}
        counts = [n for ns in per_p.values() for n in ns]
        if counts and max(counts) > 1.01 * min(counts):
            trained = "; ".join(
                f"workers={p}: {' / '.join(f'{n:,}' for n in sorted(ns))}" for p, ns in sorted(per_p.items())
            )
            groups_by_counts[trained].append(" ".join(g))
    return [
        f"{', '.join(groups)}: the jobs trained different numbers of samples ({trained}), so S(P) and "
        "E(P) compare training time per sample (samples/s), not whole runs; trainer.limit_train_batches "
        "counts each worker's batches, and an early stop or trainer.max_time ends a run sooner"
        for trained, groups in groups_by_counts.items()
    ]


def threads_notes(jobs: list[Job], swept: list[str]) -> list[str]:
    """A note where the worker counts ran different torch threads per worker without the sweep saying
    so (threads_per_worker=null is cores // workers): S(P) then compares P workers with one worker that
    used every core's thread, not with one single-threaded worker, which a reader should know."""
    if "threads_per_worker" in swept:
        return []
    by_p: dict[int, set[int]] = defaultdict(set)
    for job in jobs:
        if job.get("threads_per_worker"):
            by_p[job.workers].add(job.get("threads_per_worker"))
    if len({t for ts in by_p.values() for t in ts}) < 2:
        return []
    ran = ", ".join(f"workers={p}: {'/'.join(map(str, sorted(ts)))}" for p, ts in sorted(by_p.items()))
    one = by_p.get(1, set())
    against = (
        f": S(P) compares P workers with one worker that ran {'/'.join(map(str, sorted(one)))} threads, not with "
        "one single-threaded worker (threads_per_worker=1 compares those)"
        if one and max(one) > 1
        else ""
    )
    return [f"threads per worker differed ({ran}; threads_per_worker=null is cores // workers){against}"]


def shared_cores(jobs: list[Job]) -> dict[tuple[str, int], set[tuple[int, int]]]:
    """Per CPU (name, cores) on which some jobs ran more threads than it has cores (workers=5 on 2
    cores, a legitimate experiment that psgd does not refuse): those jobs' (workers per node, threads)."""
    over: dict[tuple[str, int], set[tuple[int, int]]] = defaultdict(set)
    for job in jobs:
        cpu = cores_of(job.get("device"))
        world = job.get("world_size") or job.workers
        per_node, threads = world // max(1, job.get("num_nodes") or 1), job.get("threads_per_worker") or 1
        if cpu and per_node * threads > cpu[1]:
            over[cpu].add((per_node, threads))
    return over


def shared_cores_notes(shared: dict[tuple[str, int], set[tuple[int, int]]]) -> list[str]:
    """A note per CPU of shared_cores: those jobs' workers took turns on the cores, which a reader of
    their S(P) should know."""
    notes = []
    for (name, cores), counts in shared.items():
        runs = ", ".join(f"workers={p}" + (f" x {t} threads" if t > 1 else "") for p, t in sorted(counts))
        notes.append(
            f"{runs}: more threads than the {cores} cores of {name}, so the workers took turns on the cores; "
            f"their speedup over one worker cannot pass {cores}, whatever the strategy"
        )
    return notes


# Lightning's older spellings of a precision, as it reads them
PRECISION_ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}


def _last_epoch(job: "Job | dict") -> tuple[dict, int]:
    """A job's last epoch record ({} without one) and its number of classes (0 where unknown)."""
    history = job.get("history") or []
    last = history[-1] if history and isinstance(history[-1], dict) else {}
    return last, len(job.get("test_acc_per_class") or job.get("test_classes") or [])


def learned_nothing(job: "Job | dict") -> bool:
    """A completed job whose model learned nothing: its last epoch's mean training loss is no lower than
    a uniform guess's, ln(classes), and its test accuracy under twice chance. (HogWild at 3-5 workers with
    the lr that trains one worker "completed" at 10-11 %: its weights settled where every image gets
    one class, with a finite loss, so no divergence was found.)"""
    last, classes = _last_epoch(job)
    loss, acc = last.get("train_loss"), job.get("test_acc")
    if job.get("status") != "completed" or classes < 2 or not all(isinstance(v, int | float) for v in (loss, acc)):
        return False
    if job.get("stopped_by") == "fast_dev_run":  # a batch or two: a smoke test, not training
        return False
    return loss >= math.log(classes) and acc < 2 / classes


# Under this many optimizer steps, a model at chance may just not have trained long enough: the lab CNN at
# the defaults was still at chance on MNIST after 3 steps (trainer.limit_train_batches=3), above it after
# 10; the WideResNet after 3, its epoch's mean loss 2.95 (ln 10 = 2.30). The lr a learned-nothing line
# names is the other cause, and the one that stays at any length.
FEW_STEPS = 100


def few_steps(job: "Job | dict") -> int | None:
    """The optimizer steps a job that learned nothing trained (its last epoch's `step`), where they are
    under FEW_STEPS and its last epoch's mean training loss stayed under twice a uniform guess's: a loss
    far above it is steps too large (lr 3 took the lab CNN's to 1e17 in 4 steps), however few."""
    last, classes = _last_epoch(job)
    step, loss = last.get("step"), last.get("train_loss")
    if not (isinstance(step, int) and isinstance(loss, int | float) and classes >= 2):
        return None
    return step if step < FEW_STEPS and loss < 2 * math.log(classes) else None


def learned_nothing_notes(jobs: list[Job]) -> list[str]:
    """One note naming the completed jobs that learned nothing, and what to change."""
    bad = [j for j in jobs if learned_nothing(j)]
    if not bad:
        return []
    which = f"job{'s' if len(bad) > 1 else ''} {', '.join(str(j.num) for j in bad)}"
    accs = ", ".join(f"{j.get('test_acc'):.4f}" for j in bad)
    hogwild = all(hogwild_workers(j.strategy, j.workers) for j in bad)
    # lr_scaling by the workers (lr_reference_batch=null): lowering optimizer.lr P-fold alone is not enough
    by_workers = all(scales_by_workers(j) for j in bad)
    trained = [few_steps(j) for j in bad]
    steps = ", ".join(map(str, trained)) if None not in trained else None
    return [f"{which} {learned_nothing_line(accs, 'P' if hogwild else None, by_workers=by_workers, steps=steps)}"]


def learned_nothing_line(
    accs: str,
    hogwild_workers: str | int | None,
    lr: float | None = None,
    optimizer_lr: float | None = None,
    by_workers: bool = False,
    steps: int | str | None = None,
) -> str:
    """What learning nothing says, and what to change (step_advice, as a diverged run's line). `steps`:
    the optimizer steps trained, where under FEW_STEPS: too few may be the cause, so the line says so
    first, and the lr after it."""
    said = (
        f"learned nothing (test accuracy {accs}, about chance; the last epoch's training loss no lower than a "
        "uniform guess's)"
    )
    if steps is not None:
        return (
            f"{said} after only {steps} optimizer steps: too few to learn from, so train longer "
            "(trainer.max_epochs, trainer.limit_train_batches, trainer.max_steps); or the steps were too large: "
            + step_advice(lr, hogwild_workers, optimizer_lr, by_workers)
        )
    return f"{said}: most often the steps were too large; " + step_advice(lr, hogwild_workers, optimizer_lr, by_workers)


def precision_notes(jobs: list[Job]) -> list[str]:
    """A note per configured precision that ran as another (16-mixed runs as bf16-mixed where there is
    no CUDA device): the report's columns show trainer.precision as written."""
    ran_as: dict[tuple[str, str], list[int]] = defaultdict(list)
    for job in jobs:
        ran = job.get("precision")
        if ran and job.precision and PRECISION_ALIASES.get(job.precision, job.precision) != ran:
            ran_as[(job.precision, ran)].append(job.num)
    notes = []
    for (asked, ran), nums in ran_as.items():
        which = f"job{'s' if len(nums) > 1 else ''} {', '.join(map(str, nums))}"
        why = ": Lightning runs it so without a CUDA device" if asked.startswith("16") and ran == "bf16-mixed" else ""
        notes.append(f"trainer.precision={asked} ran as {ran} ({which}){why}")
    return notes


TARGET_COLUMNS = ("reached target", "time to target s", "S to target", "E to target")


def extra_columns(swept: list[str]) -> list[str]:
    """Swept keys that are not already a column of their own."""
    return [k for k in swept if k not in ("workers", "strategy")]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).replace("|", "\\|")


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _pm(mean: float | None, std: float | None, scale: float = 1.0, digits: int = 2) -> str:
    if mean is None:
        return ""
    text = f"{mean * scale:.{digits}f}"
    return f"{text} ± {std * scale:.{digits}f}" if std is not None else text


def tensorboard_runs(report: Report) -> str:
    """How TensorBoard names the jobs' runs: by the folder of each under the sweep dir."""
    if all(job.path.name == str(job.num) for job in report.jobs):
        return "job N is the run `N/tensorboard`"
    return "each job's run is `<its folder>/tensorboard`"


def render_markdown(sweep_dir: Path, report: Report) -> str:
    devices = sorted({j.get("device") for j in report.jobs if j.get("device")})
    ok, interrupted, running = len(report.completed), len(report.interrupted), len(report.running)
    out = [
        f"# Sweep report: {sweep_dir}",
        "",
        f"{len(report.jobs)} jobs: {ok} completed, {len(report.failed) - interrupted} failed"
        + (f", {interrupted} interrupted" if interrupted else "")
        + (f", {running} still running (their figures are of the epochs so far)" if running else "")
        + (f", {report.not_started} of the sweep's {report.planned} not started" if report.not_started else "")
        + ". "
        f"Swept: {', '.join(report.swept) or 'nothing'}." + (f" Ran on {'; '.join(devices)}." if devices else ""),
        "Times are training only (validation and process start excluded). "
        "Speedup S(P) = T(1)/T(P) within a group (same strategy and other swept values), for the same work "
        "(time per trained sample), efficiency = S(P)/P."
        + (
            " T(1) is the mean of the group's 1-worker jobs (its seeds): in the jobs table a 1-worker job's "
            "speedup is that mean over its own time, around 1 by its timing noise."
            if any(s["workers"] == 1 and s["runs"] > 1 for s in report.summary)
            else ""
        ),
        "",
        f"Every job's curves: `tensorboard --logdir {sweep_dir}` ({tensorboard_runs(report)}; the HParams tab lists "
        "each run's settings beside its final figures).",
        "",
        "## Jobs",
        "",
    ]
    targets = any(j.get("target_acc") is not None for j in report.jobs)
    averaging = any(j.get("worker_test_acc") for j in report.jobs)
    # lr_scaling gave the jobs different lrs (by workers, or by batch with lr_reference_batch): show them
    scaled = len({j.get("lr") for j in report.jobs if j.get("lr") is not None}) > 1
    # something other than max_epochs ended some job's training (max_time, early_stop, ...): say what
    stops = any(j.get("stopped_by") not in (None, "max_epochs") for j in report.jobs)
    job_cols = [
        "job",
        *extra_columns(report.swept),
        "status",
        "strategy",
        "workers",
        *(["lr"] if scaled else []),
        "epochs",
        *(["stopped_by"] if stops else []),
        "samples",
        "train_time_s",
    ]
    # label-skewed shards: a test_acc can hide labels the final model hardly knows
    skewed = any(j.partition != "iid" for j in report.jobs)
    job_cols += ["samples_per_s", "test_acc"] + (["worker_test_acc"] if averaging else [])
    drift = ("replica_distance", "periodic_averagings", "staleness", "allreduce_wait_ms", "sync_share")
    job_cols += [key for key in drift if any(r[key] is not None for r in report.rows)]
    job_cols += ["worst_class_acc", "worst_class"] if skewed else []
    job_cols += ["speedup", "efficiency"] + (["time_to_target_s", "speedup_to_target"] if targets else [])
    # test accuracy to 4 decimals as beside it (worker_test_acc) and in the progress lines; the CSV keeps all
    shown = [r | {"test_acc": f"{r['test_acc']:.4f}"} if isinstance(r["test_acc"], float) else r for r in report.rows]
    out.append(markdown_table(shown, job_cols))
    if report.failed:
        out += ["", "## Failed or interrupted jobs" if interrupted else "## Failed jobs", ""]
        out += [f"- job {j.num} ({j.path.name}): {j.error or j.status}" for j in report.failed]
    again = rerun_command(report, sweep_dir)
    if again:
        out += ["", f"To run the jobs that did not complete (the completed ones are kept): `{again}`"]
    if report.summary:
        out += ["", "## Speedup and accuracy per group (mean ± std over seeds)", ""]
        table = [
            {
                "group": s["group"],
                "P": s["workers"],
                "runs": s["runs"],
                "test acc %": _pm(s["test_acc_mean"], s["test_acc_std"], 100),
                "workers' acc %": _pm(s["worker_acc_mean"], None, 100),
                "train time s": _pm(s["train_time_s_mean"], s["train_time_s_std"]),
                "samples/s": s["samples_per_s_mean"],
                "sync %": _pm(s["sync_share_mean"], None, 100),
                "S(P)": s["speedup"],
                "E(P)": s["efficiency"],
                "reached target": s["reached_target"],
                "time to target s": s["time_to_target_s_mean"],
                "S to target": s["speedup_to_target"],
                "E to target": s["efficiency_to_target"],
            }
            for s in report.summary
        ]
        cols = [c for c in table[0] if targets or c not in TARGET_COLUMNS]
        if not averaging:
            cols.remove("workers' acc %")
        if all(s["sync_share_mean"] is None for s in report.summary):
            cols.remove("sync %")
        out.append(markdown_table(table, cols))
    if report.plots:
        out += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in report.plots]
    if report.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    return "\n".join(out) + "\n"


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only: works without a display, in CI and on clusters
    import matplotlib.pyplot as plt

    return plt


def _curves(summary: list[dict], y: str) -> dict[str, tuple[list[int], list[float]]]:
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for s in summary:
        if s[y] is not None:
            xs, ys = curves.setdefault(s["group"], ([], []))
            xs.append(s["workers"])
            ys.append(s[y])
    return curves


def plot_scaling(sweep_dir: Path, summary: list[dict], kind: str, cores: int | None = None) -> Path | None:
    """speedup.png / efficiency.png: per group vs workers, for fixed epochs and (if any) to target.
    `cores`: the CPU's, where some job had more workers than it (shared_cores_notes): the most that
    P workers taking turns on them can give is drawn too, min(P, cores)."""
    panels = [(kind, "fixed epochs"), (f"{kind}_to_target", "time to target accuracy")]
    panels = [(key, title) for key, title in panels if any(len(c[0]) > 1 for c in _curves(summary, key).values())]
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    max_p = max(s["workers"] for s in summary)
    for ax, (key, title) in zip(axes[0], panels):
        for label, (xs, ys) in _curves(summary, key).items():
            ax.plot(xs, ys, marker="o", label=label)
        ideal = list(range(1, max_p + 1))
        ax.plot(ideal, ideal if kind == "speedup" else [1.0] * len(ideal), "k--", label="ideal")
        if cores and max_p > cores:
            bound = [min(p, cores) / (1 if kind == "speedup" else p) for p in ideal]
            ax.plot(ideal, bound, ":", color="grey", label=f"ideal on {cores} cores")
        ax.set_xlabel("workers P")
        ax.set_ylabel("S(P) = T(1) / T(P)" if kind == "speedup" else "E(P) = S(P) / P")
        ax.set_title(f"{kind} ({title})")
        ax.set_xticks(ideal)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = sweep_dir / f"{kind}.png"
    save_png(fig, path)
    plt.close(fig)
    return path


def save_plot(fig, ax, ylabel: str, title: str, path: Path) -> Path:
    """Label, grid and legend the single-panel plots alike, write the PNG and free the figure."""
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
    _plt().close(fig)
    return path


def save_png(fig, path: Path) -> None:
    """The figure as a PNG, written atomically: a full disk leaves no truncated plot."""
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)


def plot_sync(sweep_dir: Path, summary: list[dict]) -> Path | None:
    """sync.png: the share of the training time each group's workers spent synchronising (DDP waiting for
    its all-reduce, periodic averaging, the HogWild lock) vs workers: where the speedup goes."""
    curves = _curves(summary, "sync_share_mean")
    if len({s["workers"] for s in summary}) < 2 or not curves:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, (xs, ys) in curves.items():
        ax.plot(xs, [100 * y for y in ys], marker="o", label=label)
    ax.set_xlabel("workers P")
    ax.set_xticks(sorted({s["workers"] for s in summary}))
    ax.set_ylim(bottom=0)
    title = "time spent synchronising vs workers"
    return save_plot(fig, ax, "% of the training time", title, sweep_dir / "sync.png")


def plot_accuracy(sweep_dir: Path, jobs: list[Job], summary: list[dict], swept: list[str]) -> Path | None:
    """accuracy.png: test accuracy vs workers per group; averaging jobs also show each worker's."""
    if len({s["workers"] for s in summary}) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, (xs, ys) in _curves(summary, "test_acc_mean").items():
        stds = [
            next(s["test_acc_std"] or 0.0 for s in summary if s["group"] == label and s["workers"] == x) for x in xs
        ]
        (line,) = ax.plot(xs, ys, marker="o", label=f"{label} (test acc)")
        ax.errorbar(xs, ys, yerr=stds, fmt="none", ecolor=line.get_color(), capsize=3)
        groups = [j for j in jobs if j.ok and " ".join(group_key(j, swept)) == label]
        px = [j.workers for j in groups for _ in (j.get("worker_test_acc") or [])]
        py = [a for j in groups for a in (j.get("worker_test_acc") or [])]
        if py:
            ax.scatter(px, py, marker="x", color=line.get_color(), alpha=0.6, label=f"{label} (each worker)")
    ax.set_xlabel("workers P")
    ax.set_xticks(sorted({s["workers"] for s in summary}))
    return save_plot(fig, ax, "test accuracy", "test accuracy vs workers", sweep_dir / "accuracy.png")


def plot_batch(sweep_dir: Path, jobs: list[Job], swept: list[str]) -> Path | None:
    """accuracy_vs_batch.png: test accuracy vs per-worker batch size (mean over seeds) per setting."""
    if BATCH_KEY not in swept:
        return None
    curves: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for j in jobs:
        if j.ok and j.get("batch_size"):
            label = " ".join(
                [j.strategy, f"P={j.workers}"]
                + [
                    f"{k}={j.overrides.get(k)}"
                    for k in swept
                    if k not in (BATCH_KEY, "strategy", *SEED_KEYS, *WORKER_KEYS)
                ]
            )
            curves[label][int(j.get("batch_size"))].append(j.get("test_acc"))
    if not curves:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, points in curves.items():
        xs = sorted(points)
        ax.plot(xs, [statistics.fmean(points[x]) for x in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size per worker")
    return save_plot(fig, ax, "test accuracy", "test accuracy vs batch size", sweep_dir / "accuracy_vs_batch.png")


def learning_curves(jobs: list[Job], swept: list[str]) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """Each setting's validation accuracy by epoch: label (the swept values but the seed) -> (epochs,
    training time at each epoch's end, val accuracy), means over the setting's completed jobs (its seeds),
    over the epochs every one of them validated (an early stop ends some sooner)."""
    runs: dict[str, list[list[dict]]] = defaultdict(list)
    for j in jobs:
        history = [h for h in j.get("history") or [] if h.get("val_acc") is not None and h.get("time") is not None]
        if j.ok and history:
            label = " ".join(f"{k}={j.overrides.get(k)}" for k in swept if k not in SEED_KEYS)
            runs[label or j.strategy].append(history)
    curves = {}
    for label, histories in runs.items():
        n = min(len(h) for h in histories)
        curves[label] = (
            [histories[0][i]["epoch"] for i in range(n)],
            [statistics.fmean(h[i]["time"] for h in histories) for i in range(n)],
            [statistics.fmean(h[i]["val_acc"] for h in histories) for i in range(n)],
        )
    return curves


def plot_curves(sweep_dir: Path, jobs: list[Job], swept: list[str]) -> Path | None:
    """curves.png: validation accuracy per epoch and against training time (the comparison that decides
    between settings that train at different speeds), one line per setting; None without validations."""
    curves = learning_curves(jobs, swept)
    if not curves:
        return None
    plt = _plt()
    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, (epochs, times, accs) in curves.items():
        (line,) = by_epoch.plot(epochs, accs, marker="o", label=label)
        by_time.plot(times, accs, marker="o", color=line.get_color(), label=label)
    by_epoch.set_xlabel("epoch")
    by_epoch.xaxis.get_major_locator().set_params(integer=True)
    epochs_run = sorted({e for epochs, _, _ in curves.values() for e in epochs})
    if len(epochs_run) <= 12:  # each epoch its tick (one epoch alone got the locator's 0.96 ... 1.04)
        by_epoch.set_xticks(epochs_run)
    by_time.set_xlabel("training time (s)")
    for ax, title in ((by_epoch, "per epoch"), (by_time, "against training time")):
        ax.set_ylabel("validation accuracy")
        ax.set_title(
            f"validation accuracy {title}" + ("" if len(curves) <= MAX_LEGEND else f" ({len(curves)} settings)")
        )
        ax.grid(alpha=0.3)
    if len(curves) <= MAX_LEGEND:
        by_time.legend(fontsize=8)
    fig.tight_layout()
    path = sweep_dir / "curves.png"
    save_png(fig, path)
    plt.close(fig)
    return path


def sweep_lengths(sweeper_params: dict[str, str] | None, task_overrides: list[str]) -> dict[str, int]:
    """How many values each key takes in Hydra's basic sweeper (the jobs are their product), the
    command line overriding the config's `hydra.sweeper.params` key by key, as the sweeper does."""
    from hydra.core.global_hydra import GlobalHydra  # (~0.1 s: not for every importer of this module)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    texts = [f"{k}={v}" for k, v in (sweeper_params or {}).items()] + list(task_overrides)
    lengths: dict[str, int] = {}
    # a glob() sweep picks among a config group's choices: the loader of the running Hydra lists them
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    for o in OverridesParser.create(config_loader=loader).parse_overrides(texts):
        # by the key an override sets: `+data.seed=1,2` sweeps data.seed (its line said "(defaults)")
        values = len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
        lengths[override_key(o.get_key_element())] = values
    return lengths


def planned_jobs(sweep_dir: Path) -> int | None:
    """How many jobs the sweep in `sweep_dir` was to run, from its multirun.yaml (None where it cannot
    be told: no record, or a glob() sweep read outside Hydra)."""
    try:
        recorded = OmegaConf.load(sweep_dir / "multirun.yaml").hydra
        params = OmegaConf.select(recorded, "sweeper.params")
        task = [str(o) for o in recorded.overrides.task]
        return math.prod(sweep_lengths(dict(params) if params else None, task).values())
    except Exception:
        return None


def write_report(sweep_dir: str | Path) -> Report:
    """Read every job dir under `sweep_dir` and write report.csv, summary.csv, report.md and plots."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep dir {sweep_dir} {'is a file' if sweep_dir.exists() else 'does not exist'}")
    jobs = load_jobs(sweep_dir)
    if not jobs:
        raise FileNotFoundError(f"{sweep_dir} holds no job dirs (<job>/.hydra/config.yaml): is it a sweep dir?")
    swept = swept_keys(jobs)
    rows, summary = build_rows(jobs, swept)
    shared = shared_cores(jobs)
    cores = next(iter(shared))[1] if len(shared) == 1 else None  # one CPU whose cores some jobs shared
    for p in PLOTS:  # plots of an earlier build that no longer apply must not linger
        (sweep_dir / p).unlink(missing_ok=True)
    plots = [
        p
        for p in (
            plot_scaling(sweep_dir, summary, "speedup", cores),
            plot_scaling(sweep_dir, summary, "efficiency", cores),
            plot_sync(sweep_dir, summary),
            plot_accuracy(sweep_dir, jobs, summary, swept),
            plot_batch(sweep_dir, jobs, swept),
            plot_curves(sweep_dir, jobs, swept),
        )
        if p is not None
    ]
    notes = []
    if len({j.workers for j in jobs}) > 1 and not any(s["workers"] == 1 and s["speedup"] for s in summary):
        notes.append("no completed 1-worker job in any group: speedup needs workers=1 in the sweep")
    if not any(s["speedup_to_target"] for s in summary) and any(j.get("target_acc") for j in jobs):
        notes.append("no group has a 1-worker job that reached early_stop.target_acc: no speedup to target")
    notes += unequal_work_notes(jobs, swept)
    notes += learned_nothing_notes(jobs)
    notes += precision_notes(jobs)
    notes += shared_cores_notes(shared)
    notes += threads_notes(jobs, swept)
    report = Report(jobs, swept, rows, summary, plots, notes, planned_jobs(sweep_dir))
    if rows:
        write_csv(sweep_dir / "report.csv", list(rows[0]), [list(r.values()) for r in rows])
    if summary:
        write_csv(sweep_dir / "summary.csv", list(summary[0]), [list(s.values()) for s in summary])
    write_atomic(sweep_dir / "report.md", render_markdown(sweep_dir, report))
    return report


def unwritten(e: OSError, sweep_dir: Path) -> str:
    """The line for a report that could not be written (`e`: its write's error: a full disk, a folder
    that is not this user's to write or on a read-only mount)."""
    rebuild = f"python -m psgd.report {shlex.quote(str(sweep_dir))}"
    if e.errno in NO_ROOM:
        return f"no report: cannot write it ({failed_write(e)}); free space there, then: {rebuild}"
    return (
        f"no report: cannot write it ({failed_write(e)}); make the sweep dir writable, then: {rebuild} "
        "(or copy the sweep dir somewhere writable and give the copy)"
    )


def continue_command(sweep_dir: Path) -> str | None:
    """The command that continues the sweep in `sweep_dir` (its completed jobs kept, the others run):
    its overrides as Hydra recorded them in multirun.yaml (Hydra's own but the mode and the sweep dir,
    which continue_sweep names), or None without a readable record."""
    try:
        recorded = OmegaConf.load(sweep_dir / "multirun.yaml").hydra.overrides
        task, own = [str(o) for o in recorded.task], [str(o) for o in recorded.hydra]
    except Exception:  # none (a sweep dir of another launcher's), or damaged
        return None
    task = [o for o in task if override_key(o) != "continue_sweep"]
    own = [o for o in own if override_key(o) not in ("hydra.mode", "hydra.sweep.dir") and o != NOT_IN_DIR_NAMES]
    words = [*task, *own, shell_override("continue_sweep", sweep_dir)]
    return "python sweep.py -m " + " ".join(shlex.quote(w) for w in words)


def describe(report: Report, sweep_dir: Path) -> str:
    ok = len(report.completed)
    # a sweep that stopped (Ctrl-C, SIGTERM, a closed terminal) before all its jobs had run is not "finished"
    state = (
        "still running"
        if report.running
        else "stopped early"
        if report.not_started or report.interrupted
        else "finished"
    )
    parts = [f"psgd: sweep {state}: {ok}/{len(report.jobs) + report.not_started} jobs completed"]
    for word, jobs in (
        ("failed", [j for j in report.failed if j.status != "interrupted"]),
        ("interrupted", report.interrupted),
        ("running", report.running),
    ):
        if jobs:
            parts.append(f", {len(jobs)} {word} (jobs {', '.join(str(j.num) for j in jobs)})")
    if report.not_started:
        parts.append(f", {report.not_started} not started")
    parts.append(f"; report in {sweep_dir / 'report.md'}")
    again = rerun_command(report, sweep_dir)
    return "".join(parts) + (f"; to run them again: {again}" if again else "")


def rerun_command(report: Report, sweep_dir: Path) -> str | None:
    """The command that runs a sweep's failed, interrupted and not started jobs (continue_sweep), or
    None: every job completed, or one still runs (the sweep is going on)."""
    if report.running or not (report.failed or report.not_started):
        return None
    return continue_command(sweep_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m psgd.report", description="(Re)build a sweep's report.")
    parser.add_argument("sweep_dir", help="a sweep dir written by sweep.py -m (holds 0/, 1/, ...)")
    args = parser.parse_args(argv)
    try:
        report = write_report(args.sweep_dir)
    except FileNotFoundError as e:
        print(f"psgd: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk
        print(f"psgd: error: {unwritten(e, Path(args.sweep_dir))}", file=sys.stderr)
        return 2
    print(describe(report, Path(args.sweep_dir)))
    return 1 if report.failed or (report.not_started and not report.running) else 0


if __name__ == "__main__":
    sys.exit(main())
