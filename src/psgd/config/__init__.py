"""psgd's configuration: the schema of every key (schema.py), psgd's own strategies' config classes
(strategies.py), the rules that join keys, the machine's checks and a command line's jobs judged before any
starts (rules.py), the classes a config names (targets.py). Needs no torch to import: the scripts check a
command line before torch loads.
"""

from psgd.config import schema
from psgd.config.rules import (
    GIVE,
    Jobs,
    check,
    check_values,
    checked_runs,
    checkpoint_file,
    resolve_start_method,
    sweep_values_problem,
)
from psgd.config.schema import Plan, Run, compile_mode, schedule
from psgd.config.targets import build_model
from psgd.errors import ConfigError, DirInUse
from psgd.strategies.configs import BUILTIN


def describe() -> list[tuple[str, str, str]]:
    """(dotted key, its type and bounds, its meaning) of every key, psgd's own strategies' among them, for --help."""
    return schema.describe(BUILTIN)


__all__ = [
    "BUILTIN",
    "GIVE",
    "ConfigError",
    "DirInUse",
    "Jobs",
    "Plan",
    "Run",
    "build_model",
    "check",
    "check_values",
    "checked_runs",
    "checkpoint_file",
    "compile_mode",
    "describe",
    "resolve_start_method",
    "schedule",
    "sweep_values_problem",
]
