"""Bad input through train.py: one clear line, a non-zero exit, no traceback and no result dir.

(Every check itself is unit-tested in tests/unit/test_config.py; these run the CLI path end to end.)"""

import pytest
from conftest import run_cli

CASES = [
    (["trainer.devices=0"], "trainer.devices=0"),
    (["workers=2", "data.partition=sizes", "data.partition_sizes=[0.5,0.4]"], "sum to 1"),
    (["model=singa_cnn", "data=cifar10"], "needs 28x28 inputs"),
]


@pytest.mark.parametrize("overrides,fragment", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_bad_value_is_one_line_and_nonzero_exit(tiny_data, tmp_path, overrides, fragment):
    run_dir = tmp_path / "run"
    proc = run_cli("train.py", f"data.root={tiny_data}", f"hydra.run.dir={run_dir}", *overrides, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("psgd: error: ") and fragment in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not run_dir.exists()  # nothing written as a result


def test_unknown_model_lists_the_choices(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("train.py", "model=resnet50", f"hydra.run.dir={run_dir}", timeout=120)
    assert proc.returncode != 0
    assert "Could not find 'model/resnet50'" in proc.stderr
    for choice in ("lab_cnn", "wide_resnet", "singa_cnn", "mlp"):
        assert choice in proc.stderr
    assert "Traceback" not in proc.stderr and not run_dir.exists()


def test_missing_dataset_names_the_path_and_the_fix(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "train.py", f"data.root={tmp_path / 'empty'}", "data.download=false", f"hydra.run.dir={run_dir}", timeout=120
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / "empty") in lines[0] and "PSGD_DATA" in lines[0], proc.stderr
    assert not run_dir.exists()
