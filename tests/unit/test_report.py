"""The sweep report on sweep dirs laid out as Hydra and psgd write them (job dirs with .hydra/ and
metrics.json), so every number can be checked against a hand computation."""

import csv
import errno
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import CONF
from hydra import initialize_config_dir
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from psgd.process import this_process
from psgd.report import comm_label, comm_points, curves, main, plot_lines, straggler_lines, write_report
from psgd.strategies.records import sync_summary
from psgd.sweep import LAST, SweepReport, progress_line, sweep_lengths

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_job(
    sweep: Path,
    num: int,
    overrides: dict,
    metrics: dict | None,
    workers: int = 1,
    partition: str = "iid",
) -> Path:
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    task = [f"{k}={v}" for k, v in overrides.items()]
    (job / ".hydra" / "hydra.yaml").write_text(
        yaml.safe_dump({"hydra": {"job": {"num": num}, "overrides": {"task": task}}})
    )
    cfg = {"workers": workers, "trainer": {"devices": None, "num_nodes": 1}}
    cfg["strategy"] = {"name": "ddp"}
    cfg["data"] = {"partition": partition}
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    if metrics is not None:
        (job / "metrics.json").write_text(json.dumps(metrics))
    return job


def done(strategy: str, workers: int, time_s: float, acc: float, **extra) -> dict:
    return {
        "status": "completed",
        "strategy": strategy,
        "workers": workers,
        "world_size": workers,
        "threads_per_worker": 1,
        "batch_size": 128,
        "epochs": 2,
        "train_time_s": time_s,
        "samples_per_s": 120000 / time_s,
        "test_acc": acc,
        "target_acc": extra.pop("target_acc", None),
        "time_to_target_s": extra.pop("time_to_target_s", None),
        "history": [{"epoch": 1, "samples": 60000}],
        **extra,
    }


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def jobs_table(sweep: Path) -> list[list[str]]:
    """The cells of report.md's jobs table, its header row first."""
    lines = (sweep / "report.md").read_text().split("## Jobs", 1)[1].split("\n\n")[1].splitlines()
    return [[cell.strip() for cell in ln.strip("|").split("|")] for ln in lines if not ln.startswith("|---")]


@pytest.fixture
def seeded_sweep(tmp_path) -> Path:
    """workers=1,2,4 x seed=0,1 for model averaging (one job failed), as `sweep.py -m` leaves it."""
    times = {(1, 0): 20.0, (1, 1): 22.0, (2, 0): 11.0, (2, 1): 10.0, (4, 0): 7.0, (4, 1): 6.0}
    accs = {(1, 0): 0.98, (1, 1): 0.96, (2, 0): 0.97, (2, 1): 0.95, (4, 0): 0.9, (4, 1): 0.92}
    num = 0
    for p in (1, 2, 4):
        for seed in (0, 1):
            overrides = {"workers": p, "seed": seed, "strategy": "model_averaging"}
            m = done(
                "model_averaging",
                p,
                times[p, seed],
                accs[p, seed],
                target_acc=0.9,
                time_to_target_s=times[p, seed] / 2,
                worker_test_acc=[accs[p, seed] + 0.01] * p,
            )
            make_job(tmp_path, num, overrides, m, workers=p)
            num += 1
    failed = {"status": "failed", "error": "worker rank 1 died (signal SIGKILL)"}
    make_job(tmp_path, num, {"workers": 3, "seed": 0, "strategy": "model_averaging"}, failed, workers=3)
    return tmp_path


def test_report_rows_speedup_and_efficiency_are_computed_from_the_mean_1_worker_time(seeded_sweep):
    report = write_report(seeded_sweep)
    assert report.swept == ["workers", "seed"]
    rows = read_csv(seeded_sweep / "report.csv")
    assert len(rows) == 7
    t1 = (20.0 + 22.0) / 2
    job2 = next(r for r in rows if r["job"] == "2")  # P=2, seed 0, 11 s
    assert float(job2["speedup"]) == pytest.approx(t1 / 11.0, abs=1e-3)
    assert float(job2["efficiency"]) == pytest.approx(t1 / 11.0 / 2, abs=1e-3)
    assert float(job2["speedup_to_target"]) == pytest.approx((t1 / 2) / 5.5, abs=1e-3)
    assert job2["worker_test_acc"] == "0.9800 0.9800"
    failed = next(r for r in rows if r["status"] == "failed")
    assert failed["workers"] == "3" and failed["error"] == "worker rank 1 died (signal SIGKILL)"
    assert failed["speedup"] == "" and failed["test_acc"] == ""
    # 1-worker jobs of 20 and 22 s: 1.05 and 0.955, as report.md says T(1) is (the mean over seeds)
    assert [r["speedup"] for r in rows[:2]] == ["1.05", "0.955"]
    assert "with T(1) the mean of the group's 1-worker jobs" in (seeded_sweep / "report.md").read_text()


def test_the_markdown_shows_test_accuracy_to_4_decimals_and_the_csv_keeps_it_whole(tmp_path):
    # 0.203125 beside worker accuracies of 0.2031: one job's figures at two precisions
    make_job(tmp_path, 0, {"workers": 2}, done("model_averaging", 2, 5.0, 0.203125, worker_test_acc=[0.203125] * 2))
    write_report(tmp_path)
    row = [ln for ln in (tmp_path / "report.md").read_text().splitlines() if ln.startswith("| 0 |")][0]
    assert "| 0.2031 | 0.2031 0.2031 |" in row
    assert read_csv(tmp_path / "report.csv")[0]["test_acc"] == "0.203125"


def test_the_jobs_table_says_how_far_replicas_drifted_and_how_stale_hogwild_updates_were(tmp_path):
    """The jobs table shows what parallelism did to the model: the replicas' distance from their average
    (model averaging) and the other workers' updates landing during each update (HogWild), where a job has it."""
    drifted = done("model_averaging", 2, 10.0, 0.9, worker_test_acc=[0.91, 0.89], replica_distance=0.123456)
    make_job(tmp_path, 0, {"strategy": "model_averaging", "workers": 2}, drifted, workers=2)
    history = [{"epoch": 1, "staleness": 0.5}, {"epoch": 2, "staleness": 1.0}, {"epoch": 3}]
    make_job(
        tmp_path, 1, {"strategy": "hogwild", "workers": 2}, done("hogwild", 2, 9.0, 0.9, history=history), workers=2
    )
    make_job(tmp_path, 2, {"strategy": "ddp", "workers": 2}, done("ddp", 2, 8.0, 0.9), workers=2)
    write_report(tmp_path)
    rows = read_csv(tmp_path / "report.csv")
    assert [(r["replica_distance"], r["staleness"]) for r in rows] == [("0.1235", ""), ("", "0.75"), ("", "")]
    header = next(ln for ln in (tmp_path / "report.md").read_text().splitlines() if ln.startswith("| job |"))
    assert "| test_acc | worker_test_acc | replica_distance | staleness |" in header
    make_job(tmp_path / "ddp", 0, {"workers": 2}, done("ddp", 2, 8.0, 0.9), workers=2)
    write_report(tmp_path / "ddp")  # neither figure: neither column
    assert "staleness" not in (tmp_path / "ddp" / "report.md").read_text()
    assert "periodic_averagings" not in header  # averaged at the end only: no periodic averagings to count


def test_the_jobs_table_says_how_often_periodic_averaging_averaged(tmp_path):
    """A sweep over strategy.period: each job's count of averagings, 0 for a period its run never reached
    (that job is one-shot averaging under another name)."""
    for num, (period, count) in enumerate([(1, 40), (100, 0), (None, 0)]):
        job = done("model_averaging", 2, 10.0, 0.9, period=period, periodic_averagings=count)
        make_job(tmp_path, num, {"strategy.period": period if period else "null"}, job, workers=2)
    write_report(tmp_path)
    assert [r["periodic_averagings"] for r in read_csv(tmp_path / "report.csv")] == ["40", "0", ""]
    table = jobs_table(tmp_path)
    column = table[0].index("periodic_averagings")
    assert [row[column] for row in table[1:]] == ["40", "0", ""]


def test_the_time_synchronising_is_summed_over_the_epochs_and_shown_in_the_jobs_table(tmp_path):
    """The history's per-epoch all-reduce figures (each epoch's median per step) weighted by each epoch's
    steps; an epoch without figures (trained before a resume, by another strategy) counts for neither.
    Periodic averaging's and the HogWild lock's seconds per epoch over the time those epochs trained."""
    history = [
        {"epoch": 1, "step": 10, "epoch_s": 1.0, "allreduce_ms": 5.0, "allreduce_wait_ms": 4.0},
        {"epoch": 2, "step": 40, "epoch_s": 2.0, "allreduce_ms": 3.0, "allreduce_wait_ms": 2.0},
        {"epoch": 3, "step": 50, "epoch_s": 9.0},
    ]
    summary = sync_summary(history)
    # (10 x 4 + 30 x 2) ms of waiting in the 3 s the two epochs trained (the share rounded to 4 digits)
    assert summary == {"allreduce_ms": 3.5, "allreduce_wait_ms": 2.5, "allreduce_wait_share": 0.0333}
    assert sync_summary([{"epoch": 1, "step": 10, "epoch_s": 1.0}]) == {}
    make_job(tmp_path, 0, {"workers": 2}, done("ddp", 2, 8.0, 0.9, history=history, **summary), workers=2)
    make_job(tmp_path, 1, {"workers": 1}, done("ddp", 1, 12.0, 0.9), workers=1)
    # local SGD: the time in its periodic averaging over the time trained, in the same column
    periodic = [{"epoch": 1, "step": 10, "epoch_s": 2.0, "averaging_s": 0.2}, {"epoch": 2, "step": 20, "epoch_s": 3.0}]
    assert sync_summary(periodic) == {"averaging_share": 0.1} and sync_summary(periodic[1:]) == {}
    averaged = done("model_averaging", 2, 7.0, 0.9, history=periodic, **sync_summary(periodic))
    make_job(tmp_path, 2, {"workers": 2, "strategy": "model_averaging"}, averaged, workers=2)
    # locked HogWild: the time waiting for the update lock
    locked = [{"epoch": 1, "step": 10, "epoch_s": 4.0, "lock_wait_s": 1.0}]
    assert sync_summary(locked) == {"lock_wait_share": 0.25}
    make_job(
        tmp_path,
        3,
        {"workers": 2, "strategy": "hogwild"},
        done("hogwild", 2, 6.0, 0.9, **sync_summary(locked)),
        workers=2,
    )
    write_report(tmp_path)
    rows = read_csv(tmp_path / "report.csv")
    shares = [(r["allreduce_wait_ms"], r["sync_share"]) for r in rows]
    assert shares == [("2.5", "0.0333"), ("", ""), ("", "0.1"), ("", "0.25")]
    assert "| allreduce_wait_ms | sync_share |" in (tmp_path / "report.md").read_text()
    # per group and worker count too: how synchronising grows with the workers
    summary = {(r["strategy"], r["workers"]): r["sync_share_mean"] for r in read_csv(tmp_path / "summary.csv")}
    assert summary == {
        ("ddp", "1"): "",
        ("ddp", "2"): "0.0333",
        ("model_averaging", "2"): "0.1",
        ("hogwild", "2"): "0.25",
    }
    assert "| sync_share_mean |" in (tmp_path / "report.md").read_text()  # in the summary table too


def test_summary_has_mean_and_std_over_seeds_per_worker_count(seeded_sweep):
    write_report(seeded_sweep)
    summary = {int(r["workers"]): r for r in read_csv(seeded_sweep / "summary.csv")}
    assert sorted(summary) == [1, 2, 4]  # the failed P=3 job is not averaged into anything
    s4 = summary[4]
    assert s4["runs"] == "2"
    assert float(s4["test_acc_mean"]) == pytest.approx(0.91)
    assert float(s4["test_acc_std"]) == pytest.approx(0.014142, abs=1e-5)
    assert float(s4["train_time_s_mean"]) == pytest.approx(6.5)
    assert float(s4["speedup"]) == pytest.approx(21.0 / 6.5, abs=1e-3)
    assert float(s4["efficiency"]) == pytest.approx(21.0 / 6.5 / 4, abs=1e-3)
    assert float(s4["speedup_to_target"]) == pytest.approx(10.5 / 3.25, abs=1e-3)
    assert s4["reached_target"] == "2/2"
    md = (seeded_sweep / "report.md").read_text()
    assert "| 4 | 2 | 0.91 | 0.014142 |" in md  # workers, runs, test_acc_mean, test_acc_std
    assert "job 6" in md and "worker rank 1 died" in md


def test_plots_are_written_as_png_and_stale_ones_removed(seeded_sweep):
    report = write_report(seeded_sweep)
    names = sorted(p.name for p in report.plots)
    assert names == ["accuracy.png", "efficiency.png", "speedup.png"]
    for name in names:
        assert (seeded_sweep / name).read_bytes()[:8] == PNG_MAGIC
    assert all(f"![{Path(name).stem}]({name})" in (seeded_sweep / "report.md").read_text() for name in names)
    one = seeded_sweep / "one"  # a single worker count: no plot applies, and an earlier build's goes
    make_job(one, 0, {"seed": 0}, done("ddp", 1, 5.0, 0.9))
    (one / "speedup.png").write_bytes(PNG_MAGIC)
    assert write_report(one).plots == [] and not (one / "speedup.png").exists()


def test_the_accuracy_plot_labels_the_averaged_model_apart_from_the_replicas(seeded_sweep):
    """A model-averaging group's two accuracies, the averaged model's and the replicas' own, are two labelled lines
    (a plot ending at the replicas' mean disagreed with the report's test_acc); a ddp group has one, unlabelled."""
    make_job(seeded_sweep, 7, {"workers": 1, "seed": 0, "strategy": "ddp"}, done("ddp", 1, 20.0, 0.99))
    make_job(seeded_sweep, 8, {"workers": 2, "seed": 0, "strategy": "ddp"}, done("ddp", 2, 11.0, 0.98), workers=2)
    lines = plot_lines("accuracy", write_report(seeded_sweep).summary)
    assert sorted(lines) == ["ddp", "model_averaging (averaged model)", "model_averaging (replicas' mean, unaveraged)"]
    averaged, replicas = (
        lines["model_averaging (averaged model)"],
        lines["model_averaging (replicas' mean, unaveraged)"],
    )
    assert [(p, round(acc, 6)) for p, acc, _ in averaged] == [(1, 0.97), (2, 0.96), (4, 0.91)]  # the test_acc
    assert [(p, round(acc, 6)) for p, acc, _ in replicas] == [(1, 0.98), (2, 0.97), (4, 0.92)]  # worker_test_acc


def test_a_model_averaging_jobs_line_gives_the_workers_own_accuracy_beside_the_average(tmp_path):
    job = done("model_averaging", 2, 10.0, 0.6192, worker_test_acc=[0.896, 0.8944], replica_distance=3.21)
    make_job(tmp_path, 0, {"strategy": "model_averaging", "workers": 2}, job, workers=2)
    line = progress_line(0, 1, frozenset({"workers"}), tmp_path / "0")
    assert "test_acc 0.6192 (averaged model; the workers' own 0.8960 0.8944, replica_distance=3.2100)" in line
    accs = [0.9 + r / 1000 for r in range(64)]
    many = done("model_averaging", 64, 10.0, 0.95, worker_test_acc=accs, replica_distance=1)
    make_job(tmp_path, 1, {"strategy": "model_averaging", "workers": 64}, many, workers=64)
    line = progress_line(1, 2, frozenset({"workers"}), tmp_path / "1")  # simulated workers: hundreds
    assert "(averaged model; the workers' own min 0.9000 mean 0.9315 max 0.9630, replica_distance=1.0000)" in line
    report = write_report(tmp_path)  # report.md's jobs table likewise; report.csv keeps every worker's
    assert "| 0.8960 0.8944 |" in report.sweep_dir.joinpath("report.md").read_text()
    assert "| min 0.9000 mean 0.9315 max 0.9630 |" in report.sweep_dir.joinpath("report.md").read_text()
    assert len(report.rows[1]["worker_test_acc"].split()) == 64


def test_each_job_says_the_mb_its_workers_sent_and_one_plot_puts_accuracy_against_them(tmp_path):
    """DDP, compressed DDP and local SGD at several periods on one picture, HogWild (nothing sent) at 0 MB: every
    run is on it (0-byte runs fell off its log axis without a word), and a point on another's place is a larger
    ring around it (bf16 hid under fp16)."""
    jobs = [
        ("ddp", {"compression": "none"}, [8e6, 8e6], 0.99),
        ("ddp", {"compression": "topk"}, [1.6e5, 1.6e5], 0.97),
        ("model_averaging", {"period": 8}, [1e6, 1e6], 0.98),
        ("model_averaging", {"period": None}, [2e5, 2e5], 0.9),
        ("hogwild", {}, [0, 0], 0.98),
        ("ddp", {"compression": "fp16"}, [4e6, 4e6], 0.985),
        ("ddp", {"compression": "bf16"}, [4e6, 4e6], 0.9851),
    ]
    for num, (strategy, extra, sent, acc) in enumerate(jobs):
        job = done(strategy, 2, 10.0, acc, comm_bytes=sent, **extra)
        make_job(tmp_path, num, {"strategy": strategy, "workers": 2}, job, workers=2)
    report = write_report(tmp_path)
    assert [r["comm_mb"] for r in read_csv(tmp_path / "report.csv")] == [
        "8.0",
        "0.16",
        "1.0",
        "0.2",
        "0.0",
        "4.0",
        "4.0",
    ]
    assert (tmp_path / "accuracy_vs_comm.png") in report.plots
    assert (tmp_path / "accuracy_vs_comm.png").read_bytes()[:8] == PNG_MAGIC
    labels = [comm_label(j) for j in report.jobs]
    assert labels[:4] == ["ddp none x2", "ddp topk x2", "model_averaging period=8 x2", "model_averaging one-shot x2"]
    points = comm_points(report.jobs)
    assert [(label, mb, under) for mb, _, label, under in points] == [
        ("ddp none x2", 8.0, 0),
        ("ddp topk x2", 0.16, 0),
        ("model_averaging period=8 x2", 1.0, 0),
        ("model_averaging one-shot x2", 0.2, 0),
        ("hogwild x2", 0.0, 0),
        ("ddp fp16 x2", 4.0, 0),
        ("ddp bf16 x2", 4.0, 1),  # on fp16's place: drawn around it
    ]
    assert "| comm_mb |" in (tmp_path / "report.md").read_text()


def test_each_jobs_validation_accuracy_is_drawn_against_its_training_time_and_the_mb_it_sent(tmp_path):
    """curves_time.png and curves_comm.png, from the history every job writes: a line per job, labelled by its
    number and swept values; a job that sent nothing at 0 MB; an epoch without a validation is no point; a record
    that did not count its bytes is on the time curves only."""

    def history(*epochs) -> list[dict]:
        return [
            {"epoch": i + 1, "samples": 60000, "time": t, "val_acc": acc, **({"comm_bytes": sent} if sent else {})}
            for i, (t, sent, acc) in enumerate(epochs)
        ]

    simulated = history((7.0, [8e6, 8e6], 0.91))
    simulated[0]["sim_time_s"] = 0.5  # simulated workers' time, on their network
    jobs = [
        ("ddp", history((5.0, [8e6, 8e6], 0.9), (10.0, [8e6, 8e6], 0.95))),
        ("hogwild", history((4.0, [0, 0], None), (8.0, [0, 0], 0.85), (12.0, [0, 0], 0.9))),
        ("model_averaging", history((6.0, None, 0.93))),  # a record from before psgd counted bytes
        ("decentralized", simulated),
    ]
    for num, (strategy, epochs) in enumerate(jobs):
        job = done(strategy, 2, 10.0, 0.9) | {"history": epochs}
        make_job(tmp_path, num, {"strategy": strategy, "workers": 2}, job, workers=2)
    report = write_report(tmp_path)
    assert curves(report.jobs, report.swept) == {
        "0: strategy=ddp": [(5.0, 8.0, 0.9, None), (10.0, 16.0, 0.95, None)],
        "1: strategy=hogwild": [(8.0, 0.0, 0.85, None), (12.0, 0.0, 0.9, None)],
        "2: strategy=model_averaging": [(6.0, None, 0.93, None)],
        "3: strategy=decentralized": [(7.0, 8.0, 0.91, 0.5)],
    }
    for name in ("curves_time.png", "curves_comm.png", "curves_sim_time.png"):  # the last: the simulated job alone
        assert tmp_path / name in report.plots and (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
        assert f"]({name})" in (tmp_path / "report.md").read_text()


def test_simulated_jobs_speed_up_by_their_simulated_time_and_their_time_to_the_target_is_drawn(tmp_path):
    """A sweep of simulated workers: S(P) of their simulated time (the measured one is this machine's, the same at
    every P), the simulated time to the target against the workers, a line per network."""
    for num, (workers, gbps, sim_s) in enumerate([(1, 1, 8.0), (4, 1, 4.0), (1, 100, 8.0), (4, 100, 2.0)]):
        job = done("ddp", workers, 10.0, 0.98) | {"simulate": True, "sim_time_s": sim_s, "sim_time_to_target_s": sim_s}
        job["target_acc"] = 0.98
        overrides = {"workers": workers, "network.bandwidth_gbps": gbps, "strategy": "ddp"}
        make_job(tmp_path, num, overrides, job, workers=workers)
    report = write_report(tmp_path)
    speedups = {(s["group"], s["workers"]): (s["speedup"], s["sim_time_to_target_s_mean"]) for s in report.summary}
    assert speedups[("ddp network.bandwidth_gbps=1", 4)] == (2.0, 4.0)
    assert speedups[("ddp network.bandwidth_gbps=100", 4)] == (4.0, 2.0)
    assert tmp_path / "sim_time_to_target.png" in report.plots


def test_jobs_that_measured_a_consensus_distance_get_its_curve(tmp_path):
    """consensus.png: a line per job that measured one (decentralized SGD); none in a sweep without."""
    history = [{"epoch": e, "samples": 60000, "consensus_distance": d} for e, d in ((1, 0.5), (2, 0.2))]
    make_job(
        tmp_path,
        0,
        {"strategy": "decentralized", "workers": 4},
        done("decentralized", 4, 9.0, 0.95) | {"history": history},
        workers=4,
    )
    make_job(tmp_path, 1, {"strategy": "ddp", "workers": 4}, done("ddp", 4, 8.0, 0.96), workers=4)
    report = write_report(tmp_path)
    assert (tmp_path / "consensus.png") in report.plots and (tmp_path / "consensus.png").read_bytes()[:8] == PNG_MAGIC
    (tmp_path / "1" / "metrics.json").unlink()
    (tmp_path / "0" / "metrics.json").write_text(json.dumps(done("ddp", 4, 8.0, 0.96)))
    assert (tmp_path / "consensus.png") not in write_report(tmp_path).plots and not (
        tmp_path / "consensus.png"
    ).exists()


def test_a_sweep_over_stragglers_plots_time_to_target_against_the_slowest_factor_a_line_per_strategy(tmp_path):
    """experiment=stragglers' shape: strategies x the last worker's slowdown, two seeds of DDP at factor 4."""
    times = {"ddp": {1: [10.0], 2: [19.0], 4: [38.0, 40.0]}, "hogwild": {1: [12.0], 2: [13.0], 4: [15.0]}}
    num = 0
    for strategy, per_factor in times.items():
        for factor, runs in per_factor.items():
            for seed, t in enumerate(runs):
                job = done(strategy, 4, t + 1, 0.98, target_acc=0.98, time_to_target_s=t)
                job["stragglers"] = {"slowdown": [1, 1, 1, factor], "delay_s": 0.0, "distribution": "none"}
                over = {"strategy": strategy, "stragglers.slowdown": f"[1,1,1,{factor}]", "seed": seed}
                make_job(tmp_path, num, over, job, workers=4)
                num += 1
    report = write_report(tmp_path)
    key, measure, lines = straggler_lines(report.jobs, report.swept)
    assert (key, measure) == ("stragglers.slowdown", "time_to_target_s")
    assert lines == {"ddp": [(1, 10.0), (2, 19.0), (4, 39.0)], "hogwild": [(1, 12.0), (2, 13.0), (4, 15.0)]}
    assert (tmp_path / "stragglers.png") in report.plots
    assert (tmp_path / "stragglers.png").read_bytes()[:8] == PNG_MAGIC
    # without a target: the training time; a sweep over no stragglers.* key draws none
    for job in report.jobs:
        job["target_acc"] = None
    assert straggler_lines(report.jobs, report.swept)[1:] == (
        "train_time_s",
        {"ddp": [(1, 11.0), (2, 20.0), (4, 40.0)], "hogwild": [(1, 13.0), (2, 14.0), (4, 16.0)]},
    )
    assert straggler_lines(report.jobs, ["strategy", "seed"])[2] == {}


def test_groups_are_per_strategy_and_other_swept_values(tmp_path):
    num = 0
    for strategy in ("ddp", "hogwild"):
        for bs in (32, 64):
            for p, t in ((1, 10.0), (2, 8.0 if strategy == "ddp" else 5.0)):
                m = done(strategy, p, t * bs / 32, 0.9)
                m["batch_size"] = bs
                make_job(tmp_path, num, {"workers": p, "strategy": strategy, "data.batch_size": bs}, m, workers=p)
                num += 1
    report = write_report(tmp_path)
    speedups = {(s["strategy"], s["group"], s["workers"]): s["speedup"] for s in report.summary}
    assert speedups["ddp", "ddp data.batch_size=32", 2] == pytest.approx(1.25)
    assert speedups["hogwild", "hogwild data.batch_size=64", 2] == pytest.approx(2.0)
    assert "| lr |" not in (tmp_path / "report.md").read_text()  # every job ran at the same lr


def test_the_lr_each_job_ran_at_is_shown_when_lr_scaling_made_them_differ(tmp_path):
    """A batch-size sweep with lr_scaling=linear lr_reference_batch=64: each job's lr is in the report."""
    for num, bs in enumerate((32, 64, 128)):
        m = done("ddp", 1, 10.0, 0.9, batch_size=bs, lr=0.02 * bs / 64)
        make_job(tmp_path, num, {"data.batch_size": bs}, m)
    report = write_report(tmp_path)
    assert [r["lr"] for r in report.rows] == pytest.approx([0.01, 0.02, 0.04])
    table = jobs_table(tmp_path)
    column = table[0].index("lr")
    assert [row[column] for row in table[1:]] == ["0.01", "0.02", "0.04"]
    assert [row["lr"] for row in read_csv(tmp_path / "report.csv")] == ["0.01", "0.02", "0.04"]


def trained(samples_per_epoch: list[int]) -> dict:
    """A record's history with these training samples per epoch (all workers together)."""
    return {"history": [{"epoch": i + 1, "samples": n} for i, n in enumerate(samples_per_epoch)]}


def test_speedup_compares_the_same_work_when_the_jobs_trained_different_numbers_of_samples(tmp_path):
    """trainer.limit_train_batches=100 counts each worker's batches: 2 workers train twice the samples
    of 1. A 2-worker job twice as fast per sample is S(2) = 2 whatever its whole-run time, and the
    report says S(P) compares time per trained sample."""
    make_job(tmp_path, 0, {"workers": 1}, done("ddp", 1, 2.0, 0.9, **trained([12800])))
    make_job(tmp_path, 1, {"workers": 2}, done("ddp", 2, 2.0, 0.9, **trained([25600])), workers=2)
    report = write_report(tmp_path)
    summary = {s["workers"]: s for s in report.summary}
    assert summary[2]["speedup"] == pytest.approx(2.0) and summary[2]["efficiency"] == pytest.approx(1.0)
    rows = read_csv(tmp_path / "report.csv")
    assert [r["samples"] for r in rows] == ["12800", "25600"]
    assert float(rows[1]["speedup"]) == pytest.approx(2.0)
    assert "for the same work (time per trained sample)" in (tmp_path / "report.md").read_text()


def test_jobs_that_trained_the_same_samples_get_the_ratio_of_their_times(tmp_path):
    # a DistributedSampler pads a shard by a few samples: 60,000 vs 60,002 is the same work
    for num, (p, t, n) in enumerate(((1, 12.0, 60000), (2, 8.0, 60002), (3, 6.0, 60000))):
        make_job(tmp_path, num, {"workers": p}, done("ddp", p, t, 0.9, **trained([n // 2, n - n // 2])), workers=p)
    report = write_report(tmp_path)
    summary = {s["workers"]: s for s in report.summary}
    assert summary[2]["speedup"] == pytest.approx(12.0 / 8.0, abs=1e-3)
    assert summary[3]["speedup"] == pytest.approx(2.0)


def test_no_1_worker_job_means_no_speedup(tmp_path):
    for num, p in enumerate((2, 4)):
        make_job(tmp_path, num, {"workers": p}, done("ddp", p, 10.0 / p, 0.9), workers=p)
    report = write_report(tmp_path)
    assert all(s["speedup"] is None for s in report.summary)


def test_a_job_left_running_is_reported_failed(tmp_path):
    make_job(tmp_path, 0, {"seed": 0}, done("ddp", 1, 5.0, 0.9))
    make_job(tmp_path, 1, {"seed": 1}, {"status": "running", "strategy": "ddp", "world_size": 1})
    with subprocess.Popen(["true"]) as gone:  # a record naming a process that has exited (killed)
        pass
    dead = {"host": socket.gethostname(), "pid": gone.pid, "tag": f"{gone.pid}-0"}
    make_job(tmp_path, 2, {"seed": 2}, {"status": "running", "strategy": "ddp", "world_size": 1, "process": dead})
    report = write_report(tmp_path)
    assert [j["status"] for j in report.jobs] == ["completed", "failed", "failed"]
    assert "killed?" in report.jobs[1]["error"] and "killed?" in report.jobs[2]["error"]


def test_a_job_still_training_is_running_not_failed(tmp_path, capsys):
    """A report rebuilt while the sweep runs (python -m psgd.report <its dir>): the job at work is running,
    not failed, and the rebuild exits 0."""
    make_job(tmp_path, 0, {"seed": 0}, done("ddp", 1, 5.0, 0.9))
    live = {**done("ddp", 1, 2.0, 0.5), "status": "running", "process": this_process()}  # this test's process
    make_job(tmp_path, 1, {"seed": 1}, live)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("psgd: sweep still running: 1/2 jobs completed, 1 running (jobs 1); report in ")
    report = write_report(tmp_path)
    assert [j["status"] for j in report.jobs] == ["completed", "running"] and not report.failed
    assert [r["status"] for r in report.rows] == ["completed", "running"]
    assert "1/2 jobs completed, 1 running (jobs 1). Swept: seed." in (tmp_path / "report.md").read_text()
    elsewhere = {**this_process(), "host": "another-machine"}  # a SLURM node: cannot be told, as before
    make_job(tmp_path, 2, {"seed": 2}, {**live, "process": elsewhere})
    assert [j["status"] for j in write_report(tmp_path).jobs] == ["completed", "running", "failed"]


def test_a_stopped_sweep_counts_only_completed_jobs_as_completed(tmp_path, monkeypatch, capsys):
    """The line of a sweep stopped early counted every job not failed as completed, a job whose record
    still says running (its process alive: another launcher's, or this one's when its mark could not
    be written) included."""
    from psgd.sweep import report_stopped_sweep

    make_job(tmp_path, 0, {"seed": 0}, done("ddp", 1, 5.0, 0.9))
    make_job(tmp_path, 1, {"seed": 1}, {**done("ddp", 1, 2.0, 0.5), "status": "interrupted"})
    make_job(tmp_path, 2, {"seed": 2}, {**done("ddp", 1, 2.0, 0.5), "status": "running", "process": this_process()})
    # the sweep's fourth job had not started
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": ["seed=0,1,2,3"]}}}))
    monkeypatch.setitem(LAST, "sweep_dir", str(tmp_path))
    monkeypatch.setitem(LAST, "ended", False)
    assert report_stopped_sweep()
    said = capsys.readouterr().err
    counts = "1/4 jobs completed, 1 interrupted (jobs 1), 1 running (jobs 2), 1 not started; report in "
    assert said.startswith(f"psgd: sweep stopped early: {counts}"), said


def test_a_job_record_damaged_by_hand_is_a_failed_job_not_a_traceback(tmp_path):
    make_job(tmp_path, 0, {"seed": 0}, done("ddp", 1, 5.0, 0.9))
    (make_job(tmp_path, 1, {"seed": 1}, None) / "metrics.json").write_text('{"status": "compl')  # cut short
    (make_job(tmp_path, 2, {"seed": 2}, None) / "metrics.json").write_text("[1, 2]")
    (make_job(tmp_path, 3, {"seed": 3}, done("ddp", 1, 5.0, 0.9)) / ".hydra" / "hydra.yaml").unlink()
    (make_job(tmp_path, 4, {"seed": 4}, done("ddp", 1, 5.0, 0.9)) / ".hydra" / "config.yaml").write_text("a: [")
    report = write_report(tmp_path)
    assert [j["status"] for j in report.jobs] == ["completed"] + ["failed"] * 4
    assert report.jobs[1]["error"].startswith(f"{tmp_path / '1'} is unreadable (JSONDecodeError: ")
    assert report.jobs[2]["error"].endswith("is unreadable (ValueError: metrics.json holds a JSON list, not a record)")
    for job in report.jobs[3:]:  # a job without its hydra.yaml has no number: it is listed last
        assert job["error"].startswith(f"{job['path']} is unreadable (")
    assert [r["status"] for r in read_csv(tmp_path / "report.csv")] == ["completed"] + ["failed"] * 4


def test_jobs_in_folders_a_changed_sweep_subdir_names_are_found_in_job_order(seeded_sweep):
    """hydra.sweep.subdir=${hydra.job.override_dirname}: job folders named by their overrides, nested where a
    value holds a / (data.root=/data/x): the report finds them in a dir Hydra made, in job order."""
    for job in sorted(p for p in seeded_sweep.iterdir() if p.name.isdigit()):
        named = seeded_sweep / "data.root=" / "data" / f"seed{(6 - int(job.name)) % 7},n{job.name}"  # not in job order
        named.parent.mkdir(parents=True, exist_ok=True)
        job.rename(named)
    with pytest.raises(FileNotFoundError, match="is it a sweep dir"):  # no multirun.yaml: one level only
        write_report(seeded_sweep)  # (so that a home folder given by mistake is not searched whole)
    (seeded_sweep / "multirun.yaml").write_text("hydra: {}\n")  # as Hydra leaves a sweep dir
    report = write_report(seeded_sweep)
    assert [j["num"] for j in report.jobs] == list(range(7))
    assert [r["speedup"] for r in report.summary] == pytest.approx([1.0, 2.0, 42 / 13], abs=1e-3)  # as printed
    assert [j["num"] for j in report.failed] == [6]
    assert "(each job's run is `<its folder>/tensorboard`;" in (seeded_sweep / "report.md").read_text()


def test_a_sweep_stopped_before_some_jobs_started_counts_them(tmp_path, capsys):
    """A sweep stopped between jobs (Ctrl-C, SIGTERM, a closed terminal) has dirs for the jobs that ran
    only: the report counts the sweep's jobs from multirun.yaml and says how many did not start."""
    recorded = {"hydra": ["hydra.mode=MULTIRUN"], "task": ["workers=1,2", "seed=0,1", "trainer.max_epochs=3"]}
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": recorded}}))
    make_job(tmp_path, 0, {"workers": 1, "seed": 0}, done("ddp", 1, 10.0, 0.9))
    make_job(tmp_path, 1, {"workers": 1, "seed": 1}, done("ddp", 1, 11.0, 0.9))
    assert main([str(tmp_path)]) == 1  # not every job ran
    line = capsys.readouterr().out
    assert line == f"psgd: sweep stopped early: 2/4 jobs completed, 2 not started; report in {tmp_path}/report.md\n"
    assert "2/4 jobs completed, 2 not started. Swept: seed." in (tmp_path / "report.md").read_text()
    # every job ran: nothing more said
    make_job(tmp_path, 2, {"workers": 2, "seed": 0}, done("ddp", 2, 6.0, 0.9))
    make_job(tmp_path, 3, {"workers": 2, "seed": 1}, done("ddp", 2, 6.0, 0.9))
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("psgd: sweep finished: 4/4 jobs completed; report in ")
    assert "not started" not in out + (tmp_path / "report.md").read_text()


def test_rebuild_command_exit_codes(tmp_path, seeded_sweep, capsys):
    assert main([str(seeded_sweep)]) == 1  # one job failed
    assert "6/7 jobs completed, 1 failed (jobs 6)" in capsys.readouterr().out
    assert main([str(tmp_path / "nowhere")]) == 2
    no_jobs = "holds no job dirs (<job>/.hydra/config.yaml): is it a sweep dir?"
    assert capsys.readouterr().err == f"psgd: error: {tmp_path / 'nowhere'} {no_jobs}\n"
    assert main([str(seeded_sweep / "report.md")]) == 2
    assert capsys.readouterr().err == f"psgd: error: {seeded_sweep / 'report.md'} {no_jobs}\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 2
    assert "is it a sweep dir?" in capsys.readouterr().err


def test_a_sweep_dir_that_cannot_be_written_says_so(seeded_sweep, capsys, monkeypatch):
    """A sweep dir on a read-only mount or another user's (a course's shared results): one line with the
    reason and how to rebuild the report, exit code 2."""

    def refused(fig, f, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(seeded_sweep / "speedup.png"))

    monkeypatch.setattr(Figure, "savefig", refused)
    assert main([str(seeded_sweep)]) == 2
    assert capsys.readouterr().err == (
        f"psgd: error: no report: cannot write it (Read-only file system: '{seeded_sweep / 'speedup.png'}'); "
        f"once it can be written: python -m psgd.report {seeded_sweep}\n"
    )


def test_a_report_the_disk_has_no_room_for_is_one_line_and_leaves_no_truncated_file(seeded_sweep, capsys, monkeypatch):
    """The disk fills up while the report is written (here: half of the second plot fits). The sweep and
    the rebuild say so in one line with how to rebuild it, and fail; no file is left half-written."""
    real_savefig, calls = Figure.savefig, []

    def half_fits(fig, f, **kwargs):
        calls.append(f)
        if len(calls) < 2:
            return real_savefig(fig, f, **kwargs)
        f.write(PNG_MAGIC)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", half_fits)
    assert main([str(seeded_sweep)]) == 2
    line = f"psgd: error: no report: cannot write it (No space left on device: '{seeded_sweep / 'efficiency.png'}'); "
    assert capsys.readouterr().err == line + f"once it can be written: python -m psgd.report {seeded_sweep}\n"
    assert sorted(p.name for p in seeded_sweep.iterdir() if p.is_file()) == ["speedup.png"]  # whole, no temp file
    LAST.update(failed=0)
    calls.clear()  # the sweep's own build: the same plot finds the disk full
    SweepReport().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(seeded_sweep)}}}))
    assert capsys.readouterr().err.startswith(line) and LAST["failed"] == 1  # sweep.py's exit code 1


def recorded(params: dict, task: list[str]):
    """A sweep's Hydra config as multirun.yaml records it: the sweeper's params and the command line."""
    return OmegaConf.create({"sweeper": {"params": params}, "overrides": {"task": task}})


def test_job_count_and_swept_keys_follow_hydras_basic_sweeper():
    lengths = sweep_lengths(recorded({"workers": "1,2,3,4,5", "seed": "0"}, ["workers=1,2", "strategy=ddp,hogwild,x"]))
    assert lengths == {"workers": 2, "seed": 1, "strategy": 3}  # the command line wins over params
    # a glob() picks among a group's choices, which the running Hydra's loader lists (the progress
    # lines of such a sweep said [1], [2], ... and showed every override, not the swept ones)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        assert sweep_lengths(recorded({}, ["optimizer=glob(*)", "experiment=glob(dli_fashion_*)"])) == {
            "optimizer": 3,
            "experiment": 3,  # momentum, novograd, warmup
        }


def test_the_jobs_table_says_what_ended_a_jobs_training_where_it_was_not_max_epochs(tmp_path):
    """A fixed time budget (+trainer.max_time) per worker count: the jobs end at different epochs, and the
    table says max_time ended them. A sweep whose jobs all trained their epochs has no such column."""
    make_job(tmp_path / "timed", 0, {"workers": 1}, done("ddp", 1, 60.0, 0.95, epochs=7, stopped_by="max_time"))
    make_job(tmp_path / "timed", 1, {"workers": 2}, done("ddp", 2, 40.0, 0.97, epochs=12, stopped_by="max_epochs"))
    report = write_report(tmp_path / "timed")
    assert [r["stopped_by"] for r in report.rows] == ["max_time", "max_epochs"]
    md = (tmp_path / "timed" / "report.md").read_text()
    assert "| epochs | stopped_by |" in md and "| 7 | max_time |" in md
    make_job(tmp_path / "whole", 0, {"workers": 1}, done("ddp", 1, 60.0, 0.95, stopped_by="max_epochs"))
    make_job(tmp_path / "whole", 1, {"workers": 2}, done("ddp", 2, 40.0, 0.97, stopped_by="max_epochs"))
    write_report(tmp_path / "whole")
    assert "stopped_by" not in (tmp_path / "whole" / "report.md").read_text()


def test_the_report_shows_swept_values_as_typed(tmp_path):
    """Hydra's sweeper records `+trainer.max_time=00\\:00\\:00\\:01`; the report's column and groups
    show the value as typed."""
    for num, value in enumerate((r"00\:00\:00\:01", r"00\:00\:00\:02")):
        make_job(tmp_path, num, {"+trainer.max_time": value}, done("ddp", 1, 10.0 + num, 0.9))
    report = write_report(tmp_path)
    assert report.swept == ["trainer.max_time"]
    assert [r["trainer.max_time"] for r in report.rows] == ["00:00:00:01", "00:00:00:02"]
    assert "| ddp trainer.max_time=00:00:00:01 | ddp | 1 |" in (tmp_path / "report.md").read_text()


def test_progress_lines_show_the_swept_values_or_else_every_override(tmp_path):
    # a key swept with + (or ++) is swept under its own name
    swept = sweep_lengths(recorded({}, ["+data.seed=1,2", "++trainer.max_time=00:00:00:01,00:00:00:02", "workers=2"]))
    assert swept == {"data.seed": 2, "trainer.max_time": 2, "workers": 1}
    # the swept values as typed, without the escapes of Hydra's sweeper
    overrides = {"+data.seed": 1, "++trainer.max_time": r"00\:00\:00\:01", "workers": 2}
    job = make_job(tmp_path, 0, overrides, done("ddp", 2, 5.0, 0.9))
    line = progress_line(0, 4, {"data.seed", "trainer.max_time"}, job)
    assert line.startswith("psgd: [1/4] data.seed=1 trainer.max_time=00:00:00:01: completed, ")
    # `workers=1,2 workers=3`: one job, workers=3; nothing swept, so every override is shown
    job = make_job(tmp_path / "one", 0, {"data.root": r"/a\ b\,c", "workers": 3}, done("ddp", 3, 5.0, 0.9))
    assert progress_line(0, 1, set(), job).startswith("psgd: [1/1] data.root=/a b,c workers=3: completed, ")


def test_progress_line_says_values_time_and_accuracy_or_the_error(tmp_path):
    ok = make_job(tmp_path, 0, {"workers": 2}, done("ddp", 2, 12.34, 0.98125))
    line = progress_line(0, 5, {"workers"}, ok)
    assert line.startswith("psgd: [1/5] workers=2: completed, 12.3 s training") and "test_acc 0.9812" in line
    skewed = done("hogwild", 2, 9.0, 0.889, partition="by_label", test_acc_per_class=[0.99, None, 0.398833, 0.5])
    line = progress_line(
        2, 5, {"workers"}, make_job(tmp_path, 2, {"workers": 2}, skewed | {"test_classes": list("abcd")})
    )
    assert line.endswith("test_acc 0.8890 (worst class c at 0.3988)")  # the label a label-skewed job knows least
    timed = done("ddp", 2, 60.0, 0.95, epochs=7, max_epochs=50, stopped_by="max_time")
    line = progress_line(3, 5, {"workers"}, make_job(tmp_path, 3, {"workers": 2}, timed))
    assert line.endswith("test_acc 0.9500 (trainer.max_time ended training in epoch 7 of 50)")
    quick = done("ddp", 1, 0.1, 0.1, epochs=1, max_epochs=1, stopped_by="fast_dev_run")
    line = progress_line(4, 5, {"workers"}, make_job(tmp_path, 4, {"workers": 1}, quick))
    assert line.endswith("test_acc 0.1000 (trainer.fast_dev_run ended training in epoch 1 of 1)")
    whole = done("ddp", 1, 9.0, 0.9, epochs=2, max_epochs=2, stopped_by="max_epochs")
    assert progress_line(5, 6, {"workers"}, make_job(tmp_path, 5, {"workers": 1}, whole)).endswith("test_acc 0.9000")
    bad = make_job(tmp_path, 1, {"workers": 3}, {"status": "failed", "error": "data.batch_size=0 is invalid"})
    assert progress_line(1, 5, {"workers"}, bad) == "psgd: [2/5] workers=3: failed: data.batch_size=0 is invalid"


@pytest.mark.parametrize(
    "partition,on_the_command_line", [("by_label", True), ("dirichlet", False), ("iid", True)]
)  # not on the command line: a preset's (experiment=...)
def test_label_skewed_shards_show_the_label_each_job_knows_least(tmp_path, partition, on_the_command_line):
    """With by_label shards HogWild ended at 88.9 % test accuracy knowing one digit at 40 % (README,
    Results): the report shows each job's worst class when the sweep skews the shards."""
    per_class = {
        "ddp": [0.99, 0.98, 0.985, 0.99, 0.99, 0.98, 0.975, 0.99, 0.98, 0.99],
        "hogwild": [1.0, 0.99, 0.99, 1.0, 0.99, 0.95, 0.9, 0.398833, None, 0.8],
    }
    # the ddp job's metrics.json has no class names (written before psgd recorded them): its label is shown
    names = {"hogwild": {"test_classes": [f"class {c}" for c in range(10)]}, "ddp": {}}
    for num, (strategy, accs) in enumerate(per_class.items()):
        m = done(strategy, 2, 10.0, 0.9, test_acc_per_class=accs, partition=partition, **names[strategy])
        overrides = {"strategy": strategy, **({"data.partition": partition} if on_the_command_line else {})}
        make_job(tmp_path, num, overrides, m, workers=2, partition=partition)
    report = write_report(tmp_path)
    table = jobs_table(tmp_path)
    if partition == "iid":
        assert [r["worst_class"] for r in report.rows] == [None, None]
        assert "worst_class" not in table[0]
    else:
        assert [r["worst_class_acc"] for r in report.rows] == [0.975, 0.3988]  # a class with no test sample: None
        assert [r["worst_class"] for r in report.rows] == ["6", "class 7"]  # by name where metrics.json has names
        column = table[0].index("worst_class_acc")
        assert [row[column : column + 2] for row in table[1:]] == [["0.975", "6"], ["0.3988", "class 7"]]
        assert read_csv(tmp_path / "report.csv")[1]["worst_class_acc"] == "0.3988"
        assert read_csv(tmp_path / "report.csv")[1]["worst_class"] == "class 7"


def test_the_report_says_where_the_jobs_ran(tmp_path):
    """workers=1..5 on a 2-core laptop is a sweep users run (psgd does not refuse it): the report names the
    machine (its cores bound S(P) there)."""
    cpu = "cpu: Test CPU (2 cores)"
    for num, (p, threads) in enumerate([(1, 2), (2, 1), (3, 1), (4, 1), (2, 2)]):
        m = done("hogwild", p, 10.0 / min(p, 2), 0.9, device=cpu, threads_per_worker=threads)
        make_job(tmp_path, num, {"workers": p, "threads_per_worker": threads}, m, workers=p)
    write_report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "Swept: workers, threads_per_worker. Ran on cpu: Test CPU (2 cores).\n" in text
    gpu = tmp_path / "gpu"
    for num, p in enumerate([1, 4]):
        make_job(gpu, num, {"workers": p}, done("ddp", p, 5.0, 0.9, device="cuda: H200 x1"), workers=p)
    write_report(gpu)
    assert "Ran on cuda: H200 x1.\n" in (gpu / "report.md").read_text()
