"""psgd's configuration: the schema of every key (schema.py), the rules that join keys, the machine's checks
and a command line's jobs judged before any starts (rules.py), the classes a config names (targets.py).
Needs no torch to import: the scripts check a command line before torch loads.
"""

from psgd.config.rules import (
    GIVE,
    Jobs,
    Plan,
    check,
    check_values,
    checkpoint_file,
    compile_mode,
    resolve_start_method,
    resolve_workers,
    schedule,
    sweep_values_problem,
    values_problem,
)
from psgd.config.schema import describe
from psgd.config.targets import build_model
from psgd.errors import ConfigError, DirInUse

__all__ = [
    "GIVE",
    "ConfigError",
    "DirInUse",
    "Jobs",
    "Plan",
    "build_model",
    "check",
    "check_values",
    "checkpoint_file",
    "compile_mode",
    "describe",
    "resolve_start_method",
    "resolve_workers",
    "schedule",
    "sweep_values_problem",
    "values_problem",
]
