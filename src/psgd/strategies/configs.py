"""The config classes of psgd's own strategies (the contract: psgd.strategies.contract), one per
conf/strategy/<name>.yaml, which names it by `_target_`: each strategy's keys, the run's settings it refuses,
how it builds its algorithm (psgd.strategies.<name>), what it records and how the report labels it. Imports
no torch: a bad value is refused before torch loads; each `build` imports its algorithm.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from omegaconf import OmegaConf
from pydantic import Field
from typing_extensions import override

from psgd.choices import COMPRESSION_KEYS, COMPRESSIONS, TIME_VARYING, torus_shape
from psgd.errors import ConfigError
from psgd.strategies.contract import Optimizer, StrategyConfig

if TYPE_CHECKING:  # annotations only: psgd.config reads this module
    from psgd.config.schema import Plan, Run


def compression_keys_alone(config: StrategyConfig, compression: str) -> None:
    """A compression's own key (COMPRESSION_KEYS, those the config has) only with that compression.

    Raises:
        ConfigError: a key of another compression is set.
    """
    for key, (owner, _) in COMPRESSION_KEYS.items():
        if getattr(config, key, None) is not None and compression != owner:
            raise ConfigError(
                f"strategy.{key}={getattr(config, key)} is invalid with strategy.compression={compression}: "
                f"it is compression={owner}'s; use strategy.compression={owner} or leave it out"
            )


class DDP(StrategyConfig):
    name: Literal["ddp"]
    """Synchronous data parallelism: gradients all-reduced every step."""
    find_unused_parameters: bool
    """A model with parameters no loss uses (slower)."""
    bucket_cap_mb: float | None = Field(gt=0)
    """Gradient bucket size of the all-reduce; null: torch's default."""
    ddp_for_one_worker: bool
    """Wrap one worker in DDP anyway, to measure what DDP itself costs."""
    compression: Literal[COMPRESSIONS]
    """Gradient compression of the all-reduce: none, fp16, bf16, powersgd, topk, sign or qsgd."""
    powersgd_rank: int | None = Field(ge=1)
    """compression=powersgd: the rank of each gradient matrix's approximation; null: 2."""
    powersgd_start_step: int | None = Field(ge=2)
    """compression=powersgd: plain all-reduce steps before it starts (its first Qs are drawn per bucket, and DDP
    regroups its buckets after the first step: from the second on, every run's are the same); null: 10."""
    topk_ratio: float | None = Field(gt=0, le=1)
    """compression=topk: the share of the model's gradient entries sent; null: 0.01."""
    qsgd_levels: int | None = Field(ge=2)
    """compression=qsgd: the quantisation levels s; null: 16."""

    one_model: ClassVar[bool] = True
    lockstep: ClassVar[bool] = True
    simulates: ClassVar[bool] = True

    @override
    def refuse(self, run: "Run") -> None:
        """A compression's own key only with that compression."""
        compression_keys_alone(self, self.compression)

    @override
    def replica_copies(self) -> int:
        """A compression's working rows: p = g + e and its error (PowerSGD: its matrices before, and their error)."""
        return 2 if self.compression in ("topk", "sign", "powersgd") else 1 if self.compression != "none" else 0

    @override
    def runs_in_this_process(self, run: "Run") -> bool:
        return run.world_size == 1 and not self.ddp_for_one_worker and not run.simulate

    @override
    def build(self, run: "Run", plan: "Plan", run_dir: Path) -> Any:
        """Lightning's DDPStrategy with psgd's failure reports and gradient exchange; "auto" for one process."""
        if self.runs_in_this_process(run):
            return "auto"  # one process: no process group, nothing to all-reduce
        from psgd.strategies.ddp import ReportsFirstFailure

        options = {key: getattr(self, key) for key in COMPRESSION_KEYS if getattr(self, key) is not None}
        return ReportsFirstFailure(
            **self.lightning_settings(plan),
            find_unused_parameters=self.find_unused_parameters,
            gradient_as_bucket_view=True,
            compression=self.compression,
            compression_options={**options, "seed": run.seed},  # a null option: the method's default
            **({"bucket_cap_mb": self.bucket_cap_mb} if self.bucket_cap_mb is not None else {}),
        )

    @override
    def record(self) -> dict[str, Any]:
        return {"compression": self.compression}

    @classmethod
    @override
    def label(cls, record: dict[str, Any]) -> str:
        return record.get("compression") or ""


class Replicas(StrategyConfig):
    """What a strategy of one replica per worker, each on its own shard, shares (model averaging, EASGD)."""

    same_init: bool
    """Broadcast rank 0's initial weights; false: independent initialisations."""
    average_buffers: bool
    """Also average floating buffers (BatchNorm running statistics)."""
    save_replicas: bool
    """Each worker saves its weights before they are averaged to replicas/rank<r>.pt."""

    simulates: ClassVar[bool] = True

    def replica_settings(self, run: "Run", plan: "Plan", run_dir: Path) -> dict[str, Any]:
        return {
            **self.lightning_settings(plan),
            "same_init": self.same_init,
            "average_buffers": self.average_buffers,
            "seed": run.seed,
            "replica_dir": str(run_dir / "replicas") if self.save_replicas else None,
        }


class ModelAveraging(Replicas):
    name: Literal["model_averaging"]
    """Independent SGD per worker; the replicas' parameters averaged at the end (and every `period` steps)."""
    period: int | None = Field(ge=1)
    """Average also every `period` optimizer steps; null: only at the end."""
    average_optimizer_state: bool
    """Also average momentum / NovoGrad moments at each averaging."""
    sync_steps: int = Field(ge=0)
    """Post-local SGD: average after each of the first `sync_steps` optimizer steps, then every `period`."""
    outer_optimizer: Optimizer | None
    """DiLoCo: the optimizer of the outer step at each averaging point (a _partial_ optimizer); null: plain
    averaging."""
    group_periods: dict[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None
    """Hierarchical averaging: {group size: period}, groups of consecutive ranks, the largest all workers,
    e.g. {2: 4, 4: 16}; null: one group, `period`."""

    @override
    def refuse(self, run: "Run") -> None:
        """Hierarchical averaging's groups: sizes that nest (each divides the next), the largest all workers, and
        no other schedule beside them (period, sync_steps, an outer optimizer)."""
        periods, world = self.group_periods, run.world_size
        if periods is None:
            return
        sizes = sorted(periods)
        shown = "{" + ", ".join(f"{k}: {v}" for k, v in periods.items()) + "}"
        if sizes[-1] != world or any(b % a for a, b in zip(sizes, sizes[1:])):
            raise ConfigError(
                f"strategy.group_periods={shown} is invalid with {world} workers: group sizes must nest (each "
                f"divides the next) and the largest must be all {world} workers, e.g. {{{max(1, world // 2)}: 4, "
                f"{world}: 16}}"
            )
        others = {"period": self.period, "sync_steps": self.sync_steps or None, "outer_optimizer": self.outer_optimizer}
        if other := next((key for key, value in others.items() if value is not None), None):
            shown = getattr(self, other)
            shown = OmegaConf.create(shown.settings()) if other == "outer_optimizer" else shown
            raise ConfigError(
                f"strategy.{other}={shown} is invalid with strategy.group_periods: the groups' periods are the "
                "schedule; leave it out"
            )

    @override
    def optimizers(self) -> dict[str, Any]:
        return {"strategy.outer_optimizer": self.outer_optimizer} if self.outer_optimizer else {}

    @override
    def replica_copies(self) -> int:
        """An outer optimizer's θ_g, its momentum and the round's mean."""
        return 3 if self.outer_optimizer else 0

    @override
    def build(self, run: "Run", plan: "Plan", run_dir: Path) -> Any:
        from hydra.utils import instantiate

        from psgd.strategies.model_averaging import ModelAveragingStrategy

        outer = self.outer_optimizer
        return ModelAveragingStrategy(
            period=self.period,
            average_optimizer_state=self.average_optimizer_state,
            sync_steps=self.sync_steps,
            group_periods=self.group_periods,
            outer_optimizer=instantiate(outer.settings(), _convert_="all") if outer else None,
            **self.replica_settings(run, plan, run_dir),
        )

    @classmethod
    @override
    def label(cls, record: dict[str, Any]) -> str:
        """The schedule: `period=8`, `one-shot`, `groups 2:4,4:16`, with `post-local t0=...` and `outer SGD`."""
        how = f"period={record['period']}" if record.get("period") else "one-shot"
        if record.get("group_periods"):
            how = "groups " + ",".join(f"{size}:{period}" for size, period in record["group_periods"].items())
        if record.get("sync_steps"):
            how = f"post-local t0={record['sync_steps']} {how}"
        if record.get("outer_optimizer"):
            how = f"outer {record['outer_optimizer']} {how}"
        return how


class DiLoCo(ModelAveraging):
    name: Literal["diloco"]
    """DiLoCo: local SGD whose averaging points take an outer (Nesterov) step from the last point's weights."""


class ElasticAveraging(Replicas):
    name: Literal["elastic_averaging"]
    """Elastic averaging SGD (EASGD): every tau steps the replicas and a centre variable pull towards each other."""
    tau: int = Field(ge=1)
    """Optimizer steps between elastic steps (the paper: 1, 4, 16, 64)."""
    alpha: float | None = Field(gt=0)
    """The elastic pull α, in (0, 1/workers]; null: 0.9 / workers (the paper's β = 0.9)."""

    @override
    def refuse(self, run: "Run") -> None:
        """α at most 1 / workers: the centre moves workers x α of the way to the replicas' mean."""
        world = run.world_size
        if self.alpha is not None and self.alpha > 1 / world:
            raise ConfigError(
                f"strategy.alpha={self.alpha} is invalid with {world} workers: the elastic pull must be in "
                f"(0, 1/workers] = (0, {1 / world:.4g}] (the centre moves workers x alpha of the way); or null for "
                "0.9 / workers"
            )

    final_model: ClassVar[str] = "the centre"

    @override
    def replica_copies(self) -> int:
        """The centre and the replicas' mean at an elastic step."""
        return 2

    @classmethod
    @override
    def label(cls, record: dict[str, Any]) -> str:
        return f"tau={record.get('tau')}"

    @override
    def build(self, run: "Run", plan: "Plan", run_dir: Path) -> Any:
        from psgd.strategies.elastic_averaging import ElasticAveragingStrategy

        return ElasticAveragingStrategy(tau=self.tau, alpha=self.alpha, **self.replica_settings(run, plan, run_dir))


class Decentralized(Replicas):
    name: Literal["decentralized"]
    """Decentralized SGD (D-PSGD; CHOCO-SGD with a compression): each replica mixes with its neighbours on a
    graph; the replicas' mean is the final model."""
    topology: Literal["ring", "torus", "exponential", "one_peer_exponential", "complete", "random_matching"]
    """The graph: ring, torus (2-D), exponential and one_peer_exponential (directed), complete, random_matching
    (drawn per round from the seed)."""
    weights: Literal["uniform", "metropolis_hastings"]
    """The undirected graphs' mixing weights: 1 / (largest degree + 1), or 1 / (1 + max(d_i, d_j))."""
    gossip_every: int = Field(ge=1)
    """Optimizer steps between gossip rounds."""
    order: Literal["mix_then_step", "step_then_mix"]
    """D-PSGD's (Lian et al.): the gradient at the unmixed replica, the step from the mixed one; or the step,
    then the mix (Koloskova et al., 2020). CHOCO always steps, then gossips."""
    compression: Literal["none", "topk", "sign", "qsgd"]
    """none: exact gossip; topk, sign, qsgd: CHOCO-SGD's compressed gossip of differences to public copies."""
    consensus_lr: float = Field(gt=0, le=1)
    """CHOCO's consensus step size γ, in (0, 1]."""
    topk_ratio: float | None = Field(gt=0, le=1)
    """compression=topk: the share of the entries sent; null: 0.01."""
    qsgd_levels: int | None = Field(ge=2)
    """compression=qsgd: the quantisation levels s; null: 16."""
    log_consensus_every: int | None = Field(ge=1)
    """Also write the consensus distance to TensorBoard every N optimizer steps; null: at each epoch's end only."""

    report_columns: ClassVar[tuple[str, ...]] = ("topology", "spectral_gap")

    @override
    def replica_copies(self) -> int:
        """The flat parameters and their mix; CHOCO's x̂, s, q and the difference too."""
        return 2 + (4 if self.compression != "none" else 0)

    @override
    def refuse(self, run: "Run") -> None:
        """A torus needs a worker count with a factor (rows x columns, each >= 2); CHOCO keeps its neighbours' public
        copies, so a graph that changes each round is not for it; a compression's key only with it."""
        world = run.world_size
        if self.topology == "torus" and torus_shape(world) is None:
            raise ConfigError(
                f"strategy.topology=torus is invalid with {world} workers: a 2-D torus needs rows x columns, each at "
                "least 2 (4, 6, 8, 9, ... workers); use another worker count or topology=ring"
            )
        if self.compression != "none" and self.topology in TIME_VARYING:
            raise ConfigError(
                f"strategy.compression={self.compression} is invalid with strategy.topology={self.topology}: CHOCO "
                "keeps its neighbours' public copies, and this graph changes every round; use a static topology "
                "(ring, torus, exponential, complete) or compression=none"
            )
        compression_keys_alone(self, self.compression)

    @classmethod
    @override
    def label(cls, record: dict[str, Any]) -> str:
        """The graph, and CHOCO's compression: `ring`, `ring choco-topk`."""
        compression = record.get("compression") or "none"
        return f"{record.get('topology')}" + (f" choco-{compression}" if compression != "none" else "")

    @override
    def build(self, run: "Run", plan: "Plan", run_dir: Path) -> Any:
        from psgd.strategies.decentralized import DecentralizedStrategy

        return DecentralizedStrategy(
            topology=self.topology,
            weights=self.weights,
            gossip_every=self.gossip_every,
            order=self.order,
            compression=self.compression,
            consensus_lr=self.consensus_lr,
            topk_ratio=self.topk_ratio or COMPRESSION_KEYS["topk_ratio"][1],
            qsgd_levels=self.qsgd_levels or COMPRESSION_KEYS["qsgd_levels"][1],
            log_consensus_every=self.log_consensus_every,
            **self.replica_settings(run, plan, run_dir),
        )


class HogWild(StrategyConfig):
    name: Literal["hogwild"]
    """One model in CPU shared memory, updated by every worker without locks."""
    lock: bool
    """The locked baseline: one update at a time."""
    shared_queue: bool
    """The epoch's batches go to whichever worker asks next (a faster worker takes more); false: own shards."""
    start_method: Literal["forkserver"] | None
    """Fixed: forkserver keeps the model shared."""

    one_model: ClassVar[bool] = True
    cpu_only: ClassVar[bool] = True
    own_launcher: ClassVar[bool] = True

    @override
    def refuse_simulation(self, run: "Run") -> None:
        raise ConfigError(
            "simulate=true is invalid with strategy=hogwild: HogWild's point is real shared memory, written by worker "
            "processes racing without locks, which one process cannot simulate; use simulate=false"
        )

    @override
    def refuse(self, run: "Run") -> None:
        """The shared queue leaves each worker's steps per epoch to its speed: no lr schedule by steps, and no
        fraction of an epoch's batches (a number of them caps each worker's)."""
        if not self.shared_queue:
            return
        unknown = (
            "each worker takes as many of the epoch's batches as its speed allows, so its steps per epoch are unknown"
        )
        if run.scheduler.trained()["interval"] == "step":
            raise ConfigError(
                f"scheduler.interval=step is invalid with strategy.shared_queue=true: {unknown}; use "
                "scheduler.interval=epoch"
            )
        limit = run.trainer.limit_train_batches
        if isinstance(limit, float) and limit != 1.0:
            raise ConfigError(
                f"trainer.limit_train_batches={limit} is invalid with strategy.shared_queue=true: {unknown}, and a "
                "fraction of them is none; give a number of batches (each worker's most), e.g. "
                "trainer.limit_train_batches=100"
            )

    @override
    def resolved_start_method(self, accelerator: str, forkserver: bool) -> str:
        return "forkserver"  # the model stays shared (Lightning's spawn would clone it)

    @override
    def build(self, run: "Run", plan: "Plan", run_dir: Path) -> Any:
        from psgd.strategies.hogwild import HogwildStrategy

        settings = self.lightning_settings(plan)
        settings.pop("start_method")  # always forkserver: see SharedMemoryLauncher
        return HogwildStrategy(lock=self.lock, shared_queue=self.shared_queue, **settings)


BUILTIN = (
    DDP,
    ModelAveraging,
    DiLoCo,
    ElasticAveraging,
    Decentralized,
    HogWild,
)  # conf/strategy's, as --help lists them
