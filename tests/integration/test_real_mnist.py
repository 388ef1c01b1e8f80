"""The headline claims on the real MNIST files in ../shared/data (slow: run with `pytest -m slow`)."""

import pytest
from conftest import SHARED_DATA, run_cli
from helpers import metrics

pytestmark = [
    pytest.mark.slow,
    pytest.mark.real_data,
    pytest.mark.skipif(not (SHARED_DATA / "MNIST").exists(), reason="../shared/data not present"),
]


def test_default_run_reaches_99_percent(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("train.py", f"data.root={SHARED_DATA}", "quiet=true", f"hydra.run.dir={run_dir}", timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert metrics(run_dir)["test_acc"] >= 0.99


def test_four_gloo_workers_one_epoch(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "train.py",
        "strategy=ddp",
        "trainer.devices=4",
        "trainer.max_epochs=1",
        f"data.root={SHARED_DATA}",
        "quiet=true",
        f"hydra.run.dir={run_dir}",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    m = metrics(run_dir)
    assert m["world_size"] == 4 and m["test_acc"] > 0.9
