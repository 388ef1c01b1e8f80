"""The benchmark scripts (compare.py, throughput.py, gpu.py, powersgd.py; their shared helpers in common.py) run
and report what they claim (short runs on tiny generated data; the figures are not checked). The ones that start
many train.py runs are in the slow suite, `python -m pytest -m slow`."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, make_mnist_like

sys.path.insert(0, str(ROOT / "benchmarks"))
import common  # noqa: E402
import compare  # noqa: E402


def benchmark(script: str, *args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """benchmarks/<script> with `args`, run as a user runs it; its output captured as text."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


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


@pytest.mark.parametrize("loop", ["psgd", "bare"])
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


def test_reference_ratios_give_the_ratio_of_medians_and_the_median_of_per_round_ratios():
    samples = {name: [100.0, 100.0, 100.0] for row in compare.REFERENCE_RATIOS for name in row[1:3]}
    # averaging: one slow 2-worker round, which moves the ratio of medians more than the per-round median
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
    # the same training time, but for Lightning's end-of-epoch bookkeeping between them
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


@pytest.mark.parametrize(
    "script,bad,value",
    [
        ("compare.py", ["--repeats", "0"], "'0' is not an integer >= 1"),
        ("compare.py", ["--only", "referencs"], "invalid choice: 'referencs'"),
        ("compare.py", ["--target-seeds", "0", "-1"], "'-1' is not an integer >= 0"),
        ("throughput.py", ["--workers", "2", "0"], "'0' is not an integer >= 1"),
        ("throughput.py", ["--strategies", "ddp", "hogwlid"], "invalid choice: 'hogwlid'"),
        # a name with a folder would fail only when the results are written, after every measurement
        ("compare.py", ["--name", "mine/compare"], "'mine/compare' is not a file name"),
        ("throughput.py", ["--name", ""], "'' is not a file name"),
        ("simulated.py", ["--workers", "0"], "'0' is not an integer >= 1"),
    ],
)
def test_a_bad_benchmark_argument_is_refused_before_anything_runs(script, bad, value):
    results = ROOT / "benchmarks" / "results"
    before = {p: p.stat().st_mtime_ns for p in results.iterdir()}
    proc = benchmark(script, "--data-root", "unused", *bad, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1].startswith(f"{script}: error: argument {bad[0]}: {value}"), proc.stderr
    assert {p: p.stat().st_mtime_ns for p in results.iterdir()} == before


# each script calls the same check (common.exit_unless_writable); the second is slow (~5 s of a process start)
@pytest.mark.parametrize("script", ["compare.py", pytest.param("throughput.py", marks=pytest.mark.slow)])
def test_results_that_cannot_be_written_are_one_line_before_any_measurement(script, tiny_data, tmp_path):
    """A results folder that cannot be made or written is found before any measurement, not when the
    results are written minutes later."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = benchmark(script, f"--data-root={tiny_data}", f"--results={blocker / 'results'}", timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-2000:]
    said = f"{script}: error: cannot write results into {blocker / 'results'} (Not a directory); pass --results"
    assert proc.stderr == f"{said} <a writable folder>\n"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is present")
def test_the_gpu_benchmark_without_cuda_is_a_one_line_error(tmp_path):
    proc = benchmark("gpu.py", f"--results={tmp_path}")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no CUDA device" in proc.stderr and not list(tmp_path.iterdir())


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
    """One run that fails (here model averaging refuses DDP's compression) does not end the benchmark: its row
    says so, the others are measured and written, and the exit status is 1 with one line."""
    args = [f"--data-root={tiny_data}", "--workers", "1", "--repeats=1", f"--results={tmp_path}"]
    proc = benchmark("throughput.py", *args, "++strategy.compression=fp16", "--strategies", "model_averaging", "ddp")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("throughput.py: 1 run(s) failed, the first: model_averaging workers=1: psgd: error: ")
    failed, ddp = json.loads((tmp_path / "throughput.json").read_text())["rows"]
    assert failed["samples_per_s"] is None and "strategy.compression='fp16' is invalid" in failed["failed"][0]
    assert ddp["samples_per_s"] > 0 and ddp["failed"] == []
    md = (tmp_path / "throughput.md").read_text()
    assert "| model_averaging | 1 | all runs failed |  |  |" in md and "| ddp | 1 | " in md


def test_a_missing_dataset_is_one_line_before_any_measurement(tiny_data, tmp_path, offline, monkeypatch, capsys):
    """A mistyped --data-root ended in a traceback (torchvision's download error, or psgd's DataError
    from deep inside the first measured run) after the scripts had started their work."""
    monkeypatch.setattr(sys, "argv", ["compare.py"])
    with pytest.raises(SystemExit) as e:
        common.exit_without_data(str(tmp_path / "typo"))
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"compare.py: error: dataset mnist not found or unreadable under {tmp_path}"
    )
    assert "pass --data-root <dir> to where it lives" in lines[0]
    common.exit_without_data(str(tiny_data))  # found: nothing to say
    assert capsys.readouterr().err == ""
    # a script, as a user runs it (every download through a proxy that is not there: offline)
    proxy = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    proc = benchmark("throughput.py", "--data-root", str(tmp_path / "typo"), timeout=120, env={**os.environ, **proxy})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("throughput.py: error: dataset mnist not found") and proc.stderr.count("\n") == 1


def test_a_failed_run_is_none_in_its_round_and_the_other_runs_and_figures_go_on():
    """compare.py's interleaved rounds: a failed run (RunFailed) is None in its round, the other runs go
    on, and the ratios use what was measured."""
    calls = []

    def config(name: str, rate: float, fails_in: set[int]):
        def go(i: int) -> float:
            calls.append((name, i))
            if i in fails_in:
                raise common.RunFailed("psgd: error: training diverged")
            return rate

        return go

    names = [n for row in compare.REFERENCE_RATIOS for n in row[1:3]]
    configs = {n: config(n, 100.0, set()) for n in dict.fromkeys(names)}
    configs["psgd hogwild, 2 workers"] = config("psgd hogwild, 2 workers", 180.0, {1})
    configs["reference mnist_hogwild, 2 workers"] = config("reference mnist_hogwild, 2 workers", 120.0, {0})
    configs["psgd model_averaging, 2 workers"] = config("psgd model_averaging, 2 workers", 190.0, {0, 1, 2})
    failed: list[str] = []
    samples = common.interleaved(configs, 3, failed)
    assert len(calls) == 3 * len(configs)  # every run of every round ran
    assert samples["psgd hogwild, 2 workers"] == [180.0, None, 180.0]
    assert failed[0] == "reference mnist_hogwild, 2 workers: psgd: error: training diverged" and len(failed) == 5
    rows = {r["what"]: r for r in compare.reference_ratios(samples)}
    hogwild = rows["psgd HogWild / reference mnist_hogwild, 2 workers"]
    assert hogwild["ratio"] == pytest.approx(1.5) and hogwild["paired"] == pytest.approx(1.5)  # round 3 alone
    assert rows["psgd model averaging 2 workers / 1 worker"]["ratio"] is None  # all its runs failed
    assert rows["psgd HogWild 2 workers / 1 worker"]["ratio"] == pytest.approx(1.8)
    table = {r[0]: r[1:] for r in common.sample_rows(samples)}
    assert table["psgd hogwild, 2 workers"] == ["180", "180 failed 180"]
    assert table["psgd model_averaging, 2 workers"] == ["all runs failed", "failed failed failed"]
    assert common.shown(None, ".2f") == "failed" and compare.verdict(None, 1.5) == ""


@pytest.mark.slow  # ~5 s: a refused train.py run; the rounds' handling of a failure is tested above
def test_a_failed_compare_run_is_said_in_its_row_and_the_results_are_written(tiny_data, tmp_path):
    """A failed train.py run (here a refused lr) is said in its row, the results are written, and the exit
    status is 1 with one line."""
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
    # a dataset too small for one pair of chunks: one line, not statistics' "no median for empty data"
    with pytest.raises(SystemExit, match="^compare.py: no pair of 25-step chunks was timed: an epoch has fewer than"):
        compare.paired_figures([], 25)
    assert compare.paired_figures([(2.0, 1.0), (3.0, 2.0)], 25)["sum_ratio"] == pytest.approx(5 / 3)


@pytest.mark.slow  # ~15 s: two gloo processes timing four hooks
def test_the_powersgd_benchmark_prints_every_variant_against_torchs_hook():
    proc = benchmark("powersgd.py", "--steps=2", "--warmup=3", "--rounds=1", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "ms" not in line]
    assert (
        len(rows) == 4 and rows[1].startswith("| torch's powerSGD_hook, one bucket |") and rows[1].endswith("| 1.00 |")
    )


@pytest.mark.slow  # ~10 s: two gloo processes
def test_the_network_benchmark_fits_the_ring_model_and_prints_it_beside_what_it_measured(tmp_path):
    proc = benchmark(
        "network.py", "--workers", "2", "--sizes", "4096", "1048576", "--repeats", "2", f"--results={tmp_path}"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "network.json").read_text())
    assert [(p, n) for p, n, _ in data["measured_s"]] == [(2, 4096), (2, 1048576)]
    alpha, bandwidth = data["alpha_s"], data["bandwidth_bytes_per_s"]
    assert alpha >= 0 and bandwidth > 0
    for p, n, measured in data["measured_s"]:  # each row: the measured time and the fitted model's
        model = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth
        assert (
            f"| {p} | {'4 KiB' if n == 4096 else '1 MiB'} | {measured * 1e3:.3f} | {model * 1e3:.3f} |" in proc.stdout
        )


@pytest.mark.slow  # ~50 s: real and simulated runs, one of each kind
def test_the_simulated_benchmark_prints_simulated_speed_and_time_beside_real_runs(tiny_data, tmp_path):
    args = ["--workers", "8", "--steps", "5", "--repeats", "1", "--calibrate", "2", "--batches", "3"]
    proc = benchmark("simulated.py", f"--data-root={tiny_data}", *args, f"--results={tmp_path}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((tmp_path / "simulated.json").read_text())
    assert set(data["medians"]) == {"1 real worker", "8 simulated, ddp", "8 simulated, local SGD (H=16)"}
    assert [row[:2] for row in data["time"]] == [["ddp", 2], ["local SGD (H=16)", 2]]
    assert all(float(row[3]) > 0 for row in data["time"])  # the simulated epoch, beside the measured one
    assert "| 1 real worker |" in proc.stdout and "| x one real worker |" in proc.stdout
