"""What every strategy declares to the run, once: the contract between an algorithm and psgd.

A strategy is a config class, a subclass of `StrategyConfig` (its keys with their types, bounds and meaning;
the run's settings it refuses; how it builds its Lightning `Strategy`; what it records and the report shows),
and the Lightning `Strategy` its `build` returns: the algorithm. `conf/strategy/<name>.yaml` names the config
class by `_target_`, and psgd imports it to read the section: a strategy defined outside psgd is a class and a
YAML file in a config dir on Hydra's search path. The run, its checks, the fork server, resume and the report
ask the config class; none of them compares a strategy's name.

Imports neither torch nor Lightning: psgd reads a command line's strategy section before torch loads (0.5 s to a
bad value's line, against 5.5 s with Lightning loaded). So psgd's own strategies keep their config classes apart
from their algorithms, in psgd.strategies.configs, each `build` importing its algorithm; a strategy of a user's
own may keep both in one file (its module is imported to read its section). Also here: the sections every part
of the config is made of (Group, Target) and the optimizer's (a strategy may name optimizers of its own).
"""

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from psgd.errors import ConfigError

if TYPE_CHECKING:  # annotations only: the run's config reads this module, not the other way round
    from psgd.config.schema import Plan, Run

REGISTRY: dict[str, type["StrategyConfig"]] = {}  # strategy.name -> its config class, as each class is defined


def _two_betas(value: list[float] | None) -> list[float] | None:
    """Adam's and NovoGrad's betas: the decay rates of the first and second moment."""
    if value is not None and (len(value) != 2 or not all(0 <= b < 1 for b in value)):
        raise ValueError("betas takes two numbers in [0, 1), e.g. [0.9, 0.999]")
    return value


class Group(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", use_attribute_docstrings=True)


class Target(Group):
    """A section that names a class by `_target_`, its other keys the class's arguments."""

    def settings(self) -> dict[str, Any]:
        """The keys as given (`_target_` among them), for Hydra's instantiate or the class itself."""
        return self.model_dump(by_alias=True, exclude_unset=True)


class Optimizer(Target, extra="allow"):
    """torch optimizer, built by Hydra (`_partial_`); keys other than these are checked against its constructor."""

    target: str = Field(alias="_target_", pattern=r"\w\.\w")
    """The optimizer's class, as module.Class."""
    lr: float = Field(gt=0)
    """Learning rate of one worker (see lr_scaling)."""
    momentum: float = Field(None, ge=0, lt=1)
    """Momentum factor (SGD)."""
    weight_decay: float = Field(None, ge=0)
    """L2 penalty."""
    betas: Annotated[list[float] | None, AfterValidator(_two_betas)] = None
    """Decay rates of the moment estimates (Adam, NovoGrad), e.g. [0.9, 0.999]."""
    eps: float = Field(None, gt=0)
    """Added to the denominator (Adam, NovoGrad)."""
    nesterov: bool = None
    """Nesterov momentum (SGD)."""
    maximize: bool = None
    """Maximise the objective instead of minimising it."""
    amsgrad: bool = None
    """The AMSGrad variant (Adam, NovoGrad)."""
    grad_averaging: bool = None
    """NovoGrad: average the gradient into its first moment."""
    fused: bool | None = None
    """torch's fused update; null: torch's choice."""
    foreach: bool | None = None
    """torch's per-tensor-list update; null: torch's choice."""


class StrategyConfig(Group, populate_by_name=True):
    """A strategy's section of the config (`strategy.*`), and what the run asks of the strategy."""

    target: str = Field(alias="_target_", pattern=r"\w\.\w")
    """The strategy's config class, as module.Class (psgd imports it to read this section)."""
    name: str
    """The strategy: the run's label in its dir's name, metrics.json and the report."""
    backend: Literal["gloo", "nccl", "mpi"] | None
    """Process-group backend; null: gloo on CPU, nccl on GPU."""
    start_method: Literal["forkserver", "spawn"] | None
    """How the workers start; null: forkserver on CPU (workers start loaded), spawn on GPU."""
    timeout_s: int = Field(gt=0)
    """Collective timeout in seconds: a stuck peer fails the run instead of hanging it."""

    one_model: ClassVar[bool] = False
    """The workers hold one model (DDP's replicas kept equal, HogWild's shared one): each evaluates its share of
    a split, and a checkpoint of several workers' own weights is not its to go on from. False: each worker's
    replica differs and is evaluated on the whole split (metrics.json's worker_test_acc)."""
    lockstep: ClassVar[bool] = False
    """Every worker takes the same steps and one update averages every worker's micro-batches (DDP): the shards
    are dealt in equal steps, and a worker may stop inside an epoch (max_time, max_steps, a validation)."""
    cpu_only: ClassVar[bool] = False
    """The workers run on the CPU whatever trainer.accelerator says (HogWild's shared memory)."""
    own_launcher: ClassVar[bool] = False
    """The workers must be started by psgd on one machine, never by torchrun or srun."""
    report_columns: ClassVar[tuple[str, ...]] = ()
    """metrics.json keys of its own that the report shows as columns of report.csv (beside every run's)."""
    final_model: ClassVar[str] = "averaged model"
    """What a run of replicas that differ ends with (one_model False), as the result line names it."""
    simulates: ClassVar[bool] = False
    """Its workers can be simulated in one process (simulate=true): its Lightning strategy reads the workers' state
    as replica tensors and exchanges it through `comm` (psgd.strategies.collective)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Register each strategy under its declared_name."""
        super().__pydantic_init_subclass__(**kwargs)
        if name := cls.declared_name():
            REGISTRY[name] = cls

    @classmethod
    def declared_name(cls) -> str | None:
        """The name the class's `name` field allows (a Literal of one value); None for a base of strategies."""
        names = get_args(cls.model_fields["name"].annotation)
        return names[0] if len(names) == 1 else None

    def refuse(self, run: "Run") -> None:
        """Raise ConfigError for a setting of `run` this strategy cannot train with, judged from the config alone
        (no torch, no machine): one line naming the key, its value and what is allowed."""

    def refuse_simulation(self, run: "Run") -> None:
        """Raise ConfigError where simulate=true cannot run this strategy as `run` sets it (one line)."""
        if not self.simulates:
            raise ConfigError(
                f"simulate=true is invalid with strategy={self.name}: it does not declare that its workers can be "
                "simulated (StrategyConfig.simulates: its Lightning strategy exchanges through psgd's communication "
                "interface); use simulate=false"
            )

    def replica_copies(self) -> int:
        """Copies of a worker's parameters its algorithm keeps beside the parameters, gradients and optimizer state
        (EASGD's centre, DiLoCo's θ_g): what a simulated worker costs in memory (psgd.strategies.simulated)."""
        return 0

    def runs_in_this_process(self, run: "Run") -> bool:
        """Whether `run` trains in the process that launched it (one worker, no process group) rather than in
        worker processes."""
        return False

    def resolved_start_method(self, accelerator: str, forkserver: bool) -> str:
        """strategy.start_method, or for null psgd's choice: forkserver on CPU where the platform has one
        (`forkserver`: psgd's fork server starts workers already loaded), spawn on GPU."""
        return self.start_method or ("forkserver" if accelerator == "cpu" and forkserver else "spawn")

    def lightning_settings(self, plan: "Plan") -> dict[str, Any]:
        """The keywords every psgd strategy passes to Lightning's DDPStrategy it derives from."""
        return {
            "process_group_backend": self.backend,  # None: gloo on CPU, nccl on GPU
            # torchrun / srun started every worker: Lightning's popen launcher starts none
            "start_method": plan.start_method if plan.launcher == "psgd" else "popen",
            "timeout": timedelta(seconds=self.timeout_s),
        }

    def build(self, run: "Run", plan: "Plan", run_dir: Path) -> Any:
        """The Lightning `Strategy` (or a name Lightning knows) that trains `run` as `plan` resolved it; files of
        its own go under `run_dir`."""
        raise NotImplementedError(f"{type(self).__name__} builds no Lightning strategy")

    def optimizers(self) -> dict[str, Any]:
        """The optimizers of its own the strategy's section names ({dotted key: its Optimizer section}): each is
        built on a stand-in parameter before the run starts, as the run's own optimizer is."""
        return {}

    def record(self) -> dict[str, Any]:
        """What metrics.json says of the strategy beside its name (its Lightning strategy adds its figures)."""
        return {}

    @classmethod
    def label(cls, record: dict[str, Any]) -> str:
        """How a run of this strategy exchanged, from its metrics.json `record`, as accuracy_vs_comm.png labels
        its point beside the strategy's name and workers (`topk`, `period=8`); "" for nothing more to say."""
        return ""
