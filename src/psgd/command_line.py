"""What train.py and sweep.py do around Hydra: check the command line, then run it.

A command line that Hydra would refuse (a mistyped group choice or key, an override it cannot parse),
or a job whose values psgd refuses, is one line `psgd: error: ...` and exit code 2 before torch loads,
before any job starts and before anything is written: every job the line asks for is composed first
with Hydra's compose API, and Hydra's own message is said in one line (with a did-you-mean).
`train.py -m ...` runs the sweep config, as sweep.py does. Ctrl-C and SIGTERM before training are one
line and exit code 130 / 143.
"""

import atexit
import contextlib
import difflib
import gc
import importlib
import itertools
import json
import math
import os
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from psgd import forkserver, outputs, process, signals, sweep
from psgd.config import sweep_data_problem, sweep_values_problem, values_problem
from psgd.console import (
    fail,
    in_the_job,
    other_torchrun_worker,
    text_lines,
    torchrun_worker,
)
from psgd.io import say
from psgd.overrides import override_key, shell_override

MULTIRUN_FLAGS = ("-m", "--multirun")
CONFIG_DIR_FLAGS = ("-cd", "--config-dir")
HELP_FLAGS = ("-h", "--help", "--hydra-help")
INFO_FLAGS = ("-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion")
MAX_JOBS_COMPOSED = 64  # beyond this many jobs, every value of every key is composed once, not every product

# (overrides, config) of each job, the first with Hydra's node -> a one-line problem, or None
JobCheck = Callable[[list[tuple[list[str], DictConfig]]], str | None]


def main(app: Callable[[], object], config_name: str, conf: Path) -> None:
    """Run a script's `@hydra.main` function `app` for this process's command line, checked first.

    `config_name` "sweep", or a multirun of "train" (`train.py -m`), runs a sweep: with the sweep config,
    each job's values checked also against this machine and its datasets, the report written when it
    stops early, and exit code 1 when a job failed.
    """
    atexit.register(gc.freeze)  # the last exit handler: spares the exit its full-heap collections
    signals.interrupt_on_sigterm()  # as Ctrl-C, also while torch loads
    sweeping = config_name == "sweep" or is_multirun(sys.argv[1:])
    argv = hydra_argv(sys.argv[1:], sweeping)
    sys.argv[1:] = ["--config-name=sweep", *argv] if sweeping and config_name != "sweep" else argv
    try:
        check = sweep_jobs_problem if sweeping else run_jobs_problem
        if problem := command_line_problem("sweep" if sweeping else "train", argv, conf, check):
            fail(problem, every_worker_finds_it=True)
        load_training(argv)
        with contextlib.nullcontext() if sweeping else signals.held_until_released(signal.SIGINT, signal.SIGTERM):
            app()  # a single run's job releases the signals once Hydra has made its run dir
    except BaseException as e:
        exit_stopped(e, sweeping)
        raise
    if sweeping:
        sys.exit(1 if sweep.LAST["failed"] else 0)


def hydra_argv(argv: list[str], sweeping: bool) -> list[str]:
    """A script's arguments as Hydra gets them. A sweep's without -m (the sweep config's hydra.mode makes
    it a multirun, and argparse refused a -m between overrides) and with sweep_argv's additions; the
    help's without sweeping overrides (Hydra's help composes one job, and refuses them there)."""
    if sweeping:
        argv = sweep_argv([a for a in argv if a not in MULTIRUN_FLAGS])
    if any(a in HELP_FLAGS for a in argv):
        argv = without_sweeps(argv)
    return argv


def exit_stopped(e: BaseException, sweeping: bool) -> None:
    """For `e` that ended the script: a sweep's report of the jobs that ran, then Ctrl-C or SIGTERM as
    one line and exit code (exit_interrupted), and a closed stdout quietly; anything else goes on."""
    said = sweeping and sweep.report_stopped_sweep()
    if isinstance(e, KeyboardInterrupt):
        exit_interrupted(said)
    if isinstance(e, BrokenPipeError):
        exit_pipe_closed()


def is_multirun(argv: list[str]) -> bool:
    """Whether Hydra runs `argv` (a script's arguments) as a multirun: -m, --multirun or hydra.mode=MULTIRUN."""
    return any(a in MULTIRUN_FLAGS or a.replace(" ", "").upper() == "HYDRA.MODE=MULTIRUN" for a in argv)


def without_sweeps(argv: list[str]) -> list[str]:
    """`argv` without the overrides that sweep (Hydra's help composes one job, and refuses them there)."""
    parser = OverridesParser.create()

    def sweeps(word: str) -> bool:
        try:
            return parser.parse_overrides([word])[0].is_sweep_override()
        except Exception:  # not an override, or not one Hydra reads: Hydra's to judge
            return False

    return [a for a in argv if a.startswith("-") or not sweeps(a)]


def run_jobs_problem(jobs) -> str | None:
    """psgd's value checks that need no torch; with none found, the fork server that will start the
    job's workers (where they need one) is started, to import while this process does."""
    problem = values_problem(jobs, name_the_job=len(jobs) > 1)
    if problem is None:
        forkserver.start_early(jobs)
    return problem


def sweep_jobs_problem(jobs) -> str | None:
    """A sweep's jobs: the checks that need no torch first (said in about a second), then, with torch
    loaded, those that depend on this machine and its datasets."""
    problem = values_problem(jobs, name_the_job=True)
    if problem:
        return problem
    forkserver.start_early(jobs)
    load_training([])
    return sweep_values_problem(jobs) or sweep_data_problem(jobs)


def load_training(argv: list[str]) -> None:
    """Import what a job runs (torch, Lightning) before Hydra makes the run dir, so that Ctrl-C meanwhile
    leaves none; not for Hydra's flags that only print. Ctrl-C or SIGTERM while it loads is handled once
    it has loaded: inside torch's C++ initialisers it aborted the process."""
    if not any(a.split("=", 1)[0] in INFO_FLAGS for a in argv):
        with signals.held(signal.SIGINT, signal.SIGTERM):
            importlib.import_module("psgd.cli")  # not at the top: the command line is checked before torch loads


def exit_pipe_closed() -> None:
    """stdout was a pipe whose reader left (`python train.py --help | head`): exit quietly, as a shell
    command does, not with Python's BrokenPipeError traceback (Python's documented recipe)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
    raise SystemExit(141)  # 128 + SIGPIPE, what a shell reports


def exit_interrupted(said: bool = False) -> None:
    """Ctrl-C or SIGTERM that reached the script outside training (while torch loads, the checks run or
    the data is read): one line (unless `said`) and exit code 130 or 143, as a shell reports them."""
    if not (said or other_torchrun_worker()):  # torchrun: the first worker of a machine says it
        how = f" ({signals.received})" if signals.received else ""
        say(f"psgd: interrupted{how} before training started; nothing was written")
    raise SystemExit(signals.interrupted_exit_code())


def sweep_argv(argv: list[str]) -> list[str]:
    """A sweep's arguments, with `continue_sweep=<dir>` also as hydra.sweep.dir (unless given): the
    stopped sweep goes on in its dir. Not an interpolation in conf/sweep.yaml: a null continue_sweep
    leaves the date-named default."""
    given = [a.split("=", 1)[1] for a in argv if override_key(a) == "continue_sweep" and "=" in a]
    if not given or given[-1] == "null" or any(override_key(a) == "hydra.sweep.dir" for a in argv):
        return argv
    return [*argv, f"hydra.sweep.dir={given[-1]}"]


def overrides_and_config_dir(argv: list[str]) -> tuple[list[str], str | None] | None:
    """A script's arguments as (its overrides, the folder of --config-dir or None); None for a command
    line with another of Hydra's flags (--help, --cfg, -cn ...), which Hydra judges alone."""
    overrides, config_dir, words = [], None, iter(argv)
    for word in words:
        flag, eq, value = word.partition("=")
        if flag in CONFIG_DIR_FLAGS:
            config_dir = value if eq else next(words, None)
        elif word.startswith("-") and word not in MULTIRUN_FLAGS:
            return None
        elif word not in MULTIRUN_FLAGS:
            overrides.append(word)
    return overrides, config_dir


def command_line_problem(
    config_name: str, argv: list[str], config_dir: Path, job_check: JobCheck | None = None
) -> str | None:
    """The one line why Hydra would refuse the command line `argv` of `config_dir`/`config_name`.yaml, or
    why its output dir cannot take the run, or why `job_check` refuses its composed jobs; else None.
    None also where Hydra judges alone: its flags other than -m and --config-dir, and HYDRA_FULL_ERROR=1."""
    split = overrides_and_config_dir(argv)
    if split is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
        return None
    overrides, extra_dir = split
    multirun = config_name == "sweep" or is_multirun(argv)
    if multirun and torchrun_worker():
        return (
            "a sweep under torchrun: each of its workers would run the whole sweep, in a sweep dir of its own; "
            "run the sweep without torchrun (python sweep.py -m workers=N ... starts each job's workers), or "
            "one job per torchrun (torchrun ... train.py ...)"
        )
    if extra_dir is not None and any("glob(" in o for o in overrides):
        return None  # a glob over the user's choices: only Hydra's loader of their dir lists them
    if extra_dir is not None:  # the user's configs, searched besides psgd's as Hydra does
        overrides = [*overrides, f"hydra.searchpath=['file://{Path(extra_dir).absolute()}']"]
    with initialize_config_dir(config_dir=str(Path(config_dir).absolute()), version_base="1.3"):
        composed = compose_jobs(config_name, overrides, multirun)
    if isinstance(composed, str):
        return composed
    if not composed:  # another sweeper's, which composes its own jobs
        return None
    return output_dir_problem(composed[0][1], overrides, multirun) or checked(job_check, composed)


def compose_jobs(config_name: str, overrides: list[str], multirun: bool) -> list[tuple[list[str], DictConfig]] | str:
    """(overrides, config) of each job, the first with Hydra's node (it holds the output dir), or the one
    line why Hydra would refuse a job, naming the job of a sweep after the first. Inside Hydra's
    initialize_config_dir."""
    try:
        jobs = jobs_of(config_name, overrides, multirun)
    except Exception as e:
        return hydra_problem(e, config_name, overrides)
    if isinstance(jobs, str):
        return jobs
    composed = []
    for job in jobs:
        try:
            composed.append((job, compose(config_name, job, return_hydra_config=not composed)))
        except Exception as e:
            problem = hydra_problem(e, config_name, job)
            return in_the_job(problem, job, jobs) if composed else problem
    return composed


def jobs_of(config_name: str, overrides: list[str], multirun: bool) -> list[list[str]] | str:
    """The overrides of each job, as Hydra's basic sweeper makes them (with a preset's own sweep,
    hydra.sweeper.params, where the command line does not give the key), or a one-line reason why the
    sweep cannot run. Without -m, the command line itself: Hydra's compose judges any sweep in it."""
    if not multirun:
        return [overrides]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    given = parser.parse_overrides(overrides)
    plain = [o.input_line for o in given if not o.is_sweep_override()]
    try:
        sweeper = compose(config_name, plain, return_hydra_config=True).hydra.sweeper
    except Exception:  # composing each job says why; meanwhile Hydra's default sweeper
        sweeper = OmegaConf.create({"_target_": "BasicSweeper"})
    params = sweeper.get("params") or {}
    on_line = {o.get_key_element() for o in given}
    given = parser.parse_overrides([f"{k}={v}" for k, v in params.items() if k not in on_line]) + given
    if any(o.is_sweep_override() and not o.is_discrete_sweep() for o in given):
        if sweeper._target_.endswith("BasicSweeper"):
            drawn = next(o.input_line for o in given if o.is_sweep_override() and not o.is_discrete_sweep())
            return f"{drawn}: Hydra's basic sweeper runs listed values only; list them, or use a sampling sweeper"
        return []  # other sweepers (hydra/sweeper=optuna) compose their own jobs
    per_key = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in given
    ]
    if empty := next((o.input_line for o, values in zip(given, per_key, strict=True) if not values), None):
        return f"{empty} gives no value, so the sweep has no job"
    if math.prod(len(values) for values in per_key) <= MAX_JOBS_COMPOSED:
        return [list(job) for job in itertools.product(*per_key)]
    longest = max(len(values) for values in per_key)  # every value once; their combinations are not checked
    return [[values[i % len(values)] for values in per_key] for i in range(longest)]


def hydra_problem(e: Exception, config_name: str, job: list[str]) -> str:
    """Hydra's reason for refusing `job` (`e`, raised by its compose or parser) in one line."""
    if isinstance(e, MissingConfigException) and e.options is not None and "/" in (e.missing_cfg_file or ""):
        group, choice = e.missing_cfg_file.rsplit("/", 1)
        options = list(e.options)
        return f"{group}={choice} is unknown{did_you_mean(choice, options, group + '=')}; {group} can be: " + (
            ", ".join(options)
        )
    lines = [ln for ln in text_lines(e) if not ln.startswith(("See https://", "^", "full_key:", "object_type="))]
    if e.__cause__ is not None:
        lines.append(text_lines(e.__cause__)[0])
    if isinstance(e, OverrideParseException):
        key, eq, value = e.override.partition("=")
        quoted = shell_override(key, value)
        if eq and quoted != e.override and not any(c in value for c in ",[]{}()'\""):
            lines.append(f"quoted for Hydra: {quoted}")
    elif lines[0].startswith("Could not override '"):
        key = lines[0].split("'")[1]
        lines[0] = lines[0].rstrip(".") + did_you_mean_key(key, config_name, [o for o in job if override_key(o) != key])
    return "; ".join(ln.rstrip(".") for ln in lines)


def did_you_mean(name: str, candidates: list[str], prefix: str = "") -> str:
    """` (did you mean <prefix><candidate>?)` for the candidate closest to a mistyped `name`, or ""."""
    close = difflib.get_close_matches(name, candidates, n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def did_you_mean_key(key: str, config_name: str, job: list[str]) -> str:
    """For a `key` the config lacks: the closest key of its section, or one of the same name elsewhere
    (`lr` -> optimizer.lr), and the section's keys; "" where `job` without it does not compose."""
    try:
        cfg = compose(config_name, job)
    except Exception:
        return ""
    parent, _, name = key.rpartition(".")
    section = OmegaConf.select(cfg, parent) if parent else cfg
    keys = [str(k) for k in section] if isinstance(section, DictConfig) else []
    elsewhere = [k for k in dotted_keys(cfg) if k.rpartition(".")[2] == name]
    hint = f" (did you mean {elsewhere[0]}?)" if elsewhere else did_you_mean(name, keys, parent + "." if parent else "")
    return f"{hint}; {parent or 'the top level'} has: {', '.join(keys)}" if keys else hint


def dotted_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Every key of `cfg`, nested ones as `section.key`."""
    keys = []
    for k, v in cfg.items_ex(resolve=False):
        keys.append(f"{prefix}{k}")
        if isinstance(v, DictConfig):
            keys += dotted_keys(v, f"{prefix}{k}.")
    return keys


def output_dir_problem(cfg: DictConfig, overrides: list[str], multirun: bool) -> str | None:
    """Why the output dir of the composed `cfg` (with Hydra's node) cannot take this run or sweep: it
    cannot be written, holds earlier results, or the sweep's report could not read its jobs; or why a
    stopped sweep cannot be continued (continue_sweep). None if it can."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    out = Path(str(OmegaConf.select(cfg, key)))
    subdir = OmegaConf.select(cfg, "hydra.output_subdir")
    if multirun and subdir != ".hydra":  # the report finds no job then, after every job has trained
        return (
            f"hydra.output_subdir={'null' if subdir is None else subdir} would leave the sweep without its "
            "report, which reads each job's Hydra config from <job>/.hydra/: leave hydra.output_subdir as it is"
        )
    continued = OmegaConf.select(cfg, "continue_sweep", default=None) if multirun else None
    if continued is not None:
        return continue_problem(Path(str(continued)), out, overrides) or outputs.output_problem(out, key)
    return outputs.output_problem(out, key) or outputs.earlier_results(out, key)


def continue_problem(sweep_dir: Path, into: Path, overrides: list[str]) -> str | None:
    """Why the stopped sweep in `sweep_dir` cannot be continued into `into` (hydra.sweep.dir) by these
    overrides, or None: it must be a sweep dir, swept with the same values in the same order (each job
    number must name the same job), and none of its jobs may still be running."""
    given = shell_override("continue_sweep", sweep_dir)
    if into.absolute() != sweep_dir.absolute():
        return f"{given} goes on in that dir, and hydra.sweep.dir={into} names another: leave hydra.sweep.dir out"
    if not (sweep_dir / "multirun.yaml").is_file():
        return f"{given} is not a sweep dir (it has no multirun.yaml): give the dir a sweep printed its report in"
    try:
        recorded = [str(t) for t in OmegaConf.load(sweep_dir / "multirun.yaml").hydra.overrides.task]
    except Exception as e:  # damaged by hand, or not Hydra's
        return f"{given}: its multirun.yaml does not say which values it swept ({type(e).__name__}); start a new sweep"
    before = [t for t in recorded if override_key(t) != "continue_sweep"]
    now = [t for t in overrides if override_key(t) != "continue_sweep" and not override_key(t).startswith("hydra")]
    if now != before:
        same = " ".join(shlex.quote(t) for t in [*before, given])
        return (
            f"{given} swept `{' '.join(before)}` and this command line gives `{' '.join(now)}`: a sweep is "
            f"continued with its own values, in their order (each job number names one job): python sweep.py -m {same}"
        )
    for record in sorted(sweep_dir.glob("**/metrics.json")):
        with contextlib.suppress(OSError, ValueError):
            held = json.loads(record.read_text())
            if isinstance(held, dict) and process.still_running(held):
                return (
                    f"{given}: its job in {record.parent.name}/ is still running (pid {held['process']['pid']}): "
                    "let that sweep end or stop it (Ctrl-C) first"
                )
    return None


def checked(job_check: JobCheck | None, jobs: list[tuple[list[str], DictConfig]]) -> str | None:
    """`job_check`'s problem with the composed jobs; a key a job lacks (removed by `~key`) is one too."""
    if job_check is None or not jobs:
        return None
    try:
        return job_check(jobs)
    except OmegaConfBaseException as e:
        return text_lines(e)[0]
