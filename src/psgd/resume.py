"""What a run starts from: a checkpoint to resume (ckpt_path), an earlier run's weights (init_weights).

A checkpoint is resumed only where it continues the run this one's settings ask for; each mismatch is a
ConfigError that names the setting and the value that resumes it.
"""

import math
import os
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from psgd.config import GIVE, ConfigError, Plan, Run, checkpoint_file
from psgd.io import say
from psgd.module import OPTIMIZER_KEY, STEP_IMPLEMENTATION, Classifier
from psgd.optim import schedule_read
from psgd.strategies.contract import StrategyConfig
from psgd.strategies.simulated import REPLICAS_KEY, SIMULATED_KEY


def resolve_ckpt_path(
    value: str | None,
    module: Classifier,
    world_size: int = 1,
    strategy: StrategyConfig | None = None,
    simulate: bool = False,
) -> str | None:
    """The checkpoint to resume from, checked against this run: its model, lr schedule, optimizer and data,
    and (for a checkpoint of each worker's own state) its worker count and `strategy` (None: not checked); a
    simulated run's (`simulate`) only by a simulated run of as many workers, and the other way round."""
    if value is None:
        return None
    path = checkpoint_file("ckpt_path", value)
    checkpoint = load_weights_only("ckpt_path", value, path)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ConfigError(f"ckpt_path={value!r} is not a psgd checkpoint (it holds no state_dict)")
    check_fits("ckpt_path", value, checkpoint["state_dict"], module.state_dict())
    check_simulated(value, checkpoint, world_size, simulate)
    # model averaging / HogWild mid-run: one state per worker (simulated workers': one, of all of them)
    replicas = [] if checkpoint.get("averaged") or simulate else checkpoint.get("replicas") or []
    if replicas and len(replicas) != world_size:
        raise ConfigError(
            f"ckpt_path={value!r} holds {len(replicas)} workers' own state but this run has {world_size} "
            f"worker{'' if world_size == 1 else 's'}; resume with workers={len(replicas)}"
        )
    own_weights = replicas and "state_dict" in (replicas[0] or {})
    if simulate:  # every worker's parameters stacked: their own where the rows differ
        own_weights = any((t != t[:1]).any() for t in checkpoint.get(REPLICAS_KEY) or [])
    if own_weights and strategy is not None and strategy.one_model:
        raise ConfigError(
            f"ckpt_path={value!r} holds {len(replicas) or world_size} replicas that model averaging had not averaged "
            "yet, and "
            f"strategy={strategy.name} would go on from worker 0's alone: resume with strategy=model_averaging (or "
            "from the run's final checkpoint, which holds their average)"
        )
    saved = checkpoint.get("hyper_parameters") or {}  # the Classifier's, as the checkpoint's run had them
    for then, now in zip(saved.get("samples") or [], module.hparams.get("samples") or []):
        if then != now:
            raise ConfigError(
                f"ckpt_path={value!r} was trained with {then} and this run has {now}: it would go on with other "
                f"samples than its run trained and validated on; resume with {then}"
            )
    restart = (module.hparams.get("scheduler") or {}).get("restart")  # a new schedule: it may change
    schedule = None if restart else schedule_change(saved, dict(module.hparams))
    problem = schedule or optimizer_change(checkpoint, module)
    if problem:
        restarts = (
            "add scheduler.restart=true to go on from its weights and optimizer state under this run's schedule, "
        )
        raise ConfigError(
            f"ckpt_path={value!r} cannot be resumed with {problem}: resuming restores its optimizer and lr "
            "schedule as they were, which would not follow this change; resume with the checkpoint's settings, "
            f"{restarts if schedule else ''}or start a new run from its weights alone with init_weights={value}, "
            "leaving ckpt_path out"
        )
    return str(path)


def check_simulated(value: str, checkpoint: dict, world_size: int, simulate: bool) -> None:
    """A simulated run's checkpoint holds every worker in stacked tensors: only a simulated run of as many workers
    goes on from it, and a simulated run only from one.

    Raises:
        ConfigError: the checkpoint and this run differ in simulate or in the simulated workers.
    """
    workers = (checkpoint.get(SIMULATED_KEY) or {}).get("workers")
    if workers is None and simulate:
        raise ConfigError(
            f"ckpt_path={value!r} was trained by worker processes and simulate=true would hold its workers in one "
            "process; resume with simulate=false (or start from its weights alone: init_weights)"
        )
    if workers is not None and (not simulate or workers != world_size):
        raise ConfigError(
            f"ckpt_path={value!r} holds {workers} simulated workers and this run has "
            f"{'worker processes' if not simulate else f'{world_size}'}; resume with simulate=true workers={workers}"
        )


def load_weights_only(setting: str, value: str, path: Path) -> Any:
    """torch.load with weights only: a checkpoint is data, never code."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(
            f"{setting}={value!r} is not a psgd checkpoint loadable as weights only "
            f"({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        ) from e


def check_fits(setting: str, value: str, saved: dict[str, Any], expected: dict[str, torch.Tensor]) -> None:
    """Every weight of this run's model, in its shape, and no other: else a ConfigError naming one."""
    problems = []
    for key, tensor in expected.items():
        found = saved.get(key)
        if not isinstance(found, torch.Tensor) or found.shape != tensor.shape:
            what = "missing" if key not in saved else f"shape {tuple(getattr(found, 'shape', ()))}"
            problems.append(f"{key} is {what} in the checkpoint, the model needs {tuple(tensor.shape)}")
    problems += [f"the checkpoint has extra weights such as {key}" for key in sorted(set(saved) - set(expected))]
    if problems:
        raise ConfigError(
            f"{setting}={value!r} does not fit this run's model: {problems[0]} (was it saved with another model= "
            "or data=?)"
        )


def init_weights(value: str | None, module: Classifier) -> str | None:
    """Load an earlier run's weights into `module` (a run dir, a .ckpt, a worker's weights/rank<r>.pt, or a
    network's state_dict saved with torch.save); the run trains them with its own epochs, optimizer and lr
    schedule. Returns the file, or None without one."""
    if value is None:
        return None
    give = GIVE["init_weights"]
    path = checkpoint_file("init_weights", value)
    loaded = load_weights_only("init_weights", value, path)
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):  # a (psgd) Lightning checkpoint
        replicas = loaded.get("replicas")
        if replicas and not loaded.get("averaged") and "state_dict" in (replicas[0] or {}):
            raise ConfigError(
                f"init_weights={value!r} holds {len(replicas)} replicas that model averaging had not averaged "
                "yet: give the finished run (its final checkpoint holds their average) or one worker's "
                "weights/rank<r>.pt (record_weights=true)"
            )
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not loaded or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ConfigError(f"init_weights={value!r} holds no weights (a checkpoint or a state_dict of tensors); {give}")
    if not any(k.startswith("net.") for k in loaded):  # a plain network's state_dict: psgd's module holds it as net
        loaded = {f"net.{k}": v for k, v in loaded.items()}
    check_fits("init_weights", value, loaded, module.state_dict())
    module.load_state_dict(loaded)
    return str(path)


def sample_settings(cfg: Run | DictConfig) -> list[str]:
    """The settings that decide which samples a run trains and validates on, as `key=value` texts: the data
    set, the validation split with the seed that draws it, and the partition (with the seed where it fixes
    the shards: iid shards are dealt anew every epoch, by_label by label)."""
    d = cfg.data
    holdout = f"data.val_split={d.val_split:g} seed={cfg.seed}" if d.val_split else "data.val_split=0"
    shards = [f"data.partition={d.partition}"]
    if d.partition == "sizes":
        shards += [f"data.partition_sizes=[{','.join(f'{x:g}' for x in d.partition_sizes)}]", f"seed={cfg.seed}"]
    elif d.partition == "dirichlet":
        shards += [f"data.dirichlet_alpha={d.dirichlet_alpha:g}", f"seed={cfg.seed}"]
    return [f"data={d.name}", holdout, " ".join(shards)]


def _all_workers(hparams: dict[str, Any]) -> int:
    return hparams["workers"] * (hparams.get("num_nodes") or 1)


def _workers_said(hparams: dict[str, Any]) -> str:
    nodes = hparams.get("num_nodes") or 1
    return f"workers={hparams['workers']}" + (f" x trainer.num_nodes={nodes}" if nodes > 1 else "")


def schedule_change(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What of the lr and its schedule this run changes from the checkpoint's run (the Classifier's
    hyper-parameters), or None: the lr, a scheduler setting, trainer.max_epochs under a cosine decay (its
    horizon), workers under a warm-up from the default 1/workers."""
    if not saved:  # not written by psgd's Classifier: nothing to compare
        return None
    old_s, new_s = schedule_read(saved.get("scheduler")), schedule_read(now.get("scheduler"))
    if "lr" in saved and not math.isclose(saved["lr"], now["lr"], rel_tol=1e-9):
        return f"lr {now['lr']:g} (optimizer.lr x lr_scaling; the checkpoint's run had {saved['lr']:g})"
    for key in sorted(set(old_s) | set(new_s)):
        if old_s.get(key) != new_s.get(key):
            return f"scheduler.{key}={new_s.get(key)} (the checkpoint's run had {old_s.get(key)})"
    warming_up = (new_s.get("warmup_epochs") or 0) > 0 and new_s.get("start_factor") is None
    if warming_up and saved.get("workers") is not None and _all_workers(saved) != _all_workers(now):
        return (
            f"{_workers_said(now)} under a warm-up from 1/workers of the lr "
            f"(the checkpoint's run had {_workers_said(saved)}: its warm-up starts at lr/{_all_workers(saved)})"
        )
    if new_s.get("decay") == "cosine" and saved.get("max_epochs") not in (None, now["max_epochs"]):
        return (
            f"trainer.max_epochs={now['max_epochs']} under a cosine decay "
            f"(the checkpoint's run had {saved['max_epochs']}: its cosine reaches lr 0 there)"
        )
    return None


# param-group entries that are not the optimizer's settings: the parameters, the lr (schedule_change's) and
# how torch runs the step (the resumed run's own)
_NOT_SETTINGS = {"params", "lr", "initial_lr", *STEP_IMPLEMENTATION}


def optimizer_change(checkpoint: dict[str, Any], module: Classifier) -> str | None:
    """What of the optimizer this run changes from the checkpoint's run, or None: its class, or a setting
    of a param group. Lightning restores the checkpoint's param groups, settings included, so a changed
    setting would be silently dropped, and another optimizer would fail in its first step."""
    states = checkpoint.get("optimizer_states")
    if not states:
        return None
    fresh = module.build_optimizer()  # no state yet: only its settings are read
    name, old_name = type(fresh).__name__, checkpoint.get(OPTIMIZER_KEY)
    if old_name is not None and old_name != name:
        return f"optimizer {name} (the checkpoint's run used {old_name})"
    groups = fresh.param_groups  # as many as the checkpoint's (check_fits)
    for i, (old, new) in enumerate(zip(states[0].get("param_groups") or [], groups)):
        for key in sorted((set(old) & set(new)) - _NOT_SETTINGS):
            if _plain(old[key]) != _plain(new[key]):
                where = f" in its parameter group {i}" if len(groups) > 1 else ""
                return f"optimizer.{key}={_shown(new[key])}{where} (the checkpoint's run had {_shown(old[key])})"
    return None


def _plain(value: Any) -> Any:
    return [_plain(x) for x in value] if isinstance(value, list | tuple) else value


def _shown(value: Any) -> str:
    """As written on the command line: true, [0.9, 0.99]."""
    value = _plain(value)
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def elastic_resume(ckpt_path: str | None, plan: Plan, run_dir: Path) -> str | None:
    """The run dir's last checkpoint where torchrun restarted the workers (--max-restarts), else `ckpt_path`."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    last = run_dir / "checkpoints" / "last.ckpt"
    if ckpt_path is None and plan.launcher == "torchrun" and restarts > 0 and last.exists():
        if os.environ.get("RANK") == "0":
            say(f"psgd: restart {restarts}: resuming from {last}")
        return str(last)
    return ckpt_path
