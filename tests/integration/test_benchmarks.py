"""The benchmark scripts run and report what they claim (short runs; the figures are not checked).
The scripts that split the framework overhead further (step_overhead, calls_per_step, step_phases,
overhead_manual) are tested in the slow suite, `python -m pytest -m slow`."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, make_mnist_like

sys.path.insert(0, str(ROOT / "benchmarks"))
import compare  # noqa: E402


def benchmark(script: str, *args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """benchmarks/<script> with `args`, run as a user runs it; its output captured as text."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # the overhead-splitting scripts (~10 s each): pytest -m slow
def test_step_overhead_reports_every_loop_per_step(tmp_path):
    proc = benchmark("step_overhead.py", "--steps", "200", "--repeats", "1", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads((tmp_path / "step_overhead.json").read_text())["us_per_step"]
    assert list(runs) == [
        "vanilla loop",
        "Lightning, smallest LightningModule",
        "  + psgd's NoProfiler",
        "  + plain _current_fx_name write",
        "psgd's Classifier (+ metric counting)",
        "manual optimization (not adopted)",
    ]
    assert all(len(v) == 1 and v[0] > 0 for v in runs.values())
    # any Lightning loop does more per step than zero_grad, forward, backward and an SGD step
    assert min(v[0] for k, v in runs.items() if k != "vanilla loop") > runs["vanilla loop"][0]
    table = (tmp_path / "step_overhead.md").read_text()
    assert table.count("\n| ") == 7  # header + 6 loops
    assert "psgd's Classifier" in proc.stdout


@pytest.mark.slow  # the overhead-splitting scripts (~10 s each): pytest -m slow
def test_calls_per_step_counts_each_loop_and_psgd_skips_the_empty_hooks(tiny_data, tmp_path):
    args = [f"--data-root={tiny_data}", "--skip=2", "--steps=4", "--batch-size=16", f"--results={tmp_path}"]
    proc = benchmark("calls_per_step.py", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    per_step = json.loads((tmp_path / "calls_per_step.json").read_text())["per_step"]
    calls = {name: v["python"] for name, v in per_step.items()}
    assert list(calls) == [
        "vanilla loop",
        "leanest LightningModule",
        "smallest LightningModule",
        "psgd's run, every hook dispatched",
        "psgd's run",
    ]
    # a step is counted: forward, loss, backward and the optimizer are dozens of calls even in the vanilla loop
    assert 20 < calls["vanilla loop"] < calls["leanest LightningModule"] < calls["smallest LightningModule"]
    # the skipped hooks: ~6 per step, each ~8 calls per callback on the dispatch path
    assert calls["psgd's run"] < calls["psgd's run, every hook dispatched"] - 100
    table = (tmp_path / "calls_per_step.md").read_text()
    assert "psgd's run" in proc.stdout and table.count("\n| ") == 6  # header + 5 loops


@pytest.mark.slow  # the overhead-splitting scripts (~10 s each): pytest -m slow
def test_step_phases_splits_both_loops_steps_into_the_same_phases(tiny_data, tmp_path):
    args = [f"--data-root={tiny_data}", "--chunk=3", "--epochs=1", "--batch-size=16", "--repeats=1"]
    proc = benchmark("step_phases.py", *args, f"--results={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "step_phases.json").read_text())
    (run,) = out["runs"]
    batches = 512 // 16  # tiny_data holds 512 MNIST training images
    # every step of the timed epoch but its first is psgd's; a vanilla chunk follows every 3rd psgd step
    assert run["steps"] == {"psgd": batches - 1, "vanilla": batches // 3 * 3}
    med = out["median_us"]
    for loop in ("psgd", "vanilla"):
        assert list(med[loop]) == out["phases"] and all(us > 0 for us in med[loop].values())
        assert out["total_us"][loop] == pytest.approx(sum(med[loop].values()))
    # Lightning's loop between steps does far more than fetching: the margin is the benchmark's to report (alone
    # 4-5x the vanilla loop's time here; beside the rest of the slow suite, on 2 loaded cores, once 1.86x)
    assert med["psgd"]["next batch + loop"] > med["vanilla"]["next batch + loop"]
    table = (tmp_path / "step_phases.md").read_text()
    assert table.count("\n| ") == 7 and "step time ratio psgd / vanilla" in proc.stdout  # header, 5 phases, step


@pytest.mark.slow  # the overhead-splitting scripts (~10 s each): pytest -m slow
def test_step_phases_with_chunks_longer_than_an_epoch_is_a_one_line_error(tiny_data, tmp_path):
    args = [f"--data-root={tiny_data}", "--chunk=1000", "--epochs=1", "--repeats=1", f"--results={tmp_path}"]
    proc = benchmark("step_phases.py", *args)
    assert proc.returncode != 0 and "--chunk=1000" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "step_phases.json").exists()


@pytest.mark.slow  # the overhead-splitting scripts (~10 s each): pytest -m slow
def test_grad_lifetime_reports_each_loop_variant_and_psgd_with_its_zeroing_and_lightnings(tiny_data, tmp_path):
    import grad_lifetime

    args = [f"--data-root={tiny_data}", "--chunk=3", "--pairs=2", "--epochs=1", "--batch-size=16", "--repeats=1"]
    proc = benchmark("grad_lifetime.py", *args, f"--results={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "grad_lifetime.json").read_text())
    (loop,), (ours,) = out["minimal_loop"], out["psgd"]
    assert list(loop) == list(grad_lifetime.VARIANTS)
    assert all(v["median"] > 0 and v["sum_ratio"] > 0 and v["us_per_step"] > 0 for v in loop.values())
    # psgd's 32 batches of the timed epoch: chunks start at 0, 3, ..., 30; each one after the first is
    # timed when the next starts, alternately with psgd's zeroing and Lightning's
    assert list(ours) == list(grad_lifetime.PSGD_ROWS.values()) and [v["chunks"] for v in ours.values()] == [5, 5]
    table = (tmp_path / "grad_lifetime.md").read_text()
    assert table.count("\n| ") == 6 and "psgd as it is" in proc.stdout  # header + 5 rows


@pytest.mark.slow
def test_grad_lifetime_switches_the_zeroing_with_its_chunks(tiny_data, tmp_path):
    """What the psgd rows compare: in a chunk with psgd's zeroing, no gradient is left from one batch into
    the next; in one with Lightning's (LightningModule's optimizer_step and optimizer_zero_grad), the
    step's gradients stay until the next forward."""
    import grad_lifetime
    import pytorch_lightning as L

    from psgd.run import train

    cfg = compare.psgd_overhead_cfg(str(tiny_data), 1, 2, ["data.batch_size=16"])
    toggled, seen = grad_lifetime.Toggled(cfg, 3), []

    class Seen(L.Callback):  # after Toggled, inside a chunk: the zeroing of the batch before is the chunk's
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.current_epoch >= 1 and batch_idx % 3:
                seen.append((toggled.psgds_zeroing, all(p.grad is None for p in module.parameters())))

    train(cfg, tmp_path / "run", callbacks=[toggled, Seen()])
    assert len(seen) == 21 and {psgds for psgds, _ in seen} == {True, False}  # 32 batches, 11 chunk starts
    assert all(psgds == none_left for psgds, none_left in seen)
    # the minimal loop's variants: in place keeps the same gradient tensors, the others make new ones
    torch.manual_seed(0)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    for where, same in (("before", False), ("after", False), ("in place", True)):
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
        step = grad_lifetime.variant_step(net, torch.optim.SGD(net.parameters(), lr=0.1), where)
        step(x, y)
        first = net[1].weight.grad
        step(x, y)
        assert (net[1].weight.grad is first) == same, where


def test_plumbing_figures_take_each_arm_over_the_minimal_loop_and_against_psgd_in_its_rotation():
    import plumbing

    rows = [  # (rotation, arm, psgd's chunk seconds, the minimal loop's beside it)
        (0, "psgd", 1.05, 1.0),
        (0, "lightning", 1.06, 1.0),
        (0, "raw", 2.06, 2.0),
        (1, "raw", 1.03, 1.0),
        (1, "lightning", 1.10, 1.0),
        (1, "psgd", 1.04, 1.0),
        (2, "psgd", 1.00, 1.0),  # a rotation the epoch's end cut short: no arm compared in it
    ]
    f = plumbing.figures(rows)
    assert {arm: v["chunks"] for arm, v in f.items()} == {"psgd": 3, "lightning": 2, "raw": 2}
    assert f["psgd"]["median"] == pytest.approx(1.04) and f["raw"]["sum_ratio"] == pytest.approx(3.09 / 3.0)
    assert "minus_psgd" not in f["psgd"]
    lightning, raw = f["lightning"]["minus_psgd"], f["raw"]["minus_psgd"]
    assert lightning["rotations"] == raw["rotations"] == 2
    assert lightning["mean"] == pytest.approx(0.035) and lightning["median"] == pytest.approx(0.035)
    assert raw["mean"] == pytest.approx(-0.015) and raw["sem"] == pytest.approx(0.005)


@pytest.mark.slow  # the overhead-splitting scripts (~10 s each): pytest -m slow
def test_plumbing_reports_each_arm_and_switches_what_psgds_step_runs(tiny_data, tmp_path):
    import plumbing
    import pytorch_lightning as L
    from pytorch_lightning.plugins.precision import Precision

    from psgd.hooks import PlainPrecision
    from psgd.run import train

    args = [f"--data-root={tiny_data}", "--chunk=3", "--epochs=1", "--batch-size=16", f"--results={tmp_path}"]
    proc = benchmark("plumbing.py", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = json.loads((tmp_path / "plumbing.json").read_text())["runs"]
    # 32 batches: chunks start at 0, 3, ..., 30, each timed when the next starts (10), in rotations
    # psgd lightning raw, raw lightning psgd, ...; three rotations whole
    assert {arm: v["chunks"] for arm, v in run.items()} == {"psgd": 3, "lightning": 3, "raw": 4}
    assert run["lightning"]["minus_psgd"]["rotations"] == run["raw"]["minus_psgd"]["rotations"] == 3
    table = (tmp_path / "plumbing.md").read_text()
    assert table.count("\n| ") == 4 and "PlainPrecision" in proc.stdout  # header + 3 rows
    # what each arm runs: its precision plugin, Lightning's optimization, and whether its steps go through
    # Lightning's optimizer step (the raw step goes around it)
    cfg = compare.psgd_overhead_cfg(str(tiny_data), 1, 2, ["data.batch_size=16"])
    rotation, seen = plumbing.Rotation(cfg, 3), []

    class Seen(L.Callback):  # after Rotation, on each chunk's last batch: what that chunk ran
        updates = 0

        def on_before_optimizer_step(self, trainer, module, optimizer):
            self.updates += 1

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.current_epoch >= 1 and batch_idx % 3 == 2:
                plugin = type(trainer.strategy.precision_plugin)
                seen.append((rotation.arm, plugin, module.automatic_optimization, self.updates))

    train(cfg, tmp_path / "run", callbacks=[rotation, Seen()])
    assert [arm for arm, *_ in seen] == (["psgd", "lightning", "raw", "raw", "lightning", "psgd"] * 2)[:10]
    for (arm, plugin, automatic, updates), (_, _, _, before) in zip(seen[1:], seen, strict=False):
        assert plugin is {"psgd": PlainPrecision, "lightning": Precision, "raw": PlainPrecision}[arm]
        assert automatic == (arm != "raw")
        assert updates - before == (0 if arm == "raw" else 3), arm


def test_paired_data_path_times_loader_and_fixed_batch_chunks_over_whole_epochs(tiny_data):
    r = compare.paired_data_path(str(tiny_data), 1, chunk=3, epochs=2, overrides=["data.batch_size=16"])
    # every batch of each measured epoch is in one loader chunk, paired with as many fixed-batch steps
    from psgd.data import ClassificationData

    data = ClassificationData(root=str(tiny_data), batch_size=16)
    data.setup("fit")
    batches = len(data.train_dataloader())
    assert r["pairs"] == 2 * -(-batches // 3) and len(r["ratios"]) == r["pairs"]
    assert all(x > 0 for x in r["ratios"]) and r["sum_ratio"] > 0
    assert min(r["ratios"]) <= r["median"] <= max(r["ratios"])


@pytest.mark.parametrize("loop", ["psgd", "bare", "lean"])
def test_paired_overhead_times_lightning_and_vanilla_chunks_in_one_run(tiny_data, loop):
    from psgd.data import ClassificationData

    data = ClassificationData(root=str(tiny_data), batch_size=16)
    data.setup("fit")
    batches = len(data.train_dataloader())
    chunk = 2
    assert batches % chunk == 0  # an epoch's last chunk is whole, and untimed: the pairs must not shift by it
    r = compare.paired_overhead(str(tiny_data), 1, chunk=chunk, epochs=2, overrides=["data.batch_size=16"], loop=loop)
    # each measured epoch's chunks in order, each timed with the vanilla chunk that ran right after it
    # (an epoch's last one is timed only when the next epoch's first starts, so it is not)
    firsts = list(range(0, batches - chunk, chunk))
    assert r["chunks"] == [[epoch, first] for epoch in (1, 2) for first in firsts]
    assert r["pairs"] == len(r["chunks"]) == len(r["ratios"])
    assert all(x > 0 for x in r["ratios"])
    assert min(r["ratios"]) <= r["median"] <= max(r["ratios"])


@pytest.mark.slow  # the overhead-splitting scripts (~10 s each): pytest -m slow
def test_manual_optimization_variant_is_manual_trains_like_psgd_and_is_paired(tiny_data, tmp_path):
    import overhead_manual
    import pytorch_lightning as L

    from psgd.module import Classifier
    from psgd.run import train

    modes = []

    class Mode(L.Callback):
        def on_train_start(self, trainer, module):
            modes.append(module.automatic_optimization)

    cfg = compare.psgd_overhead_cfg(str(tiny_data), 1, 2, ["data.batch_size=16"])
    automatic = train(cfg, tmp_path / "automatic", callbacks=[Mode()])
    with overhead_manual.manual_optimization():
        manual = train(cfg, tmp_path / "manual", callbacks=[Mode()])
    with overhead_manual.manual_optimization(overhead_manual.raw_training_step):
        raw = train(cfg, tmp_path / "raw", callbacks=[Mode()])
    assert modes == [True, False, False]
    # the same steps in the same order: the same final model
    for other in (manual, raw):
        assert (other["test_acc"], other["test_loss"]) == (automatic["test_acc"], automatic["test_loss"])
    assert raw["history"][-1]["train_acc"] == automatic["history"][-1]["train_acc"]  # counted the same
    assert Classifier.training_step not in (overhead_manual.manual_training_step, overhead_manual.raw_training_step)

    runs = overhead_manual.measure(str(tiny_data), 1, 1, ["data.batch_size=16"], chunk=2, epochs=2)
    arms = [
        "automatic (psgd)",
        "every hook dispatched",
        "manual",
        "raw step",
        "smallest LightningModule",
        "leanest LightningModule",
    ]
    assert list(runs) == arms
    assert all(len(v) == 1 and v[0]["pairs"] >= 4 and v[0]["median"] > 0 for v in runs.values())


def test_reference_ratios_give_the_ratio_of_medians_and_the_median_of_per_round_ratios():
    samples = {name: [100.0, 100.0, 100.0] for row in compare.REFERENCE_RATIOS for name in row[1:3]}
    # averaging: one slow 2-worker round (the EPYC set of 2026-11-22 had one at 6.8k against 8.5-9.6k)
    samples["psgd model_averaging, 1 worker"] = [5000.0, 4800.0, 4900.0]
    samples["psgd model_averaging, 2 workers"] = [9700.0, 9200.0, 6800.0]
    rows = {r["what"]: r for r in compare.reference_ratios(samples)}
    assert len(rows) == len(compare.REFERENCE_RATIOS)
    averaging = rows["psgd model averaging 2 workers / 1 worker"]
    assert averaging["ratio"] == pytest.approx(9200 / 4900)
    assert averaging["paired"] == pytest.approx(9200 / 4800)  # the rounds' 1.94, 1.917 and 1.388
    assert averaging["target"] == 1.8
    assert rows["psgd DDP / reference DDP, 2 workers"]["ratio"] == pytest.approx(1.0)


def test_time_to_target_is_the_median_over_seeds_with_a_miss_counting_as_slowest():
    assert compare.median_time([12.0, 19.0, 15.0]) == 15.0
    assert compare.median_time([12.0, None, 19.0]) == 19.0  # the miss ranks above every time
    assert compare.median_time([12.0, None, None]) is None  # most runs never reached it
    assert compare.median_time([12.0, 14.0, None, None]) is None


@pytest.mark.slow  # two train.py runs (13-30 s); the median's logic is tested above, in the default run
def test_time_to_target_runs_each_seed_and_reports_every_run_and_the_median(tiny_data, tmp_path):
    import argparse

    args = argparse.Namespace(
        data_root=str(tiny_data), target_acc=0.05, target_seeds=[0, 1],
        target_overrides=["trainer.max_epochs=2", "data.batch_size=64"],
    )  # fmt: skip
    result, lines = compare.time_to_target(args, tmp_path)
    runs = result["runs"]
    assert [r["seed"] for r in runs] == [0, 1] and result["reached"] == 2
    # chance is 10 %: both reach 5 % after their first epoch, timed by the run itself, and stop there
    assert all(r["epoch_to_target"] == 1 and len(r["epoch_s"]) == 1 for r in runs)
    # the time to target is read at the validation that saw it; the epoch's time later, at the epoch's end:
    # the same training time, but for Lightning's end-of-epoch bookkeeping between them (~0.5 ms here; it
    # exceeded the 1 ms this test allowed in one slow-suite run, 2026-11-24)
    assert all(-1e-4 <= r["epoch_s"][0] - r["time_to_target_s"] < 0.01 for r in runs), runs
    assert result["median_s"] == pytest.approx(sum(r["time_to_target_s"] for r in runs) / 2)
    for seed in (0, 1):  # each run got its seed
        assert f"seed={seed}" in (tmp_path / f"target-{seed}" / ".hydra" / "overrides.yaml").read_text()
    text = "\n".join(lines)
    assert "seed=0" in text and "seed=1" in text and "median of 2** (2 reached)" in text and "met" in text


@pytest.mark.slow  # ~35 s: six train.py runs; the features it measures have default tests of their own
def test_gpu_benchmark_runs_every_variant_and_reports_the_ratios(tiny_data, tmp_path):
    # on CPU (the runs are the same; on_device and NCCL then mean the host and gloo): the script itself works
    args = [f"--data-root={tiny_data}", "--accelerator=cpu", "--epochs=1", "--repeats=1", "--limit-batches=3"]
    proc = benchmark("gpu.py", *args, "--models", "lab CNN", f"--results={tmp_path}", "--name=g")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "g.json").read_text())
    assert list(out["median"]) == [
        "lab CNN | host batches, fp32",
        "lab CNN | on device, fp32",
        "lab CNN | on device, bf16 autocast",
        "lab CNN | on device, bf16 autocast, cuDNN autotuner",
        "lab CNN | on device, fp32, per-tensor SGD",
        "lab CNN | on device, fp32, DDP (1 process)",
    ]
    assert all(v > 0 for v in out["median"].values())
    assert len(out["ratios"]) == 5 and out["device"].startswith("cpu: ")
    fused = out["ratios"]["lab CNN | fused update / torch's per-tensor SGD (fp32)"]
    assert fused == pytest.approx(
        out["median"]["lab CNN | on device, fp32"] / out["median"]["lab CNN | on device, fp32, per-tensor SGD"],
        abs=0.01,
    )
    md = (tmp_path / "g.md").read_text()
    assert md.count("| lab CNN |") == 11 and "bf16 autocast / fp32" in md and "cuDNN autotuner / without" in md


@pytest.mark.slow  # ~25 s: six train.py runs that fail; the interleaving's failures are tested by default
def test_gpu_benchmark_whose_runs_fail_says_so_in_its_rows_and_exit_status_and_writes_its_results(tmp_path):
    """gpu.py's runs after its data check passed (the training split): here the test split is damaged,
    so every train.py run ends with psgd's one-line error. The rows say `all runs failed`, the ratios
    `failed`, the results are still written, and the exit status is not 0, naming the first failure."""
    root = make_mnist_like(tmp_path / "data", "MNIST", n_train=256, n_test=64, seed=4)
    (root / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    args = [f"--data-root={root}", "--accelerator=cpu", "--epochs=1", "--repeats=1", "--limit-batches=2"]
    proc = benchmark("gpu.py", *args, "--models", "lab CNN", f"--results={tmp_path}", "--name=g")
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gpu.py: 6 run(s) failed, the first: lab CNN, host batches, fp32: psgd: error: "), last
    out = json.loads((tmp_path / "g.json").read_text())
    assert len(out["failed"]) == 6 and out["median"] == {} and set(out["ratios"].values()) == {None}
    assert all(runs == [None] for runs in out["samples"].values()) and len(out["samples"]) == 6
    md = (tmp_path / "g.md").read_text()
    assert md.count("| all runs failed | failed |") == 6 and md.count("| failed |") == 6 + 5


@pytest.mark.slow  # ~10 s on a CPU, a GPU benchmark: pytest -m slow
def test_gpu_step_benchmark_counts_the_lab_cnn_flop_and_times_every_variant(tmp_path):
    # on CPU: the script itself (the figures are the GPU's); ~10 s
    args = ["--device=cpu", "--steps=2", "--batches", "4", "8", "--models", "lab CNN", f"--results={tmp_path}"]
    proc = benchmark("gpu_step.py", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "gpu_step.json").read_text())["rows"]
    variants = [(r["batch"], r["precision"], r["cudnn.benchmark"]) for r in rows]
    assert variants == [(b, p, a) for b in (4, 8) for p in ("fp32", "bf16 autocast") for a in (False, True)]
    # the figure: a lab-CNN training sample (forward and backward) costs 10.1 MFLOP
    assert {r["gflop_per_sample"] for r in rows} == {0.0101}
    for r in rows:
        assert r["samples_per_s"] > 0
        assert r["samples_per_s"] == pytest.approx(r["batch"] * 1000 / r["ms_per_step"], rel=0.01)
        assert r["tflop_per_s"] == pytest.approx(r["samples_per_s"] * 0.0101e-3, abs=0.01)
    assert "lab CNN: 0.0101 GFLOP per training sample" in (tmp_path / "gpu_step.md").read_text()


def test_optimizer_step_benchmark_times_every_way_of_each_optimizer(tmp_path):
    proc = benchmark("optimizer_step.py", "--steps=3", "--repeats=1", f"--results={tmp_path}", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "optimizer_step.json").read_text())["rows"]
    assert [(r["model"], r["optimizer"]) for r in rows] == [("lab CNN", "sgd"), ("lab CNN", "adam")]
    for r in rows:
        us = r["us_per_update"]
        assert list(us) == ["per-tensor loop", "foreach", "fused"] and all(v > 0 for v in us.values())
        assert r["fused_speedup"] == pytest.approx(us["per-tensor loop"] / us["fused"])
    assert (tmp_path / "optimizer_step.md").read_text().count("| lab CNN |") == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without CUDA")
def test_optimizer_step_benchmark_on_cuda_without_a_gpu_is_one_line(tmp_path):
    proc = benchmark("optimizer_step.py", "--device=cuda", f"--results={tmp_path / 'r'}", timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "optimizer_step.py: error: --device cuda, but torch sees no CUDA device here"
    ), proc.stderr[-2000:]
    assert not (tmp_path / "r").exists()


@pytest.mark.slow  # ~15 s on a CPU, a GPU benchmark: pytest -m slow
def test_gpu_profile_benchmark_times_psgd_against_the_bare_step(tmp_path):
    # on CPU: the script itself (the GPU's busy time and kernels are the GPU's own; n/a here)
    root = make_mnist_like(tmp_path / "data", "MNIST", n_train=128 * 9, n_test=64, seed=5)
    args = [f"--data-root={root}", "--device=cpu", "--models", "lab CNN"]
    steps = ["--warm-up=2", "--steps=3", "--profiled=2"]
    over = ["--overrides", "optimizer.fused=false"]  # both steps then run torch's per-tensor SGD
    proc = benchmark("gpu_profile.py", *args, "--precisions", "fp32", "bf16", *steps, *over, f"--results={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "gpu_profile.json").read_text())
    assert out["args"]["overrides"] == ["optimizer.fused=false"]
    assert [(r["model"], r["precision"]) for r in out["rows"]] == [("lab CNN", "fp32"), ("lab CNN", "bf16")]
    # the override reached both steps: each ran the per-tensor update (psgd's default is the fused one)
    assert [r["update"] for r in out["rows"]] == [{"bare": "SGD, torch's default", "psgd": "SGD, torch's default"}] * 2
    for r in out["rows"]:
        assert r["bare"]["wall_ms"] > 0 and r["psgd"]["wall_ms"] > 0
        assert r["psgd_speed_of_bare"] == pytest.approx(r["bare"]["wall_ms"] / r["psgd"]["wall_ms"], rel=0.01)
        assert r["bare"]["gpu_busy_ms"] is None and r["psgd"]["kernels"] is None  # no GPU: not made up
    md = (tmp_path / "gpu_profile.md").read_text()
    assert md.count("| lab CNN |") == 2 and "| n/a |" in md and out["device"].startswith("cpu: ")
    assert md.splitlines()[0].endswith("psgd against the bare step, both with optimizer.fused=false")
    assert md.count("| SGD, torch's default |") == 2
    # without overrides, and with another optimizer (which gpu_profile.py failed on with a traceback)
    for over, said in (([], "SGD, fused"), (["--overrides", "optimizer=adam"], "Adam, fused")):
        proc = benchmark("gpu_profile.py", *args, "--precisions", "fp32", *steps, *over, f"--results={tmp_path / 'b'}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert f"| {said} |" in (tmp_path / "b" / "gpu_profile.md").read_text()


@pytest.mark.parametrize(
    "override,said",
    [
        ("optimizer.fused=maybe", "optimizer.fused='maybe' is invalid: must be true or false"),  # psgd's check
        ("optimiser.lr=0.1", "Could not override 'optimiser.lr'."),  # Hydra's: no such key
    ],
)
def test_gpu_profile_benchmark_refuses_a_bad_override_in_one_line_before_measuring(override, said, tmp_path):
    root = make_mnist_like(tmp_path / "data", "MNIST", n_train=64, n_test=64, seed=5)
    args = [f"--data-root={root}", "--device=cpu", "--models", "lab CNN", "--precisions", "fp32"]
    proc = benchmark("gpu_profile.py", *args, "--overrides", override, f"--results={tmp_path / 'r'}", timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"gpu_profile.py: error: --overrides {override}: {said}"
    ), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


@pytest.mark.slow  # ~10 s: one psgd run that ends before the profile does
def test_gpu_profile_benchmark_on_too_few_batches_is_one_line(tmp_path):
    root = make_mnist_like(tmp_path / "data", "MNIST", n_train=128 * 4, n_test=64, seed=5)
    args = [f"--data-root={root}", "--device=cpu", "--models", "lab CNN", "--precisions", "fp32"]
    proc = benchmark("gpu_profile.py", *args, "--warm-up=2", "--steps=3", "--profiled=2", f"--results={tmp_path / 'r'}")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "gpu_profile.py: psgd's lab CNN run ended before step 7: fewer batches in an epoch"
    ), proc.stderr[-2000:]
    assert not (tmp_path / "r" / "gpu_profile.json").exists()


@pytest.mark.parametrize("bad", [["--steps", "0"], ["--batches", "128", "-4"]])
def test_gpu_step_benchmark_refuses_a_count_below_one_in_one_line(bad, tmp_path):
    proc = benchmark("gpu_step.py", "--device=cpu", *bad, f"--results={tmp_path}")
    assert proc.returncode == 2 and f"'{bad[-1]}' is not an integer >= 1" in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "script,bad,value",
    [
        ("compare.py", ["--repeats", "0"], "'0' is not an integer >= 1"),  # was statistics' traceback at the end
        # it measured nothing and wrote empty tables over benchmarks/results/compare.json and .md
        ("compare.py", ["--only", "referencs"], "invalid choice: 'referencs'"),
        ("compare.py", ["--target-seeds", "0", "-1"], "'-1' is not an integer >= 0"),
        ("throughput.py", ["--workers", "2", "0"], "'0' is not an integer >= 1"),  # was train.py's error, at run 2
        ("throughput.py", ["--strategies", "ddp", "hogwlid"], "invalid choice: 'hogwlid'"),
        # a name with a folder: every figure measured, then a traceback at the last line (no such folder)
        ("compare.py", ["--name", "mine/compare"], "'mine/compare' is not a file name"),
        ("startup.py", ["--name", ""], "'' is not a file name"),
    ],
)
def test_a_bad_benchmark_argument_is_refused_before_anything_runs(script, bad, value):
    results = ROOT / "benchmarks" / "results"
    before = {p: p.stat().st_mtime_ns for p in results.iterdir()}
    proc = benchmark(script, "--data-root", "unused", *bad, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1].startswith(f"{script}: error: argument {bad[0]}: {value}"), proc.stderr
    assert {p: p.stat().st_mtime_ns for p in results.iterdir()} == before


# each script calls the same check (compare.exit_unless_writable); the second is slow (~5 s of a process start)
@pytest.mark.parametrize("script", ["compare.py", pytest.param("overhead_manual.py", marks=pytest.mark.slow)])
def test_results_that_cannot_be_written_are_one_line_before_any_measurement(script, tiny_data, tmp_path):
    """A results folder that cannot be made or written was found at the run's last line, after minutes of
    measurements: a traceback, and the figures were lost (but for the table printed just before)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = benchmark(script, f"--data-root={tiny_data}", f"--results={blocker / 'results'}", timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-2000:]
    said = f"{script}: error: cannot write results into {blocker / 'results'} (Not a directory); pass --results"
    assert proc.stderr == f"{said} <a writable folder>\n"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is present")
@pytest.mark.parametrize("script", ["gpu.py", "gpu_step.py", "gpu_profile.py"])
def test_a_gpu_benchmark_without_cuda_is_a_one_line_error(script, tmp_path):
    proc = benchmark(script, f"--results={tmp_path}")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no CUDA device" in proc.stderr and not list(tmp_path.iterdir())


@pytest.mark.slow  # ~40 s: four fresh processes that import torch and Lightning, two with 2 workers
def test_startup_benchmark_times_each_run_to_its_last_line_and_its_exit(tiny_data, tmp_path):
    args = [f"--data-root={tiny_data}", "--workers", "2", "--repeats=1", "--batches=2", f"--results={tmp_path}"]
    proc = benchmark("startup.py", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "startup.json").read_text())
    assert [r["run"] for r in result["rows"]] == [
        "train.py workers=2",
        "train.py workers=2 strategy.start_method=spawn",
        "imports only",
        "imports only + gc.freeze()",
    ]
    assert all(r["to_last_line_s"] > 0 and r["exit_s"] > 0 for r in result["rows"])
    md = (tmp_path / "startup.md").read_text()
    assert "gc.freeze() before exit saves" in md
    spawn, server = (r["to_last_line_s"] for r in result["rows"][1::-1])
    assert result["forkserver_sooner_than_spawn_s"] == {"2": round(spawn - server, 2)}
    assert "fork server (the default on CPU) gets 2 workers to their result" in md


@pytest.mark.slow  # ~15 s: two train.py runs
def test_throughput_benchmark_reports_samples_per_s_and_the_share_spent_synchronising(tiny_data, tmp_path):
    """Each row: the median samples/s, the speedup over 1 worker, and where speed went: DDP's wait for
    the all-reduce at 2 workers (nothing to wait for at 1), in the JSON and the markdown table."""
    args = [f"--data-root={tiny_data}", "--workers", "1", "2", "--strategies", "ddp", "--repeats=1"]
    proc = benchmark("throughput.py", *args, f"--results={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    one, two = json.loads((tmp_path / "throughput.json").read_text())["rows"]
    assert (one["workers"], one["sync_share"], one["speedup_vs_1_worker"]) == (1, None, 1.0)
    assert two["workers"] == 2 and 0 < two["sync_share"] < 1 and two["samples_per_s"] > 0
    md = (tmp_path / "throughput.md").read_text().splitlines()
    assert md[0].endswith("| sync % (median) |") and md[2].endswith("| 1.0 |  |")
    assert md[3].endswith(f"| {two['sync_share']:.1%} |")


@pytest.mark.slow  # ~15 s: two train.py runs
def test_a_failed_throughput_run_is_reported_in_its_row_and_the_others_are_kept(tiny_data, tmp_path):
    """One run that fails (here model averaging refuses the period; before, a HogWild run at 5 workers that
    diverged) no longer ends the benchmark and loses every figure measured before it: its row says so,
    the others are measured and written, and the exit status is 1 with one line."""
    args = [f"--data-root={tiny_data}", "--workers", "1", "--repeats=1", f"--results={tmp_path}"]
    proc = benchmark("throughput.py", *args, "++strategy.period=-1", "--strategies", "model_averaging", "ddp")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("throughput.py: 1 run(s) failed, the first: model_averaging workers=1: psgd: error: ")
    failed, ddp = json.loads((tmp_path / "throughput.json").read_text())["rows"]
    assert failed["samples_per_s"] is None and "strategy.period=-1 is invalid" in failed["failed"][0]
    assert ddp["samples_per_s"] > 0 and ddp["failed"] == []
    md = (tmp_path / "throughput.md").read_text()
    assert "| model_averaging | 1 | all runs failed |  |  |" in md and "| ddp | 1 | " in md


def test_a_missing_dataset_is_one_line_before_any_measurement(tiny_data, tmp_path, offline, monkeypatch, capsys):
    """A mistyped --data-root ended in a traceback (torchvision's download error, or psgd's DataError
    from deep inside the first measured run) after the scripts had started their work."""
    monkeypatch.setattr(sys, "argv", ["compare.py"])
    with pytest.raises(SystemExit) as e:
        compare.exit_without_data(str(tmp_path / "typo"))
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"compare.py: error: dataset mnist not found or unreadable under {tmp_path}"
    )
    assert "pass --data-root <dir> to where it lives" in lines[0]
    compare.exit_without_data(str(tiny_data))  # found: nothing to say
    assert capsys.readouterr().err == ""
    # a script, as a user runs it (every download through a proxy that is not there: offline)
    proxy = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    proc = benchmark("throughput.py", "--data-root", str(tmp_path / "typo"), timeout=120, env={**os.environ, **proxy})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("throughput.py: error: dataset mnist not found") and proc.stderr.count("\n") == 1


def test_a_failed_run_is_none_in_its_round_and_the_other_runs_and_figures_go_on():
    """compare.py's interleaved rounds: one failed run (RunFailed) ended the whole benchmark, losing every
    figure measured before it; now it is None in its round, and the ratios use what was measured."""
    calls = []

    def config(name: str, rate: float, fails_in: set[int]):
        def go(i: int) -> float:
            calls.append((name, i))
            if i in fails_in:
                raise compare.RunFailed("psgd: error: training diverged")
            return rate

        return go

    names = [n for row in compare.REFERENCE_RATIOS for n in row[1:3]]
    configs = {n: config(n, 100.0, set()) for n in dict.fromkeys(names)}
    configs["psgd hogwild, 2 workers"] = config("psgd hogwild, 2 workers", 180.0, {1})
    configs["reference mnist_hogwild, 2 workers"] = config("reference mnist_hogwild, 2 workers", 120.0, {0})
    configs["psgd model_averaging, 2 workers"] = config("psgd model_averaging, 2 workers", 190.0, {0, 1, 2})
    failed: list[str] = []
    samples = compare.interleaved(configs, 3, failed)
    assert len(calls) == 3 * len(configs)  # every run of every round ran
    assert samples["psgd hogwild, 2 workers"] == [180.0, None, 180.0]
    assert failed[0] == "reference mnist_hogwild, 2 workers: psgd: error: training diverged" and len(failed) == 5
    rows = {r["what"]: r for r in compare.reference_ratios(samples)}
    hogwild = rows["psgd HogWild / reference mnist_hogwild, 2 workers"]
    assert hogwild["ratio"] == pytest.approx(1.5) and hogwild["paired"] == pytest.approx(1.5)  # round 3 alone
    assert rows["psgd model averaging 2 workers / 1 worker"]["ratio"] is None  # all its runs failed
    assert rows["psgd HogWild 2 workers / 1 worker"]["ratio"] == pytest.approx(1.8)
    table = {r[0]: r[1:] for r in compare.sample_rows(samples)}
    assert table["psgd hogwild, 2 workers"] == ["180", "180 failed 180"]
    assert table["psgd model_averaging, 2 workers"] == ["all runs failed", "failed failed failed"]
    assert compare.shown(None, ".2f") == "failed" and compare.verdict(None, 1.5) == ""


@pytest.mark.slow  # ~5 s: a refused train.py run; the rounds' handling of a failure is tested above
def test_a_failed_compare_run_is_said_in_its_row_and_the_results_are_written(tiny_data, tmp_path):
    """A failed train.py run (here a refused lr) stopped compare.py with its lines and wrote nothing; now
    its row says it, the results are written, and the exit status is 1 with one line."""
    args = [f"--data-root={tiny_data}", "--only", "target", "--target-seeds", "0"]
    proc = benchmark("compare.py", *args, "--target-overrides", "optimizer.lr=-1", f"--results={tmp_path}")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("compare.py: 1 run(s) failed, the first: target seed=0: psgd: error: optimizer.lr")
    out = json.loads((tmp_path / "compare.json").read_text())
    (run,) = out["target"]["runs"]
    assert run["seed"] == 0 and run["failed"].startswith("psgd: error: optimizer.lr=-1")
    assert out["failed"] == [proc.stderr.strip().removeprefix("compare.py: 1 run(s) failed, the first: ")]
    md = (tmp_path / "compare.md").read_text()
    assert "| seed=0 | failed: psgd: error: optimizer.lr=-1" in md
    assert "| **median of 0** (0 reached, 1 failed) | **no run completed** |" in md


def test_paired_chunks_longer_than_an_epoch_are_one_line_not_a_statistics_error():
    # on a small dataset compare.py's overhead section said "statistics.StatisticsError: no median for empty data"
    with pytest.raises(SystemExit, match="^compare.py: no pair of 25-step chunks was timed: an epoch has fewer than"):
        compare.paired_figures([], 25)
    assert compare.paired_figures([(2.0, 1.0), (3.0, 2.0)], 25)["sum_ratio"] == pytest.approx(5 / 3)


def test_instructions_per_step_reads_callgrinds_dumps_in_order_and_counts_the_gap_to_lightning(tmp_path):
    import instructions_per_step as ips

    # dumps as callgrind writes them: cg.<pid>.<n> in the order of the markers (n sorts numerically), and the
    # exit's cg.<pid> without a number; each has a "summary:" line with the instructions since the last dump
    counts = [900, 7, 110, 100, 3, 106, 100, 4, 108, 102, 2]  # warm-up, epoch start, then [lightning, vanilla, gap]
    for n, count in enumerate(counts, 1):
        (tmp_path / f"cg.4242.{n}").write_text(f"version: 1\ncreator: callgrind\nsummary: {count}\ntotals: {count}\n")
    (tmp_path / "cg.4242").write_text("summary: 123456\n")
    assert ips.dumps(tmp_path) == counts
    out = ips.chunks(counts, chunk=2)
    # the first chunk (110 + 3 against 100) is left out: the vanilla loop's first steps build its state
    assert out["chunks"] == 2
    assert out["lightning"] == pytest.approx(((106 + 4) / 2 + (108 + 2) / 2) / 2)  # the gap is Lightning's
    assert out["vanilla"] == pytest.approx((100 / 2 + 102 / 2) / 2)
    assert out["extra"] == pytest.approx(out["lightning"] - out["vanilla"])
    assert ips.chunks(counts[:5], chunk=2) == {}  # one chunk only: nothing counted


def test_instructions_per_step_without_valgrind_is_one_line_before_anything_runs(tiny_data, tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no valgrind on it
    args = [f"--data-root={tiny_data}", f"--results={tmp_path / 'results'}"]
    proc = benchmark("instructions_per_step.py", *args, timeout=120, env=env)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == "instructions_per_step: needs valgrind (callgrind and callgrind_control) on the PATH"
    assert not (tmp_path / "results").exists()
