"""A sweep's report, built from its job dirs alone: report.csv (one row per job), summary.csv (one row per
group and worker count), report.md and the plots.

A group is every job with the same strategy and the same values of the swept keys other than workers and
seed. S(P) = T(1)/T(P) and E(P) = S(P)/P, where T(1) is the mean of the group's 1-worker jobs and T a job's
training time per sample it trained (all workers together), so that jobs that trained different numbers of
samples still compare the same work.
"""

import argparse
import contextlib
import math
import shlex
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from psgd.config.schema import strategy_class
from psgd.errors import ConfigError
from psgd.io import atomic_file, failed_write, read_json, write_atomic, write_csv
from psgd.overrides import as_typed, override_key
from psgd.process import still_running
from psgd.strategies.contract import REGISTRY, StrategyConfig

# the keys a group's jobs may differ in: the worker count P, the seed (and the strategy, the group's name)
NOT_GROUPED_BY = ("workers", "trainer.devices", "seed", "strategy")
# plot name -> (y label; the summary columns it draws, each with what it adds to a line's label; the ideal at P)
PLOTS = {
    "speedup": ("S(P) = T(1) / T(P)", {"speedup": "", "speedup_to_target": " (to target)"}, float),
    "efficiency": ("E(P) = S(P) / P", {"efficiency": "", "efficiency_to_target": " (to target)"}, lambda p: 1.0),
    "accuracy": ("test accuracy", {"test_acc_mean": "", "worker_acc_mean": " (replicas' mean, unaveraged)"}, None),
    # simulated workers: their projected time to early_stop.target_acc on the job's network
    "sim_time_to_target": ("simulated time to the target (s)", {"sim_time_to_target_s_mean": ""}, None),
}
LOG_MB = "per worker (payload; log scale, 0 at the left)"
# what a model-averaging group's test accuracy adds to its label: the replicas' own are a line of their own
AVERAGED = " (averaged model)"

Job = dict[str, Any]  # a job's metrics.json record with what load_job reads besides


@dataclass
class Report:
    """What write_report read and wrote."""

    sweep_dir: Path
    jobs: list[Job]
    swept: list[str]
    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    plots: list[Path]
    not_started: int  # the sweep's jobs without a dir: it stopped before them (or is still going)

    @property
    def failed(self) -> list[Job]:
        """Every job that did not complete: failed or interrupted (not one still running)."""
        return [j for j in self.jobs if j["status"] not in ("completed", "running")]

    @property
    def running(self) -> bool:
        return any(j["status"] == "running" for j in self.jobs)


# ---- what a job's line says beside its result (the report, the sweep's progress lines, a run's last line) ----

# what ended training, by stopped_by, where not max_epochs did
STOPPERS = {
    "early_stop": "early_stop.target_acc",
    "max_steps": "trainer.max_steps",
    "max_time": "trainer.max_time",
    "fast_dev_run": "trainer.fast_dev_run",
}


def worst_class(accs: list[float | None] | None, names: list[str] | None) -> tuple[str, float] | None:
    """The class the final model knows least (its name, else its label) and its test accuracy, if any."""
    known = [(a, c) for c, a in enumerate(accs or []) if a is not None]
    if not known:
        return None
    acc, label = min(known)
    return (names[label] if names and label < len(names) else str(label)), round(acc, 4)


def skew_note(record: dict) -> str:
    """' (worst class 3 - three at 0.0396)' for a run on label-skewed shards (partition not iid), else ''."""
    worst = worst_class(record.get("test_acc_per_class"), record.get("test_classes"))
    if worst is None or record.get("partition", "iid") == "iid":
        return ""
    return f" (worst class {worst[0]} at {worst[1]:.4f})"


MAX_LISTED = 8  # per-worker figures shown one by one; more: their min, mean and max


def listed(values: list[float]) -> str:
    """Per-worker figures as a line shows them: one by one, or past MAX_LISTED (simulated workers: hundreds) their
    min, mean and max."""
    if len(values) > MAX_LISTED:
        return f"min {min(values):.4f} mean {statistics.fmean(values):.4f} max {max(values):.4f}"
    return " ".join(f"{v:.4f}" for v in values)


def averaging_note(record: dict) -> str:
    """' (averaged model; the workers' own 0.8961 0.8944, replica_distance=3.2150)' for a model-averaging run of
    several workers (EASGD's: ' (the centre; ...'): the test accuracy before it is the final model's, which can be
    far from every replica's."""
    workers = record.get("worker_test_acc") or []
    if len(workers) < 2:
        return ""
    own = listed(workers)
    model = strategy_of(record).final_model
    return f" ({model}; the workers' own {own}, replica_distance={record.get('replica_distance'):.4f})"


def stop_note(record: dict) -> str:
    """' (trainer.max_time ended training in epoch 30 of 500)' where not max_epochs ended training, else ''."""
    stopper = STOPPERS.get(record.get("stopped_by"))
    if stopper is None:
        return ""
    of = f" of {record['max_epochs']}" if record.get("max_epochs") else ""
    return f" ({stopper} ended training in epoch {record.get('epochs')}{of})"


# ---- reading the sweep dir ----


def load_job(path: Path) -> Job:
    """The job in `path`: its metrics.json record ({} before it trained or failed) with its `num` and
    `overrides` (as typed) from .hydra/, `path`, `status` and `error` (a job whose process ended without a final
    status failed), `strategy`, `workers` and `samples`. Files that cannot be read make a failed job that says so."""
    hydra, cfg = OmegaConf.create(), OmegaConf.create()
    try:
        hydra = OmegaConf.load(path / ".hydra" / "hydra.yaml").hydra
        cfg = OmegaConf.load(path / ".hydra" / "config.yaml")
        record = read_json(path / "metrics.json") if (path / "metrics.json").exists() else {}
        if not isinstance(record, dict):
            raise ValueError(f"metrics.json holds a JSON {type(record).__name__}, not a record")
    except Exception as e:
        record = {"status": "failed", "error": f"{path} is unreadable ({type(e).__name__}: {str(e).splitlines()[0]})"}
    status, error = record.get("status", "not finished"), record.get("error")
    if still_running(record):
        status = "running"
    elif status in ("running", "trained"):  # its process ended without writing the final status
        status, error = "failed", error or f"ended with status {status!r} (killed?)"
    with contextlib.suppress(ConfigError):  # a strategy of the user's own: known to the report once imported
        strategy_class(OmegaConf.select(cfg, "strategy"))
    texts = [as_typed(str(text)) for text in OmegaConf.select(hydra, "overrides.task", default=[])]
    return record | {
        "num": OmegaConf.select(hydra, "job.num", default=-1),
        "path": path,
        "overrides": {override_key(text): text.partition("=")[2] for text in texts},
        "status": status,
        "error": error,
        "strategy": record.get("strategy") or str(OmegaConf.select(cfg, "strategy.name", default="?")),
        "workers": int(record.get("world_size") or OmegaConf.select(cfg, "workers", default=0) or 0),
        "samples": sum(h.get("samples", 0) for h in record.get("history") or []) or None,
    }


def load_jobs(sweep_dir: Path) -> list[Job]:
    """The jobs under `sweep_dir` in job order: its <n>/ dirs; in a dir Hydra made (it has multirun.yaml) also
    folders at any depth that a changed hydra.sweep.subdir named (`workers=2,seed=0/`)."""
    pattern = "**/.hydra/config.yaml" if (sweep_dir / "multirun.yaml").is_file() else "*/.hydra/config.yaml"
    found = sorted(f.parent.parent for f in sweep_dir.glob(pattern) if f.parent.parent != sweep_dir)
    return sorted(map(load_job, found), key=lambda j: (j["num"] < 0, j["num"], str(j["path"])))


def swept_keys(jobs: list[Job]) -> list[str]:
    """Override keys that take more than one value across the jobs, in command-line order."""
    keys = list(dict.fromkeys(k for job in jobs for k in job["overrides"]))
    return [k for k in keys if len({j["overrides"].get(k) for j in jobs}) > 1]


def group_key(job: Job, swept: list[str]) -> tuple[str, ...]:
    """Jobs that differ only in workers and seed form one speedup curve."""
    return (job["strategy"], *(f"{k}={job['overrides'].get(k)}" for k in swept if k not in NOT_GROUPED_BY))


def sweep_lengths(hydra: DictConfig) -> dict[str, int]:
    """How many values each key takes in a sweep by Hydra's basic sweeper (its jobs are their product), from
    the sweep's Hydra config: its task overrides over its `sweeper.params`, key by key, as the sweeper does.
    A glob() over a config group's choices is counted where Hydra is initialized (its loader lists them)."""
    params = OmegaConf.select(hydra, "sweeper.params") or {}
    texts = [f"{k}={v}" for k, v in params.items()] + [str(o) for o in hydra.overrides.task]
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    lengths: dict[str, int] = {}
    for o in OverridesParser.create(config_loader=loader).parse_overrides(texts):
        values = len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
        lengths[override_key(o.get_key_element())] = values  # `+data.seed=1,2` sweeps data.seed
    return lengths


# ---- the tables ----


def sync_share(job: Job) -> float | None:
    """The share of a job's training time its workers synchronised: DDP's wait for the gradient all-reduce,
    periodic model averaging's time averaging, or locked HogWild's wait for the lock; None for none."""
    shares = (job.get("allreduce_wait_share"), job.get("averaging_share"), job.get("lock_wait_share"))
    return next((v for v in shares if v is not None), None)


def _mean(values: list[float | None]) -> float | None:
    """The mean of the values that are not None; None where none is."""
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _r(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def comm_mb(job: Job) -> float | None:
    """The MB (10^6 bytes) of payload a job's workers each handed to torch.distributed for training, their
    mean; None for a job that did not count it."""
    sent = job.get("comm_bytes")
    return round(statistics.fmean(sent) / 1e6, 3) if sent else None


def strategy_of(record: dict) -> type[StrategyConfig]:
    """The config class of a run's strategy, as registered when a config of it was read (the contract's defaults
    for a strategy this process cannot import)."""
    return REGISTRY.get(record.get("strategy"), StrategyConfig)


def cell(value: Any) -> Any:
    """A metrics.json value as a report.csv cell: a list as its items joined by spaces."""
    return " ".join(map(str, value)) if isinstance(value, list) else value


def comm_label(job: Job) -> str:
    """A job's point on accuracy_vs_comm.png: `ddp topk x2`, `model_averaging period=8 x2`, `... one-shot x2`."""
    how = strategy_of(job).label(job)
    return " ".join(part for part in (job["strategy"], how, f"x{job['workers']}") if part)


def _time_per_sample(job: Job) -> float | None:
    """T: a job's training time per sample it trained (simulated workers: their simulated time's)."""
    return _ratio(job.get("sim_time_s" if job.get("simulate") else "train_time_s"), job["samples"])


def _time_to_target(job: Job) -> float | None:
    """A job's time to the target accuracy (simulated workers: their simulated time's)."""
    return job.get("sim_time_to_target_s" if job.get("simulate") else "time_to_target_s")


def speedup_columns(ones: list[Job], jobs: list[Job], p: int) -> dict[str, float | None]:
    """S(P) and E(P) of `jobs`, a group's completed jobs at P workers, against `ones`, its 1-worker jobs (each T
    the mean over them): for the whole training and for the time to the target accuracy. A group is simulated or
    not as a whole (`simulate` swept is a key of the group): simulated jobs' S(P) are of their simulated time."""
    columns = {}
    for name, time in (("", _time_per_sample), ("_to_target", _time_to_target)):
        speedup = _ratio(_mean([time(j) for j in ones]), _mean([time(j) for j in jobs]))
        columns |= {f"speedup{name}": _r(speedup, 3), f"efficiency{name}": _r(_ratio(speedup, p), 3)}
    return columns


def build_rows(jobs: list[Job], swept: list[str]) -> tuple[list[dict], list[dict]]:
    """The rows of report.csv (one per job) and of summary.csv (one per group and worker count)."""
    groups: dict[tuple, dict[int, list[Job]]] = defaultdict(lambda: defaultdict(list))  # completed, by P
    for job in jobs:
        if job["status"] == "completed":
            groups[group_key(job, swept)][job["workers"]].append(job)

    own = list(dict.fromkeys(key for job in jobs for key in strategy_of(job).report_columns))  # strategies' own
    rows = []
    for job in jobs:
        worker_acc = job.get("worker_test_acc")
        # label-skewed shards: the class a test_acc can hide
        skewed = job.get("partition") not in (None, "iid")
        worst = worst_class(job.get("test_acc_per_class"), job.get("test_classes")) if skewed else None
        completed = [job] if job["status"] == "completed" else []
        rows.append(
            {
                "job": job["num"],
                **{k: job["overrides"].get(k) for k in swept if k not in ("workers", "strategy")},
                "status": job["status"],
                "strategy": job["strategy"],
                "workers": job["workers"],
                "threads_per_worker": job.get("threads_per_worker"),
                "lr": job.get("lr"),  # after lr_scaling
                "epochs": job.get("epochs"),
                "stopped_by": job.get("stopped_by"),
                "samples": job["samples"],
                "train_time_s": _r(job.get("train_time_s"), 2),
                "samples_per_s": job.get("samples_per_s"),
                "test_acc": job.get("test_acc"),
                "worker_test_acc": " ".join(f"{a:.4f}" for a in worker_acc) if worker_acc else None,
                "replica_distance": _r(job.get("replica_distance"), 4),
                "periodic_averagings": job.get("periodic_averagings") if job.get("period") else None,
                "staleness": _r(_mean([h.get("staleness") for h in job.get("history") or []]), 3),
                "comm_mb": comm_mb(job),
                "allreduce_wait_ms": job.get("allreduce_wait_ms"),
                "sync_share": sync_share(job),
                **{key: cell(job.get(key)) for key in own},
                "worst_class_acc": worst and worst[1],
                "worst_class": worst and worst[0],
                "time_to_target_s": _r(job.get("time_to_target_s"), 2),
                # simulated workers: the time projected on the job's network (the times above are this machine's)
                "sim_time_s": _r(job.get("sim_time_s"), 4),
                "sim_time_to_target_s": _r(job.get("sim_time_to_target_s"), 4),
                **speedup_columns(groups[group_key(job, swept)].get(1, []), completed, job["workers"]),
                "error": job["error"],
                "dir": job["path"].name,
            }
        )

    summary = []
    for g, per_p in groups.items():
        for p, group in sorted(per_p.items()):
            times, accs = [j.get("train_time_s") for j in group], [j.get("test_acc") for j in group]
            reached = [t for j in group if (t := j.get("time_to_target_s")) is not None]
            targeted = any(j.get("target_acc") is not None for j in group)
            summary.append(
                {
                    "group": " ".join(g),
                    "strategy": g[0],
                    "workers": p,
                    "runs": len(group),
                    "test_acc_mean": _r(_mean(accs), 6),
                    "test_acc_std": _r(statistics.stdev(accs), 6) if len(accs) > 1 else None,
                    "worker_acc_mean": _r(_mean([a for j in group for a in j.get("worker_test_acc") or []]), 6),
                    "sync_share_mean": _r(_mean([sync_share(j) for j in group]), 4),
                    "train_time_s_mean": _r(_mean(times), 2),
                    "train_time_s_std": _r(statistics.stdev(times), 2) if len(times) > 1 else None,
                    "samples_per_s_mean": _r(_mean([j.get("samples_per_s") or 0.0 for j in group]), 1),
                    "reached_target": f"{len(reached)}/{len(group)}" if targeted else None,
                    "time_to_target_s_mean": _r(_mean(reached), 2),
                    "sim_time_to_target_s_mean": _r(_mean([j.get("sim_time_to_target_s") for j in group]), 4),
                    **speedup_columns(per_p.get(1, []), group, p),
                }
            )
    return rows, summary


# ---- report.md ----


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    """`rows` as a Markdown table of `columns`, less those no row has a value in."""

    def cell(value: Any) -> str:
        return "" if value is None else f"{value:g}" if isinstance(value, float) else str(value).replace("|", "\\|")

    columns = [c for c in columns if any(r.get(c) not in (None, "") for r in rows)]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows])


def jobs_table(rows: list[dict]) -> str:
    """report.md's jobs table: report.csv's columns but error and dir, threads_per_worker, lr and stopped_by only
    where the jobs differ in them; test_acc to 4 decimals as the progress lines show it, the workers' own as
    `listed` (the CSV keeps them whole)."""
    same = [c for c in ("threads_per_worker", "lr", "stopped_by") if len({r[c] for r in rows} - {None}) < 2]
    columns = [c for c in rows[0] if c not in ("error", "dir", *same)]
    shown = [r | {"test_acc": f"{r['test_acc']:.4f}"} if isinstance(r["test_acc"], float) else r for r in rows]
    shown = [
        r | {"worker_test_acc": listed(list(map(float, r["worker_test_acc"].split())))}
        if r.get("worker_test_acc")
        else r
        for r in shown
    ]
    return markdown_table(shown, columns)


def render_markdown(report: Report) -> str:
    sweep_dir = report.sweep_dir
    devices = sorted({j.get("device") for j in report.jobs if j.get("device")})
    ran_on = f" Ran on {'; '.join(devices)}." if devices else ""
    out = [
        f"# Sweep report: {sweep_dir}",
        "",
        f"{job_counts(report)}. Swept: {', '.join(report.swept) or 'nothing'}.{ran_on}",
        "Times are training only (validation and process start excluded). Speedup S(P) = T(1)/T(P) within a "
        "group (same strategy and other swept values), for the same work (time per trained sample), with T(1) "
        "the mean of the group's 1-worker jobs; efficiency = S(P)/P.",
        "",
        f"Every job's curves: `tensorboard --logdir {sweep_dir}` (each job's run is `<its folder>/tensorboard`; "
        "the HParams tab lists each run's settings beside its final figures).",
        "",
        "## Jobs",
        "",
        jobs_table(report.rows),
    ]
    if report.failed:
        interrupted = any(j["status"] == "interrupted" for j in report.failed)
        out += ["", "## Failed or interrupted jobs" if interrupted else "## Failed jobs", ""]
        out += [f"- job {j['num']} ({j['path'].name}): {j['error'] or j['status']}" for j in report.failed]
    if report.summary:
        table = markdown_table(report.summary, list(report.summary[0]))
        out += ["", "## Speedup and accuracy per group (mean and std over seeds)", "", table]
    if report.plots:
        out += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in report.plots]
    return "\n".join(out) + "\n"


# ---- plots ----


def plot_lines(name: str, summary: list[dict]) -> dict[str, list[tuple[int, float, float]]]:
    """The lines of plot `name` (of PLOTS): label -> (P, value, std over seeds) of each group's columns; a
    model-averaging group's test accuracy is labelled as the averaged model's."""
    lines: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for column, says in PLOTS[name][1].items():
        for s in summary:
            if s[column] is not None:
                std = s["test_acc_std"] if column == "test_acc_mean" else None
                averaged = column == "test_acc_mean" and s.get("worker_acc_mean") is not None
                lines[s["group"] + says + (AVERAGED if averaged else "")].append((s["workers"], s[column], std or 0.0))
    return lines


@contextlib.contextmanager
def figure(path: Path, size: tuple[float, float] = (6.5, 4.5)) -> Iterator[Any]:
    """Axes to draw on, gridded; the figure is written whole to `path` (PNG) as the block ends: a full disk leaves
    no truncated plot."""
    from matplotlib.figure import Figure  # a heavy import, for the sweep's end only

    ax = (fig := Figure(figsize=size, layout="tight")).subplots()
    yield ax
    ax.grid(alpha=0.3, which="both")
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)


def colour(i: int) -> tuple[float, ...]:
    """The i-th job's colour on a plot of a line or point per job: 20 apart, then again."""
    from matplotlib import colormaps

    return colormaps["tab20"](i % 20)


def write_plots(sweep_dir: Path, summary: list[dict]) -> list[Path]:
    """The PLOTS that have a line over two worker counts or more (plot_lines), beside the ideal; none is left
    from an earlier build."""
    written = []
    for name, (ylabel, _, ideal) in PLOTS.items():
        path = sweep_dir / f"{name}.png"
        path.unlink(missing_ok=True)
        lines = plot_lines(name, summary)
        if all(len(points) < 2 for points in lines.values()):
            continue
        many = len(lines) > 6  # a colour each and the legend beside, as line_plot's
        with figure(path, (9, 4.5) if many else (6.5, 4.5)) as ax:
            for i, (label, points) in enumerate(lines.items()):
                xs, ys, stds = zip(*points, strict=True)
                style = {"color": colour(i)} if many else {}
                ax.errorbar(xs, ys, yerr=stds if any(stds) else None, marker="o", capsize=3, label=label, **style)
            counts = sorted({s["workers"] for s in summary})
            workers = list(range(1, counts[-1] + 1))
            if ideal:
                ax.plot(workers, [ideal(p) for p in workers], "k--", label="ideal")
            if counts[-1] > 16:  # simulated workers: 1 to 1,024 read apart on a log scale
                ax.set_xscale("log", base=2)
            ax.set(xlabel="workers P", ylabel=ylabel, title=f"{name} vs workers", xticks=counts)
            ax.set_xticklabels([str(p) for p in counts])
            ax.legend(
                **({"fontsize": 7, "loc": "center left", "bbox_to_anchor": (1.01, 0.5)} if many else {"fontsize": 8})
            )
        written.append(path)
    return written


def comm_points(jobs: list[Job]) -> list[tuple[float, float, str, int]]:
    """accuracy_vs_comm.png's points, 0 MB too: each completed job's (MB each worker sent, test accuracy, comm_label,
    how many points before it are at its place: within 2 % of its MB, 0.002 of its accuracy; drawn larger)."""
    points: list[tuple[float, float, str, int]] = []
    for job in jobs:
        mb, acc = comm_mb(job), job.get("test_acc")
        if job["status"] != "completed" or mb is None or acc is None:
            continue
        same = sum(1 for m, a, _, _ in points if abs(m - mb) <= 0.02 * max(m, mb) and abs(a - acc) <= 0.002)
        points.append((mb, acc, comm_label(job), same))
    return points


def write_comm_plot(sweep_dir: Path, jobs: list[Job]) -> Path | None:
    """accuracy_vs_comm.png: comm_points, test accuracy against MB sent on a symmetric log scale (linear below the
    least sent: 0 MB at its left end), labelled (comm_label); None (and no file) for fewer than two jobs."""
    path = sweep_dir / "accuracy_vs_comm.png"
    path.unlink(missing_ok=True)
    points = comm_points(jobs)
    if len(points) < 2:
        return None
    kinds = list(dict.fromkeys(label.split()[0] for _, _, label, _ in points))
    with figure(path, (9, 4.5)) as ax:
        for i, (mb, acc, label, under) in enumerate(points):  # a marker per strategy, a colour per job
            marker, size = "osD^vP"[kinds.index(label.split()[0]) % 6], 30 * (1 + 1.5 * under) ** 2
            ax.scatter(mb, acc, s=size, marker=marker, facecolors="none", edgecolors=colour(i), label=label)
        ax.set_xscale("symlog", linthresh=min((mb for mb, *_ in points if mb > 0), default=1.0))
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        ax.set(xlabel=f"MB sent per worker {LOG_MB}", ylabel="test accuracy", title="accuracy vs communication")
    return path


def curves(jobs: list[Job], swept: list[str]) -> dict[str, list[tuple[float, float | None, float, float | None]]]:
    """curves_time.png's, curves_comm.png's and curves_sim_time.png's lines: per job with a validated epoch,
    labelled by its number and swept values, (training time s, MB each worker had sent, None where not counted;
    validation accuracy; simulated time s, None for worker processes) at the end of each validated epoch."""
    lines = {}
    for job in jobs:
        points, mb = [], 0.0
        for h in job.get("history") or []:
            sent = h.get("comm_bytes")
            mb = mb + statistics.fmean(sent) / 1e6 if mb is not None and sent and None not in sent else None
            if h.get("val_acc") is not None:
                points.append((h["time"], mb, h["val_acc"], h.get("sim_time_s")))
        if points:
            lines[job_label(job, swept)] = points
    return lines


def job_label(job: Job, swept: list[str]) -> str:
    """A job's line on a plot of a line per job: its number and swept values (its strategy where none)."""
    values = " ".join(f"{k}={job['overrides'].get(k)}" for k in swept if k in job["overrides"])
    return f"{job['num']}: {values or job['strategy']}"


def write_curves(sweep_dir: Path, jobs: list[Job], swept: list[str]) -> list[Path]:
    """curves_time.png and curves_comm.png: each job's validation accuracy against its training time (measured on
    this machine) and against the MB each worker sent (jobs that counted it; 0 MB at the left of a symmetric log
    axis); curves_sim_time.png, simulated workers' against their simulated time."""
    lines, written = curves(jobs, swept), []
    plots = [
        ("curves_time", 0, "training time (s, measured)"),
        ("curves_comm", 1, f"MB sent {LOG_MB}"),
        ("curves_sim_time", 3, "simulated time (s, on each job's network)"),
    ]
    for name, x, xlabel in plots:
        (path := sweep_dir / f"{name}.png").unlink(missing_ok=True)
        drawn = {
            label: [(p[x], p[2]) for p in points]
            for label, points in lines.items()
            if None not in [p[x] for p in points]
        }
        if drawn:
            title = f"validation accuracy vs {xlabel.split(' (')[0]}"
            written.append(line_plot(path, drawn, x == 1, xlabel=xlabel, ylabel="validation accuracy", title=title))
    return written


def line_plot(path: Path, lines: dict[str, list[tuple[float, float]]], symlog_x: bool = False, **axes: Any) -> Path:
    """`path`: `lines` (label -> its (x, y) points), a colour each, the legend beside; `axes` the axes' settings
    (xlabel, ylabel, title, yscale, ylim); `symlog_x`: a symmetric log x-axis, linear below the least x above 0."""
    with figure(path, (9, 4.5)) as ax:
        for i, (label, points) in enumerate(lines.items()):
            ax.plot(*zip(*points, strict=True), marker="o", markersize=4, color=colour(i), label=label)
        if symlog_x:
            ax.set_xscale("symlog", linthresh=min((x for v in lines.values() for x, _ in v if x > 0), default=1.0))
        ax.set(**axes)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return path


def write_consensus_plot(sweep_dir: Path, jobs: list[Job], swept: list[str]) -> Path | None:
    """consensus.png: the consensus distance (1/P) sum_i ||x_i - x̄||² at each epoch's end of every job that
    measured one (decentralized SGD), a line per job on a log scale; None (and no file) where none did."""
    path = sweep_dir / "consensus.png"
    path.unlink(missing_ok=True)
    lines = {
        job_label(job, swept): [(h["epoch"], h["consensus_distance"]) for h in history]
        for job in jobs
        if (history := [h for h in job.get("history") or [] if h.get("consensus_distance") is not None])
    }
    if not lines:
        return None
    ylabel, title = "consensus distance (1/P) Σ‖x_i − x̄‖²", "consensus distance vs epoch"
    return line_plot(path, lines, yscale="log", xlabel="epoch", ylabel=ylabel, title=title)


def straggler_x(job: Job, key: str) -> float | None:
    """A job's `key` (a swept stragglers.* key) as its metrics.json records it, as a number: a slowdown's largest
    factor (the slowest worker's), a delay as it is; None where the job has none (the simulation was off)."""
    value = (job.get("stragglers") or {}).get(key.removeprefix("stragglers."))
    if key == "stragglers.slowdown":
        return max(value) if value else None
    return value


def straggler_lines(jobs: list[Job], swept: list[str]) -> tuple[str, str, dict[str, list[tuple[float, float]]]]:
    """stragglers.png's lines for a sweep over a stragglers.* key (the first swept, if several): the key, what is
    drawn (`time_to_target_s` where every completed job has a target, else `train_time_s`) and, per group of the
    other swept keys (the strategy first), (the key's value as straggler_x reads it, the mean over seeds) in order;
    no lines for a sweep over none."""
    key = next((k for k in swept if k.startswith("stragglers.") and k != "stragglers.distribution"), "")
    done = [j for j in jobs if j["status"] == "completed"]
    measure = "time_to_target_s" if done and all(j.get("target_acc") is not None for j in done) else "train_time_s"
    points: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for job in done if key else []:
        x, y = straggler_x(job, key), job.get(measure)
        if x is not None and y is not None:
            points[" ".join(group_key(job, [k for k in swept if k != key]))][x].append(y)
    lines = {label: [(x, statistics.fmean(ys[x])) for x in sorted(ys)] for label, ys in points.items()}
    return key, measure, lines


def write_straggler_plot(sweep_dir: Path, jobs: list[Job], swept: list[str]) -> Path | None:
    """stragglers.png: straggler_lines' lines, time (to the target, else training) against the straggler setting;
    None (and no file) where no line has two points."""
    path = sweep_dir / "stragglers.png"
    path.unlink(missing_ok=True)
    key, measure, lines = straggler_lines(jobs, swept)
    if all(len(points) < 2 for points in lines.values()):
        return None
    target = next((j["target_acc"] for j in jobs if j.get("target_acc") is not None), None)
    ylabel = f"time to val acc {target:g} (s)" if measure == "time_to_target_s" else "training time (s)"
    xlabel = "slowest worker's slowdown factor" if key == "stragglers.slowdown" else f"{key} (s)"
    return line_plot(
        path, lines, xlabel=xlabel, ylabel=ylabel, title=f"{ylabel.split(' (')[0]} vs {key}", ylim=(0, None)
    )


# ---- the sweep as a whole ----


def write_report(sweep_dir: str | Path) -> Report:
    """Read every job dir under `sweep_dir` and its multirun.yaml; write the plots, report.csv, summary.csv
    and report.md.

    Raises:
        FileNotFoundError: `sweep_dir` holds no job dirs (or is no folder).
        OSError: a file could not be written (every file written is whole).
    """
    sweep_dir = Path(sweep_dir)
    jobs = load_jobs(sweep_dir)
    if not jobs:
        raise FileNotFoundError(f"{sweep_dir} holds no job dirs (<job>/.hydra/config.yaml): is it a sweep dir?")
    planned = len(jobs)
    with contextlib.suppress(Exception):  # no multirun.yaml; a glob() sweep read outside Hydra is not counted
        planned = math.prod(sweep_lengths(OmegaConf.load(sweep_dir / "multirun.yaml").hydra).values())
    swept = swept_keys(jobs)
    rows, summary = build_rows(jobs, swept)
    plots = write_plots(sweep_dir, summary)
    plots += [p for p in [write_comm_plot(sweep_dir, jobs), write_straggler_plot(sweep_dir, jobs, swept)] if p]
    plots += write_curves(sweep_dir, jobs, swept)
    plots += [p for p in [write_consensus_plot(sweep_dir, jobs, swept)] if p]
    not_started = max(0, planned - len(jobs))
    report = Report(sweep_dir, jobs, swept, rows, summary, plots, not_started)
    write_csv(sweep_dir / "report.csv", list(rows[0]), [list(r.values()) for r in rows])
    if summary:
        write_csv(sweep_dir / "summary.csv", list(summary[0]), [list(s.values()) for s in summary])
    write_atomic(sweep_dir / "report.md", render_markdown(report))
    return report


def job_counts(report: Report) -> str:
    """'6/8 jobs completed, 1 failed (jobs 6), 1 not started': the jobs that did not complete, by status."""
    completed = sum(j["status"] == "completed" for j in report.jobs)
    line = f"{completed}/{len(report.jobs) + report.not_started} jobs completed"
    for status in dict.fromkeys(j["status"] for j in report.jobs if j["status"] != "completed"):
        nums = [str(j["num"]) for j in report.jobs if j["status"] == status]
        line += f", {len(nums)} {status} (jobs {', '.join(nums)})"
    return line + (f", {report.not_started} not started" if report.not_started else "")


def describe(report: Report, stopped: bool = False) -> str:
    """The sweep's last line: its state (`stopped`: a multirun that Ctrl-C or SIGTERM ended), the jobs that
    did not complete and where the report is."""
    if report.running and not stopped:
        state = "still running"
    elif stopped or report.not_started or any(j["status"] == "interrupted" for j in report.failed):
        state = "stopped early"
    else:
        state = "finished"
    return f"psgd: sweep {state}: {job_counts(report)}; report in {report.sweep_dir / 'report.md'}"


def report_sweep(sweep_dir: Path, stopped: bool = False) -> Report | None:
    """Write the report of the sweep in `sweep_dir` and print its last line (on stderr where the sweep was
    `stopped` before its end). None, after an error line, where there is no report."""
    try:
        report = write_report(sweep_dir)
    except OSError as e:  # write_report's own (no sweep dir: no file named), or a full disk, a read-only dir
        rebuild = f"python -m psgd.report {shlex.quote(str(sweep_dir))}"
        line = f"no report: cannot write it ({failed_write(e)}); once it can be written: {rebuild}"
        print(f"psgd: error: {line if e.filename else e}", file=sys.stderr, flush=True)
        return None
    print(describe(report, stopped), file=sys.stderr if stopped else sys.stdout, flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    """`python -m psgd.report <sweep dir>`. Exit code 0: every job completed (or some still run); 1: some
    failed or did not start; 2: no report."""
    parser = argparse.ArgumentParser(prog="python -m psgd.report", description="(Re)build a sweep's report.")
    parser.add_argument("sweep_dir", type=Path, help="a sweep dir written by sweep.py -m (holds 0/, 1/, ...)")
    report = report_sweep(parser.parse_args(argv).sweep_dir)
    if report is None:
        return 2
    return 1 if report.failed or (report.not_started and not report.running) else 0


if __name__ == "__main__":
    sys.exit(main())
