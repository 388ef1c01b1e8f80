"""The command line of train.py and sweep.py, checked before Hydra runs it.

A mistyped config group choice (`strategy=hogwlid`) or setting (`trainer.max_epoch=3`), or an override
Hydra cannot parse, gets one line `psgd: error: ...` naming the bad value and what is allowed, and exit
code 2; Hydra itself prints ~10 lines (its config search path, a hint about HYDRA_FULL_ERROR) and exits
with 1. The check composes the config of every job the command line asks for, with Hydra's compose API
(~10-70 ms each), before torch or Lightning are imported, so such a typo is reported in about a
second. It reports what Hydra would refuse anyway (anything it cannot judge is left to Hydra), then
what the script's job check finds in the composed jobs: psgd's value checks that need no torch
(psgd.config.check_values), so a bad value is reported as quickly.

This module stays light (Hydra and OmegaConf only): the scripts import it before anything else.
"""

import difflib
import functools
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from psgd import signals
from psgd.io import NO_ROOM, say
from psgd.process import proc_stat, still_running

MAX_JOBS_COMPOSED = 64  # beyond this many jobs, every value of every key is composed once, not every product


def fail(message: str, every_worker_finds_it: bool = False) -> None:
    """A user error: one line on stderr, exit code 2. `every_worker_finds_it`: the line follows from
    the config and the machine alone, so that under torchrun each worker of a machine finds it: the
    first one (local rank 0) says it and the others leave it to that one (see leave_it_to_the_first)."""
    if not (every_worker_finds_it and leave_it_to_the_first()):
        say(f"psgd: error: {message}")
    raise SystemExit(2)


def global_rank() -> str | None:
    """This process's global rank when torchrun or srun started it as one of the workers, else None."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID"))


def first_worker() -> bool:
    """This process speaks for the run: it is not one of several workers that torchrun or srun started
    as train.py processes, or it is rank 0 of them (each finds the same settings, files and results)."""
    return global_rank() in (None, "0")


# while a sweep runs its jobs in this process (Hydra's basic launcher): the warnings said so far, each
# said for its first job only (a GPU-only switch on CPU came once per job, 25 lines in a 25-job sweep)
_SAID_IN_SWEEP: set[str] | None = None


def warn_once_per_sweep(on: bool) -> None:
    """From now on (on=True) until off, a warning said by one job of the sweep is not said again."""
    global _SAID_IN_SWEEP
    _SAID_IN_SWEEP = set() if on else None


def warn(message: str) -> None:
    """A `psgd: warning: ...` line on stderr, said once per run (first_worker), and once per sweep."""
    if not first_worker():
        return
    if _SAID_IN_SWEEP is not None:
        if message in _SAID_IN_SWEEP:
            return
        _SAID_IN_SWEEP.add(message)
    say(f"psgd: warning: {message}")


# how long a torchrun worker waits for its agent's SIGTERM once the first worker has said the problem
AGENT_STOPS_WITHIN_S = 10.0


def torchrun_worker() -> bool:
    """This process is one of the workers that torchrun (torch elastic) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def other_torchrun_worker() -> bool:
    """A worker that torchrun started other than the first on its machine (local rank 0)."""
    return torchrun_worker() and os.environ.get("LOCAL_RANK", "0") != "0"


def leave_it_to_the_first() -> bool:
    """In a torchrun worker other than its machine's first, which found the same problem as that one:
    wait for the agent to stop this worker (it sends SIGTERM to the others once one has exited), so that
    the first worker says it, once, and is not stopped by the agent before it could. True when stopped
    so, and the problem was said; False elsewhere, or when no SIGTERM came in time (then this worker
    says it too). (srun keeps one line per task: it stops the others only with --kill-on-bad-exit.)"""
    if not other_torchrun_worker():
        return False
    try:
        time.sleep(AGENT_STOPS_WITHIN_S)
    except KeyboardInterrupt:  # the agent's SIGTERM (signals.interrupt_on_sigterm), or Ctrl-C
        return True
    return False


INFO_FLAGS = ("-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion")


def load_training() -> None:
    """Import what a job runs (torch, Lightning: ~3 s) before Hydra makes the run dir, so that Ctrl-C
    meanwhile leaves none; not for Hydra's flags that only print (--help, --cfg job ...). Ctrl-C or
    SIGTERM while it loads is handled as soon as it has loaded (signals.held): inside torch's C++
    initialisers it aborted the process."""
    if not any(a.split("=", 1)[0] in INFO_FLAGS for a in sys.argv[1:]):
        with signals.held(signal.SIGINT, signal.SIGTERM):  # Ctrl-C or SIGTERM meanwhile: handled once loaded
            import psgd.cli  # noqa: F401


def exit_pipe_closed() -> None:
    """stdout was a pipe whose reader left (`python train.py --help | head`): exit quietly, as a shell
    command does, not with Python's BrokenPipeError traceback (Python's documented recipe)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
    raise SystemExit(141)  # 128 + SIGPIPE, what a shell reports


def exit_interrupted(said: bool = False) -> None:
    """Ctrl-C or SIGTERM that reached the script: outside training (while torch loads, the checks run or
    the data is read), where no handler of Lightning's or psgd's winds a run down (psgd.run.mark_stopped).
    One line (unless `said`) and exit code 130 or 143, as a shell reports SIGINT or SIGTERM, not a
    traceback of whatever was loading."""
    if not (said or other_torchrun_worker()):  # torchrun: the first worker of a machine says it
        how = f" ({signals.received})" if signals.received else ""
        say(f"psgd: interrupted{how} before training started; nothing was written")
    raise SystemExit(signals.interrupted_exit_code())


def process_start(pid: int) -> datetime | None:
    """When process `pid` started (Linux: /proc), or None where that cannot be read."""
    try:
        ticks = int(proc_stat(pid)[19])  # field 22, starttime
        boot = next(ln for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime "))
        return datetime.fromtimestamp(int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def job_start(env: Mapping[str, str]) -> datetime | None:
    """When this torchrun / srun job started, alike in all of its processes and in a worker torchrun
    restarts hours later: srun's SLURM_JOB_START_TIME (a Unix time, the same on every node), or the
    start of torchrun's agent, the workers' parent on each machine. None where neither can be read."""
    if torchrun_worker():
        return process_start(os.getppid())
    try:
        return datetime.fromtimestamp(int(env["SLURM_JOB_START_TIME"]))
    except (KeyError, ValueError, OverflowError, OSError):
        return None


def run_name() -> str:
    """The run dir under outputs/: <date>/<time>, or a name every process of one torchrun / srun job
    computes alike, so that all workers (and a restarted worker) write into the same dir. Its date is
    the job's start (job_start), not today's: a worker that started, or was restarted, after midnight
    would otherwise file itself under the next day, apart from the run it belongs to."""
    env = os.environ
    if torchrun_worker():
        started = job_start(env)
        day = (started or datetime.now()).strftime("%Y-%m-%d")
        run_id = env["TORCHELASTIC_RUN_ID"]
        if run_id not in ("", "none"):  # --rdzv-id, or the id torchrun makes up for one machine
            return f"{day}/torchrun-{run_id}"
        # "none": a static rendezvous (--master-port given). On one machine every worker, restarted
        # ones too, is a child of the one torchrun process: its pid and start time name this job (the
        # port alone would name every such job of the day alike). Across machines, only the port.
        if started is not None and env.get("WORLD_SIZE") == env.get("LOCAL_WORLD_SIZE"):
            return started.strftime(f"%Y-%m-%d/%H-%M-%S-torchrun{os.getppid()}")
        return f"{day}/torchrun-port{env.get('MASTER_PORT', '')}"
    if "SLURM_JOB_ID" in env and "SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS") or 1) > 1:
        # srun's tasks (one per worker); one task, e.g. `python train.py` lines in a batch script, has
        # no other process to agree with and gets a name of its own, as anywhere
        day = (job_start(env) or datetime.now()).strftime("%Y-%m-%d")
        return f"{day}/slurm-{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    return datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")


OmegaConf.register_new_resolver("psgd_run_name", run_name, use_cache=True, replace=True)


MULTIRUN_FLAGS = ("-m", "--multirun")  # Hydra's
# characters Hydra's override syntax takes only in a quoted value (besides non-ASCII ones; ~ has its own line)
QUOTE_ONLY = "!#&;<>^`="


def shell_override(key: str, value: object) -> str:
    """`key=value` as one shell word that Hydra reads back as the string `value` (a path with a space,
    a non-ASCII letter or a #: quoted for both)."""
    text = str(value)
    if re.fullmatch(r"[\w/.+:@%-]+", text, re.ASCII) and not text.startswith("~"):
        return f"{key}={text}"
    if not any(c in text for c in "'\"$`\\!"):  # no character the two quotings would take as their own
        return f"\"{key}='{text}'\""
    # Hydra's escapes in a quoted value: \' for a quote, \\ for a backslash before a quote or at the end
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m[1] * 2, text).replace("'", "\\'")
    return shlex.quote(f"{key}='{escaped}'")


def is_multirun(argv: list[str]) -> bool:
    """Whether Hydra would run `argv` (a script's arguments) as a multirun: `-m`, `--multirun` or the
    override hydra.mode=MULTIRUN."""
    return any(a in MULTIRUN_FLAGS or a.replace(" ", "").upper() == "HYDRA.MODE=MULTIRUN" for a in argv)


def interpreter_flags() -> list[str]:
    """The Python interpreter's own options this process was started with (`python -X dev -W error
    train.py ...` gives ["-X", "dev", "-W", "error"]), for a script that re-executes itself as another."""
    return list(sys.orig_argv[1 : len(sys.orig_argv) - len(sys.argv)])


def sweep_argv(argv: list[str]) -> list[str]:
    """sweep.py's arguments (argv[1:]) as Hydra must get them: always a multirun, `-m` first.

    Hydra reads a `-m` between overrides as an unknown argument (argparse's usage text, exit 2), and
    without `-m` it would run one plain job: sweep.py adds it, in front. A line with other Hydra flags
    (--cfg, -cn, --help ...) is not made a multirun: Hydra's flags go after the overrides, as Hydra
    reads them (`hydra_order`). `continue_sweep=<dir>` also sets hydra.sweep.dir=<dir>, where the
    stopped sweep goes on (not given there as an interpolation: SLURM's job processes resolve the sweep
    dir again, without psgd's resolvers)."""
    given = [a.split("=", 1)[1] for a in argv if override_key(a) == "continue_sweep" and "=" in a]
    if given:
        argv = _continue_sweep_not_in_job_dir_names(argv)
    if given and given[-1] != "null" and not any(override_key(a) == "hydra.sweep.dir" for a in argv):
        argv = [*argv, f"hydra.sweep.dir={given[-1]}"]  # the value as typed: Hydra parses it alike
    rest = [a for a in argv if a not in MULTIRUN_FLAGS]
    if any(a.startswith("-") for a in rest):
        return hydra_order(argv)
    return ["-m", *rest]


EXCLUDE_KEYS = "hydra.job.config.override_dirname.exclude_keys"
NOT_IN_DIR_NAMES = f"{EXCLUDE_KEYS}=[continue_sweep]"  # what sweep.py adds with continue_sweep


def _continue_sweep_not_in_job_dir_names(argv: list[str]) -> list[str]:
    """`continue_sweep` left out of `${hydra.job.override_dirname}`: job folders named by their overrides
    (hydra.sweep.subdir=${hydra.job.override_dirname}) are then the stopped sweep's, where its jobs go on
    (they were new folders `continue_sweep=<dir>,...`: every job ran again, and the report counted both)."""
    given = [a for a in argv if override_key(a) == EXCLUDE_KEYS]
    if not given:
        return [*argv, NOT_IN_DIR_NAMES]
    key, _, value = given[-1].partition("=")
    inner = value.strip()
    if not (inner.startswith("[") and inner.endswith("]")):  # not a list as typed: Hydra's to judge
        return argv
    keys = [k.strip() for k in inner[1:-1].split(",") if k.strip()]
    if "continue_sweep" in keys:
        return argv
    last = len(argv) - 1 - argv[::-1].index(given[-1])
    return [*argv[:last], f"{key}=[{','.join([*keys, 'continue_sweep'])}]", *argv[last + 1 :]]


def hydra_order(argv: list[str]) -> list[str]:
    """A script's arguments with Hydra's flags (and their values) after all the overrides. Hydra's
    argparse takes the overrides only as one run of words: `a=1 --config-dir my_conf b=2` failed with
    "unrecognized arguments: b=2" (and usage text, exit 2). Overrides first, not flags first: `--info`
    takes an optional topic, and would take the override after it for one."""
    flags, overrides, words = [], [], list(argv)
    while words:
        word = words.pop(0)
        if not word.startswith("-"):
            overrides.append(word)
            continue
        flags.append(word)
        action = _hydra_flags().get(word)  # None: unknown (argparse's to judge), or --flag=value with its value
        if (
            action is not None
            and words
            and (action.nargs is None or (action.nargs == "?" and words[0] in (action.choices or ())))
        ):
            flags.append(words.pop(0))  # --cfg job, -cd my_conf, --info defaults
    if any(_flag_dest(f) in ("help", "hydra_help") for f in flags):
        # the help composes one job, also after -m: a sweep's values made it Hydra's traceback
        overrides = [o for o in overrides if not _sweeps(o)]
    return overrides + flags


def _sweeps(text: str) -> bool:
    """Whether the override `text` gives its key several values (a sweep); False if it does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides([text])[0].is_sweep_override()
    except Exception:  # Hydra's to judge
        return False


@functools.cache
def _hydra_flags() -> dict:
    """Hydra's command-line flags: each option string (-m, --multirun, --cfg ...) -> its argparse action."""
    from hydra._internal.utils import get_args_parser

    return {s: a for a in get_args_parser()._actions for s in a.option_strings}


def _flag_dest(word: str) -> str | None:
    """What Hydra's flag `word` sets (`-m` and `--multirun`: "multirun"; `--config-dir=d`: "config_dir"),
    or None for an override or an unknown flag."""
    return getattr(_hydra_flags().get(word.split("=", 1)[0]), "dest", None)


MODES = ("run", "multirun", "cfg", "info", "shell_completion")  # Hydra does one of these per call


def _modes_problem(argv: list[str]) -> str | None:
    """Two of Hydra's modes on one line (`-m --cfg job`, `--cfg job --info`): Hydra raised a ValueError
    with its traceback ("Only one of --run, --multirun, --cfg, --info and --shell_completion can be
    specified")."""
    given: dict[str, str] = {}  # mode -> the flag as typed (-m and --multirun are one mode)
    for a in argv:
        if (mode := _flag_dest(a)) in MODES:
            given.setdefault(mode, a.split("=", 1)[0])
    if len(given) < 2:
        return None
    given = list(given.values())
    return (
        f"{' and '.join(given)} cannot go together: Hydra runs the job (or -m, a sweep), prints its config "
        "(--cfg job) or prints information (--info), one of these per call"
    )


# Judges the composed jobs once Hydra would accept them all: (overrides, config) of each job, the
# first with Hydra's node; returns a one-line problem or None (sweep.py: psgd's value checks).
JobCheck = Callable[[list[tuple[list[str], DictConfig]]], str | None]


def check_command_line(
    config_name: str, config_dir: Path, argv: list[str] | None = None, job_check: JobCheck | None = None
) -> None:
    """Exit with one line (code 2) if Hydra would refuse the overrides in `argv` (default: sys.argv)
    to the script whose configs are `config_dir`/`config_name`.yaml, or `job_check` the jobs."""
    try:
        problem = command_line_problem(config_name, sys.argv[1:] if argv is None else argv, config_dir, job_check)
    except Exception:  # a syntax this check does not know (glob sweeps need Hydra's loader): Hydra judges
        problem = None
    if problem:
        fail(problem, every_worker_finds_it=True)


def _without_config_dir(texts: list[str]) -> tuple[str | None, list[str]]:
    """Hydra's `--config-dir <dir>` (or `-cd <dir>`, `--config-dir=<dir>`: a config folder searched besides
    psgd's) taken out of the arguments: (that folder or None, the other arguments)."""
    folder, rest = None, []
    words = iter(texts)
    for a in words:
        if _flag_dest(a) != "config_dir":
            rest.append(a)
        elif "=" in a:
            folder = a.split("=", 1)[1]
        elif (folder := next(words, None)) is None:
            return None, texts  # no folder after it: Hydra's to judge
    return folder, rest


def command_line_problem(
    config_name: str, argv: list[str], config_dir: Path, job_check: JobCheck | None = None
) -> str | None:
    """The one-line reason Hydra would refuse these arguments, or None (also for anything not judged
    here: Hydra's own flags other than -m, or HYDRA_FULL_ERROR=1, which asks for Hydra's full report).
    Then, with every job composed, `job_check`'s reason, if any."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return None
    if problem := _modes_problem(argv):
        return problem
    shows = [a for a in argv if _flag_dest(a) == "cfg"]
    if shows and (swept := next((a for a in argv if not a.startswith("-") and _sweeps(a)), None)):
        # Hydra's "Ambiguous value" said to add --multirun, which it then refuses with --cfg
        key = override_key(swept)
        return f"{shows[0]} prints one job's config and {swept} gives {key} several values: give it one of them"
    multirun = any(a in MULTIRUN_FLAGS for a in argv)
    if multirun and torchrun_worker():  # each worker ran the sweep, in a sweep dir of its own, and its second
        # job's process group failed to connect (torchrun's store is for one group per attempt)
        return (
            "a sweep under torchrun: each of its workers would run the whole sweep, in a sweep dir of its own; "
            "run the sweep without torchrun (python sweep.py -m workers=N ... starts each job's workers), or "
            "one job per torchrun (torchrun ... train.py ...)"
        )
    extra_dir, texts = _without_config_dir([a for a in argv if a not in MULTIRUN_FLAGS])
    if any(a.startswith("-") for a in texts):  # no override starts with "-"
        return None  # other Hydra flags (-cn, --cfg job, --help ...): Hydra's to judge
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    # glob() sweeps pick among a config group's choices, which only Hydra's config loader knows
    globs = multirun and any("glob(" in t for t in texts)
    if extra_dir is not None:  # --config-dir: the user's configs are searched besides psgd's, as Hydra does
        searched = Path(extra_dir).absolute()
        if (
            globs
            or "'" in str(searched)
            or not searched.is_dir()
            or any(t.startswith("hydra.searchpath") for t in texts)
        ):
            return None  # a glob over the user's choices, or a search path of their own: Hydra's to judge
        texts = [*texts, f"hydra.searchpath=['file://{searched}']"]
    parser = OverridesParser.create(config_loader=_config_loader(config_dir) if globs else None)
    try:
        overrides = parser.parse_overrides(texts)
    except OverrideParseException as e:
        why = [ln for ln in text_lines(e.message) if not ln.startswith(("Error parsing override", "See https://"))]
        key, eq, value = str(e.override).partition("=")
        if eq and value.startswith("~"):  # the shell leaves ~ alone after data.root= (not a variable name)
            why = [f"a value starting with ~ must be quoted for Hydra: {shell_override(key, value)} (or write $HOME)"]
        elif eq and (c := next((c for c in value if c in QUOTE_ONLY or not c.isascii()), None)):
            if any(s in value for s in "'\",[]{}()"):  # quotes, a sweep, a list...: each value on its own
                why = [
                    f"a value with {c!r} must be quoted for Hydra, each value of a sweep or list on its own: "
                    f"{key}='a','b'"
                ]
            else:  # a path with a non-ASCII letter, #, & ...
                why = [f"a value with {c!r} must be quoted for Hydra: {shell_override(key, value)}"]
        return f"cannot read the override '{e.override}': {'; '.join(why) or 'not key=value'} (Hydra's override syntax)"
    if problem := _interval_problem(config_name, overrides, config_dir) or _deleted_setting(
        config_name, overrides, config_dir
    ):
        return problem
    sweeps = [o for o in overrides if o.is_sweep_override()]
    if multirun and (problem := _dropped_sweep(overrides)):
        return problem
    if sweeps and not multirun:
        o = sweeps[0]
        text, key = o.input_line, o.get_key_element()
        values = ",".join(o.sweep_string_iterator()) if o.is_discrete_sweep() else "..."
        # Lightning's GPU ids are not psgd's way either: a list of them is refused (config.devices_allowed)
        as_list = (key == "trainer.devices" and gpus_by_id(values.split(","))) or f"for a list write {key}=[{values}]"
        as_jobs = f"to run one job per value add -m (python sweep.py -m {text})"
        return f"{text} gives {key} several values: {as_jobs}; {as_list}"
    if multirun:  # a preset's hydra.sweeper.params sweep too (the command line wins for a key in both)
        try:
            preset = _sweeper_params(config_name, _jobs(overrides)[0], config_dir)
        except Exception:  # the first job does not compose: the loop below reports why
            preset = []
        on_line = {o.get_key_element() for o in overrides}
        from_preset = parser.parse_overrides(preset)
        overrides = [o for o in from_preset if o.get_key_element() not in on_line] + overrides
    if any(o.is_sweep_override() and not o.is_discrete_sweep() for o in overrides):
        return None  # interval() sweeps are for other sweepers, which compose their own jobs
    composed: list[tuple[list[str], DictConfig]] = []
    jobs = list(_jobs(overrides))
    if not jobs:  # Hydra would launch none and leave a sweep dir without results
        return _no_job(overrides)
    for i, job in enumerate(jobs):
        # the first job with Hydra's own node, which holds the output dir (one composition, not two)
        problem, cfg = _compose_problem(config_name, job, config_dir, hydra_node=not composed)
        if problem:  # after jobs that composed, name the one that does not
            return in_the_job(problem, job, jobs) if i > 0 else problem
        if cfg is not None:
            composed.append((job, cfg))
    if not composed:
        return None
    subdir = OmegaConf.select(composed[0][1], "hydra.output_subdir", default=".hydra")
    if multirun and subdir != ".hydra":  # the report found no job and failed after every job had trained
        return (
            f"hydra.output_subdir={'null' if subdir is None else subdir} would leave the sweep without its "
            "report, which reads each job's Hydra config from <job>/.hydra/: leave hydra.output_subdir as it is"
        )
    continued = OmegaConf.select(composed[0][1], "continue_sweep", default=None) if multirun else None
    problem = _continue_problem(Path(str(continued)), texts, composed[0][1]) if continued is not None else None
    problem = problem or _output_problem(composed[0][1], multirun, continued)
    return problem or (job_check(composed) if job_check else None)


def as_typed(override: str) -> str:
    """An override as its user typed it: Hydra's sweeper escapes special characters in a job's string
    values (`trainer.max_time=00\\:00\\:01\\:00`), which a line or a report shows without."""
    key, sep, value = override.partition("=")
    return key + sep + re.sub(r"\\([\\()\[\]{}:=, \t])", r"\1", value)


def override_key(text: str) -> str:
    """The key an override sets (`+data.seed=1` -> data.seed; a flag is its own key)."""
    return text.split("=", 1)[0].lstrip("+~")


def _continue_problem(sweep_dir: Path, texts: list[str], cfg: DictConfig) -> str | None:
    """Why the stopped sweep in `sweep_dir` cannot be continued by this command line (its overrides
    `texts`, composed into `cfg`), or None: it must be a sweep dir, swept with the same values in the
    same order (each job number must name the same job), and none of its jobs may still be running."""
    given = shell_override("continue_sweep", sweep_dir)
    try:
        into = Path(str(OmegaConf.select(cfg, "hydra.sweep.dir")))
    except Exception:  # left to Hydra
        into = sweep_dir
    if into.absolute() != sweep_dir.absolute():  # a hydra.sweep.dir of the command line's wins
        return f"{given} goes on in that dir, and hydra.sweep.dir={into} names another: leave hydra.sweep.dir out"
    if not (sweep_dir / "multirun.yaml").is_file():
        return f"{given} is not a sweep dir (it has no multirun.yaml): give the dir a sweep printed its report in"
    try:
        recorded = [str(t) for t in OmegaConf.load(sweep_dir / "multirun.yaml").hydra.overrides.task]
    except Exception as e:  # damaged by hand, or not Hydra's
        return f"{given}: its multirun.yaml does not say which values it swept ({type(e).__name__}); start a new sweep"
    before = [t for t in recorded if override_key(t) != "continue_sweep"]
    now = [t for t in texts if override_key(t) != "continue_sweep" and not override_key(t).startswith("hydra")]
    if now != before:
        same = " ".join(shlex.quote(t) for t in [*before, given])
        return (
            f"{given} swept `{' '.join(before)}` and this command line gives `{' '.join(now)}`: a sweep is "
            f"continued with its own values, in their order (each job number names one job): python sweep.py -m {same}"
        )
    for record in sorted(sweep_dir.glob("**/metrics.json")):
        try:
            held = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(held, dict) and still_running(held):
            return (
                f"{given}: its job in {record.parent.name}/ is still running (pid {held['process']['pid']}): "
                "let that sweep end or stop it (Ctrl-C) first"
            )
    return None


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def _interval_problem(config_name: str, overrides: list, config_dir: Path) -> str | None:
    """An interval() sweep under Hydra's basic sweeper, which cannot draw values from a range (Hydra
    raised its HydraException with a traceback, and left a sweep dir). Other sweepers (hydra/sweeper=
    optuna, nevergrad) take it: left to them."""
    o = next((o for o in overrides if o.is_sweep_override() and not o.is_discrete_sweep()), None)
    if o is None:
        return None
    try:
        cfg = _compose(config_name, [x.input_line for x in overrides if not x.is_sweep_override()], config_dir, True)
    except Exception:  # does not compose: Hydra's to report
        return None
    if OmegaConf.select(cfg, "hydra.sweeper._target_") != BASIC_SWEEPER:
        return None
    key = o.get_key_element()
    return (
        f"{o.input_line} asks for values drawn from a range, which only a sampling sweeper does "
        f"(e.g. hydra/sweeper=optuna, a Hydra plugin); psgd's sweeper runs the values listed: "
        f"{listed_instead(key, o.value())}"
    )


def listed_instead(key: str, interval) -> str:
    """Values from `interval`'s ends that the basic sweeper runs: `workers=1,2,3,4 or workers=range(1,5)`
    for interval(1,4), `data.batch_size=32,64,128,256` for interval(32,256), `optimizer.lr=0.01,0.03,0.1`
    for interval(0.01,0.1): the ends and a value between (on a log scale where they are orders of
    magnitude apart, as lrs are)."""
    lo, hi = interval.start, interval.end
    whole = lo.is_integer() and hi.is_integer()
    if lo >= hi:  # not a range: its ends
        return f"{key}={lo:g}" + (f",{hi:g}" if hi != lo else "")
    if whole and hi - lo < 8:
        lo, hi = int(lo), int(hi)
        return f"{key}={','.join(map(str, range(lo, hi + 1)))} or {key}=range({lo},{hi + 1})"
    if whole and lo > 0 and all(v.is_integer() and v > 0 for v in (math.log2(lo), math.log2(hi))):
        return f"{key}={','.join(str(2**e) for e in range(int(math.log2(lo)), int(math.log2(hi)) + 1))}"
    apart = 0 < lo and hi >= 10 * lo  # orders of magnitude apart
    middle = math.sqrt(lo * hi) if apart else (lo + hi) / 2
    middle = round(middle) if whole else float(f"{middle:.{1 if apart else 2}g}")
    return f"{key}={lo:g},{middle:g},{hi:g}"


# groups whose settings, but these, are the arguments of the class they build (model._target_, a model of
# the user's, may take no dropout): removing one (`~model.dropout`) leaves that argument at the class's default
CONSTRUCTOR_GROUPS = ("model", "optimizer")
READ_BY_PSGD = ("model.name", "model._target_", "optimizer._target_", "optimizer._partial_", "optimizer.lr")


def _deleted_setting(config_name: str, overrides: list, config_dir: Path) -> str | None:
    """`~key` of a setting the config files define, or `~group` / `group=null` of a config group they
    choose (data, model ...): psgd reads them all, but the constructor arguments of CONSTRUCTOR_GROUPS.
    The run failed later with OmegaConf's "Key 'workers' is not in struct", or for a group Hydra's
    traceback."""

    from hydra.core.override_parser.types import ChoiceSweep

    def group(o) -> bool:
        return (config_dir / o.key_or_group).is_dir()

    def null(o) -> bool:  # data=null, or a sweep over data's choices with null among them
        if not group(o) or o.is_delete():
            return False
        if not o.is_sweep_override():
            return o.value() is None
        return isinstance(o.value(), ChoiceSweep) and None in o.value().list

    removals = [o for o in overrides if o.is_delete() or null(o)]
    removals = [o for o in removals if not o.key_or_group.startswith("hydra")]
    if not removals:
        return None
    mine = [o.input_line for o in overrides if not (o in removals or o.is_sweep_override() or o.is_add())]
    try:
        cfg = _compose(config_name, mine, config_dir)  # the config files' keys (and groups chosen)
    except Exception:  # does not compose: judged below, or Hydra's to report
        return None
    for o in removals:
        key = o.key_or_group
        value = OmegaConf.select(cfg, key.replace("/", "."), default=_ABSENT)
        if value is _ABSENT:  # not the config files' (a key the command line added, a group left unchosen)
            continue
        if key.split(".")[0] in CONSTRUCTOR_GROUPS and "." in key and key not in READ_BY_PSGD:
            continue  # an argument of the model's or optimizer's class: its default then
        if group(o):
            choices = ", ".join(sorted(f.stem for f in (config_dir / key).glob("*.yaml")))
            what = f"{o.input_line}: null" if o.is_sweep_override() else o.input_line
            return f"{what} removes the {key} settings psgd reads; choose one instead: {key} can be: {choices}"
        shown = json.dumps(value) if value is None or isinstance(value, bool) else value
        return f"{o.input_line} removes a setting psgd reads; set it instead: {key}=<value> (here: {shown})"
    return None


_ABSENT = object()


def _dropped_sweep(overrides: list) -> str | None:
    """A sweep that a later override of the same key replaces: Hydra keeps a key's last value, so
    `workers=1,2,4 ... workers=8` ran one job, silently."""
    last = {(o.key_or_group, o.package): o for o in overrides}
    for o in overrides:
        later = last[(o.key_or_group, o.package)]
        if o is not later and o.is_sweep_override():
            return (
                f"{o.input_line} is replaced by {later.input_line} later on the command line (Hydra keeps "
                f"a key's last value), so its sweep would not run; give {o.get_key_element()} once"
            )
    return None


def in_the_job(problem: object, job: list[str], jobs: list[list[str]]) -> str:
    """`problem`, naming the job of a sweep it is in by the job's swept values (its overrides that not
    every job has)."""
    values = " ".join(as_typed(o) for o in job if not all(o in other for other in jobs))
    return f"{problem} (in the job {values or 'of the defaults'}; no job was started)"


# the nearest folder of the run's (or sweep's) output dir that existed when the command line was
# checked: a run that fails before training takes away the folders below it that it left empty
outputs_existed: Path | None = None


def _output_problem(cfg: DictConfig, multirun: bool, continued: object = None) -> str | None:
    """Why the results could not be written where Hydra will put them (hydra.run.dir, or
    hydra.sweep.dir with -m, of the composed `cfg`), or None. Hydra would stop with a traceback when it
    makes that dir; this tries to make a folder in its nearest existing ancestor (and removes it), so
    nothing is left."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        out = Path(str(OmegaConf.select(cfg, key)))
    except Exception:  # left to Hydra
        return None
    existing = out.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    global outputs_existed
    outputs_existed = existing
    fix = f"set PSGD_OUTPUTS=<dir> or {key}=<dir> to a writable folder"
    if not existing.is_dir():
        return f"cannot write results to {out}: {existing} is not a folder; {fix}"
    probe = None
    try:  # a folder, and a file in it: a full disk still makes folders, and Hydra's first file failed
        probe = Path(tempfile.mkdtemp(prefix=".psgd-write-check-", dir=existing))
        with open(probe / "probe", "wb") as f:
            f.write(bytes(4096))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        fix = f"free space there, or {fix}" if e.errno in NO_ROOM else fix
        return f"cannot write results to {out}: {e.strerror or e} in {existing}; {fix}"
    finally:
        if probe is not None:
            shutil.rmtree(probe, ignore_errors=True)
    return None if continued is not None else earlier_results(out, key)  # a continued sweep goes on in its dir


def earlier_results(out: Path, key: str) -> str | None:
    """Why `out` cannot take this run: it holds an earlier run's record (metrics.json) or sweep's
    (report.md, job records; with key "hydra.sweep.dir"), which this one would overwrite, its Hydra
    config first. None if it holds none, or for a worker that torchrun restarted, which goes on in its
    job's dir. `key` names what the user sets to choose another dir (hydra.run.dir, or train()'s
    run_dir)."""
    fix = f"set {key} to a new folder, or delete that one"
    if key == "hydra.sweep.dir":
        jobs = len(list(out.glob("**/metrics.json")))  # <n>/, or folders a changed hydra.sweep.subdir names
        held = [f"{jobs} job record(s)"] if jobs else []
        held += ["report.md"] if (out / "report.md").exists() else []
        if not held:
            return None
        return f"{out} holds an earlier sweep's results ({', '.join(held)}), which this sweep would overwrite: {fix}"
    record = out / "metrics.json"
    if not record.is_file() or int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) > 0:
        return None
    try:
        status = json.loads(record.read_text()).get("status", "unknown")
    except (OSError, ValueError, AttributeError):
        status = "unreadable"
    return (
        f"{out} holds an earlier run's results (metrics.json: {status}), which this run would overwrite: {fix} "
        f"({shell_override('ckpt_path', out)} resumes that run in a new folder)"
    )


def _jobs(overrides) -> list[list[str]]:
    """The override list of each job, as Hydra's basic sweeper makes them (one job without sweeps)."""
    per_key = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
        for o in overrides
    ]
    if not per_key:
        return [[]]
    if math.prod(len(values) for values in per_key) <= MAX_JOBS_COMPOSED:
        return [list(job) for job in itertools.product(*per_key)]
    longest = max(len(values) for values in per_key)  # every value once; their combinations are not checked
    return [[values[i % len(values)] for values in per_key] for i in range(longest)]


def _config_loader(config_dir: Path):
    """Hydra's config loader for the configs in `config_dir` (it lists a group's choices)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return GlobalHydra.instance().config_loader()


def _no_job(overrides) -> str:
    """Why a sweep has no job: one of its keys sweeps no value (range(1,1), a glob() matching no choice)."""
    from hydra.core.object_type import ObjectType
    from hydra.core.override_parser.types import Glob

    for o in overrides:
        if not (o.is_sweep_override() and next(iter(o.sweep_string_iterator()), None) is None):
            continue
        key, why = o.get_key_element(), f"{o.input_line} gives no value, so the sweep has no job"
        if not isinstance(o.value(), Glob):
            return why
        choices = o.config_loader.get_group_options(key, results_filter=ObjectType.CONFIG)
        if not choices:
            return f"{why}: glob() picks among a config group's choices and {key} is not a group (e.g. data=glob(*))"
        listed = ", ".join(choices)
        return f"{o.input_line} matches none of {key}'s choices, so the sweep has no job; {key} can be: {listed}"
    return "the sweep has no job"


def _compose_problem(
    config_name: str, job: list[str], config_dir: Path, hydra_node: bool = False
) -> tuple[str | None, DictConfig | None]:
    """(why Hydra would refuse to compose `job`, None) or (None, the composed config; None where the
    failure is left to Hydra)."""
    from hydra.errors import ConfigCompositionException, MissingConfigException

    try:
        return None, _compose(config_name, job, config_dir, hydra_node)
    except MissingConfigException as e:
        return _missing_choice(e), None
    except ConfigCompositionException as e:
        found = re.match(r"Could not override '([^']+)'", str(e))
        if found:
            return _unknown_key(config_name, job, config_dir, found.group(1)), None
        merging = re.match(r"Error merging override (\S+)$", str(e))
        if merging and e.__cause__ is not None:  # a typed (structured) key of Hydra's: the type it needs
            return f"{merging.group(1)} is invalid: {text_lines(e.__cause__)[0]}", None
        return " ".join(text_lines(e)), None
    except Exception:  # nothing Hydra reports as a composition error: left to Hydra
        return None, None


def _compose(config_name: str, overrides: list[str], config_dir: Path, hydra_node: bool = False) -> DictConfig:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=hydra_node)


def _sweeper_params(config_name: str, job: list[str], config_dir: Path) -> list[str]:
    """The sweep a config itself asks for (`hydra.sweeper.params` of a preset), as overrides, the way
    Hydra's basic sweeper reads them: `key=value` per entry."""
    params = OmegaConf.select(_compose(config_name, job, config_dir, hydra_node=True), "hydra.sweeper.params")
    return [f"{k}={v}" for k, v in params.items()] if isinstance(params, DictConfig) else []


def _missing_choice(e) -> str:
    """`model=resnet50 is unknown; model can be: lab_cnn, mlp, ...` (the file Hydra could not find)."""
    missing = e.missing_cfg_file or ""
    if "/" not in missing or e.options is None:
        return text_lines(e)[0]
    group, choice = missing.rsplit("/", 1)
    options = list(e.options)
    close = difflib.get_close_matches(choice, options, n=1)
    hint = f" (did you mean {group}={close[0]}?)" if close else ""
    return f"{group}={choice} is unknown{hint}; {group} can be: {', '.join(options)}"


def _unknown_key(config_name: str, job: list[str], config_dir: Path, key: str) -> str:
    """`trainer.max_epoch is not a setting (did you mean ...?); trainer has: ...; a new key: +...`"""
    if key == "continue_sweep":  # sweep.py's alone
        return (
            "continue_sweep continues a stopped sweep: python sweep.py -m <the sweep's values> continue_sweep=<its dir>"
        )
    mine = [o for o in job if override_key(o) == key]
    try:
        cfg = _compose(config_name, [o for o in job if o not in mine], config_dir)
    except Exception:
        cfg = None
    parent, node = key.rpartition(".")[0], None
    while cfg is not None:  # the deepest existing section above the key
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if isinstance(node, DictConfig) or not parent:
            break
        parent = parent.rpartition(".")[0]
    keys = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    prefix = f"{parent}." if parent else ""
    close = [prefix + k for k in difflib.get_close_matches(key[len(prefix) :], keys, n=1)]
    if not close and cfg is not None:  # the same name elsewhere: `lr=0.1` for optimizer.lr
        name = key.rpartition(".")[2]
        close = [k for k in _dotted_keys(cfg) if k.rpartition(".")[2] == name][:1]
    hint = f" (did you mean {close[0]}?)" if close else ""
    where = f"{parent} has" if parent else "the top level has"
    listing = f"; {where}: {', '.join(keys)}" if keys else ""
    add = f"; to add a new key write +{mine[0].lstrip('~+')}" if mine else ""
    chosen, others = _choices_having(config_name, job, config_dir, key)
    if others:  # strategy.period with strategy=ddp: a setting of model averaging's
        group = key.partition(".")[0]
        named = [f"{group}={o}" for o in others]
        theirs = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
        if mine and group in CONSTRUCTOR_GROUPS:  # passed to the class of each choice: the others would refuse it
            add = f"; a sweep can give it only to jobs of {theirs} (another {group}'s class refuses it)"
        elif mine:
            reads = "reads" if len(others) == 1 else "read"
            # ++ (add or override): + alone fails in the jobs whose choice sets the key (but to null)
            given = f"++{mine[0].lstrip('~+')}"
            add = f"; in a sweep over {group}, {given} gives it to every job (only {theirs} {reads} it)"
        return f"{key} is not a setting of {group}={chosen} but of {theirs}{listing}{add}"
    return f"{key} is not a setting{hint}{listing}{add}"


def _choices_having(config_name: str, job: list[str], config_dir: Path, key: str) -> tuple[str | None, list[str]]:
    """For a key of a config group that the job's choice of it does not have (strategy.period with
    strategy=ddp): (that choice, the group's other choices whose files set the key); (None, []) elsewhere."""
    group, _, sub = key.partition(".")
    if not sub or not (config_dir / group).is_dir():
        return None, []
    try:
        cfg = _compose(config_name, [o for o in job if override_key(o) != key], config_dir, hydra_node=True)
        chosen = OmegaConf.select(cfg, f"hydra.runtime.choices.{group}")
        others = [
            f.stem
            for f in sorted((config_dir / group).glob("*.yaml"))
            if f.stem != chosen and OmegaConf.select(OmegaConf.load(f), sub, default=_ABSENT) is not _ABSENT
        ]
    except Exception:  # does not compose, or a file that does not load: no hint
        return None, []
    return (chosen, others) if chosen else (None, [])


def _dotted_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for k, v in cfg.items_ex(resolve=False):
        keys.append(f"{prefix}{k}")
        if isinstance(v, DictConfig):
            keys += _dotted_keys(v, f"{prefix}{k}.")
    return keys


def gpus_by_id(ids: list[str]) -> str | None:
    """psgd's way to what Lightning's trainer.devices=[0,1] does (psgd's trainer.devices is a count),
    where `ids` are device ids (digits); else None."""
    if not ids or not all(i.isdigit() for i in ids):
        return None
    return (
        "to train on particular GPUs, make only those visible: "
        f"CUDA_VISIBLE_DEVICES={','.join(ids)} python train.py trainer.accelerator=gpu workers={len(ids)}"
    )


def text_lines(text: object) -> list[str]:
    """The non-blank lines of a (multi-line) message, stripped; never empty."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines or ["unknown error"]
