"""sweep.py under Hydra's real multirun: one job dir per value."""

from conftest import run_cli
from helpers import metrics


def test_multirun_runs_one_job_per_value(tiny_data, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(
        "sweep.py",
        "-m",
        "seed=0,1",
        f"data.root={tiny_data}",
        "trainer.max_epochs=1",
        "data.batch_size=64",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    jobs = [metrics(sweep_dir / str(i)) for i in range(2)]
    assert [j["seed"] for j in jobs] == [0, 1]
    assert all(j["status"] == "completed" for j in jobs)
