"""The strategy contract's proof: a strategy defined outside psgd (this module, and a strategy YAML in a config dir
of its own on Hydra's search path) trains through train.py's config with 2 workers, has its own key refused with
psgd's one line, writes its own metrics.json key and has its own column in a sweep's report, with no edit to psgd.

"independent": each worker trains alone on its shard, nothing is communicated, and each worker's model is tested
(the run's test_acc is worker 0's); its own figure is the spread of the workers' test accuracies.
"""

import csv
import json
import os
import textwrap
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
from conftest import ROOT, run_cli
from pydantic import Field
from typing_extensions import override

from psgd.command_line import command_line_problem
from psgd.config import checked_runs
from psgd.strategies.contract import StrategyConfig
from psgd.strategies.model_averaging import ModelAveragingStrategy

HERE = Path(__file__).parent


class IndependentStrategy(ModelAveragingStrategy):
    """psgd's replicas, never averaged: each worker ends with the model it trained."""

    strategy_name = "independent"

    @override
    def _finish(self) -> None:
        """Nothing is exchanged at the end either."""

    @override
    def on_train_end(self) -> None:
        super().on_train_end()  # each worker's model tested (worker_test_acc), the checkpoint saved
        accs = self.report.get("worker_test_acc") or [0.0]
        self.report["worker_acc_spread"] = round((max(accs) - min(accs)) * 100, self.digits)


class Independent(StrategyConfig):
    name: Literal["independent"]
    """Each worker trains alone: nothing is communicated, each worker's model is tested."""
    same_init: bool
    """Start every worker from rank 0's initial weights; false: each its own."""
    digits: int = Field(ge=0, le=6)
    """Decimals of worker_acc_spread (percentage points)."""

    report_columns: ClassVar[tuple[str, ...]] = ("worker_acc_spread",)

    @override
    def build(self, run: Any, plan: Any, run_dir: Path) -> Any:
        strategy = IndependentStrategy(same_init=self.same_init, seed=run.seed, **self.lightning_settings(plan))
        strategy.digits = self.digits
        return strategy


YAML = textwrap.dedent(
    """
    # each worker trains alone (tests/integration/test_contract.py)
    _target_: test_contract.Independent
    name: independent
    same_init: true
    digits: 2
    backend: null
    start_method: null
    timeout_s: 120
    """
)


@pytest.fixture
def strategy_dir(tmp_path: Path) -> Path:
    """A config dir holding strategy/independent.yaml, for Hydra's search path."""
    (tmp_path / "conf" / "strategy").mkdir(parents=True)
    (tmp_path / "conf" / "strategy" / "independent.yaml").write_text(YAML)
    return tmp_path / "conf"


def with_this_module() -> dict[str, str]:
    """The environment in which train.py and sweep.py (and their workers) import this module."""
    paths = [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH")]  # (this module imports conftest)
    return {"PYTHONPATH": os.pathsep.join(filter(None, paths))}


def test_a_bad_value_of_its_own_key_is_psgds_one_line(strategy_dir):
    """As train.py judges its command line before it starts anything (psgd.command_line)."""
    argv = [f"hydra.searchpath=[file://{strategy_dir}]", "strategy=independent", "strategy.digits=9"]
    problem = command_line_problem("train", argv, ROOT / "conf", job_check=lambda jobs: checked_runs(jobs, False)[0])
    assert problem == "strategy.digits=9 is invalid: Input should be less than or equal to 6"


def test_a_strategy_from_outside_psgd_trains_records_and_reports(strategy_dir, tiny_data, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(
        "sweep.py",
        "-m",
        f"hydra.searchpath=[file://{strategy_dir}]",
        "strategy=independent",
        "workers=2",
        "strategy.same_init=false",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=1",
        "data.batch_size=64",
        f"hydra.sweep.dir={sweep_dir}",
        env=with_this_module(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job,) = [p.parent for p in sweep_dir.glob("*/metrics.json")]
    metrics = json.loads((job / "metrics.json").read_text())
    assert (metrics["strategy"], metrics["world_size"], metrics["status"]) == ("independent", 2, "completed")
    assert job.name == "0_independent_x2"  # its own name in the run dir
    workers = metrics["worker_test_acc"]
    assert len(workers) == 2 and metrics["test_acc"] == pytest.approx(workers[0], abs=1e-6)  # worker 0's own model
    assert metrics["worker_acc_spread"] == round((max(workers) - min(workers)) * 100, 2)
    assert metrics["comm_bytes"] == [0, 0]  # nothing communicated for training
    with open(sweep_dir / "report.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert row["strategy"] == "independent" and float(row["worker_acc_spread"]) == metrics["worker_acc_spread"]
