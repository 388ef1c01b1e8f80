"""sweep.py under Hydra's real multirun: every strategy in one sweep, the report, a failed job."""

import csv
import re
import subprocess
import sys

import pytest
from conftest import DUMPS_STACKS, ROOT, ended, run_cli
from helpers import metrics, tensorboard, undocumented, unnamed_columns
from matplotlib.image import imread
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

pytestmark = pytest.mark.distributed


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def mixed_sweep(tiny_data, tmp_path_factory):
    """`sweep.py -m workers=1,2 strategy=ddp,model_averaging,hogwild` on tiny data: 6 jobs."""
    sweep_dir = tmp_path_factory.mktemp("sweep") / "mixed"
    proc = run_cli(
        "sweep.py",
        "-m",
        "workers=1,2",
        "strategy=ddp,model_averaging,hogwild",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=1",
        "data.batch_size=64",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=400,
    )
    return proc, sweep_dir


def test_one_sweep_runs_every_strategy_with_its_own_world_size(mixed_sweep):
    proc, sweep_dir = mixed_sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_csv(sweep_dir / "report.csv")
    assert len(rows) == 6
    seen = set()
    for row in rows:
        job = metrics(sweep_dir / row["dir"])
        assert row["status"] == job["status"] == "completed"
        assert (row["strategy"], int(row["workers"])) == (job["strategy"], job["world_size"])
        assert float(row["test_acc"]) == pytest.approx(job["test_acc"])
        assert 0.0 <= job["test_acc"] <= 1.0
        seen.add((job["strategy"], job["world_size"]))
        # each job's dir, and so its TensorBoard run, says what it ran (it said only the job's number)
        assert row["dir"] == f"{row['job']}_{job['strategy']}_x{job['world_size']}"
        if job["strategy"] == "model_averaging":  # each worker's accuracy beside the average
            assert len(row["worker_test_acc"].split()) == job["world_size"]
            assert job["period"] is None and job["periodic_averagings"] == 0  # one-shot: only at the end
    assert seen == {(s, p) for s in ("ddp", "model_averaging", "hogwild") for p in (1, 2)}
    # a user looks a column, a job's metrics.json key or a TensorBoard tag up in the README: each is there
    assert unnamed_columns(sweep_dir / "report.csv") == unnamed_columns(sweep_dir / "summary.csv") == []
    assert [undocumented(sweep_dir / row["dir"]) for row in rows] == [[]] * 6


def test_report_speedup_is_t1_over_tp_per_strategy(mixed_sweep):
    _, sweep_dir = mixed_sweep
    rows = read_csv(sweep_dir / "report.csv")
    for strategy in ("ddp", "model_averaging", "hogwild"):
        (one,) = [r for r in rows if r["strategy"] == strategy and r["workers"] == "1"]
        (two,) = [r for r in rows if r["strategy"] == strategy and r["workers"] == "2"]
        t1, t2 = (metrics(sweep_dir / r["dir"])["train_time_s"] for r in (one, two))
        assert float(one["speedup"]) == 1.0
        assert float(two["speedup"]) == pytest.approx(t1 / t2, rel=0.02)
        assert float(two["efficiency"]) == pytest.approx(t1 / t2 / 2, rel=0.02)
    md = (sweep_dir / "report.md").read_text()
    assert "6/6 jobs completed." in md and "| model_averaging | 2 |" in md


def test_report_plots_are_valid_pngs(mixed_sweep):
    _, sweep_dir = mixed_sweep
    for name in ("speedup.png", "efficiency.png", "accuracy.png"):
        image = imread(sweep_dir / name)  # raises on anything but a readable PNG
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_a_progress_line_per_job_and_a_final_line(mixed_sweep):
    proc, sweep_dir = mixed_sweep
    lines = [ln for ln in proc.stdout.splitlines() if re.match(r"psgd: \[\d/6\]", ln)]
    assert [ln.split("]")[0] for ln in lines] == [f"psgd: [{i}/6" for i in range(1, 7)]
    assert all("completed" in ln and "test_acc" in ln and " s training" in ln for ln in lines)
    assert "workers=1 strategy=ddp:" in lines[0]  # the swept values, not every override
    assert f"psgd: sweep finished: 6/6 jobs completed; report in {sweep_dir}/report.md" in proc.stdout
    assert "Initializing distributed" not in proc.stdout + proc.stderr  # workers are quiet too


def test_every_job_has_its_own_tensorboard_run_with_hparams(mixed_sweep):
    _, sweep_dir = mixed_sweep
    for row in read_csv(sweep_dir / "report.csv"):
        acc = tensorboard(sweep_dir / row["dir"])
        start = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
        hparams = HParamsPluginData.FromString(start).session_start_info.hparams
        assert hparams["strategy.name"].string_value == row["strategy"]
        assert hparams["workers"].number_value == int(row["workers"])
        assert acc.Scalars("test/acc")[-1].value == pytest.approx(float(row["test_acc"]), abs=1e-6)
        # TensorBoard's run for this job is <job>_<strategy>_x<workers>/tensorboard, as the report says
        assert row["dir"] == f"{row['job']}_{row['strategy']}_x{row['workers']}"
    assert (
        f"`tensorboard --logdir {sweep_dir}` (each job's run is `<its folder>/tensorboard`;"
        in (sweep_dir / "report.md").read_text()
    )


@pytest.mark.parametrize(
    "script",
    [
        "sweep.py",
        # `train.py -m` is sweep.py's sweep: a line per job, the report, exit 1 with a job failed
        pytest.param("train.py", marks=pytest.mark.slow),  # ~9 s; the default run checks it by its help
    ],
)
def test_a_failed_job_is_marked_and_the_rest_reported(tiny_data, tmp_path, script):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(
        script,
        "optimizer.lr=0.05,1e6",  # 1e6: the training loss turns NaN, found only once the job trains
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=1",
        f"hydra.sweep.dir={sweep_dir}",
        "-m",  # where Hydra alone would not read it (sweep.py puts it first; it may also be left out)
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    ok, bad = read_csv(sweep_dir / "report.csv")
    assert ok["status"] == "completed" and float(ok["test_acc"]) > 0
    assert bad["status"] == "failed"
    assert bad["error"].startswith("training diverged: the mean training loss of epoch 1 is nan")
    assert "psgd: [2/2] optimizer.lr=1000000.0: failed: training diverged" in proc.stdout
    assert "1 failed (jobs 1)" in proc.stdout
    assert "## Failed jobs" in (sweep_dir / "report.md").read_text()
    assert "Traceback" not in proc.stderr
    # the report can be rebuilt from the sweep dir alone, with the same rows and exit code
    (sweep_dir / "report.csv").unlink()
    rebuilt = subprocess.run([sys.executable, "-m", "psgd.report", str(sweep_dir)], capture_output=True, timeout=120)
    assert rebuilt.returncode == 1
    assert [r["status"] for r in read_csv(sweep_dir / "report.csv")] == ["completed", "failed"]


def test_train_py_with_hydras_multirun_flag_is_a_sweep():
    """`train.py -m` (or hydra.mode=MULTIRUN) runs as `sweep.py -m`: a line per job, the report and its exit code."""
    for flag in ("-m", "--multirun", "hydra.mode=MULTIRUN"):
        proc = run_cli("train.py", flag, "--help", timeout=60)
        assert proc.returncode == 0 and proc.stdout.startswith("psgd sweep.py: one training job per combination")
    assert run_cli("train.py", "--help", timeout=60).stdout.startswith("psgd train.py: train one network")
    # the help leaves the sweep's values out (Hydra composes one job for it)
    proc = run_cli("train.py", "-m", "seed=0,1", "--help", timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("psgd sweep.py: one training job per combination")


def test_a_sweep_of_real_and_simulated_workers_reports_them_apart_and_alike(tiny_data, tmp_path):
    """`simulate=false,true`: two worker processes and two simulated workers, one sweep. Each is its own group (its
    speedup is of its own time: measured, simulated), the simulated one alone has a simulated time and its curve
    against it; with one thread a worker and dropout 0 they train the same model."""
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(
        "sweep.py", "-m", "simulate=false,true", "workers=2", "strategy=model_averaging", "strategy.period=2",
        f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=1", "data.batch_size=64",
        "threads_per_worker=1", "model.dropout=0", f"hydra.sweep.dir={sweep_dir}", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    real, sim = sorted(read_csv(sweep_dir / "report.csv"), key=lambda row: row["simulate"])
    assert (real["simulate"], sim["simulate"]) == ("False", "True") and real["status"] == sim["status"] == "completed"
    assert real["sim_time_s"] == "" and float(sim["sim_time_s"]) > 0
    assert abs(float(real["test_acc"]) - float(sim["test_acc"])) <= 2 / 256  # 256 test samples
    assert len({row["group"] for row in read_csv(sweep_dir / "summary.csv")}) == 2
    assert (sweep_dir / "curves_time.png").exists() and (sweep_dir / "curves_sim_time.png").exists()


def test_a_sweep_stopped_early_reports_the_jobs_that_ran(tiny_data, tmp_path):
    """SIGTERM in the middle of a job: Hydra runs no end-of-multirun callback then, and psgd still writes the
    report of the jobs that ran, the interrupted one with its finished epochs."""
    import json
    import os
    import signal
    import time

    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "sweep.py"),
            "-m",
            "trainer.max_epochs=1,60",  # job 0 ends, job 1 runs longer
            f"data.root={tiny_data}",
            "data.val_split=0",
            "data.batch_size=64",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **DUMPS_STACKS},
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            try:  # an epoch finished and its checkpoint written (the record may come first): job 1 can resume
                last = sweep_dir / "1_ddp_x1" / "checkpoints" / "last.ckpt"
                if json.loads((sweep_dir / "1_ddp_x1" / "metrics.json").read_text())["history"] and last.exists():
                    break
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("job 1 finished no epoch in 180 s")
        os.kill(proc.pid, signal.SIGTERM)
        _, stderr = ended(proc, 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    report = sweep_dir / "report.md"
    said = stderr.strip().splitlines()[-1]
    assert said == f"psgd: sweep stopped early: 1/2 jobs completed, 1 interrupted (jobs 1); report in {report}"
    ok, stopped = read_csv(sweep_dir / "report.csv")
    assert ok["status"] == "completed" and float(ok["test_acc"]) > 0
    assert stopped["status"] == "interrupted" and int(stopped["epochs"]) >= 1
    assert "1/2 jobs completed, 1 interrupted (jobs 1)." in report.read_text()
