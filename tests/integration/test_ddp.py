"""Real multi-process DDP on CPU (gloo), started through train.py."""

import statistics
from pathlib import Path

import pytest
import pytorch_lightning as L
import torch
from conftest import compose_cfg, run_cli
from helpers import hparam_columns, metrics, scalars, tensorboard, undocumented

from psgd.run import train

pytestmark = pytest.mark.distributed

TINY = ["quiet=true", "data.batch_size=32", "data.eval_batch_size=64", "record_shards=true"]


# two workers, a warm-up per step and linear lr scaling: the `ddp2` run
DDP2 = [
    "strategy=ddp",
    "workers=2",
    "trainer.max_epochs=3",
    "lr_scaling=linear",
    "scheduler=warmup",
    "scheduler.warmup_epochs=1.5",
    "scheduler.interval=step",  # the lr moves after every step; its length counts each worker's own steps
    *TINY,
]


@pytest.fixture(scope="module")
def ddp2(tiny_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ddp2") / "run"
    proc = run_cli("train.py", *DDP2, f"data.root={tiny_data}", "data.val_split=0", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr
    return run_dir


def shards(run_dir, epoch, workers):
    return [torch.load(run_dir / "shards" / f"epoch{epoch}_rank{r}.pt") for r in range(workers)]


def assert_disjoint_and_covering(parts, n):
    sets = [set(p.tolist()) for p in parts]
    assert sum(len(s) for s in sets) == sum(len(p) for p in parts)  # no repeats within a worker
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1 :])
    assert set().union(*sets) == set(range(n))


def test_two_workers_train_on_disjoint_shards_covering_the_data(ddp2):
    for epoch in range(3):
        assert_disjoint_and_covering(shards(ddp2, epoch, 2), 512)
    # reshuffled every epoch: rank 0 sees a different shard in epoch 1 than in epoch 0
    assert set(shards(ddp2, 0, 2)[0].tolist()) != set(shards(ddp2, 1, 2)[0].tolist())


def test_two_worker_metrics_and_tensorboard(ddp2):
    assert undocumented(ddp2) == []  # every key and tag is in the README (the all-reduce figures too)
    m = metrics(ddp2)
    assert (m["world_size"], m["workers"], m["status"]) == (2, 2, "completed")
    assert m["parallel_batches"] == 2  # each update averages both workers' batches
    assert m["test_acc"] > 0.2  # twice chance after 12 warm-up steps: it learned (accuracy is tested elsewhere)
    assert m["lr"] == pytest.approx(0.04)  # 0.02 x 2 workers (linear scaling)
    assert [h["samples"] for h in m["history"]] == [512] * 3  # summed over both workers
    acc = tensorboard(ddp2)
    # warm-up from lr/workers to lr over 1.5 epochs (12 of each worker's 8 steps per epoch), then flat;
    # the lr at each epoch's start
    assert scalars(acc, "lr") == pytest.approx([0.02, 0.02 + 0.02 / 1.5, 0.04])
    assert [h["lr"] for h in m["history"]] == pytest.approx([0.02, 0.02 + 0.02 / 1.5, 0.04], abs=1e-6)  # the same
    assert scalars(acc, "val/acc") == pytest.approx([h["val_acc"] for h in m["history"]], abs=1e-6)
    assert len(scalars(acc, "time/samples_per_s")) == 3
    # rank 0's loss within the epochs: one point per epoch here (8 steps < log_every_n_steps), one writer
    assert [e.step for e in acc.Scalars("train/loss_step")] == [7, 15, 23]
    # each worker's own training loss per epoch; equal shards, so train/loss is their mean (rank 0's is the step's)
    own = [scalars(acc, f"worker/{r}/train_loss") for r in range(2)]
    assert [(a + b) / 2 for a, b in zip(*own)] == pytest.approx(scalars(acc, "train/loss"), abs=1e-5)
    assert own[0] == pytest.approx(scalars(acc, "train/loss_step"), abs=1e-5) and own[0] != own[1]
    assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")
    # the gradient all-reduce, clocked by psgd's comm hook: every epoch has its figures, in the history and TensorBoard
    for h in m["history"]:
        assert h["allreduce_ms"] >= h["allreduce_wait_ms"] >= 0 and h["allreduce_ms"] > 0, h
    assert scalars(acc, "ddp/allreduce_wait_ms") == pytest.approx([h["allreduce_wait_ms"] for h in m["history"]])
    assert 0 <= m["allreduce_wait_share"] < 1 and m["allreduce_ms"] >= m["allreduce_wait_ms"] >= 0
    # and a column of the HParams tab, beside the accuracy and the speed
    columns = hparam_columns(acc)
    assert {"ddp/allreduce_wait_ms", "test/acc", "time/samples_per_s"} <= columns
    assert not any(c.startswith(("hogwild/", "averag")) for c in columns)  # only what a DDP run writes


def test_a_straggler_holds_every_step_and_the_other_worker_waits_for_it_in_the_allreduce(ddp2, tiny_data, tmp_path):
    """stragglers.slowdown=[1, 3]: worker 1 sleeps twice its compute after each step. Every DDP step waits for the
    slowest worker, so the epoch lasts at least worker 1's sleep and compute (its compute: half its sleep), and
    worker 0 waits out worker 1's sleeps in the all-reduce (all but the last step's, which it waits out at the
    epoch's end: 7 of 8 here, less where worker 0's own next step overlaps), up to two thirds of its time (a third
    in the mean over both workers); the ddp2 run, whose workers keep pace, waits less."""
    cfg = compose_cfg(
        f"data.root={tiny_data}",
        "data.val_split=0",
        "workers=2",
        "trainer.max_epochs=1",
        "stragglers.slowdown=[1,3]",
        *TINY,
    )
    slow = train(cfg, tmp_path / "run")
    slept, comm = slow["straggler_wait_s"], slow["comm_s"]
    assert slept[0] == 0 and slept[1] > 0 and slow["steps_per_worker"] == [8, 8]
    assert slow["train_time_s"] >= 1.5 * slept[1]
    assert comm[0] >= 0.5 * slept[1] and comm[0] > 3 * comm[1], slow
    assert slow["allreduce_wait_share"] > 0.2, slow
    # (the pace-keeping run's waits are the machine's noise: under a loaded suite on 2 cores 6.5 ms against 12.0)
    assert metrics(ddp2)["allreduce_wait_ms"] < slow["allreduce_wait_ms"]
    assert slow["stragglers"] == {"slowdown": [1, 3], "delay_s": 0.0, "distribution": "none", "shift_s": 0.0}
    assert metrics(ddp2)["stragglers"] is None and "straggler_wait_s" not in metrics(ddp2)  # off: nothing
    events = tensorboard(tmp_path / "run")
    assert scalars(events, "stragglers/wait_s") == pytest.approx([slept[1] / 2], abs=1e-3)
    assert "stragglers/wait_s" in hparam_columns(events)  # a column of the HParams tab
    assert undocumented(tmp_path / "run") == []


class CountsBroadcasts(L.Callback):
    """Counts each worker's torch.distributed.broadcast calls from its first training step's start to its
    last step's end, into <folder>/broadcasts<rank>."""

    def __init__(self, folder):
        self.folder, self.counting, self.count = str(folder), False, 0

    def on_train_start(self, trainer, pl_module):
        real = torch.distributed.broadcast

        def counted(*args, **kwargs):
            self.count += self.counting
            return real(*args, **kwargs)

        torch.distributed.broadcast = counted

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.counting = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.counting = batch_idx < trainer.num_training_batches - 1  # (between steps too: the next one's start)

    def on_train_end(self, trainer, pl_module):
        folder = Path(self.folder)
        folder.mkdir(exist_ok=True)
        (folder / f"broadcasts{trainer.global_rank}").write_text(str(self.count))


def test_a_ddp_step_broadcasts_nothing(tiny_data, tmp_path):
    """The gradient all-reduce is a DDP step's one collective: Lightning's per-step broadcast of rank 0's
    SIGTERM flag (one more collective a step; +3 % samples/s without it for 2 CPU workers) is replaced by a
    local check in psgd's DDP strategy, as in its other strategies."""
    cfg = compose_cfg(f"data.root={tiny_data}", "data.val_split=0", "workers=2", "trainer.max_epochs=1", *TINY)
    train(cfg, tmp_path / "run", callbacks=[CountsBroadcasts(tmp_path / "counts")])
    assert metrics(tmp_path / "run")["history"][-1]["step"] == 8  # 8 steps: 7 between them to check
    assert [(tmp_path / "counts" / f"broadcasts{r}").read_text() for r in (0, 1)] == ["0", "0"]


def test_workers_from_the_fork_server_train_exactly_as_spawned_ones(ddp2, tiny_data, tmp_path):
    """psgd's fork server (the default on CPU) forks its workers already loaded; each must still get its
    own copy of the model (torch hands the model over in shared memory: two DDP workers stepping one copy
    trained to other weights), the launcher's random state and environment, as a spawned worker does."""
    spawned = tmp_path / "spawned"
    spawn = ["strategy.start_method=spawn", f"data.root={tiny_data}", "data.val_split=0", f"hydra.run.dir={spawned}"]
    proc = run_cli("train.py", *DDP2, *spawn)
    assert proc.returncode == 0, proc.stderr
    assert (metrics(ddp2)["start_method"], metrics(spawned)["start_method"]) == ("forkserver", "spawn")
    ckpts = (torch.load(d / "checkpoints" / "last.ckpt", weights_only=True) for d in (ddp2, spawned))
    forked, spawn = (c["state_dict"] for c in ckpts)
    assert forked.keys() == spawn.keys() and all(torch.equal(forked[k], spawn[k]) for k in forked)
    assert [h["val_acc"] for h in metrics(ddp2)["history"]] == [h["val_acc"] for h in metrics(spawned)["history"]]


def test_a_ddp_update_is_one_workers_update_on_both_workers_batches(tiny_data, tmp_path):
    """Synchronous DDP, checked against its definition: each step all-reduces the gradients, so two
    workers taking every other sample of the epoch's order train exactly as one worker averaging the
    same two micro-batches per update (parallel_batches=2: both see the epoch's first 2 x 32 samples at
    step 0, and so on), momentum and cosine schedule included. No dropout: its random draws are the
    one thing each worker makes differently."""
    common = [f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=1", "model.dropout=0", *TINY]
    proc = run_cli("train.py", *common, "workers=2", f"hydra.run.dir={tmp_path / 'ddp'}")
    assert proc.returncode == 0, proc.stderr
    train(compose_cfg(*common, "parallel_batches=2"), tmp_path / "one")
    runs = ("ddp", "one")
    ddp, one = (torch.load(tmp_path / n / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"] for n in runs)
    m = {n: metrics(tmp_path / n) for n in runs}
    assert (m["ddp"]["world_size"], m["one"]["world_size"]) == (2, 1)
    assert m["ddp"]["parallel_batches"] == m["one"]["parallel_batches"] == 2
    assert [h["step"] for h in m["ddp"]["history"]] == [h["step"] for h in m["one"]["history"]] == [8]
    assert "allreduce_wait_ms" in m["ddp"] and "allreduce_wait_ms" not in m["one"]  # one worker: no all-reduce
    for key in one:
        torch.testing.assert_close(ddp[key], one[key], rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # ~25 s: 4 processes on 2 cores; 4-way shards are unit-tested, 2-worker DDP runs by default
def test_four_processes_via_trainer_devices(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "train.py",
        "strategy=ddp",
        "trainer.devices=4",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=1",
        f"hydra.run.dir={run_dir}",
        *TINY,
    )
    assert proc.returncode == 0, proc.stderr
    m = metrics(run_dir)
    assert (m["world_size"], m["threads_per_worker"]) == (4, max(1, m["threads_per_worker"]))
    assert_disjoint_and_covering(shards(run_dir, 0, 4), 512)


def test_uneven_sizes_partition_runs_in_lockstep_without_hanging(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "train.py",
        "workers=2",
        "data.partition=sizes",
        "data.partition_sizes=[0.7,0.3]",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=1",
        f"hydra.run.dir={run_dir}",
        *TINY,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    big, small = shards(run_dir, 0, 2)
    # the 0.3 shard (154 samples) allows 5 batches of 32; the 0.7 worker takes the same 5 steps
    assert (len(small), len(big)) == (154, 160)
    assert metrics(run_dir)["history"][0]["samples"] == 314


def test_a_shard_smaller_than_the_batch_is_one_step_in_lockstep(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    over = ["workers=2", "data.partition=sizes", "data.partition_sizes=[0.7,0.3]", "trainer.max_epochs=1", *TINY]
    proc = run_cli(
        "train.py",
        *over,
        "data.batch_size=200",
        f"data.root={tiny_data}",
        "data.val_split=0",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 0, proc.stderr
    big, small = shards(run_dir, 0, 2)
    assert (len(small), len(big)) == (154, 200)  # the whole small shard is the one step; the other takes 200


@pytest.mark.slow  # ~20 s: two runs; the flag's value check is in test_config
def test_one_worker_runs_without_ddp_unless_asked_and_then_trains_the_same(tiny_data, tmp_path):
    # ddp_for_one_worker: a one-process gloo group around the same training (what DDP itself costs);
    # all-reducing one worker's gradients changes nothing, so the weights equal the plain run's
    runs = {}
    for wrap in (False, True):
        run_dir = tmp_path / f"wrap{wrap}"
        proc = run_cli(
            "train.py",
            f"data.root={tiny_data}",
            "data.val_split=0",
            "trainer.max_epochs=1",
            f"strategy.ddp_for_one_worker={str(wrap).lower()}",
            f"hydra.run.dir={run_dir}",
            *TINY,
        )
        assert proc.returncode == 0, proc.stderr
        runs[wrap] = run_dir
    assert metrics(runs[False])["lightning_strategy"] == "auto"
    wrapped = metrics(runs[True])
    assert (wrapped["lightning_strategy"], wrapped["world_size"], wrapped["status"]) == ("DDPStrategy", 1, "completed")
    plain, ddp = (torch.load(runs[w] / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"] for w in runs)
    for key in plain:
        torch.testing.assert_close(ddp[key], plain[key], rtol=1e-5, atol=1e-6)
    assert wrapped["test_acc"] == pytest.approx(metrics(runs[False])["test_acc"], abs=1e-3)


def test_a_run_cut_inside_an_epoch_resumes_with_another_worker_count(tiny_data, tmp_path):
    """One worker stopped by trainer.max_steps=23, 7 batches into its second 16-batch epoch; resumed
    with two workers (8 batches an epoch each), the cut epoch trains again from its start over both
    workers' shards, then epoch 3."""
    common = [f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=3", "scheduler=none", *TINY]
    cut = train(compose_cfg(*common, "trainer.max_steps=23"), tmp_path / "cut")
    assert [h["step"] for h in cut["history"]] == [16, 23]
    resumed = train(compose_cfg(*common, "workers=2", f"ckpt_path={tmp_path / 'cut'}"), tmp_path / "resumed")
    assert [(h["epoch"], h["step"], h["samples"]) for h in resumed["history"]] == [
        (1, 16, 512),
        (2, 24, 512),
        (3, 32, 512),
    ]
    assert resumed["history"][0] == cut["history"][0]
    assert all(h["train_loss"] is not None for h in resumed["history"]) and resumed["status"] == "completed"
    assert_disjoint_and_covering(shards(tmp_path / "resumed", 1, 2), 512)  # epoch 2: both shards, whole


def compressed(tiny_data, run_dir: Path, compression: str, *more: str, cli: bool = False) -> dict:
    """A 2-worker DDP run on tiny data, its gradients compressed; `cli`: through train.py in a fresh process."""
    overrides = [
        f"data.root={tiny_data}",
        "data.val_split=0",
        "workers=2",
        "trainer.max_epochs=2",
        f"strategy.compression={compression}",
    ]
    if cli:
        proc = run_cli("train.py", *overrides, *TINY, *more, f"hydra.run.dir={run_dir}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        return metrics(run_dir)
    return train(compose_cfg(*overrides, *TINY, *more), run_dir)


# a compression's settings for its resume test: PowerSGD from its third step, over the lab CNN's gradients in
# several DDP buckets (bucket_cap_mb 0.05), which DDP groups otherwise in a resumed run's first step
RESUMED = {
    "powersgd": ["strategy.powersgd_start_step=2", "strategy.bucket_cap_mb=0.05"],
    "topk": ["strategy.topk_ratio=0.05", "strategy.bucket_cap_mb=0.05"],
    "sign": ["strategy.bucket_cap_mb=0.05"],
    "qsgd": ["strategy.bucket_cap_mb=0.05"],
}


@pytest.mark.parametrize(
    "compression",
    # ~20 s each: two runs; one by default, and the hooks' resume into a fresh DDP is unit-tested for every method
    ["powersgd", *(pytest.param(c, marks=pytest.mark.slow) for c in ("topk", "sign", "qsgd"))],
)
def test_a_compressed_run_resumed_goes_on_exactly_and_counts_its_bytes(tiny_data, tmp_path, compression):
    """Each worker's compression state (error, PowerSGD's Qs and random stream, QSGD's step) is in its checkpoints:
    2 epochs, and 1 epoch resumed by train.py in fresh processes for a second, end with the same weights and the
    same state on every worker (a fresh state, or one kept by bucket, would not)."""
    settings = RESUMED[compression]
    compressed(tiny_data, tmp_path / "straight", compression, *settings, "checkpoint_every_epoch=true")
    resumed = tmp_path / "resumed"
    first = tmp_path / "straight" / "checkpoints" / "epoch0.ckpt"
    compressed(tiny_data, resumed, compression, *settings, f"ckpt_path={first}", cli=True)
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert max((a["state_dict"][k] - b["state_dict"][k]).abs().max().item() for k in a["state_dict"]) <= 1e-6
    assert a["psgd_compression"]["compression"] == compression
    # the state too, to rounding (the first resumed step's matrices lie elsewhere in DDP's buffer)
    for saved, again in zip(a["psgd_compression"]["workers"], b["psgd_compression"]["workers"], strict=True):
        for x, y in zip(tensors(saved), tensors(again), strict=True):
            assert torch.allclose(x.double(), y.double(), atol=1e-5, rtol=1e-4)
    if compression != "qsgd":  # its state is a step count
        assert any(t.abs().sum() > 0 for t in tensors(a["psgd_compression"]["workers"][1]))
    m = metrics(tmp_path / "straight")
    assert m["compression"] == compression and m["comm_bytes"][0] == m["comm_bytes"][1] > 0
    acc = tensorboard(tmp_path / "straight")
    assert scalars(acc, "comm/bytes") == pytest.approx([statistics.fmean(h["comm_bytes"]) for h in m["history"]])
    assert len(scalars(acc, "comm/s")) == 2 and undocumented(tmp_path / "straight") == []
    assert metrics(resumed)["comm_bytes"] == m["comm_bytes"]  # the resumed run's record holds the first epoch too


def tensors(state) -> list[torch.Tensor]:
    """Every tensor in a compressor's state (dicts, lists), in order."""
    if torch.is_tensor(state):
        return [state]
    items = state.values() if isinstance(state, dict) else state if isinstance(state, list | tuple) else []
    return [t for item in items for t in tensors(item)]


@pytest.mark.parametrize(
    "compression",
    # all slow (~10 s each): the default run has topk's (resume test above) and the hooks' exactness tests
    [pytest.param(c, marks=pytest.mark.slow) for c in ("powersgd", "none", "fp16", "bf16", "sign", "qsgd")],
)
def test_each_compression_trains_two_real_workers_and_counts_what_they_sent(tiny_data, tmp_path, compression):
    """Each method on 2 gloo processes: it completes, learns, and writes its counts (none's are the full gradient;
    fp16 and bf16 half of it; powersgd from its third step fewer; sign and qsgd a fraction, sent as fp32)."""
    more = ["strategy.powersgd_start_step=2"] if compression == "powersgd" else []
    m = compressed(tiny_data, tmp_path / "run", compression, *more)
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    full = m["history"][-1]["step"] * sum(
        v.numel() * 4 for k, v in state.items() if k.startswith("net.") and v.is_floating_point()
    )
    share = {"none": 1.0, "fp16": 0.5, "bf16": 0.5}
    assert m["status"] == "completed" and m["test_acc"] > 0.2
    assert m["comm_bytes"][0] == m["comm_bytes"][1] > 0 and m["comm_calls"][0] > 0
    if compression in share:
        assert m["comm_bytes"] == m["comm_sent_bytes"] == [full * share[compression]] * 2
    else:
        assert m["comm_bytes"][0] < full / 2
    if compression in ("sign", "qsgd"):  # gloo carries the quantised values as fp32
        assert m["comm_sent_bytes"] == [full] * 2


def test_a_run_too_short_for_powersgd_says_it_runs_as_plain_ddp(tiny_data, tmp_path):
    """PowerSGD all-reduces plainly for its first strategy.powersgd_start_step steps: a run that ends before
    then is plain DDP, and says so at its start (it did without a word)."""
    over = ["strategy.ddp_for_one_worker=true", "strategy.compression=powersgd", "trainer.max_steps=3", *TINY]
    proc = run_cli("train.py", f"data.root={tiny_data}", "data.val_split=0", f"hydra.run.dir={tmp_path / 'run'}", *over)
    assert proc.returncode == 0, proc.stderr
    said = "psgd: strategy.compression=powersgd compresses from step 10 (strategy.powersgd_start_step) and this run "
    assert f"{said}takes 3: it runs as plain DDP" in proc.stdout.splitlines()
