"""The GPU paths, through train.py as a user starts them: the dataset kept on the GPU, bf16 autocast,
DDP over NCCL with every gradient compression. They need a CUDA device and are skipped without one; on a GPU
machine:

    python -m pytest -m gpu -n 0      (one test at a time, as they passed on an H100 and an H200;
                                      -n 2 was not run on a GPU)

PSGD_TEST_ACCELERATOR=cpu runs the same tests on the CPU (on_device has no effect there and the
one-process DDP group is gloo): a check of the tests themselves where no GPU is lent.
"""

import os

import pytest
import torch
from conftest import run_cli
from helpers import metrics

ACCELERATOR = os.environ.get("PSGD_TEST_ACCELERATOR", "gpu")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(ACCELERATOR == "gpu" and not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TINY = ["quiet=true", "data.batch_size=32", "data.eval_batch_size=64", "trainer.max_epochs=3"]


def gpu_run(tiny_data, run_dir, *overrides: str) -> dict:
    proc = run_cli(
        "train.py", f"data.root={tiny_data}", "data.val_split=0", f"trainer.accelerator={ACCELERATOR}",
        f"hydra.run.dir={run_dir}", *TINY, *overrides,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = metrics(run_dir)
    assert m["status"] == "completed" and m["device"].startswith("cuda" if ACCELERATOR == "gpu" else "cpu"), m
    return m


@pytest.fixture(scope="module")
def on_device_run(tiny_data, tmp_path_factory) -> dict:
    return gpu_run(tiny_data, tmp_path_factory.mktemp("gpu") / "on_device", "data.on_device=true")


def test_the_dataset_on_the_device_trains_as_batches_made_on_the_host(on_device_run, tiny_data, tmp_path):
    host = gpu_run(tiny_data, tmp_path / "host", "data.on_device=false")
    assert on_device_run["test_acc"] > 0.5 and host["test_acc"] > 0.5  # chance is 0.1
    # the same seed, samples and normalisation: only the kernels' rounding may differ
    assert on_device_run["test_acc"] == pytest.approx(host["test_acc"], abs=0.05)
    assert [h["samples"] for h in on_device_run["history"]] == [h["samples"] for h in host["history"]]


def test_bf16_autocast_learns(tiny_data, tmp_path):
    m = gpu_run(tiny_data, tmp_path / "bf16", "data.on_device=true", "trainer.precision=bf16-mixed")
    assert m["test_acc"] > 0.5


def test_ddp_over_nccl_in_one_process_trains_as_the_run_without_ddp(on_device_run, tiny_data, tmp_path):
    # all-reducing one worker's gradients changes nothing: the same run, through NCCL
    m = gpu_run(tiny_data, tmp_path / "ddp", "data.on_device=true", "strategy.ddp_for_one_worker=true")
    assert (m["lightning_strategy"], m["world_size"]) == ("DDPStrategy", 1)
    assert m["test_acc"] == pytest.approx(on_device_run["test_acc"], abs=0.05)


def test_more_workers_than_gpus_is_one_line_before_any_worker_starts(tiny_data, tmp_path):
    if ACCELERATOR != "gpu":
        pytest.skip("counts CUDA devices")
    too_many = torch.cuda.device_count() + 1
    run_dir = tmp_path / "too_many"
    proc = run_cli(
        "train.py", f"data.root={tiny_data}", "data.val_split=0", "trainer.accelerator=gpu", f"workers={too_many}",
        f"hydra.run.dir={run_dir}", *TINY,
    )  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"workers={too_many} is invalid on GPU" in proc.stderr and not run_dir.exists()


def test_a_compiled_network_trains_as_the_eager_one(on_device_run, tiny_data, tmp_path):
    """compile=reduce-overhead on GPU: the network's forward and backward replayed as CUDA graphs, whose
    outputs each replay overwrites; the training counts keep outputs over several steps (log_every_n_steps),
    so a kept output that was not copied fails the run or miscounts. On CPU: compile=true."""
    mode = "reduce-overhead" if ACCELERATOR == "gpu" else "true"
    m = gpu_run(tiny_data, tmp_path / "compiled", "data.on_device=true", f"compile={mode}")
    assert m["test_acc"] == pytest.approx(on_device_run["test_acc"], abs=0.05)
    eager = on_device_run["history"]
    assert [h["samples"] for h in m["history"]] == [h["samples"] for h in eager]
    # the same samples and the same steps: the training accuracy counted from the kept outputs agrees
    assert m["history"][-1]["train_acc"] == pytest.approx(eager[-1]["train_acc"], abs=0.05)


def test_a_compiled_network_under_ddp_over_nccl_trains_as_the_eager_one(on_device_run, tiny_data, tmp_path):
    """compile=reduce-overhead inside DDP (the network compiled in place, DDP's reducer hooked on its
    parameters; one process, so the all-reduce itself changes nothing). On CPU: compile=true over gloo."""
    mode = "reduce-overhead" if ACCELERATOR == "gpu" else "true"
    m = gpu_run(
        tiny_data,
        tmp_path / "compiled_ddp",
        "data.on_device=true",
        f"compile={mode}",
        "strategy.ddp_for_one_worker=true",
    )
    assert (m["lightning_strategy"], m["world_size"]) == ("DDPStrategy", 1)
    assert m["test_acc"] == pytest.approx(on_device_run["test_acc"], abs=0.05)
    # as the compiled run without DDP: the same samples, a falling loss and the same training accuracy
    # (on an H200 the losses were 1.888, 0.500, 0.051 against eager's 1.877, ..., 0.083: a loss this
    # small is not compared, compiled kernels round otherwise)
    eager = on_device_run["history"]
    assert [h["samples"] for h in m["history"]] == [h["samples"] for h in eager]
    assert m["history"][-1]["train_loss"] < m["history"][0]["train_loss"] / 4
    assert m["history"][-1]["train_acc"] == pytest.approx(eager[-1]["train_acc"], abs=0.05)


def test_the_fused_update_trains_as_torchs_per_tensor_loop(on_device_run, tiny_data, tmp_path):
    """optimizer.fused=true (the default) is one CUDA kernel per update; false is torch's loop over tensors.
    The same run either way: only the kernels' rounding may differ."""
    loop = gpu_run(tiny_data, tmp_path / "loop", "data.on_device=true", "optimizer.fused=false")
    fused_loss = [h["train_loss"] for h in on_device_run["history"]]
    assert [h["train_loss"] for h in loop["history"]] == pytest.approx(fused_loss, rel=0.05)
    assert fused_loss[-1] < fused_loss[0]
    assert loop["test_acc"] == pytest.approx(on_device_run["test_acc"], abs=0.05)


@pytest.mark.parametrize(("written", "resumed"), [("false", "true"), ("true", "false")])
def test_adam_resumed_on_the_gpu_updates_as_the_resumed_run_says(tiny_data, tmp_path, written, resumed):
    """A resume takes this run's optimizer.fused, not the checkpoint's (module._update_as_configured). On
    CUDA the fused update needs Adam's step counts on the GPU, torch's foreach loop does not: the state
    is placed as the resumed run's update needs before it runs its first step, or that step fails."""
    first = tmp_path / "first"
    gpu_run(tiny_data, first, "optimizer=adam", f"optimizer.fused={written}", "checkpoint_every_epoch=true",
            "trainer.max_epochs=2")  # fmt: skip
    m = gpu_run(
        tiny_data,
        tmp_path / "resumed",
        "optimizer=adam",
        f"optimizer.fused={resumed}",
        "trainer.max_epochs=2",
        f"ckpt_path={first / 'checkpoints' / 'epoch0.ckpt'}",
    )
    assert m["epochs"] == 2
    saved = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert saved["epoch"] == 1  # it went on from the checkpoint's epoch and trained the second
    optimizer = saved["optimizer_states"][0]
    assert optimizer["param_groups"][0]["fused"] is (resumed == "true")
    # every parameter's step count is both epochs' steps: the moments went on, they did not start over
    one_epoch = torch.load(first / "checkpoints" / "epoch0.ckpt", weights_only=True, map_location="cpu")["global_step"]
    assert {state["step"].item() for state in optimizer["state"].values()} == {2 * one_epoch}


@pytest.mark.parametrize("compression", ["none", "fp16", "bf16", "powersgd", "topk", "sign", "qsgd"])
def test_each_compression_over_nccl_trains_and_resumes_on_the_gpu(on_device_run, tiny_data, tmp_path, compression):
    """Every compression hook on the GPU, in a one-process NCCL group (the arithmetic on the device, QSGD's draws
    from a CUDA generator, PowerSGD's QR on the device), the lab CNN in several buckets (bucket_cap_mb 0.05): it
    learns (`none` as the run without DDP), counts its bytes, and a resume from the first epoch goes on with the
    state it saved (on the CPU in the checkpoint)."""
    more = ["strategy.ddp_for_one_worker=true", f"strategy.compression={compression}", "strategy.bucket_cap_mb=0.05"]
    more += ["data.on_device=true", *(["strategy.powersgd_start_step=2"] if compression == "powersgd" else [])]
    m = gpu_run(tiny_data, tmp_path / "straight", *more, "checkpoint_every_epoch=true")
    assert (m["lightning_strategy"], m["world_size"], m["compression"]) == ("DDPStrategy", 1, compression)
    assert m["test_acc"] > 0.5 and m["comm_bytes"][0] > 0  # chance is 0.1; a lossy method learns otherwise
    if compression == "none":
        assert m["test_acc"] == pytest.approx(on_device_run["test_acc"], abs=0.05)
    first = tmp_path / "straight" / "checkpoints" / "epoch0.ckpt"
    resumed = gpu_run(tiny_data, tmp_path / "resumed", *more, f"ckpt_path={first}")
    assert resumed["epochs"] == m["epochs"] and resumed["test_acc"] == pytest.approx(m["test_acc"], abs=0.05)
    saved = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)  # on any machine
    assert ("psgd_compression" in saved) is (compression in ("powersgd", "topk", "sign", "qsgd"))
