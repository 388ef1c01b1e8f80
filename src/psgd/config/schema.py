"""The schema of psgd's configuration: every key a run reads, with its type, bounds or choices and meaning.

pydantic v2 models validate the config Hydra composed (presets and command line applied), so one check
covers every group choice and preset. The defaults stay in conf/**.yaml (a test checks that each of their
keys has a field here). Hydra's structured configs were not chosen: OmegaConf types have no bounds, no
choices and no unions (`compile: bool | mode`). Torch is not imported: the scripts validate a command
line before torch loads.

`problem(cfg)` turns the first validation error into psgd's one line: `key=value is invalid: <allowed>`;
`describe()` lists every key for --help.
"""

import types
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from omegaconf import DictConfig, OmegaConf
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from psgd.choices import AUGMENTATIONS, DECAYS, INFO, LR_SCALING, SCHEMES


class ConfigError(ValueError):
    """A bad configuration value; str() is the one-line message shown to the user."""


class DirInUse(ConfigError):
    """The run dir holds an earlier run's results: nothing may be written there, not even a failure."""


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DURATION_UNITS = ("days", "hours", "minutes", "seconds")


def setting(default: Any = ..., *, allowed: str | None = None, hint: Callable[[Any], str] | None = None, **bounds):
    """A field whose error line says `allowed` instead of the text made from its type and bounds, and
    adds `hint(value)` (a way out for that value, or "")."""
    extra = {key: value for key, value in (("allowed", allowed), ("hint", hint)) if value is not None}
    return Field(default, json_schema_extra=extra, **bounds)


def duration_s(value: Any) -> float | None:
    """Seconds in a duration as Lightning's Timer (trainer.max_time) takes it: "DD:HH:MM:SS" or a
    mapping of timedelta's arguments; None for anything else."""
    try:
        if isinstance(value, str):
            parts = value.strip().split(":")
            if len(parts) == 4:
                return timedelta(**dict(zip(DURATION_UNITS, map(int, parts), strict=True))).total_seconds()
        elif isinstance(value, DictConfig | dict):
            return timedelta(**{str(k): v for k, v in dict(value).items()}).total_seconds()
    except (TypeError, ValueError, OverflowError):
        pass
    return None


def _a_duration(value: Any) -> Any:
    if value is not None and not (duration_s(value) or 0) > 0:
        raise ValueError("not a duration longer than 0")
    return value


def _devices_hint(devices: Any) -> str:
    """The way to what a Lightning user means by a list of device ids, or by "auto" / -1 (every device)."""
    ids = devices.split(",") if isinstance(devices, str) else devices if isinstance(devices, list) else []
    ids = [str(i).strip() for i in ids if str(i).strip()]
    if ids and all(i.isdigit() for i in ids):
        return (
            "to train on particular GPUs, make only those visible: "
            f"CUDA_VISIBLE_DEVICES={','.join(ids)} python train.py trainer.accelerator=gpu workers={len(ids)}"
        )
    if devices in ("auto", -1, "-1"):
        return "Lightning's 'every device' is not taken: say how many workers with workers=N"
    return ""


def _max_epochs_hint(value: Any) -> str:
    if value in (-1, None):
        return (
            "Lightning's -1 or null, no limit, is not taken: psgd's lr schedules and records count epochs; to let "
            "trainer.max_steps or max_time end training, set max_epochs above the epochs they reach"
        )
    return ""


def _start_method_hint(value: Any) -> str:
    return {
        "fork": "a forked worker hangs once the launcher has used OpenMP's threads",
        "popen": "Lightning's popen runs the whole command again for each worker (in a sweep: the sweep)",
    }.get(value, "")


class Group(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", use_attribute_docstrings=True)


class Data(Group):
    name: Literal[tuple(INFO)]
    """The dataset."""
    root: str = setting(allowed="must be a folder (a path)")
    """Its folder; the PSGD_DATA environment variable sets the default."""
    batch_size: int = Field(ge=1)
    """Samples per training batch, per worker."""
    eval_batch_size: int = Field(ge=1)
    """Samples per validation and test batch."""
    partition: Literal[SCHEMES]
    """How the training set is dealt to the workers."""
    partition_sizes: list[Annotated[float, Field(gt=0)]] | None = setting(
        allowed="must be a list of fractions > 0 (one per worker, summing to 1), or null"
    )
    """partition=sizes: each worker's fraction, e.g. [0.7, 0.3]."""
    dirichlet_alpha: float | None = Field(gt=0)
    """partition=dirichlet: the label skew (smaller = more skewed), e.g. 0.5."""
    augment: Literal[AUGMENTATIONS]
    """Augmentation of training batches (random per sample)."""
    val_split: float = Field(ge=0, lt=1)
    """0: validate on the test split; else the fraction of the training set held out for validation."""
    download: bool
    """Download the files when missing."""
    verify_md5: bool
    """CIFAR10: check the batch files' md5 sums."""
    drop_last: bool
    """Drop each shard's last partial batch."""
    on_device: bool
    """GPU: keep the dataset on the GPU and make batches there."""


class Model(Group, extra="allow"):
    """The network; keys other than these are its constructor's arguments, checked against its signature."""

    name: str = setting(allowed="must be a name (text)")
    """The run's label (model=<name> chooses a built-in model and its settings)."""
    target: str = setting(alias="_target_", allowed="must name a class as module.Class", pattern=r"\w\.\w")
    """The network's class, as module.Class."""
    dropout: float = Field(None, ge=0, lt=1)
    """Dropout probability (the models that have one)."""
    batch_norm: bool = None
    """BatchNorm after each convolution (the lab CNN)."""


class Optimizer(Group, extra="allow"):
    """torch optimizer, built by Hydra (`_partial_`); keys other than these are checked against its constructor."""

    target: str = setting(alias="_target_", allowed="must name a class as module.Class", pattern=r"\w\.\w")
    """The optimizer's class, as module.Class."""
    lr: float = Field(gt=0)
    """Learning rate of one worker (see lr_scaling)."""
    momentum: float = Field(None, ge=0, lt=1)
    """Momentum factor (SGD)."""
    weight_decay: float = Field(None, ge=0)
    """L2 penalty."""


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


class Strategy(Group, extra="allow"):
    """A strategy's keys; another strategy's key is allowed (a sweep over strategies gives it to every job)."""

    backend: Literal["gloo", "nccl", "mpi"] | None
    """Process-group backend; null: gloo on CPU, nccl on GPU."""
    start_method: Literal["forkserver", "spawn"] | None = setting(hint=_start_method_hint)
    """How the workers start; null: forkserver on CPU (workers start loaded), spawn on GPU."""
    timeout_s: int = Field(gt=0)
    """Collective timeout in seconds: a stuck peer fails the run instead of hanging it."""


class DDP(Strategy):
    name: Literal["ddp"]
    """Synchronous data parallelism: gradients all-reduced every step."""
    find_unused_parameters: bool
    """A model with parameters no loss uses (slower)."""
    bucket_cap_mb: float | None = Field(gt=0)
    """Gradient bucket size of the all-reduce; null: torch's default."""
    ddp_for_one_worker: bool
    """Wrap one worker in DDP anyway, to measure what DDP itself costs."""


class ModelAveraging(Strategy):
    name: Literal["model_averaging"]
    """Independent SGD per worker; the replicas' parameters averaged at the end (and every `period` steps)."""
    period: int | None = Field(ge=1)
    """Average also every `period` optimizer steps; null: only at the end."""
    same_init: bool
    """Broadcast rank 0's initial weights; false: independent initialisations."""
    average_buffers: bool
    """Also average floating buffers (BatchNorm running statistics)."""
    average_optimizer_state: bool
    """Also average momentum / NovoGrad moments at each averaging."""
    save_replicas: bool
    """Each worker saves its pre-averaging weights to replicas/rank<r>.pt."""


class HogWild(Strategy):
    name: Literal["hogwild"]
    """One model in CPU shared memory, updated by every worker without locks."""
    lock: bool
    """The locked baseline: one update at a time."""
    start_method: Literal["forkserver"] | None = setting(allowed="strategy=hogwild always uses forkserver (or null)")
    """Fixed: forkserver keeps the model shared."""


class Trainer(Group, extra="allow"):
    """Lightning Trainer arguments: psgd checks these; any other is Lightning's to check."""

    accelerator: Literal["auto", "cpu", "gpu", "cuda"] = "auto"
    """Where the workers run."""
    devices: int | None = setting(None, hint=_devices_hint, ge=1)
    """Workers per node; null: follow `workers`."""
    num_nodes: int = Field(ge=1)
    """Machines (torchrun or srun starts the workers on each)."""
    max_epochs: int = setting(hint=_max_epochs_hint, ge=1)
    """Epochs of training."""
    max_steps: Literal[-1] | Annotated[int, Field(ge=1)] | None = setting(
        None, allowed="must be an integer >= 1, or -1 for no limit (trainer.max_epochs ends training)"
    )
    """Stop after this many optimizer steps (DDP or one worker)."""
    max_time: Annotated[Any, AfterValidator(_a_duration)] = setting(
        None, allowed="must be a duration longer than 0, as DD:HH:MM:SS (00:01:30:00) or {hours: 1, minutes: 30}"
    )
    """Stop training after that long (DDP or one worker)."""
    precision: Any = setting(None, allowed="one of Lightning's precisions (Lightning checks it)")
    """Floating-point precision, e.g. 32-true, bf16-mixed."""
    log_every_n_steps: int | None = Field(None, ge=1)
    """Optimizer steps between logged training figures."""
    num_sanity_val_steps: int | None = setting(
        None, allowed="must be an integer >= 0, or -1 for all validation batches", ge=-1
    )
    """Validation batches run before training."""
    check_val_every_n_epoch: int | None = Field(None, ge=1)
    """Epochs between validations."""
    val_check_interval: Annotated[float, Field(gt=0, le=1)] | Annotated[int, Field(ge=1)] | None = setting(
        None,
        allowed="must be a fraction of an epoch in (0, 1] (e.g. 0.25), a whole number of batches, or null "
        "(once per epoch)",
    )
    """Validations inside an epoch (0.25: four per epoch)."""
    fast_dev_run: bool | Annotated[int, Field(ge=0)] | None = setting(
        None, allowed="allowed: true, false, or a number of batches >= 0"
    )
    """One batch (or N) of train/val/test, no logs or checkpoints: a smoke test."""
    limit_train_batches: float | None = Field(None, gt=0)
    """Training batches per epoch: a fraction up to 1.0 or a number; null: all."""
    limit_val_batches: float | None = Field(None, ge=0)
    """Validation batches (0: no validation); null: all."""
    limit_test_batches: float | None = Field(None, gt=0)
    """Batches of the final test; null: all."""
    gradient_clip_val: float | None = Field(None, ge=0)
    """Clip gradients' norm to this; null or 0: no clipping."""
    accumulate_grad_batches: int | None = Field(None, ge=1)
    """Micro-batches per update (or parallel_batches)."""
    sync_batchnorm: bool = False
    """GPU: synchronise BatchNorm statistics across workers."""
    deterministic: bool | Literal["warn"] | None = None
    """torch's deterministic algorithms."""
    benchmark: bool | None = None
    """GPU: cuDNN's autotuner; null: off."""


class EarlyStop(Group):
    target_acc: float | None = Field(gt=0, le=1)
    """Stop once val/acc >= target_acc (for `patience` validations in a row); null: no early stop."""
    patience: int = Field(ge=1)
    """Validations in a row at target_acc."""


class Run(Group):
    """One training run (train.yaml; sweep.yaml adds continue_sweep)."""

    data: Data
    model: Model
    optimizer: Optimizer
    scheduler: Scheduler
    strategy: Annotated[DDP | ModelAveraging | HogWild, Field(discriminator="name")]
    trainer: Trainer
    early_stop: EarlyStop
    workers: int = Field(ge=1)
    """Worker processes per node; trainer.devices follows unless set."""
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
    compile: bool | Literal[COMPILE_MODES] | None = setting(
        allowed=f"allowed: false, true (torch.compile's default mode), {', '.join(COMPILE_MODES[1:])}"
    )
    """torch.compile the network, in one of its modes."""
    flush_denormal: bool
    """CPU: flush denormal floats to zero."""
    checkpoint_every_epoch: bool
    """Keep checkpoints/epoch<N>.ckpt for every epoch besides last.ckpt."""
    ckpt_path: Annotated[str, Field(min_length=1)] | None = setting(
        allowed="must be a checkpoint file or run dir (a path; null, the default, starts a new run)"
    )
    """Resume: a .ckpt file or an earlier run dir."""
    init_weights: Annotated[str, Field(min_length=1)] | None = setting(
        allowed="must be an earlier run's dir, a .ckpt file or a weights file (a path)"
    )
    """Start from an earlier run's weights only."""
    record_shards: bool
    """Save the sample indices each worker trained on, per epoch."""
    record_weights: bool
    """Every worker saves the weights it ends with."""
    quiet: bool
    """No progress bar, model summary or Lightning info lines."""
    continue_sweep: str | None = None
    """sweep.py: a stopped sweep's dir, whose completed jobs are kept."""


STRATEGIES = {get_args(m.model_fields["name"].annotation)[0]: m for m in (DDP, ModelAveraging, HogWild)}


def _choices(annotation: Any) -> tuple[list[Any], bool]:
    """The members of a union annotation (Annotated unwrapped), and whether None is one."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return [a for a in args if a is not type(None)], type(None) in args


def said(value: Any) -> str:
    """A value as the command line writes it ([0.7, 0.3], true, null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)


def _bounds(metadata: list[Any]) -> str:
    low = next((m for m in metadata if isinstance(m, at.Ge | at.Gt)), None)
    high = next((m for m in metadata if isinstance(m, at.Le | at.Lt)), None)
    if low is not None and high is not None:
        left, right = ("[", low.ge) if isinstance(low, at.Ge) else ("(", low.gt)
        top, close = (high.le, "]") if isinstance(high, at.Le) else (high.lt, ")")
        return f" in {left}{right:g}, {top:g}{close}"
    if low is not None:
        return f" >= {low.ge:g}" if isinstance(low, at.Ge) else f" > {low.gt:g}"
    return ""


def allowed(field: FieldInfo) -> str:
    """What a field takes, in words: its `allowed`, or words made from its type and bounds."""
    if text := (field.json_schema_extra or {}).get("allowed"):
        return text
    kinds, nullable = _choices(field.annotation)
    null = ", or null" if nullable else ""
    if kinds == [bool] and not nullable:
        return "must be true or false"
    choices: list[Any] = []
    for kind in kinds:
        if kind is bool:
            choices += [True, False]
        elif get_origin(kind) is Literal:
            choices += get_args(kind)
        else:
            noun = {int: "an integer", float: "a number", str: "text"}.get(kind, "a value")
            return f"must be {noun}{_bounds(field.metadata)}{null}"
    return f"allowed: {', '.join(map(said, choices))}{null}"


def _models(field: FieldInfo) -> list[type[BaseModel]]:
    kinds, _ = _choices(field.annotation)
    return [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]


def _field(loc: tuple) -> tuple[str, FieldInfo | None]:
    """The dotted key of an error's location and its field (None: a key the schema does not have)."""
    models, keys, field = [Run], [], None
    for part in loc:
        if not models:  # inside a setting: the rest names a union's branch or a list's item
            break
        if len(models) > 1:  # strategy: the part is the tag that chose its model
            models = [STRATEGIES[part]] if part in STRATEGIES else []
            continue
        fields = {f.alias or name: f for name, f in models[0].model_fields.items()}
        keys.append(str(part))
        field = fields.get(part)
        if field is None:
            break
        models = _models(field)
    return ".".join(keys), field


def line(error: dict[str, Any], values: dict[str, Any]) -> str:
    """psgd's one line for one of pydantic's errors: the dotted key, the value as typed, what is allowed."""
    key, field = _field(error["loc"])
    value = values
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if field is None:
        return f"{key}={said(value)} is not a setting psgd has: leave +{key} out"
    if error["type"] == "missing":
        return f"{key} is missing: {allowed(field)}"
    hint = (field.json_schema_extra or {}).get("hint")
    way = hint(value) if hint else ""
    shown = "null" if value is None else repr(value)
    return f"{key}={shown} is invalid: {allowed(field)}{f'; {way}' if way else ''}"


def given(cfg: DictConfig) -> dict[str, Any]:
    """The config's settings as plain values, interpolations resolved, Hydra's own node left out."""
    return {
        k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
        for k, v in cfg.items()
        if k != "hydra"
    }


def problem(cfg: DictConfig) -> str | None:
    """The line for the config's first value the schema refuses, or None."""
    values = given(cfg)
    try:
        Run.model_validate(values)
    except ValidationError as e:
        return line(e.errors()[0], values)
    return None


def describe() -> list[tuple[str, str, str]]:
    """(dotted key, what it takes, its meaning) of every key of the schema, for --help; a strategy's own
    keys are marked with its name."""
    rows: list[tuple[str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str, mark: str = "", skip: tuple[str, ...] = ()) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{field.alias or name}"
            if name in skip:
                continue
            if name == "strategy":
                walk(Strategy, "strategy.")
                for tag, member in STRATEGIES.items():
                    walk(member, "strategy.", f"[strategy={tag}] ", tuple(Strategy.model_fields))
            elif models := _models(field):
                walk(models[0], f"{key}.")
            else:
                rows.append((key, allowed(field), f"{mark}{field.description or ''}"))

    walk(Run, "")
    return rows
