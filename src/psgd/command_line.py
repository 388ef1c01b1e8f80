"""What train.py and sweep.py do around Hydra: compose and check every job of the command line (what Hydra
or psgd would refuse is one line and exit code 2 before torch loads or anything is written), then run it."""

import contextlib
import difflib
import functools
import importlib
import itertools
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from psgd import forkserver, outputs, signals, sweep
from psgd.config import Jobs, checked_runs, describe, sweep_values_problem
from psgd.console import fail, in_the_job, other_torchrun_worker, text_lines
from psgd.io import say

MULTIRUN_FLAGS = ("-m", "--multirun")
HELP_FLAGS = ("-h", "--help")
MAX_JOBS_COMPOSED = 64  # beyond this many jobs, every value of every key is composed once, not every product


def main(app: Callable[[], object], config_name: str, conf: Path) -> None:
    """Run a script's `@hydra.main` function `app` for this process's command line, checked first; a sweep
    ("sweep", or `train.py -m`) exits 1 when a job failed. Hydra's flags (--help, --cfg ...) go unchecked."""
    signals.interrupt_on_sigterm()  # as Ctrl-C, also while torch loads
    argv = sys.argv[1:]
    sweeping = config_name == "sweep" or is_multirun(argv)
    if sweeping:
        argv = [a for a in argv if a not in MULTIRUN_FLAGS]  # the sweep config's hydra.mode says it
    if any(a in HELP_FLAGS for a in argv):
        argv = without_sweeps(argv)
    sys.argv[1:] = ["--config-name=sweep", *argv] if sweeping and config_name != "sweep" else argv
    hydras_flags = any(a.startswith("-") for a in argv)  # but -m, taken out above
    try:
        if hydras_flags:
            run_hydras_flags(app, argv)
            return
        check = functools.partial(jobs_problem, sweeping=sweeping)
        if problem := command_line_problem("sweep" if sweeping else "train", argv, conf, check):
            fail(problem, every_worker_finds_it=True)
        load_training()
        with contextlib.nullcontext() if sweeping else signals.held(signal.SIGINT, signal.SIGTERM):
            app()  # a single run's job releases the signals once Hydra has made its run dir
    except BaseException as e:
        exit_stopped(e, sweeping and not hydras_flags)
        raise
    if sweeping:
        sys.exit(1 if sweep.LAST["failed"] else 0)


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


def run_hydras_flags(app: Callable[[], object], argv: list[str]) -> None:
    """Hydra's run of a command line with its flags; after its --help, the schema's keys (describe)."""
    if not any(a in HELP_FLAGS for a in argv):
        app()
        return
    with contextlib.suppress(SystemExit):
        app()
    print("Keys (key: meaning [what it takes]):")
    for key, allowed, meaning in describe():
        print(f"  {key}: {meaning} [{allowed}]")


def exit_stopped(e: BaseException, sweeping: bool) -> None:
    """For `e` that ended the script: a sweep's report of the jobs that ran; Ctrl-C or SIGTERM as one line
    and exit code 130 / 143; a closed stdout quietly."""
    said = sweeping and sweep.report_stopped_sweep()
    if isinstance(e, KeyboardInterrupt):
        if not (said or other_torchrun_worker()):  # torchrun: the first worker of a machine says it
            how = f" ({signals.received})" if signals.received else ""
            say(f"psgd: interrupted{how} before training started; nothing was written")
        raise SystemExit(signals.interrupted_exit_code())
    if isinstance(e, BrokenPipeError):  # `python train.py --help | head`: quiet, as a shell command is
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        raise SystemExit(141)  # 128 + SIGPIPE, what a shell reports


def jobs_problem(jobs: Jobs, sweeping: bool) -> str | None:
    """psgd's checks of the composed jobs: those without torch first (then the fork server starts early);
    for a sweep also, with torch loaded, those of this machine and its datasets."""
    problem, runs = checked_runs(jobs, name_the_job=sweeping or len(jobs) > 1)
    if problem:
        return problem
    forkserver.start_early(jobs[0][1], runs)
    if not sweeping:
        return None
    load_training()
    from psgd.run_checks import sweep_data_problem  # imports torch: only once the values passed

    return sweep_values_problem(jobs) or sweep_data_problem(jobs)


def load_training() -> None:
    """Import torch and Lightning before Hydra makes the run dir, with Ctrl-C and SIGTERM held (inside torch's
    C++ initialisers they abort the process)."""
    with signals.held(signal.SIGINT, signal.SIGTERM):
        importlib.import_module("psgd.cli")  # not at the top: the command line is checked before torch loads


def command_line_problem(
    config_name: str, argv: list[str], config_dir: Path, job_check: Callable[[Jobs], str | None] | None = None
) -> str | None:
    """The one line why Hydra would refuse the `argv` of `config_dir`/`config_name`.yaml (naming a sweep's
    job), why its output dir cannot take the run, or why `job_check` refuses the composed jobs; else None."""
    multirun = config_name == "sweep" or is_multirun(argv)
    overrides = [a for a in argv if a not in MULTIRUN_FLAGS]
    if any(a.startswith("-") for a in overrides):  # Hydra's flags: Hydra judges those alone
        return None
    composed: Jobs = []
    with initialize_config_dir(config_dir=str(Path(config_dir).absolute()), version_base="1.3"):
        try:
            jobs = jobs_of(config_name, overrides, multirun)
            for job in jobs:
                composed.append((job, compose(config_name, job, return_hydra_config=not composed)))
        except Exception as e:
            return in_the_job(hydra_problem(e), job, jobs) if composed else hydra_problem(e)
    if not composed:  # another sweeper's jobs: it composes them itself
        return None
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        out = Path(str(OmegaConf.select(composed[0][1], key)))
        problem = outputs.output_problem(out, key) or outputs.earlier_results(out, key)
    except OmegaConfBaseException:  # the dir's name reads a key a job lacks (removed by `~key`): job_check says it
        problem = None
    try:
        return problem or (job_check and job_check(composed))
    except OmegaConfBaseException as e:  # a key a job lacks (removed by `~key`)
        return text_lines(e)[0]


def jobs_of(config_name: str, overrides: list[str], multirun: bool) -> list[list[str]]:
    """The overrides of each job as Hydra's basic sweeper makes them (with a preset's hydra.sweeper.params);
    [] for ranges to sample (its sweeper's to judge); without -m, the command line itself."""
    if not multirun:
        return [overrides]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    given = parser.parse_overrides(overrides)
    params = {}
    with contextlib.suppress(Exception):  # composing each job says why it fails
        plain = [o.input_line for o in given if not o.is_sweep_override()]
        params = compose(config_name, plain, return_hydra_config=True).hydra.sweeper.get("params") or {}
    on_line = {o.get_key_element() for o in given}
    given = parser.parse_overrides([f"{k}={v}" for k, v in params.items() if k not in on_line]) + given
    if any(o.is_sweep_override() and not o.is_discrete_sweep() for o in given):
        return []
    per_key = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in given
    ]
    if math.prod(len(values) for values in per_key) <= MAX_JOBS_COMPOSED:
        return [list(job) for job in itertools.product(*per_key)]
    longest = max(len(values) for values in per_key)  # every value once; their combinations are not checked
    return [[values[i % len(values)] for values in per_key] for i in range(longest)]


def hydra_problem(e: Exception) -> str:
    """Hydra's reason for refusing a job in one line, with a did-you-mean for a mistyped choice or key."""
    if isinstance(e, MissingConfigException) and e.options:  # a group's choice
        group, _, choice = (e.missing_cfg_file or "").rpartition("/")
        hint = did_you_mean(choice, list(e.options), f"{group}=")
        return f"{group}={choice} is unknown{hint}; {group} can be: {', '.join(e.options)}"
    lines = [ln for ln in text_lines(e) if not ln.startswith(("See https://", "^"))]
    if e.__cause__ is not None:
        lines.append(text_lines(e.__cause__)[0])
    if lines[0].startswith("Could not override '"):
        lines[0] = lines[0].rstrip(".") + did_you_mean(lines[0].split("'")[1], [key for key, _, _ in describe()])
    return "; ".join(ln.rstrip(".") for ln in lines)


def did_you_mean(word: str, options: list[str], prefix: str = "") -> str:
    """` (did you mean <prefix><option>?)` for the option closest to a mistyped `word` (a dotted key: one of
    the same name in another section first, `lr` -> optimizer.lr), or "" (also where `word` is an option)."""
    same_name = [o for o in options if o.rpartition(".")[2] == word.rpartition(".")[2]]
    close = same_name or difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close and close[0] != word else ""
