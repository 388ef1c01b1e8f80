"""Checks of a run that need its model built or its data read, made before any worker starts (and for every
job of a sweep before the first one starts): a setting that cannot work is one line (DataError)."""

from omegaconf import DictConfig, OmegaConf
from torch import nn

from psgd import forkserver
from psgd.choices import INFO
from psgd.config import ConfigError, Jobs, compile_mode, resolve_accelerator, resolve_workers
from psgd.config.targets import meta_network
from psgd.console import in_the_job
from psgd.data import ClassificationData
from psgd.data.datasets import DataError
from psgd.memory import memory_problem


def check_memory(cfg: DictConfig, net: nn.Module, image_size: int, sizes: list[int], workers: int) -> None:
    """Raise a DataError where `workers` CPU workers on this machine cannot each train a batch (data.batch_size,
    or its whole shard where smaller; `sizes`: the shards) in the memory available (psgd.memory's lower bound).
    Not judged under compile, whose graphs may keep fewer tensors than the eager network."""
    if compile_mode(cfg.get("compile")):
        return
    batch = min(cfg.data.batch_size, max(sizes))
    shape = (INFO[cfg.data.name].channels, image_size, image_size)
    optimizer = str(cfg.optimizer.get("_target_", "")).rpartition(".")[2]
    asked = f"data.batch_size={cfg.data.batch_size}" + (
        f" (a batch of {batch}: each worker's whole shard)" if batch < cfg.data.batch_size else ""
    )
    hogwild = cfg.strategy.name == "hogwild"  # one copy of the weights in shared memory
    half = "16" in str(cfg.trainer.get("precision"))  # bf16-mixed, 16-mixed, bf16-true ...
    if problem := memory_problem(net, shape, batch, workers, optimizer, asked, shared_weights=hogwild, half=half):
        raise DataError(problem)


def build_datamodule(cfg: DictConfig, image_size: int | None = None) -> ClassificationData:
    """The run's datamodule, its images resized to `image_size` (None: the dataset's own); nothing read yet."""
    return ClassificationData(
        **OmegaConf.to_container(cfg.data, resolve=True),
        image_size=image_size,
        seed=cfg.seed,
        channels_last=cfg.channels_last,
        record_shards=cfg.record_shards,
        lockstep=cfg.strategy.name == "ddp",  # DDP needs equal steps on every worker; averaging lets each run its own
        # replicas that differ (model averaging) are each evaluated on the whole split
        shard_eval=cfg.strategy.name in ("ddp", "hogwild"),
    )


def sweep_data_problem(jobs: Jobs) -> str | None:
    """Why a job of this sweep cannot run on its data, or None: a dataset missing or damaged (downloaded here,
    once, where data.download allows), a worker without a training batch, a final test of no batch, or (on
    CPU) training that cannot fit in memory. Each dataset and folder is read once. Only for Hydra's basic
    launcher, whose jobs run on this machine; every job has passed `check`."""
    if not forkserver.runs_jobs_here(jobs[0][1]):
        return None
    sources = [(cfg.data.name, str(cfg.data.root), cfg.data.download, cfg.data.verify_md5) for _, cfg in jobs]
    read: dict[tuple, ClassificationData] = {}  # the first datamodule of each source
    for (job, cfg), source in zip(jobs, sources, strict=True):
        try:
            datamodule = build_datamodule(cfg)
            if source in read:
                datamodule.decoded_from(read[source])
            else:
                read[source] = datamodule
                try:
                    datamodule.prepare_data()
                except DataError as e:
                    if len(set(sources)) == 1:  # every job would fail on it
                        return f"{e} (no job was started)"
                    raise
            workers = resolve_workers(cfg) * cfg.trainer.num_nodes
            datamodule.check_batches(workers)
            datamodule.check_test_limit(cfg.trainer.get("limit_test_batches"))
            if resolve_accelerator(cfg) == "cpu":  # a batch that cannot fit in memory, as the job judges it
                net, size = meta_network(cfg.model, cfg.data.name)
                check_memory(cfg, net, size, datamodule.train_shards(workers)[0], workers)
        except (DataError, ConfigError) as e:
            return in_the_job(e, job, [j for j, _ in jobs])
        except Exception:  # anything else: left to the job, which reports it as its failure
            continue
    return None
