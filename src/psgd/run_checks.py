"""Checks of a run that need its model built or its data read, made before any worker starts (and for every
job of a sweep before the first one starts): a setting that cannot work is one line (DataError)."""

from psgd import forkserver
from psgd.config import ConfigError, Jobs, Run, check_values
from psgd.console import in_the_job
from psgd.data import ClassificationData
from psgd.errors import DataError


def build_datamodule(run: Run, image_size: int | None = None) -> ClassificationData:
    """The run's datamodule, its images resized to `image_size` (None: the dataset's own); nothing read yet.
    A trainer.fast_dev_run smoke test evaluates batches no larger than the training's: its one validation and
    one test batch of data.eval_batch_size were most of its time (docs/performance.md, "Start-up")."""
    data = run.data.model_dump()
    if run.trainer.fast_dev_run:
        data["eval_batch_size"] = min(data["eval_batch_size"], data["batch_size"])
    return ClassificationData(
        **data,
        image_size=image_size,
        seed=run.seed,
        channels_last=run.channels_last,
        lockstep=run.strategy.lockstep,  # DDP needs equal steps on every worker; averaging lets each run its own
        # replicas that differ (model averaging) are each evaluated on the whole split
        shard_eval=run.strategy.one_model,
        replicas=run.world_size if run.simulate else 0,  # every simulated worker's batches, in this process
    )


def sweep_data_problem(jobs: Jobs) -> str | None:
    """Why a job of this sweep cannot run on its data, or None: a dataset missing or damaged (downloaded here,
    once, where data.download allows), a worker without a training batch, or a final test of no batch. Each
    dataset and folder is read once. Only for Hydra's basic launcher, whose jobs run on this machine; every job
    has passed `check`."""
    if not forkserver.runs_jobs_here(jobs[0][1]):
        return None
    sources = [(cfg.data.name, str(cfg.data.root), cfg.data.download, cfg.data.verify_md5) for _, cfg in jobs]
    read: dict[tuple, ClassificationData] = {}  # the first datamodule of each source
    for (job, cfg), source in zip(jobs, sources, strict=True):
        try:
            run = check_values(cfg)
            datamodule = build_datamodule(run)
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
            datamodule.check_batches(run.world_size)
            datamodule.check_test_limit(run.trainer.limit_test_batches)
        except (DataError, ConfigError) as e:
            return in_the_job(e, job, [j for j, _ in jobs])
        except Exception:  # anything else: left to the job, which reports it as its failure
            continue
    return None
