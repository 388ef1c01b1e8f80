"""psgd's strategies in a user's own Lightning code (`Trainer(strategy="model_averaging")` once
psgd.strategies.registry is imported, as the README offers): a LightningModule and DataLoaders of the user's
own, real worker processes."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ThreadsAtExit, own_lines

pytestmark = pytest.mark.distributed

MODULE = """
import torch, torch.nn.functional as F
import pytorch_lightning as L

class Mine(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
"""

# a user's script, with MODULE beside it (a user's own module file): write_script
SCRIPT = """
import json, signal, sys
from pathlib import Path
import torch
import pytorch_lightning as L
from torch.utils.data import DataLoader, TensorDataset
import psgd.strategies.registry  # registers model_averaging, diloco, elastic_averaging and hogwild
import mymodule

OUT = Path(sys.argv[2])

class Mine(mymodule.Mine):
    def on_fit_end(self):  # after the strategy's end of training: what each worker ends with
        torch.save(self.net.state_dict(), OUT / f"rank{self.global_rank}.pt")
        (OUT / f"sigint{self.global_rank}").write_text(getattr(signal.getsignal(signal.SIGINT), "__name__", "?"))
        if self.global_rank == 0:
            (OUT / "report.json").write_text(json.dumps(getattr(self.trainer.strategy, "report", None)))

if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 3, (256,)))
    trainer = L.Trainer(
        strategy=sys.argv[1], accelerator="cpu", devices=2, max_epochs=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Mine(), DataLoader(data, batch_size=16))
    (OUT / "main_report.json").write_text(json.dumps(trainer.strategy.report))  # in this, the caller's process
"""


def write_script(folder, text: str, name: str = "mine.py"):
    """A user's script in `folder`, with their module (MODULE) beside it."""
    (folder / "mymodule.py").write_text(MODULE)
    (folder / name).write_text(text)
    return folder / name


@pytest.mark.parametrize("strategy", ["model_averaging", pytest.param("hogwild", marks=pytest.mark.slow)])
def test_a_users_own_module_trains_and_ends_with_one_model(tmp_path, strategy):
    """Model averaging failed at the end of such a run: it evaluated each replica with psgd's
    Classifier.evaluate and datamodule ("'Mine' object has no attribute 'evaluate'"). Now the replicas
    are averaged all the same, without the per-replica accuracy psgd's own runs report.
    No worker leaves its process group to Python's shutdown, where a gloo thread can abort it: model
    averaging's spawned rank 1 ended so now and then ("terminate called without an active exception",
    SIGABRT, after `max_epochs=2` reached); the thread count below fails every run without the fix."""
    script, threads = write_script(tmp_path, SCRIPT), ThreadsAtExit(tmp_path / "threads")
    proc = subprocess.run(
        [sys.executable, str(script), strategy, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **threads.env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert threads.processes() and not threads.gloo_left(), threads.processes()
    ends = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert all(torch.equal(ends[0][k], ends[1][k]) for k in ends[0])  # one model: averaged, or shared
    # Ctrl-C in a worker is raised outside threading's code (psgd.signals.ctrl_c): inside, it could make
    # rank 0's TensorBoard logger wait up to 2 minutes at its close
    assert [(tmp_path / f"sigint{r}").read_text() for r in (0, 1)] == ["ctrl_c", "ctrl_c"]
    report = json.loads((tmp_path / "report.json").read_text())
    # the strategy's report reaches the caller's process too (Lightning itself sends back weights, state and
    # logged metrics only)
    assert json.loads((tmp_path / "main_report.json").read_text()) == report and report
    if strategy == "model_averaging":
        assert report["replica_distance"] > 0  # the two shards had moved the replicas apart before
        assert "worker_test_acc" not in report


@pytest.mark.parametrize("period", [0, -3, 2.5, True])
def test_a_bad_averaging_period_in_code_is_refused_as_on_the_command_line(period):
    from psgd.strategies.model_averaging import ModelAveragingStrategy

    with pytest.raises(ValueError, match=rf"^period={period!r} is invalid: must be an integer >= 1, or None"):
        ModelAveragingStrategy(period=period)  # 0 had silently meant "only at the end"
    assert ModelAveragingStrategy(period=5).period == 5 and ModelAveragingStrategy().period is None


# what a notebook cell or Python's prompt runs: `__main__` has no file, and Lightning takes the session as
# interactive (sys.ps1, set before it is imported)
SESSION = """
import sys
sys.ps1 = ">>> "
sys.path.insert(0, {module_dir!r})
import torch
import pytorch_lightning as L
from torch.utils.data import DataLoader, TensorDataset
import psgd.strategies.registry
from hydra import compose, initialize_config_dir
from psgd.run import train
from mymodule import Mine  # a user's module in a file beside the notebook

class Here(Mine):  # a class of the session's own
    pass

class Noted(L.Callback):
    pass

def lightning():
    return L.Trainer(strategy={strategy!r}, accelerator="cpu", devices=2, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)

data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,))), batch_size=16)
with initialize_config_dir(config_dir={conf!r}, version_base="1.3"):
    overrides = ["workers=2", "data.root={data}", "data.val_split=0", "trainer.max_epochs=1", "quiet=true"]
    cfg = compose(config_name="train", overrides=overrides)
for attempt in (lambda: lightning().fit(Here(), data), lambda: train(cfg, {refused!r}, callbacks=[Noted()])):
    try:
        attempt()
    except TypeError as e:
        print("refused:", e, flush=True)
trainer = lightning()
trainer.fit(Mine(), data)
print("trained in code:", trainer.state.finished, flush=True)
print("trained by psgd:", train(cfg, {run_dir!r})["status"], flush=True)
"""


# hogwild's workers come from psgd's fork server; model averaging's are spawned (~6 s more: slow)
@pytest.mark.parametrize("strategy", ["hogwild", pytest.param("model_averaging", marks=pytest.mark.slow)])
def test_a_notebook_runs_workers_and_refuses_its_own_classes_by_name(tmp_path, tiny_data, strategy):
    """In a notebook (or at Python's prompt) Lightning refuses every spawned run ("Trainer(strategy=...) is
    not compatible with an interactive environment"). psgd's workers start from a fresh interpreter or its
    fork server, not from a fork of the session, so they run; what they cannot get, a class of the
    session's own (the workers start without its code: "Can't get attribute 'Here' on <module
    '__main__'>"), is refused by name before any worker starts or any file is written."""
    from conftest import CONF

    (tmp_path / "mymodule.py").write_text(MODULE)
    refused, run_dir = tmp_path / "refused", tmp_path / "run"
    code = SESSION.format(
        module_dir=str(tmp_path),
        conf=str(CONF),
        data=tiny_data,
        refused=str(refused),
        run_dir=str(run_dir),
        strategy=strategy,
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    session = (
        "is defined in this interactive session (a notebook or Python's prompt), and each worker process starts "
        "without the session's code: define it in a .py file beside the notebook and import it from there, or run "
        "one worker in this process"
    )
    assert own_lines(proc.stdout) == [
        f"refused: Here {session}",
        f"refused: Noted {session}",
        "trained in code: True",
        "trained by psgd: completed",
    ], proc.stdout + proc.stderr[-3000:]
    assert not refused.exists()
    assert json.loads((run_dir / "metrics.json").read_text())["workers"] == 2
