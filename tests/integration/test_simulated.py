"""Simulated workers (simulate=true) against real worker processes: the same strategy, seeds and shards give the
same weights, every worker's; the outputs a real run writes; what simulation refuses, in one line."""

import pytest
import torch
from conftest import compose_cfg, run_cli
from helpers import metrics, scalars, tensorboard, undocumented

from psgd.config import ConfigError, check_values
from psgd.run import train

pytestmark = pytest.mark.distributed

# one thread per process: a convolution's rounding depends on its threads (a simulated run is one process of them)
TINY = ["quiet=true", "threads_per_worker=1", "data.batch_size=32", "data.eval_batch_size=64", "data.val_split=0"]
TINY += ["trainer.max_epochs=2"]
# dropout 0: a worker process and its simulated replica draw the same masks, but only where nothing else draws
PLAIN = ["model.dropout=0", "optimizer.weight_decay=0", "scheduler=none"]
MOMENTUM = ["optimizer.momentum=0.9"]


def run(tiny_data, run_dir, *overrides: str) -> dict:
    train(compose_cfg(f"data.root={tiny_data}", *TINY, *PLAIN, *overrides), run_dir)
    return metrics(run_dir)


def worker_weights(run_dir, workers: int, folder: str) -> list[dict]:
    return [torch.load(run_dir / folder / f"rank{r}.pt", weights_only=True) for r in range(workers)]


def furthest(a: list[dict], b: list[dict]) -> float:
    """The largest difference between any two corresponding weights of the workers of `a` and `b`."""
    assert len(a) == len(b) and all(x.keys() == y.keys() for x, y in zip(a, b, strict=True))
    return max((x[k].float() - y[k].float()).abs().max().item() for x, y in zip(a, b, strict=True) for k in x)


# (strategy overrides, the weights compared: each worker's before the final averaging where they differ)
SAME_AS_REAL = {
    "ddp": (["strategy=ddp"], "weights"),
    "ddp_topk": (["strategy=ddp", "strategy.compression=topk"], "weights"),
    "ddp_sign": (["strategy=ddp", "strategy.compression=sign"], "weights"),
    "ddp_qsgd": (["strategy=ddp", "strategy.compression=qsgd"], "weights"),
    # the lab CNN is one DDP bucket: the processes' first Qs are drawn from one seed, as the simulated ones'
    "ddp_powersgd": (["strategy=ddp", "strategy.compression=powersgd", "strategy.powersgd_start_step=2"], "weights"),
    # batches of 20: 26 steps at 2 workers, 14 at 4, so that the run ends between averaging points
    "model_averaging_period4": (["strategy=model_averaging", "strategy.period=4", "data.batch_size=20"], "replicas"),
    "diloco": (["strategy=diloco", "strategy.period=3"], "replicas"),
    "elastic_averaging": (["strategy=elastic_averaging", "strategy.tau=2"], "replicas"),
    "decentralized_ring": (["strategy=decentralized", "strategy.topology=ring"], "replicas"),
}
# (name, workers, optimizer): each at 2 and 4 workers, with plain and momentum SGD among them; the default run
# has three of them (its 8 minutes), the rest are slow
CASES = [("ddp", 2, "plain"), ("ddp_topk", 4, "momentum"), ("decentralized_ring", 4, "momentum")]
SLOW_CASES = [("ddp", 4, "momentum"), ("ddp_topk", 2, "plain"), ("decentralized_ring", 2, "plain")]
SLOW_CASES += [("model_averaging_period4", 2, "plain"), ("model_averaging_period4", 4, "momentum")]
SLOW_CASES += [("diloco", 2, "momentum"), ("diloco", 4, "plain")]
SLOW_CASES += [("elastic_averaging", 2, "momentum"), ("elastic_averaging", 4, "plain")]
SLOW_CASES += [("ddp_sign", 2, "momentum"), ("ddp_qsgd", 4, "plain"), ("ddp_powersgd", 2, "momentum")]


@pytest.mark.parametrize(
    ("name", "workers", "optimizer"), CASES + [pytest.param(*case, marks=pytest.mark.slow) for case in SLOW_CASES]
)
def test_simulated_workers_end_with_the_weights_of_real_worker_processes(tiny_data, tmp_path, name, workers, optimizer):
    """Each worker's weights after 2 epochs (16 steps at 2 workers, 8 at 4; model averaging's, 26 and 14): within
    1e-5 of the real run's, every worker's, before the final averaging where the replicas differ (save_replicas);
    the same bytes sent."""
    overrides, folder = SAME_AS_REAL[name]
    keep = ["record_weights=true"] if folder == "weights" else ["strategy.save_replicas=true"]
    common = [f"workers={workers}", *(MOMENTUM if optimizer == "momentum" else []), *overrides, *keep]
    real = run(tiny_data, tmp_path / "real", *common)
    sim = run(tiny_data, tmp_path / "sim", *common, "simulate=true")
    assert sim["steps_per_worker"] == real["steps_per_worker"] and sum(real["steps_per_worker"]) > 0
    real_weights = worker_weights(tmp_path / "real", workers, folder)
    assert furthest(worker_weights(tmp_path / "sim", workers, folder), real_weights) <= 1e-5
    if folder == "replicas":  # they differ: the comparison is of each worker's own
        assert furthest(real_weights[:1], real_weights[1:2]) > 1e-4
    assert sim["comm_bytes"] == real["comm_bytes"] and sim["comm_calls"] == real["comm_calls"]
    assert sim["test_acc"] == pytest.approx(real["test_acc"], abs=2 / 256)  # 256 test samples


def test_every_ddp_compression_runs_simulated_keeping_the_workers_equal_and_sending_less(tiny_data, tmp_path):
    """fp16, PowerSGD (from its third step), sign and QSGD on 4 simulated workers: every worker ends with the same
    weights (each gets the same mean), each method's its own, and each sends less than fp32 gradients would."""
    common = ["workers=4", "simulate=true", "strategy=ddp", "record_weights=true", "trainer.max_epochs=1"]
    ends = {}
    for method in ("fp16", "powersgd", "sign", "qsgd"):
        extra = ["strategy.powersgd_start_step=2"] if method == "powersgd" else []
        m = run(tiny_data, tmp_path / method, *common, f"strategy.compression={method}", *extra)
        weights = worker_weights(tmp_path / method, 4, "weights")
        assert furthest(weights[:1], weights[3:]) == 0, method
        fp32 = sum(t.numel() for t in weights[0].values()) * 4 * m["steps_per_worker"][0]
        assert 0 < m["comm_bytes"][0] < fp32 and m["sim_time_s"] > 0, method
        ends[method] = weights[:1]
    assert min(furthest(ends[a], ends[b]) for a in ends for b in ends if a < b) > 1e-6


def test_one_simulated_worker_is_a_one_worker_run(tiny_data, tmp_path):
    one = run(tiny_data, tmp_path / "one", *MOMENTUM, "record_weights=true", "trainer.max_epochs=1")
    sim = run(tiny_data, tmp_path / "sim", *MOMENTUM, "record_weights=true", "trainer.max_epochs=1", "simulate=true")
    assert furthest(worker_weights(tmp_path / "sim", 1, "weights"), worker_weights(tmp_path / "one", 1, "weights")) == 0
    assert sim["test_acc"] == one["test_acc"] and sim["sim_time_s"] > 0 and "sim_time_s" not in one


def test_a_simulated_run_writes_a_real_runs_outputs_for_every_worker_and_its_simulated_time(tiny_data, tmp_path):
    m = run(
        tiny_data, tmp_path / "sim", "workers=8", "strategy=model_averaging", "strategy.period=2", "simulate=true",
        "record_weights=true", "network.bandwidth_gbps=1", "early_stop.target_acc=0.35", "trainer.max_epochs=3",
        *MOMENTUM, "optimizer.lr=0.05",
    )  # fmt: skip
    assert m["status"] == "completed" and m["simulate"] is True and m["world_size"] == 8
    assert m["network"] == {"bandwidth_gbps": 1.0, "latency_ms": 0.05, "compute_scale": 1.0}
    assert len(m["worker_test_acc"]) == 8 and len(m["comm_bytes"]) == 8 and len(m["steps_per_worker"]) == 8
    epochs = m["history"]
    assert [h["sim_time_s"] for h in epochs] == pytest.approx(
        [sum(h["sim_epoch_s"] for h in epochs[: i + 1]) for i in range(len(epochs))], abs=1e-5
    )
    assert m["sim_time_s"] > epochs[-1]["sim_time_s"] > 0  # and the final average's all-reduce
    assert m["sim_time_to_target_s"] is not None and m["sim_time_to_target_s"] <= m["sim_time_s"]
    # every sample of every worker counted, per second of this machine
    assert epochs[0]["samples"] == 512 and epochs[0]["samples_per_s"] > 0
    acc = tensorboard(tmp_path / "sim")
    assert scalars(acc, "sim/cumulative_s") == pytest.approx([h["sim_time_s"] for h in epochs], abs=1e-6)
    assert len(scalars(acc, "sim/epoch_s")) == len(epochs)
    for r in range(8):  # each worker's own figures, as worker processes write them
        assert len(scalars(acc, f"worker/{r}/train_loss")) == len(scalars(acc, f"worker/{r}/val_acc")) == len(epochs)
    assert scalars(acc, "worker/0/train_loss") != scalars(acc, "worker/7/train_loss")  # on their own batches
    assert sorted(p.name for p in (tmp_path / "sim" / "weights").iterdir()) == [f"rank{r}.pt" for r in range(8)]
    checkpoint = torch.load(tmp_path / "sim" / "checkpoints" / "last.ckpt", weights_only=False)
    assert [t.shape[0] for t in checkpoint["psgd_simulated_replicas"]] == [8] * 10  # every worker's parameters
    assert undocumented(tmp_path / "sim") == []


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["strategy=hogwild"], "simulate=true is invalid with strategy=hogwild: HogWild's point is real shared memory"),
        (["network.bandwidth_gbps=0"], "network.bandwidth_gbps=0 is invalid: Input should be greater than 0"),
        (["network.latency_ms=-1"], "network.latency_ms=-1 is invalid: Input should be greater than 0"),
        (["network.compute_scale=0"], "network.compute_scale=0 is invalid: Input should be greater than 0"),
        (["optimizer=novograd"], "optimizer._target_=torch_optimizer.NovoGrad is invalid with simulate=true: its"),
        (["trainer.num_nodes=2"], "trainer.num_nodes=2 is invalid with simulate=true: simulated workers are one"),
        (["trainer.accumulate_grad_batches=2"], "trainer.accumulate_grad_batches=2 is invalid with simulate=true"),
    ],
)
def test_what_simulation_cannot_run_is_one_line(overrides, said):
    with pytest.raises(ConfigError) as e:
        check_values(compose_cfg("simulate=true", "workers=4", *overrides))
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_a_model_with_batchnorm_and_a_run_that_would_not_fit_are_refused_before_any_replica(tiny_data, tmp_path):
    with pytest.raises(ConfigError, match=r"^model=lab_cnn is invalid with simulate=true: it keeps buffers"):
        run(tiny_data, tmp_path / "bn", "simulate=true", "workers=4", "model.batch_norm=true")
    with pytest.raises(ConfigError) as e:  # 10 million lab CNNs: terabytes
        run(tiny_data, tmp_path / "huge", "simulate=true", "workers=10000000")
    assert str(e.value).startswith("workers=10000000 is invalid with simulate=true here: 10000000 replicas of ")
    assert "GiB and this machine has" in str(e.value) and not (tmp_path / "huge").exists()


def test_shards_of_different_batch_counts_are_refused_in_one_line(tiny_data, tmp_path):
    """Simulated workers step together: shards that hold different numbers of batches are refused before training,
    with what to change."""
    from psgd.errors import DataError

    cases = [
        (["workers=3", "data.batch_size=85"], "iid: its 3 shards hold 2 to 3 batches of data.batch_size=85, and"),
        (["workers=3", "data.batch_size=85"], "use a data.batch_size or worker count that gives each shard as many"),
        (["workers=2", "data.partition=sizes", "data.partition_sizes=[0.7,0.3]"], "use data.partition=iid, or"),
    ]
    for overrides, said in cases:
        with pytest.raises(DataError) as e:
            run(tiny_data, tmp_path / "run", "simulate=true", *overrides)
        assert said in str(e.value) and "\n" not in str(e.value) and not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow  # two train.py processes, ~30 s: the default run's 8 minutes
def test_a_simulated_run_resumed_in_a_fresh_process_goes_on_exactly(tiny_data, tmp_path):
    """DiLoCo of 4 simulated workers (their replicas, momentum, θ_g and outer momentum in the checkpoint): resumed in
    a new process from the checkpoint of its first epoch, it ends where the run that went on did, every worker's
    weights bit for bit (before the final averaging)."""
    common = [f"data.root={tiny_data}", *TINY, *PLAIN, *MOMENTUM, "simulate=true", "workers=4", "strategy=diloco"]
    common += ["strategy.period=3", "strategy.save_replicas=true"]  # every 3 of 4 steps an epoch: across epochs
    straight = run_cli("train.py", *common, "checkpoint_every_epoch=true", f"hydra.run.dir={tmp_path / 'straight'}")
    epoch1 = tmp_path / "straight" / "checkpoints" / "epoch0.ckpt"
    resumed = run_cli("train.py", *common, f"ckpt_path={epoch1}", f"hydra.run.dir={tmp_path / 'resumed'}")
    assert straight.returncode == resumed.returncode == 0, resumed.stderr[-2000:]
    kept = worker_weights(tmp_path / "resumed", 4, "replicas")
    assert furthest(kept, worker_weights(tmp_path / "straight", 4, "replicas")) == 0
    m, whole = metrics(tmp_path / "resumed"), metrics(tmp_path / "straight")
    assert m["comm_bytes"] == whole["comm_bytes"] and m["periodic_averagings"] == whole["periodic_averagings"] == 2
    assert m["history"][0] == whole["history"][0]  # the first epoch's record, simulated time too, from the checkpoint
    assert m["sim_time_s"] > m["history"][0]["sim_time_s"] > 0  # the simulated clocks went on from the checkpoint's


@pytest.mark.slow  # two train.py processes
def test_a_simulated_compressed_ddp_run_resumed_in_a_fresh_process_goes_on_exactly(tiny_data, tmp_path):
    """DDP with top-k on 4 simulated workers, each worker's error feedback in the checkpoint as a worker process
    keeps its own: resumed in a new process from its first epoch's checkpoint, every worker's weights bit for bit."""
    common = [f"data.root={tiny_data}", *TINY, *PLAIN, *MOMENTUM, "simulate=true", "workers=4", "strategy=ddp"]
    common += ["strategy.compression=topk", "record_weights=true"]
    straight = run_cli("train.py", *common, "checkpoint_every_epoch=true", f"hydra.run.dir={tmp_path / 'straight'}")
    epoch1 = tmp_path / "straight" / "checkpoints" / "epoch0.ckpt"
    resumed = run_cli("train.py", *common, f"ckpt_path={epoch1}", f"hydra.run.dir={tmp_path / 'resumed'}")
    assert straight.returncode == resumed.returncode == 0, resumed.stderr[-2000:]
    errors = [state["error"] for state in torch.load(epoch1, weights_only=True)["psgd_compression"]["workers"]]
    assert len(errors) == 4 and not torch.equal(errors[0][0], errors[1][0])  # each worker's own
    assert (
        furthest(
            worker_weights(tmp_path / "resumed", 4, "weights"), worker_weights(tmp_path / "straight", 4, "weights")
        )
        == 0
    )


def test_a_straggler_slows_a_simulated_synchronous_run_by_its_factor(tiny_data, tmp_path):
    """The last of 4 simulated DDP workers 4x slower: every step waits for it, so the simulated time is about 4x
    (on a network fast enough that compute rules); its own measured time is this machine's, unslowed."""
    fast = ["workers=4", "network.bandwidth_gbps=10000", "network.latency_ms=0.000001", "simulate=true"]
    fast += ["trainer.max_epochs=1"]
    even = run(tiny_data, tmp_path / "even", *fast)
    slow = run(tiny_data, tmp_path / "slow", *fast, "stragglers.slowdown=[1,1,1,4]")
    assert 2.5 < slow["sim_time_s"] / even["sim_time_s"] < 6.5  # (two runs' measured compute: noisy when loaded)
    assert "straggler_wait_s" not in slow  # nobody slept: the slowdown is on the simulated clocks


def test_a_refused_simulation_is_one_line_exit_2_and_nothing_written(tmp_path):
    proc = run_cli("train.py", "simulate=true", "workers=4", "strategy=hogwild", f"hydra.run.dir={tmp_path / 'run'}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "simulate=true is invalid with strategy=hogwild" in lines[0]
    assert not (tmp_path / "run").exists()
