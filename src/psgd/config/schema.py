"""The schema of psgd's configuration: every key a run reads, with its type, bounds or choices and meaning.

pydantic v2 models validate the config Hydra composed (presets and command line applied); the defaults stay in
conf/**.yaml. pydantic rather than Hydra's structured configs: OmegaConf types have neither bounds nor choices of
mixed types (`compile: false | true | mode`). Imports no torch: the scripts check a command line before it loads.
"""

import functools
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from omegaconf import DictConfig, OmegaConf
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, ValidationError, create_model

from psgd.choices import DECAYS, INFO, LR_SCALING, SCHEMES
from psgd.config.targets import locate
from psgd.errors import ConfigError
from psgd.strategies.contract import REGISTRY, Group, Optimizer, StrategyConfig, Target


def _a_duration(value: Any) -> Any:
    """trainer.max_time as Lightning's Timer takes it: "DD:HH:MM:SS" or a mapping of timedelta's arguments."""
    try:
        if isinstance(value, str):
            days, hours, minutes, seconds = map(int, value.split(":"))
            length = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        else:
            length = timedelta(**value)
    except (TypeError, ValueError, OverflowError):
        length = timedelta(0)
    if value is not None and length <= timedelta(0):
        raise ValueError("must be a duration longer than 0, as DD:HH:MM:SS (00:01:30:00) or {hours: 1, minutes: 30}")
    return value


def _a_holdout(value: Any) -> Any:
    """data.val_split as written: a whole number of samples (5000), or a fraction below 1 (0.1)."""
    if isinstance(value, float) and value >= 1:
        raise ValueError("must be a fraction below 1 (0.1) or a whole number of samples (5000)")
    return value


class Data(Group):
    name: Literal[tuple(INFO)]
    """The dataset."""
    root: str
    """Its folder; the PSGD_DATA environment variable sets the default."""
    batch_size: int = Field(ge=1)
    """Samples per training batch, per worker."""
    eval_batch_size: int = Field(ge=1)
    """Samples per validation and test batch."""
    partition: Literal[SCHEMES]
    """How the training set is dealt to the workers."""
    partition_sizes: list[Annotated[float, Field(gt=0)]] | None
    """partition=sizes: each worker's fraction, e.g. [0.7, 0.3]."""
    dirichlet_alpha: float | None = Field(gt=0)
    """partition=dirichlet: the label skew (smaller = more skewed), e.g. 0.5."""
    augment: Literal["none", "cifar", "pad_crop_flip"]  # psgd.data.augment.PRESETS
    """Augmentation of training batches (random per sample)."""
    val_split: Annotated[float, Field(ge=0), BeforeValidator(_a_holdout)]
    """Training samples held out for validation: a number (5000), a fraction below 1 (0.1), or 0: validate on
    the test split."""
    download: bool
    """Download the files when missing."""
    verify_md5: bool
    """CIFAR10: check the batch files' md5 sums."""
    drop_last: bool
    """Drop each shard's last partial batch."""
    on_device: bool
    """GPU: keep the dataset on the GPU and make batches there."""


class Model(Target, extra="allow"):
    """The network; keys other than these are its constructor's arguments, checked by building it (check)."""

    name: str
    """The run's label (model=<name> chooses a built-in model and its settings)."""
    target: str = Field(alias="_target_", pattern=r"\w\.\w")
    """The network's class, as module.Class."""
    dropout: float = Field(None, ge=0, lt=1)
    """Dropout probability (the models that have one)."""
    batch_norm: bool = None
    """BatchNorm after each convolution (the lab CNN)."""


class Scheduler(Group):
    name: str
    """The schedule chosen (scheduler=none keeps optimizer.lr constant, whatever the other keys say)."""
    warmup_epochs: float = Field(ge=0)
    """Epochs of linear warm-up from lr x start_factor (fractions need interval=step)."""
    start_factor: float | None = Field(gt=0, le=1)
    """The warm-up's first lr factor; null: 1/workers."""
    decay: Literal[DECAYS]
    """After the warm-up: none, cosine to 0 at trainer.max_epochs, or step (x gamma every step_size)."""
    step_size: int = Field(ge=1)
    """decay=step: epochs between decays."""
    gamma: float = Field(gt=0)
    """decay=step: the lr factor per step."""
    interval: Literal["epoch", "step"]
    """When the lr changes: once per epoch, or after every optimizer step."""
    restart: bool
    """With ckpt_path: a new schedule (warm-up, decay) from the checkpoint's epoch to trainer.max_epochs, its
    weights and optimizer state kept, lr and schedule as this run sets them."""

    def trained(self) -> dict[str, Any]:
        """The schedule the run trains with (`schedule`: scheduler=none is a constant lr)."""
        return schedule(self.model_dump())


class Trainer(Group, extra="allow"):
    """Lightning Trainer arguments: psgd checks these (their defaults: conf/trainer/default.yaml; null leaves
    Lightning's own); any other is Lightning's to check."""

    accelerator: Literal["auto", "cpu", "gpu", "cuda"]
    """Where the workers run."""
    devices: int | None = Field(ge=1)
    """Workers per node; null: follow `workers`."""
    num_nodes: int = Field(ge=1)
    """Machines (torchrun or srun starts the workers on each)."""
    max_epochs: int = Field(ge=1)
    """Epochs of training."""
    max_steps: Literal[-1] | Annotated[int, Field(ge=1)] | None
    """Stop after this many optimizer steps (DDP or one worker)."""
    max_time: Annotated[Any, AfterValidator(_a_duration)]
    """Stop training after that long (DDP or one worker)."""
    precision: Any
    """Floating-point precision, e.g. 32-true, bf16-mixed."""
    log_every_n_steps: int | None = Field(ge=1)
    """Optimizer steps between logged training figures."""
    num_sanity_val_steps: int | None = Field(ge=-1)
    """Validation batches run before training."""
    check_val_every_n_epoch: int | None = Field(ge=1)
    """Epochs between validations."""
    val_check_interval: int | float | None = Field(gt=0)
    """Validations inside an epoch (0.25: four per epoch)."""
    fast_dev_run: bool | int | None
    """One batch (or N) of train/val/test, no logs or checkpoints: a smoke test."""
    limit_train_batches: int | float | None = Field(gt=0)
    """Training batches per epoch: a fraction up to 1.0 or a number; null: all."""
    limit_val_batches: int | float | None = Field(ge=0)
    """Validation batches (0: no validation); null: all."""
    limit_test_batches: int | float | None = Field(gt=0)
    """Batches of the final test; null: all."""
    gradient_clip_val: float | None = Field(ge=0)
    """Clip gradients' norm to this; null or 0: no clipping."""
    accumulate_grad_batches: int | None = Field(ge=1)
    """Micro-batches each worker accumulates per update (parallel_batches, set, wins)."""
    sync_batchnorm: bool
    """GPU: synchronise BatchNorm statistics across workers."""
    deterministic: bool | Literal["warn"] | None
    """torch's deterministic algorithms."""
    benchmark: bool | None
    """GPU: cuDNN's autotuner; null: off."""


class EarlyStop(Group):
    target_acc: float | None = Field(gt=0, le=1)
    """Stop once val/acc >= target_acc (for `patience` validations in a row); null: no early stop."""
    patience: int = Field(ge=1)
    """Validations in a row at target_acc."""


def _factors(value: Any) -> Any:
    """stragglers.slowdown: a list of one factor f >= 1 per worker (1: its own speed; 3: three times its compute per
    step), or None."""
    numbers = isinstance(value, list) and all(isinstance(f, int | float) and not isinstance(f, bool) for f in value)
    if value is not None and not (numbers and value and all(f >= 1 for f in value)):
        raise ValueError(
            "slowdown takes a list of one factor >= 1 per worker, e.g. [1, 3] (1: its own speed, 3: three times "
            "slower), or null"
        )
    return value


class Stragglers(Group):
    slowdown: Annotated[list[float] | None, BeforeValidator(_factors)]
    """One factor per worker: after each step a worker with factor f sleeps (f - 1) x the step's compute time."""
    delay_s: float = Field(ge=0)
    """An extra sleep per step, as `distribution` draws it (s)."""
    distribution: Literal["none", "fixed", "exponential"]
    """The extra sleep: none, fixed (delay_s) or exponential (shift_s + Exp(mean delay_s)), seeded per worker."""
    shift_s: float = Field(ge=0)
    """distribution=exponential: the shift of the exponential delay (s)."""


class Network(Group):
    bandwidth_gbps: float = Field(gt=0)
    """Each simulated worker's link (Gb/s)."""
    latency_ms: float = Field(gt=0)
    """A message's latency (ms)."""
    compute_scale: float = Field(gt=0)
    """A simulated worker's compute speed relative to one replica's on this machine."""


class Run(Group):
    """One training run (train.yaml; sweep.yaml is the same)."""

    data: Data
    model: Model
    optimizer: Optimizer
    scheduler: Scheduler
    strategy: StrategyConfig
    """The strategy's section: its config class (strategy._target_) validates it."""
    trainer: Trainer
    early_stop: EarlyStop
    stragglers: Stragglers
    workers: int = Field(ge=1)
    """Worker processes per node; trainer.devices follows unless set."""
    simulate: bool
    """Simulate the workers: every one a replica in this process, its time projected on `network`."""
    network: Network
    """simulate=true: the simulated machines and the links between them."""
    threads_per_worker: int | None = Field(ge=1)
    """torch threads per worker; null: cores // workers."""
    seed: int = Field(ge=0)
    """Seeds everything; the same seed on CPU gives the same result."""
    parallel_batches: int | None = Field(ge=1)
    """K micro-batches per update, spread over the workers (K / workers each)."""
    lr_scaling: Literal[LR_SCALING]
    """Multiply optimizer.lr by workers (linear) or its square root (sqrt) ..."""
    lr_reference_batch: int | None = Field(ge=1)
    """... or, set, by samples per update / lr_reference_batch."""
    channels_last: bool
    """NHWC memory format for conv nets."""
    compile: Literal[False, True, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None
    """torch.compile the network, in one of its modes."""
    flush_denormal: bool
    """CPU: flush denormal floats to zero."""
    checkpoint_every_epoch: bool
    """Keep checkpoints/epoch<N>.ckpt for every epoch besides last.ckpt."""
    ckpt_path: str | None = Field(min_length=1)
    """Resume: a .ckpt file or an earlier run dir."""
    init_weights: str | None = Field(min_length=1)
    """Start from an earlier run's weights only."""
    record_shards: bool
    """Save the sample indices each worker trained on, per epoch."""
    record_weights: bool
    """Every worker saves the weights it ends with."""
    quiet: bool
    """No progress bar, model summary or Lightning info lines."""

    @property
    def workers_per_node(self) -> int:
        """Worker processes per node: trainer.devices where set (psgd.config.rules checks that it agrees with
        `workers`), else `workers`."""
        return self.trainer.devices or self.workers

    @property
    def world_size(self) -> int:
        """The workers of every node."""
        return self.workers_per_node * self.trainer.num_nodes


@dataclass(frozen=True)
class Plan:
    """What the config resolves to on this machine."""

    run: Run  # the typed config (the workers per node and of every node: run.workers_per_node, run.world_size)
    threads_per_worker: int
    accelerator: str  # cpu or gpu
    accumulate_grad_batches: int = 1  # micro-batches each worker accumulates per update
    launcher: str = "psgd"  # who starts the worker processes: psgd, or torchrun / srun (one per worker)
    start_method: str = "spawn"  # how psgd's launcher starts them (strategy.start_method, resolved)


def compile_mode(value: Any) -> str | None:
    """The torch.compile mode the `compile` setting asks for, or None (not compiled)."""
    return "default" if value is True else (value or None)


def schedule(scheduler: Mapping[str, Any]) -> dict[str, Any]:
    """The lr schedule a run trains with: its scheduler settings, but a constant lr for scheduler=none
    (whatever its other keys say: a sweep over schedules gives them to every job)."""
    settings = dict(scheduler)
    if settings["name"] == "none":
        settings.update(warmup_epochs=0, decay="none", interval="epoch")
    return settings


def strategy_class(section: Any) -> type[StrategyConfig]:
    """The config class that `strategy._target_` names, imported: it reads the strategy's section. A name that
    cannot be imported, or names no strategy's config class, is a ConfigError."""
    target = section.get("_target_") if isinstance(section, Mapping) else None
    if target is None:
        raise ConfigError(
            "strategy._target_ is missing: a strategy's section names its config class (a subclass of "
            "psgd.strategies.contract.StrategyConfig), e.g. psgd.strategies.configs.DDP"
        )
    cls = locate("strategy._target_", target)
    if not issubclass(cls, StrategyConfig):
        raise ConfigError(
            f"strategy._target_={target} is invalid: {cls.__name__} is not a strategy's config class (a subclass "
            "of psgd.strategies.contract.StrategyConfig)"
        )
    return cls


@functools.cache
def run_model(strategy: type[StrategyConfig]) -> type[Run]:
    """The schema of a run of `strategy`: Run with that class reading the strategy's section."""
    return create_model("Run", __base__=Run, __doc__=Run.__doc__, strategy=(strategy, ...))


def validate(cfg: DictConfig) -> Run:
    """The typed run `cfg` (Hydra's composed config) describes; the first value the schema refuses is a
    ConfigError, `key=value is invalid: <what is allowed>` in pydantic's words (for a key that takes one of
    several types, each type's words)."""
    values = {
        k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
        for k, v in cfg.items()
        if k != "hydra"  # Hydra's own node
    }
    strategy = strategy_class(values.get("strategy"))
    try:
        return run_model(strategy).model_validate(values)
    except ValidationError as e:
        raise ConfigError(refusal(e.errors(), values, strategy)) from None


def refusal(errors: list[Any], values: dict[str, Any], strategy: type[StrategyConfig]) -> str:
    """The line for pydantic's first error of `values`, whose strategy section `strategy` reads."""
    first, keys, value = errors[0], [], values
    for part in first["loc"]:  # a part that names no key of the input names a union's member
        if isinstance(value, dict) and part in value:
            keys.append(str(part))
            value = value[part]
    key = ".".join(keys)
    if first["type"] == "missing":
        return f"{key}.{first['loc'][-1]} is missing".lstrip(".")
    shown = "null" if value is None else repr(value)
    name = strategy.declared_name()
    if first["type"] == "literal_error" and keys == ["strategy", "name"]:
        use = f"; use strategy={value}" if value in REGISTRY else ""
        return (
            f"strategy.name={shown} is invalid: the section is strategy={name}'s; a strategy is chosen by its config "
            f"group{use}"
        )
    if first["type"] == "extra_forbidden" and keys[0] == "strategy":
        owners = [other for other, cls in REGISTRY.items() if keys[-1] in cls.model_fields and other != name]
        where = (
            f"it is a key of strategy={' and '.join(owners)}; use strategy={owners[0]}"
            if owners
            else (f"strategy={name} has no such key; see `python train.py --help`")
        )
        return f"{key}={shown} is invalid with strategy={name}: {where} or leave it out"
    same_key = [e for e in errors if e["loc"][: len(keys)] == first["loc"][: len(keys)] and e["input"] is value]
    allowed = ", or ".join(dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in same_key))
    return f"{key}={shown} is invalid: {allowed}"


BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def allowed(kind: Any, metadata: list[Any]) -> str:
    """A key's type and bounds as --help says them: `int > 0`, `iid, sizes, by_label, dirichlet`, `int or null`."""
    args = get_args(kind)
    if get_origin(kind) is Annotated:
        return allowed(args[0], list(args[1:]))
    if get_origin(kind) is Literal:
        text = ", ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in args)
    elif get_origin(kind) in (Union, types.UnionType):
        text = " or ".join("null" if a is type(None) else allowed(a, []) for a in args)
    else:
        text = getattr(kind, "__name__", str(kind))
    bounds = [f"{BOUNDS[k]} {getattr(m, k)}" for m in metadata for k in BOUNDS if getattr(m, k, None) is not None]
    return " ".join([text, *bounds])


def describe(strategies: Iterable[type[StrategyConfig]]) -> list[tuple[str, str, str]]:
    """(dotted key, its type and bounds, its meaning) of every key of the schema, for --help; the own keys of each
    of `strategies` are marked with the strategies that have them (`[strategy=model_averaging, diloco]`)."""
    rows: list[tuple[str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str, skip: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
        found = []
        for name, field in model.model_fields.items():
            if name in skip:
                continue
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                found += walk(field.annotation, f"{prefix}{name}.")
            else:
                found.append(
                    (f"{prefix}{field.alias or name}", allowed(field.annotation, field.metadata), field.description)
                )
        return found

    rows = walk(Run, "", skip=("strategy",)) + walk(StrategyConfig, "strategy.")
    owners: dict[tuple[str, str, str], list[str]] = {}  # a strategy's key: the strategies that have it alike
    for member in strategies:
        for row in walk(member, "strategy.", skip=tuple(StrategyConfig.model_fields)):
            owners.setdefault(row, []).append(member.declared_name())
    return rows + [
        (key, text, f"[strategy={', '.join(names)}] {meaning}") for (key, text, meaning), names in owners.items()
    ]
