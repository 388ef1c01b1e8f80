"""A sweep's report: one row per job, speedup and efficiency per group, tables and plots.

`sweep.py -m ...` writes it when the multirun ends; `python -m psgd.report <sweep dir>` rebuilds it from
the job dirs alone. It writes into the sweep dir report.csv (one row per job), summary.csv (one row per
group and worker count: mean ± std over seeds, speedup and efficiency, for the fixed epochs and to the
target accuracy), report.md (both tables, the failed jobs, notes on reading the figures) and the plots
speedup.png, efficiency.png, sync.png, accuracy.png, accuracy_vs_batch.png and curves.png where they apply.

A group is every job with the same strategy and the same values of the swept keys other than workers
and seed. S(P) = T(1)/T(P), efficiency S(P)/P, where T(1) is the mean of the group's 1-worker jobs and T
a job's training time per sample it trained (all workers together): jobs that trained different numbers
of samples (trainer.limit_train_batches counts each worker's batches; an early stop) still compare the
same work, and where they trained the same, S(P) is exactly the ratio of their times.
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

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from psgd.advice import (
    few_steps,
    hogwild_workers,
    learned_nothing,
    learned_nothing_line,
    scales_by_workers,
    worst_class,
)
from psgd.environment import cores_of
from psgd.io import NO_ROOM, atomic_file, failed_write, read_json, write_atomic, write_csv
from psgd.overrides import NOT_IN_DIR_NAMES, as_typed, override_key, shell_override
from psgd.process import still_running

WORKER_KEYS = ("workers", "trainer.devices")  # the keys that set P
SEED_KEYS = ("seed",)
BATCH_KEY = "data.batch_size"
PLOTS = ("speedup.png", "efficiency.png", "sync.png", "accuracy.png", "accuracy_vs_batch.png", "curves.png")
MAX_LEGEND = 16  # curves.png: more settings than this get no legend (it would hide the lines)
# Lightning's older spellings of a precision
PRECISION_ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}
TARGET_COLUMNS = ("reached target", "time to target s", "S to target", "E to target")


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
    partition: str = "iid"  # data.partition as configured
    precision: str | None = None  # trainer.precision as configured

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def get(self, key: str) -> Any:
        return self.metrics.get(key)

    @property
    def samples(self) -> int | None:
        """Training samples of the whole run, all workers together, or None for a record without them."""
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
        """The sweep's jobs without a dir: the sweep stopped before them (or is still going)."""
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
        """Jobs whose process is still training (a report rebuilt while the sweep runs)."""
        return [j for j in self.jobs if j.status == "running"]

    @property
    def interrupted(self) -> list[Job]:
        """Those of `failed` stopped by Ctrl-C or SIGTERM."""
        return [j for j in self.failed if j.status == "interrupted"]


# ---- reading the sweep dir ----


def load_job(path: Path) -> Job | None:
    """The job in `path` (its .hydra/ and, once it trained or failed, its metrics.json); None if it has no
    .hydra/config.yaml. A record or config damaged by hand makes a failed job that says so."""
    hydra_dir = path / ".hydra"
    if not (hydra_dir / "config.yaml").exists():
        return None
    unreadable = None
    try:
        overrides = {}
        for text in OmegaConf.load(hydra_dir / "overrides.yaml"):
            text = as_typed(str(text))
            overrides[override_key(text)] = text.partition("=")[2]
        cfg = OmegaConf.load(hydra_dir / "config.yaml")
    except Exception as e:
        overrides, cfg = {}, OmegaConf.create()
        unreadable = f"its Hydra config in {hydra_dir} is unreadable ({type(e).__name__}: {str(e).splitlines()[0]})"
    record = path / "metrics.json"
    try:
        metrics = read_json(record) if record.exists() else {}
        if not isinstance(metrics, dict):
            raise ValueError(f"a JSON {type(metrics).__name__}, not a record")
    except (OSError, ValueError) as e:
        metrics, unreadable = {}, unreadable or f"{record} is unreadable ({type(e).__name__}: {e})"
    status = "failed" if unreadable else metrics.get("status", "not finished")
    error = unreadable or metrics.get("error")
    if not unreadable and still_running(metrics):
        status = "running"
    elif status in ("running", "trained"):  # its process ended without writing the final status
        status, error = "failed", error or f"ended with status {status!r} (killed?)"
    precision = OmegaConf.select(cfg, "trainer.precision", default=None)  # 16 in YAML is an int
    return Job(
        num=_job_num(path),
        path=path,
        overrides=overrides,
        status=status,
        error=error,
        strategy=metrics.get("strategy") or str(OmegaConf.select(cfg, "strategy.name", default="?")),
        workers=int(metrics.get("world_size") or _config_workers(cfg)),
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


def _job_num(path: Path) -> int:
    """The job's number in its sweep: its dir's name (Hydra's <n>/), else what Hydra recorded; -1 if unknown."""
    if path.name.isdigit():
        return int(path.name)
    try:
        return int(OmegaConf.load(path / ".hydra" / "hydra.yaml").hydra.job.num)
    except Exception:
        return -1


def load_jobs(sweep_dir: Path) -> list[Job]:
    """The jobs under `sweep_dir` in job order: its <n>/ dirs; in a dir Hydra made (it has multirun.yaml) also
    folders at any depth that a changed hydra.sweep.subdir named (`workers=2,seed=0/`)."""
    pattern = "**/.hydra/config.yaml" if (sweep_dir / "multirun.yaml").is_file() else "*/.hydra/config.yaml"
    found = sorted(f.parent.parent for f in sweep_dir.glob(pattern) if f.parent.parent != sweep_dir)
    jobs = [j for j in map(load_job, found) if j is not None]
    return sorted(jobs, key=lambda j: (j.num < 0, j.num, str(j.path)))


def swept_keys(jobs: list[Job]) -> list[str]:
    """Override keys that take more than one value across the jobs, in command-line order."""
    keys = list(dict.fromkeys(k for job in jobs for k in job.overrides))
    return [k for k in keys if len({j.overrides.get(k) for j in jobs}) > 1]


def group_key(job: Job, swept: list[str]) -> tuple[str, ...]:
    """Jobs that differ only in workers and seed form one speedup curve."""
    rest = tuple(f"{k}={job.overrides.get(k)}" for k in swept if k not in (*WORKER_KEYS, *SEED_KEYS, "strategy"))
    return (job.strategy, *rest)


def extra_columns(swept: list[str]) -> list[str]:
    """Swept keys that are not already a column of their own."""
    return [k for k in swept if k not in ("workers", "strategy")]


# ---- the tables ----


def sync_share(job: "Job | dict") -> float | None:
    """The share of a job's training time its workers synchronised: DDP's wait for the gradient all-reduce,
    periodic model averaging's time averaging, or locked HogWild's wait for the lock; None for none."""
    shares = (job.get("allreduce_wait_share"), job.get("averaging_share"), job.get("lock_wait_share"))
    return next((v for v in shares if v is not None), None)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _std(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _r(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def completed_by_group(jobs: list[Job], swept: list[str]) -> dict[tuple, dict[int, list[Job]]]:
    """The completed jobs of each speedup group, by worker count."""
    by_group: dict[tuple, dict[int, list[Job]]] = defaultdict(lambda: defaultdict(list))
    for job in jobs:
        if job.ok:
            by_group[group_key(job, swept)][job.workers].append(job)
    return by_group


def build_rows(jobs: list[Job], swept: list[str]) -> tuple[list[dict], list[dict]]:
    """The rows of report.csv (one per job) and of summary.csv (one per group and worker count)."""
    by_group = completed_by_group(jobs, swept)
    # per sample where every completed job of the group says its samples, so that unequal work compares
    per_sample = {g: all(j.samples for js in per_p.values() for j in js) for g, per_p in by_group.items()}

    def work_time(job: Job) -> float | None:
        t = job.get("train_time_s")
        if t is None or not job.ok:
            return None
        return t / job.samples if per_sample[group_key(job, swept)] else t

    def mean_over(group: tuple, p: int, value) -> float | None:
        return _mean([v for j in by_group[group].get(p, []) if (v := value(j)) is not None])

    def time_to_target(job: Job) -> float | None:
        return job.get("time_to_target_s")

    rows = []
    for job in jobs:
        g = group_key(job, swept)
        t1, ttt1 = mean_over(g, 1, work_time), mean_over(g, 1, time_to_target)
        speedup = _ratio(t1, work_time(job)) if job.ok else None
        speedup_t = _ratio(ttt1, time_to_target(job)) if job.ok else None
        worker_acc = job.get("worker_test_acc")
        staleness = [h["staleness"] for h in job.get("history") or [] if h.get("staleness") is not None]
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
                "lr": job.get("lr"),  # after lr_scaling
                "epochs": job.get("epochs"),
                "stopped_by": job.get("stopped_by"),
                "samples": job.samples,
                "train_time_s": _r(job.get("train_time_s"), 2),
                "samples_per_s": job.get("samples_per_s"),
                "test_acc": job.get("test_acc"),
                "worker_test_acc": " ".join(f"{a:.4f}" for a in worker_acc) if worker_acc else None,
                "replica_distance": _r(job.get("replica_distance"), 4),
                "periodic_averagings": job.get("periodic_averagings") if job.get("period") else None,
                "staleness": _r(_mean(staleness), 3),
                "allreduce_wait_ms": job.get("allreduce_wait_ms"),
                "sync_share": sync_share(job),
                "worst_class_acc": worst and worst[1],
                "worst_class": worst and worst[0],
                "time_to_target_s": _r(time_to_target(job), 2),
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
        t1, ttt1 = mean_over(g, 1, work_time), mean_over(g, 1, time_to_target)
        for p in sorted(per_p):
            group = per_p[p]
            times = [j.get("train_time_s") for j in group]
            accs = [j.get("test_acc") for j in group]
            ttt = [t for j in group if (t := time_to_target(j)) is not None]
            s, s_t = _ratio(t1, mean_over(g, p, work_time)), _ratio(ttt1, _mean(ttt))
            summary.append(
                {
                    "group": " ".join(g),
                    "strategy": g[0],
                    "workers": p,
                    "runs": len(group),
                    "test_acc_mean": _r(_mean(accs), 6),
                    "test_acc_std": _r(_std(accs), 6),
                    "worker_acc_mean": _r(_mean([a for j in group for a in j.get("worker_test_acc") or []]), 6),
                    "sync_share_mean": _r(mean_over(g, p, sync_share), 4),
                    "train_time_s_mean": _r(_mean(times), 2),
                    "train_time_s_std": _r(_std(times), 2),
                    "samples_per_s_mean": _r(_mean([j.get("samples_per_s") or 0.0 for j in group]), 1),
                    "speedup": _r(s, 3),
                    "efficiency": _r(_ratio(s, p), 3),
                    "reached_target": f"{len(ttt)}/{len(group)}",
                    "time_to_target_s_mean": _r(_mean(ttt), 2),
                    "speedup_to_target": _r(s_t, 3),
                    "efficiency_to_target": _r(_ratio(s_t, p), 3),
                }
            )
    return rows, summary


# ---- notes: what a reader of the figures should know ----


def _jobs_named(nums: list[int]) -> str:
    return f"job{'s' if len(nums) > 1 else ''} {', '.join(map(str, nums))}"


def unequal_work_notes(jobs: list[Job], swept: list[str]) -> list[str]:
    """A note per set of groups whose completed jobs trained numbers of samples more than 1 % apart."""
    groups_by_counts: dict[str, list[str]] = defaultdict(list)
    for g, by_p in completed_by_group(jobs, swept).items():
        per_p = {p: ns for p, group in by_p.items() if (ns := {j.samples for j in group if j.samples})}
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
    """A note where the worker counts ran different torch threads per worker without the sweep setting them
    (threads_per_worker=null is cores // workers)."""
    if "threads_per_worker" in swept:
        return []
    by_p: dict[int, set[int]] = defaultdict(set)
    for job in jobs:
        if job.get("threads_per_worker"):
            by_p[job.workers].add(job.get("threads_per_worker"))
    if len(set().union(*by_p.values())) < 2:
        return []
    ran = ", ".join(f"workers={p}: {'/'.join(map(str, sorted(ts)))}" for p, ts in sorted(by_p.items()))
    one = by_p.get(1, set())
    against = ""
    if one and max(one) > 1:
        against = (
            f": S(P) compares P workers with one worker that ran {'/'.join(map(str, sorted(one)))} threads, not "
            "with one single-threaded worker (threads_per_worker=1 compares those)"
        )
    return [f"threads per worker differed ({ran}; threads_per_worker=null is cores // workers){against}"]


def shared_cores(jobs: list[Job]) -> dict[tuple[str, int], set[tuple[int, int]]]:
    """Per CPU (name, cores) on which some jobs ran more threads than it has cores: those jobs'
    (workers per node, threads per worker)."""
    over: dict[tuple[str, int], set[tuple[int, int]]] = defaultdict(set)
    for job in jobs:
        cpu = cores_of(job.get("device"))
        world = job.get("world_size") or job.workers
        per_node, threads = world // max(1, job.get("num_nodes") or 1), job.get("threads_per_worker") or 1
        if cpu and per_node * threads > cpu[1]:
            over[cpu].add((per_node, threads))
    return over


def shared_cores_notes(shared: dict[tuple[str, int], set[tuple[int, int]]]) -> list[str]:
    """A note per CPU of shared_cores: those jobs' workers took turns on its cores."""
    notes = []
    for (name, cores), counts in shared.items():
        runs = ", ".join(f"workers={p}" + (f" x {t} threads" if t > 1 else "") for p, t in sorted(counts))
        notes.append(
            f"{runs}: more threads than the {cores} cores of {name}, so the workers took turns on the cores; "
            f"their speedup over one worker cannot pass {cores}, whatever the strategy"
        )
    return notes


def learned_nothing_notes(jobs: list[Job]) -> list[str]:
    """One note naming the completed jobs that learned nothing, and what to change."""
    bad = [j for j in jobs if learned_nothing(j)]
    if not bad:
        return []
    accs = ", ".join(f"{j.get('test_acc'):.4f}" for j in bad)
    hogwild = "P" if all(hogwild_workers(j.strategy, j.workers) for j in bad) else None
    by_workers = all(scales_by_workers(j) for j in bad)
    trained = [few_steps(j) for j in bad]
    steps = ", ".join(map(str, trained)) if None not in trained else None
    line = learned_nothing_line(accs, hogwild, by_workers=by_workers, steps=steps)
    return [f"{_jobs_named([j.num for j in bad])} {line}"]


def precision_notes(jobs: list[Job]) -> list[str]:
    """A note per configured precision that ran as another (16-mixed runs as bf16-mixed without CUDA)."""
    ran_as: dict[tuple[str, str], list[int]] = defaultdict(list)
    for job in jobs:
        ran = job.get("precision")
        if ran and job.precision and PRECISION_ALIASES.get(job.precision, job.precision) != ran:
            ran_as[(job.precision, ran)].append(job.num)
    notes = []
    for (asked, ran), nums in ran_as.items():
        why = ": Lightning runs it so without a CUDA device" if asked.startswith("16") and ran == "bf16-mixed" else ""
        notes.append(f"trainer.precision={asked} ran as {ran} ({_jobs_named(nums)}){why}")
    return notes


def report_notes(jobs: list[Job], swept: list[str], summary: list[dict], shared: dict) -> list[str]:
    notes = []
    if len({j.workers for j in jobs}) > 1 and not any(s["workers"] == 1 and s["speedup"] for s in summary):
        notes.append("no completed 1-worker job in any group: speedup needs workers=1 in the sweep")
    if not any(s["speedup_to_target"] for s in summary) and any(j.get("target_acc") for j in jobs):
        notes.append("no group has a 1-worker job that reached early_stop.target_acc: no speedup to target")
    return (
        notes
        + unequal_work_notes(jobs, swept)
        + learned_nothing_notes(jobs)
        + precision_notes(jobs)
        + shared_cores_notes(shared)
        + threads_notes(jobs, swept)
    )


# ---- report.md ----


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


def _pm(mean: float | None, std: float | None, scale: float = 1.0) -> str:
    """'91.00 ± 1.41': a mean (times `scale`) and its std, to 2 decimals."""
    if mean is None:
        return ""
    text = f"{mean * scale:.2f}"
    return f"{text} ± {std * scale:.2f}" if std is not None else text


def job_columns(report: Report) -> list[str]:
    """The columns of report.md's jobs table: those of report.csv that tell this sweep's jobs apart."""
    jobs = report.jobs
    columns = ["job", *extra_columns(report.swept), "status", "strategy", "workers"]
    if len({j.get("lr") for j in jobs if j.get("lr") is not None}) > 1:  # lr_scaling made them differ
        columns.append("lr")
    columns.append("epochs")
    if any(j.get("stopped_by") not in (None, "max_epochs") for j in jobs):
        columns.append("stopped_by")
    columns += ["samples", "train_time_s", "samples_per_s", "test_acc"]
    if any(j.get("worker_test_acc") for j in jobs):
        columns.append("worker_test_acc")
    for key in ("replica_distance", "periodic_averagings", "staleness", "allreduce_wait_ms", "sync_share"):
        if any(r[key] is not None for r in report.rows):
            columns.append(key)
    if any(j.partition != "iid" for j in jobs):  # label-skewed shards: a test_acc can hide a class
        columns += ["worst_class_acc", "worst_class"]
    columns += ["speedup", "efficiency"]
    if any(j.get("target_acc") is not None for j in jobs):
        columns += ["time_to_target_s", "speedup_to_target"]
    return columns


def summary_table(report: Report) -> str:
    """report.md's table of summary.csv, in percent and mean ± std."""
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
    targets = any(j.get("target_acc") is not None for j in report.jobs)
    hidden = set() if targets else set(TARGET_COLUMNS)
    if not any(j.get("worker_test_acc") for j in report.jobs):
        hidden.add("workers' acc %")
    if all(s["sync_share_mean"] is None for s in report.summary):
        hidden.add("sync %")
    return markdown_table(table, [c for c in table[0] if c not in hidden])


def render_markdown(sweep_dir: Path, report: Report) -> str:
    devices = sorted({j.get("device") for j in report.jobs if j.get("device")})
    interrupted, running = len(report.interrupted), len(report.running)
    counts = f"{len(report.jobs)} jobs: {len(report.completed)} completed, {len(report.failed) - interrupted} failed"
    if interrupted:
        counts += f", {interrupted} interrupted"
    if running:
        counts += f", {running} still running (their figures are of the epochs so far)"
    if report.not_started:
        counts += f", {report.not_started} of the sweep's {report.planned} not started"
    counts += f". Swept: {', '.join(report.swept) or 'nothing'}." + (
        f" Ran on {'; '.join(devices)}." if devices else ""
    )
    times = (
        "Times are training only (validation and process start excluded). Speedup S(P) = T(1)/T(P) within a "
        "group (same strategy and other swept values), for the same work (time per trained sample), "
        "efficiency = S(P)/P."
    )
    if any(s["workers"] == 1 and s["runs"] > 1 for s in report.summary):
        times += (
            " T(1) is the mean of the group's 1-worker jobs (its seeds): in the jobs table a 1-worker job's "
            "speedup is that mean over its own time, around 1 by its timing noise."
        )
    if all(job.path.name == str(job.num) for job in report.jobs):
        runs = "job N is the run `N/tensorboard`"
    else:
        runs = "each job's run is `<its folder>/tensorboard`"
    out = [
        f"# Sweep report: {sweep_dir}",
        "",
        counts,
        times,
        "",
        f"Every job's curves: `tensorboard --logdir {sweep_dir}` ({runs}; the HParams tab lists "
        "each run's settings beside its final figures).",
        "",
        "## Jobs",
        "",
    ]
    # test accuracy to 4 decimals, as worker_test_acc and the progress lines show it; the CSV keeps it whole
    shown = [r | {"test_acc": f"{r['test_acc']:.4f}"} if isinstance(r["test_acc"], float) else r for r in report.rows]
    out.append(markdown_table(shown, job_columns(report)))
    if report.failed:
        out += ["", "## Failed or interrupted jobs" if interrupted else "## Failed jobs", ""]
        out += [f"- job {j.num} ({j.path.name}): {j.error or j.status}" for j in report.failed]
    again = rerun_command(report, sweep_dir)
    if again:
        out += ["", f"To run the jobs that did not complete (the completed ones are kept): `{again}`"]
    if report.summary:
        out += ["", "## Speedup and accuracy per group (mean ± std over seeds)", "", summary_table(report)]
    if report.plots:
        out += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in report.plots]
    if report.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    return "\n".join(out) + "\n"


# ---- plots ----


def save_png(fig: Figure, path: Path) -> None:
    """The figure as a PNG, written atomically: a full disk leaves no truncated plot."""
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)


def _finish(ax, xlabel: str, ylabel: str, title: str, legend: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8)


def _curves(summary: list[dict], y: str) -> dict[str, tuple[list[int], list[float]]]:
    """Per group, the worker counts and the summary's `y` at them (where it has one)."""
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for s in summary:
        if s[y] is not None:
            xs, ys = curves.setdefault(s["group"], ([], []))
            xs.append(s["workers"])
            ys.append(s[y])
    return curves


def plot_scaling(sweep_dir: Path, summary: list[dict], kind: str, cores: int | None = None) -> Path | None:
    """speedup.png or efficiency.png (`kind`): per group against workers, for the fixed epochs and (where a
    group has it) to the target accuracy, beside the ideal; and with `cores` (a CPU that some jobs had more
    workers than cores on) the most that P workers taking turns on them can give, min(P, cores)."""
    panels = [(kind, "fixed epochs"), (f"{kind}_to_target", "time to target accuracy")]
    panels = [(key, title) for key, title in panels if any(len(xs) > 1 for xs, _ in _curves(summary, key).values())]
    if not panels:
        return None
    fig = Figure(figsize=(6 * len(panels), 4.5), layout="tight")
    max_p = max(s["workers"] for s in summary)
    ideal = list(range(1, max_p + 1))
    if kind == "speedup":
        best, on_cores = ideal, [min(p, cores or p) for p in ideal]
    else:
        best, on_cores = [1.0] * len(ideal), [min(p, cores or p) / p for p in ideal]
    for ax, (key, title) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for label, (xs, ys) in _curves(summary, key).items():
            ax.plot(xs, ys, marker="o", label=label)
        ax.plot(ideal, best, "k--", label="ideal")
        if cores and max_p > cores:
            ax.plot(ideal, on_cores, ":", color="grey", label=f"ideal on {cores} cores")
        ax.set_xticks(ideal)
        ylabel = "S(P) = T(1) / T(P)" if kind == "speedup" else "E(P) = S(P) / P"
        _finish(ax, "workers P", ylabel, f"{kind} ({title})")
    path = sweep_dir / f"{kind}.png"
    save_png(fig, path)
    return path


def plot_sync(sweep_dir: Path, summary: list[dict]) -> Path | None:
    """sync.png: the share of the training time each group's workers spent synchronising, against workers."""
    curves = _curves(summary, "sync_share_mean")
    workers = sorted({s["workers"] for s in summary})
    if len(workers) < 2 or not curves:
        return None
    fig = Figure(figsize=(6.5, 4.5), layout="tight")
    ax = fig.subplots()
    for label, (xs, ys) in curves.items():
        ax.plot(xs, [100 * y for y in ys], marker="o", label=label)
    ax.set_xticks(workers)
    ax.set_ylim(bottom=0)
    _finish(ax, "workers P", "% of the training time", "time spent synchronising vs workers")
    save_png(fig, sweep_dir / "sync.png")
    return sweep_dir / "sync.png"


def plot_accuracy(sweep_dir: Path, jobs: list[Job], summary: list[dict], swept: list[str]) -> Path | None:
    """accuracy.png: test accuracy (mean ± std) against workers per group; averaging jobs also each worker's."""
    workers = sorted({s["workers"] for s in summary})
    if len(workers) < 2:
        return None
    fig = Figure(figsize=(6.5, 4.5), layout="tight")
    ax = fig.subplots()
    for label, (xs, ys) in _curves(summary, "test_acc_mean").items():
        stds = [s["test_acc_std"] or 0.0 for s in summary if s["group"] == label and s["test_acc_mean"] is not None]
        (line,) = ax.plot(xs, ys, marker="o", label=f"{label} (test acc)")
        ax.errorbar(xs, ys, yerr=stds, fmt="none", ecolor=line.get_color(), capsize=3)
        group = [j for j in jobs if j.ok and " ".join(group_key(j, swept)) == label]
        px = [j.workers for j in group for _ in j.get("worker_test_acc") or []]
        py = [a for j in group for a in j.get("worker_test_acc") or []]
        if py:
            ax.scatter(px, py, marker="x", color=line.get_color(), alpha=0.6, label=f"{label} (each worker)")
    ax.set_xticks(workers)
    _finish(ax, "workers P", "test accuracy", "test accuracy vs workers")
    save_png(fig, sweep_dir / "accuracy.png")
    return sweep_dir / "accuracy.png"


def plot_batch(sweep_dir: Path, jobs: list[Job], swept: list[str]) -> Path | None:
    """accuracy_vs_batch.png: test accuracy (mean over seeds) against the per-worker batch size, per setting."""
    if BATCH_KEY not in swept:
        return None
    others = [k for k in swept if k not in (BATCH_KEY, "strategy", *SEED_KEYS, *WORKER_KEYS)]
    curves: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for j in jobs:
        if j.ok and j.get("batch_size"):
            label = " ".join([j.strategy, f"P={j.workers}", *(f"{k}={j.overrides.get(k)}" for k in others)])
            curves[label][int(j.get("batch_size"))].append(j.get("test_acc"))
    if not curves:
        return None
    fig = Figure(figsize=(6.5, 4.5), layout="tight")
    ax = fig.subplots()
    for label, points in curves.items():
        xs = sorted(points)
        ax.plot(xs, [statistics.fmean(points[x]) for x in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    _finish(ax, "batch size per worker", "test accuracy", "test accuracy vs batch size")
    save_png(fig, sweep_dir / "accuracy_vs_batch.png")
    return sweep_dir / "accuracy_vs_batch.png"


def learning_curves(jobs: list[Job], swept: list[str]) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """Each setting's validation accuracy by epoch: label (the swept values but the seed) -> (epochs, training
    time at each epoch's end, val accuracy), means over the setting's completed jobs, over the epochs every
    one of them validated."""
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
    """curves.png: validation accuracy per epoch and against training time, one line per setting; None
    without validations."""
    curves = learning_curves(jobs, swept)
    if not curves:
        return None
    fig = Figure(figsize=(12, 4.5), layout="tight")
    by_epoch, by_time = fig.subplots(1, 2)
    for label, (epochs, times, accs) in curves.items():
        (line,) = by_epoch.plot(epochs, accs, marker="o", label=label)
        by_time.plot(times, accs, marker="o", color=line.get_color(), label=label)
    by_epoch.xaxis.get_major_locator().set_params(integer=True)
    epochs_run = sorted({e for epochs, _, _ in curves.values() for e in epochs})
    if len(epochs_run) <= 12:
        by_epoch.set_xticks(epochs_run)
    legend = len(curves) <= MAX_LEGEND
    settings = "" if legend else f" ({len(curves)} settings)"
    _finish(by_epoch, "epoch", "validation accuracy", f"validation accuracy per epoch{settings}", legend=False)
    title = f"validation accuracy against training time{settings}"
    _finish(by_time, "training time (s)", "validation accuracy", title, legend=legend)
    save_png(fig, sweep_dir / "curves.png")
    return sweep_dir / "curves.png"


# ---- the sweep as a whole ----


def sweep_lengths(sweeper_params: dict[str, str] | None, task_overrides: list[str]) -> dict[str, int]:
    """How many values each key takes in Hydra's basic sweeper (the jobs are their product), the command
    line overriding the config's `hydra.sweeper.params` key by key, as the sweeper does. A glob() over a
    config group's choices is counted where Hydra is initialized (its config loader lists them)."""
    texts = [f"{k}={v}" for k, v in (sweeper_params or {}).items()] + list(task_overrides)
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    lengths: dict[str, int] = {}
    for o in OverridesParser.create(config_loader=loader).parse_overrides(texts):
        values = len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
        lengths[override_key(o.get_key_element())] = values  # `+data.seed=1,2` sweeps data.seed
    return lengths


def _recorded(sweep_dir: Path):
    """The `hydra` node Hydra recorded in the sweep dir's multirun.yaml (raises where there is none)."""
    return OmegaConf.load(sweep_dir / "multirun.yaml").hydra


def planned_jobs(sweep_dir: Path) -> int | None:
    """How many jobs the sweep in `sweep_dir` was to run, from its multirun.yaml; None where it cannot be
    told (no record, or a glob() sweep read outside Hydra)."""
    try:
        recorded = _recorded(sweep_dir)
        params = OmegaConf.select(recorded, "sweeper.params")
        task = [str(o) for o in recorded.overrides.task]
        return math.prod(sweep_lengths(dict(params) if params else None, task).values())
    except Exception:
        return None


def continue_command(sweep_dir: Path) -> str | None:
    """The command that continues the sweep in `sweep_dir` (its completed jobs kept, the others run): its
    overrides as recorded in multirun.yaml, Hydra's own but the mode and the sweep dir; None without a
    readable record."""
    try:
        recorded = _recorded(sweep_dir).overrides
        task, own = [str(o) for o in recorded.task], [str(o) for o in recorded.hydra]
    except Exception:
        return None
    task = [o for o in task if override_key(o) != "continue_sweep"]
    own = [o for o in own if override_key(o) not in ("hydra.mode", "hydra.sweep.dir") and o != NOT_IN_DIR_NAMES]
    words = [*task, *own, shell_override("continue_sweep", sweep_dir)]
    return "python sweep.py -m " + " ".join(shlex.quote(w) for w in words)


def rerun_command(report: Report, sweep_dir: Path) -> str | None:
    """The command that runs a sweep's failed, interrupted and not started jobs, or None: every job
    completed, or one still runs."""
    if report.running or not (report.failed or report.not_started):
        return None
    return continue_command(sweep_dir)


def write_report(sweep_dir: str | Path) -> Report:
    """Read every job dir under `sweep_dir`; write the plots, report.csv, summary.csv and report.md.

    Raises:
        FileNotFoundError: `sweep_dir` is not a folder, or holds no job dirs.
        OSError: a file could not be written (every file written is whole).
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep dir {sweep_dir} {'is a file' if sweep_dir.exists() else 'does not exist'}")
    jobs = load_jobs(sweep_dir)
    if not jobs:
        raise FileNotFoundError(f"{sweep_dir} holds no job dirs (<job>/.hydra/config.yaml): is it a sweep dir?")
    swept = swept_keys(jobs)
    rows, summary = build_rows(jobs, swept)
    shared = shared_cores(jobs)
    cores = next(iter(shared))[1] if len(shared) == 1 else None
    for name in PLOTS:  # an earlier build's plots that no longer apply
        (sweep_dir / name).unlink(missing_ok=True)
    plots = [
        plot_scaling(sweep_dir, summary, "speedup", cores),
        plot_scaling(sweep_dir, summary, "efficiency", cores),
        plot_sync(sweep_dir, summary),
        plot_accuracy(sweep_dir, jobs, summary, swept),
        plot_batch(sweep_dir, jobs, swept),
        plot_curves(sweep_dir, jobs, swept),
    ]
    notes = report_notes(jobs, swept, summary, shared)
    report = Report(jobs, swept, rows, summary, [p for p in plots if p], notes, planned_jobs(sweep_dir))
    if rows:
        write_csv(sweep_dir / "report.csv", list(rows[0]), [list(r.values()) for r in rows])
    if summary:
        write_csv(sweep_dir / "summary.csv", list(summary[0]), [list(s.values()) for s in summary])
    write_atomic(sweep_dir / "report.md", render_markdown(sweep_dir, report))
    return report


def unwritten(e: OSError, sweep_dir: Path) -> str:
    """The line for a report that could not be written (`e`: its write's error)."""
    rebuild = f"python -m psgd.report {shlex.quote(str(sweep_dir))}"
    if e.errno in NO_ROOM:
        return f"no report: cannot write it ({failed_write(e)}); free space there, then: {rebuild}"
    return (
        f"no report: cannot write it ({failed_write(e)}); make the sweep dir writable, then: {rebuild} "
        "(or copy the sweep dir somewhere writable and give the copy)"
    )


def describe(report: Report, sweep_dir: Path) -> str:
    """The sweep's last line: its state, the jobs that did not complete, where the report is, and the
    command that runs those jobs again."""
    if report.running:
        state = "still running"
    elif report.not_started or report.interrupted:
        state = "stopped early"
    else:
        state = "finished"
    line = f"psgd: sweep {state}: {len(report.completed)}/{len(report.jobs) + report.not_started} jobs completed"
    failed = [j for j in report.failed if j.status != "interrupted"]
    for word, jobs in (("failed", failed), ("interrupted", report.interrupted), ("running", report.running)):
        if jobs:
            line += f", {len(jobs)} {word} (jobs {', '.join(str(j.num) for j in jobs)})"
    if report.not_started:
        line += f", {report.not_started} not started"
    line += f"; report in {sweep_dir / 'report.md'}"
    again = rerun_command(report, sweep_dir)
    return line + (f"; to run them again: {again}" if again else "")


def main(argv: list[str] | None = None) -> int:
    """`python -m psgd.report <sweep dir>`. Exit code 0: every job completed (or some still run); 1: some
    failed or did not start; 2: no report."""
    parser = argparse.ArgumentParser(prog="python -m psgd.report", description="(Re)build a sweep's report.")
    parser.add_argument("sweep_dir", help="a sweep dir written by sweep.py -m (holds 0/, 1/, ...)")
    args = parser.parse_args(argv)
    try:
        report = write_report(args.sweep_dir)
    except FileNotFoundError as e:
        print(f"psgd: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"psgd: error: {unwritten(e, Path(args.sweep_dir))}", file=sys.stderr)
        return 2
    print(describe(report, Path(args.sweep_dir)))
    return 1 if report.failed or (report.not_started and not report.running) else 0


if __name__ == "__main__":
    sys.exit(main())
