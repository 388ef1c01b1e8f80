"""psgd's configuration: the schema of every key (schema.py), the rules that join keys and the machine's
checks (rules.py), the classes a config names (targets.py) and a command line's jobs judged before any
starts (jobs.py). Needs no torch to import: the scripts check a command line before torch loads.
"""

from psgd.config.jobs import READ_ONLY_WHEN, sweep_data_problem, sweep_values_problem, values_problem
from psgd.config.rules import (
    GIVE,
    Plan,
    check,
    check_values,
    checkpoint_file,
    compile_mode,
    resolve_start_method,
    resolve_workers,
    schedule,
)
from psgd.config.schema import ConfigError, DirInUse, describe, duration_s
from psgd.config.targets import SPARSE_GRADIENTS_WAY_OUT, model_arguments

__all__ = [
    "GIVE",
    "READ_ONLY_WHEN",
    "SPARSE_GRADIENTS_WAY_OUT",
    "ConfigError",
    "DirInUse",
    "Plan",
    "check",
    "check_values",
    "checkpoint_file",
    "compile_mode",
    "describe",
    "duration_s",
    "model_arguments",
    "resolve_start_method",
    "resolve_workers",
    "schedule",
    "sweep_data_problem",
    "sweep_values_problem",
    "values_problem",
]
