"""Failing loud and fast: dead workers, Ctrl-C, resume, bad checkpoints, concurrent runs."""

import atexit
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytorch_lightning as L
import torch
import torch.distributed as dist
from conftest import DUMPS_STACKS, ROOT, ThreadsAtExit, compose_cfg, ended, run_cli, user_code
from integration.helpers import undocumented
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from psgd.process import proc_stat
from psgd.run import train
from psgd.strategies.workers import lost_a_peer

TINY = ["quiet=true", "data.batch_size=16", "data.eval_batch_size=64"]


def one_epoch_run(tiny_data, run_dir: Path) -> Path:
    """`run_dir`, where train.py has trained one epoch on the small generated data (a checkpoint to resume)."""
    proc = run_cli(
        "train.py",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=1",
        f"hydra.run.dir={run_dir}",
        *TINY,
    )
    assert proc.returncode == 0, proc.stderr
    return run_dir


def long_run(tiny_data, *more: str) -> list[str]:
    """A run of 200 epochs on the small generated data, all of it trained on: one a test stops."""
    return [f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=200", *TINY, *more]


def start(run_dir: Path, *overrides: str, background: bool = False, env: dict | None = None) -> subprocess.Popen:
    """train.py in a session of its own; `background`: with SIGINT ignored, as a shell starts `cmd &`."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **DUMPS_STACKS, **(env or {})}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if background else None,
    )


def wait_for_epochs(run_dir: Path, proc: subprocess.Popen, epochs: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            m = json.loads((run_dir / "metrics.json").read_text())
            if len(m["history"]) >= epochs:
                return m
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"no {epochs} finished epochs within {timeout}s")


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def command_line(pid: int) -> str:
    """The process's command line; "" once it has exited (a child can end between `children` listing it
    and this read: CI once failed on that FileNotFoundError while a run's workers were starting)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def worker_pids(launcher: int) -> list[int]:
    """The training workers of a psgd launcher process, in rank order (rank = start order)."""
    workers = [p for p in children(launcher) if "spawn_main" in command_line(p)]
    if not workers:  # forkserver (hogwild): the workers are children of the fork server
        server = [p for p in children(launcher) if "forkserver" in command_line(p)]
        workers = sorted(c for s in server for c in children(s))
    return workers


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive(pids)


def stop_after_two_epochs(run_dir: Path, proc: subprocess.Popen, send, workers: int = 2) -> tuple[str, list[int]]:
    """Once `proc` has finished two epochs (the first epoch's checkpoint is written before the second
    starts), call `send(worker_pids)`; returns its stderr once it has ended (at most 60 s later, else
    it is killed and the test fails) and the worker pids."""
    try:
        wait_for_epochs(run_dir, proc, 2)
        pids = worker_pids(proc.pid) if workers > 1 else []
        assert len(pids) == (workers if workers > 1 else 0), pids
        send(pids)
        _, stderr = ended(proc, 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    return stderr, pids


def alive(pids: list[int]) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists() and "zombie" not in _state(p)]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


@pytest.mark.distributed
@pytest.mark.parametrize(
    "strategy",
    # slow: model averaging's workers are started and watched as DDP's are (spawn); hogwild's are started by a
    # fork server and watched by the same launcher code (test_workers_do_not_outlive_a_killed_launcher: hogwild)
    ["ddp", pytest.param("model_averaging", marks=pytest.mark.slow), pytest.param("hogwild", marks=pytest.mark.slow)],
)
def test_a_killed_worker_ends_the_run_with_its_rank(tiny_data, tmp_path, strategy):
    run_dir = tmp_path / "run"
    proc = start(run_dir, *long_run(tiny_data, f"strategy={strategy}", "workers=2"))
    victim = 1
    stderr, workers = stop_after_two_epochs(run_dir, proc, lambda pids: os.kill(pids[victim], signal.SIGKILL))
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith(f"psgd: error: worker rank {victim} died (signal SIGKILL)"), stderr
    # (a surviving worker that loses its peer mid-collective may, in a race with torch's clean-up, print
    # its own connection-reset traceback first; the run's verdict is the last line)
    time.sleep(1)
    assert alive(workers) == []  # no process left behind
    m = json.loads((run_dir / "metrics.json").read_text())
    assert len(m["history"]) >= 2 and m["status"] == "failed"  # finished epochs stay on disk
    assert undocumented(run_dir) == []  # what the record says (its error too) is in the README
    assert_resumable(run_dir)


@pytest.mark.distributed
def test_a_killed_fork_server_ends_the_run_in_one_line_and_takes_its_workers(tiny_data, tmp_path):
    """psgd's fork server (the default start on CPU) tells the launcher how each of its workers ended;
    killed (by the OOM killer, say), it can tell nothing: the run ends as by a dead worker, and the
    orphaned workers, which would train on, are stopped."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, *long_run(tiny_data, "workers=2"))

    def kill_the_server(workers: list[int]) -> None:
        os.kill(int(proc_stat(workers[0])[1]), signal.SIGKILL)  # the workers' parent

    stderr, workers = stop_after_two_epochs(run_dir, proc, kill_the_server)
    last = stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"psgd: error: worker rank [01] died \(exit code 255\); .* in {re.escape(str(run_dir))}", last)
    assert proc.returncode == 2
    assert gone_within(workers, 5)
    m = json.loads((run_dir / "metrics.json").read_text())
    assert len(m["history"]) >= 2 and m["status"] == "failed"


@pytest.mark.distributed
def test_sigterm_to_one_worker_ends_the_run_with_its_rank(tiny_data, tmp_path):
    # Lightning's SIGTERM handler broadcast from inside the handler: with psgd's workers not joining
    # it, the run hung until the process group's timeout (30 min)
    run_dir = tmp_path / "run"
    proc = start(run_dir, *long_run(tiny_data, "workers=2"))
    stderr, workers = stop_after_two_epochs(run_dir, proc, lambda pids: os.kill(pids[1], signal.SIGTERM))
    assert stderr.strip().splitlines()[-1].startswith("psgd: error: worker rank 1 died (signal SIGTERM)"), stderr
    assert gone_within(workers, 5)
    m = json.loads((run_dir / "metrics.json").read_text())
    assert len(m["history"]) >= 2 and m["status"] == "failed"
    assert_resumable(run_dir)


@pytest.mark.distributed
@pytest.mark.slow  # ~50 s, most of it torch's 30 s SIGTERM grace; the verdict is unit-tested in test_launcher.py
def test_a_stopped_worker_ends_the_run_naming_it_not_the_peer_that_timed_out(tiny_data, tmp_path):
    """A worker that stops (SIGSTOP here; a deadlock or a hung system call alike) does not die: its peer's
    collective times out after strategy.timeout_s, and that peer's gloo error used to be the verdict
    ("worker rank 0 failed: RuntimeError: [...] Timed out waiting 5000ms for recv operation to complete")."""
    run_dir = tmp_path / "run"
    overrides = [
        "workers=2",
        "strategy.timeout_s=5",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=200",
        *TINY,
    ]
    proc = start(run_dir, *overrides)
    stderr, workers = stop_after_two_epochs(run_dir, proc, lambda pids: os.kill(pids[1], signal.SIGSTOP))
    line = (
        "psgd: error: worker rank 1 stopped responding: worker rank 0 waited for it in a collective (5 s, "
        "strategy.timeout_s) and it did not exit on SIGTERM either (stopped, deadlocked or stuck in a system call); "
        f"results of finished epochs are in {run_dir}"
    )
    assert stderr.strip().splitlines()[-1] == line, stderr
    assert gone_within(workers, 5)
    m = json.loads((run_dir / "metrics.json").read_text())
    assert len(m["history"]) >= 2 and m["status"] == "failed" and m["error"] == line.removeprefix("psgd: error: ")
    assert_resumable(run_dir)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "strategy,to",
    [
        ("ddp", "launcher"),  # kill <pid>, timeout: the launching process only
        pytest.param("ddp", "group", marks=pytest.mark.slow),  # scancel, kill -- -<pgid>: every process
        pytest.param("hogwild", "launcher", marks=pytest.mark.slow),  # workers started by a fork server
    ],
)
def test_sigterm_stops_the_run_as_ctrl_c_does(tiny_data, tmp_path, strategy, to):
    # started in the background (SIGINT ignored), where the workers had trained on, orphaned, to the end
    run_dir = tmp_path / "run"
    args = long_run(tiny_data, f"strategy={strategy}", "workers=2")
    proc = start(run_dir, *args, background=True)
    send = os.kill if to == "launcher" else os.killpg
    stderr, workers = stop_after_two_epochs(run_dir, proc, lambda pids: send(proc.pid, signal.SIGTERM))
    assert stderr.strip().splitlines()[-1].startswith("psgd: interrupted (SIGTERM); finished epochs are kept"), stderr
    assert proc.returncode == 128 + signal.SIGTERM  # as a shell reports it (Lightning's exit code was 1)
    assert gone_within(workers, 5)
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["status"] == "interrupted" and len(m["history"]) >= 2
    assert_resumable(run_dir)
    assert not list(run_dir.glob("**/.*.tmp"))


@pytest.mark.distributed
@pytest.mark.parametrize(
    "strategy",
    ["ddp", pytest.param("model_averaging", marks=pytest.mark.slow), pytest.param("hogwild", marks=pytest.mark.slow)],
)
def test_ctrl_c_to_the_launcher_alone_stops_its_workers(tiny_data, tmp_path, strategy):
    """`kill -INT <pid>`, `timeout -s INT`, an IDE's stop button: SIGINT reaches the launcher only, and its
    workers trained on to max_epochs before the run ended as interrupted, its result thrown away; then they
    trained on for the launcher's 10 s before its SIGTERM (two more epochs of the lab CNN). They stop at once now:
    the last worker ends within 1.5 s of the signal, with at most the epoch then under way finished after it."""
    run_dir = tmp_path / "run"
    args = long_run(tiny_data, f"strategy={strategy}", "workers=2")
    proc = start(run_dir, *args)
    sent = {}

    def interrupt(pids: list[int]) -> None:
        sent["epochs"] = len(json.loads((run_dir / "metrics.json").read_text())["history"])
        sent["at"] = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        while alive(pids) and time.monotonic() - sent["at"] < 30:
            time.sleep(0.02)
        sent["took"] = time.monotonic() - sent["at"]  # to the last worker's end

    stderr, workers = stop_after_two_epochs(run_dir, proc, interrupt)
    assert stderr.strip().splitlines()[-1] == f"psgd: interrupted; finished epochs are kept in {run_dir}", stderr
    assert proc.returncode == 128 + signal.SIGINT
    assert sent["took"] < 1.5 and not alive(workers), f"the last worker ended {sent['took']:.1f} s after the signal"
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["status"] == "interrupted" and sent["epochs"] <= len(m["history"]) <= sent["epochs"] + 1
    assert_resumable(run_dir)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "strategy",
    # hogwild's fork-server workers are the harder case (their parent, the fork server, outlives the
    # launcher); spawned workers are watched the same way
    [pytest.param("ddp", marks=pytest.mark.slow), "hogwild"],
)
def test_workers_do_not_outlive_a_killed_launcher(tiny_data, tmp_path, strategy):
    run_dir = tmp_path / "run"
    args = long_run(tiny_data, f"strategy={strategy}", "workers=2")
    proc = start(run_dir, *args, background=True)
    try:
        wait_for_epochs(run_dir, proc, 2)
        workers = worker_pids(proc.pid)
        assert len(workers) == 2, workers
        os.kill(proc.pid, signal.SIGKILL)  # nothing of the launcher's runs: the workers must notice
        proc.communicate(timeout=10)
        assert gone_within(workers, 30), "workers still training after their launcher died"
    finally:
        for p in alive(locals().get("workers", [])):
            os.kill(p, signal.SIGKILL)


@pytest.mark.distributed
def test_a_worker_still_starting_does_not_outlive_its_launcher(tiny_data, tmp_path):
    """The OOM killer took a launcher and one worker while the workers were starting: the others waited
    in the process group's rendezvous for the dead one's store, orphaned, until strategy.timeout_s (30
    min by default). Killing the launcher and worker 0 just after the spawn is that case."""
    run_dir = tmp_path / "run"
    args = [
        "workers=2",
        "strategy.timeout_s=300",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=200",
        *TINY,
    ]
    proc = start(run_dir, *args, background=True)
    workers = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            workers = worker_pids(proc.pid)
            time.sleep(0.05)
        assert len(workers) == 2, workers
        for pid in (proc.pid, workers[0]):
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=10)  # (its output pipes stay open while a worker lives)
        assert gone_within(workers, 20), "a worker still waits for its peers after its launcher died"
    finally:
        for p in alive(workers):
            os.kill(p, signal.SIGKILL)


def test_sigterm_to_a_one_worker_run(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(run_dir, *long_run(tiny_data), background=True)
    stderr, _ = stop_after_two_epochs(run_dir, proc, lambda pids: os.kill(proc.pid, signal.SIGTERM), workers=1)
    assert stderr.strip().splitlines()[-1].startswith("psgd: interrupted (SIGTERM)"), stderr
    assert proc.returncode == 128 + signal.SIGTERM
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["status"] == "interrupted" and len(m["history"]) >= 2
    assert_resumable(run_dir)


def assert_resumable(run_dir: Path) -> None:
    """A run that died keeps a checkpoint of a finished epoch to resume from (ckpt_path=<run dir>)."""
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] > 0 and ckpt["state_dict"]


@pytest.mark.parametrize(
    "workers,method",
    [(1, None), (2, None), pytest.param(2, "spawn", marks=pytest.mark.slow)],
    ids=["in-process", "ddp-2", "ddp-2-spawn"],
)
def test_ctrl_c_leaves_a_valid_metrics_file_marked_interrupted(tiny_data, tmp_path, workers, method):
    """The interrupted workers let go of the process group before Python shuts down (its threads outlived
    every exit hook, which could abort a worker: see the limit_train_batches test in test_cli_errors.py).
    That shutdown is a spawned worker's; psgd's fork server (the default) is ignoring Ctrl-C, its
    workers are not, and they leave by os._exit."""
    run_dir, threads = tmp_path / "run", ThreadsAtExit(tmp_path)
    overrides = long_run(tiny_data, f"workers={workers}")
    overrides += [f"strategy.start_method={method}"] if method else []
    proc = start(run_dir, *overrides, env=threads.env)
    # what Ctrl-C sends: SIGINT to the whole foreground process group
    stderr, _ = stop_after_two_epochs(run_dir, proc, lambda pids: os.killpg(proc.pid, signal.SIGINT), workers=workers)
    assert stderr.strip().splitlines() == [f"psgd: interrupted; finished epochs are kept in {run_dir}"]
    assert proc.returncode == 128 + signal.SIGINT  # 130, as before training started (Lightning's exit code was 1)
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["status"] == "interrupted" and len(m["history"]) >= 2 and undocumented(run_dir) == []
    # train.py (and multiprocessing's resource tracker); spawned workers too
    assert len(threads.processes()) >= (1 if method is None else 1 + workers), threads.processes()
    assert not threads.gloo_left(), threads.processes()
    assert_resumable(run_dir)
    assert not list(run_dir.glob(".*.tmp"))  # no half-written temp files left


def test_ctrl_c_between_fit_and_test_keeps_the_epochs_and_says_so(tiny_data, tmp_path, monkeypatch, capsys):
    """Between fit and the test (and during the last writes) no handler of Lightning's winds a run down:
    Ctrl-C there reached the script, which said "interrupted before training started; nothing was
    written" of a run whose finished epochs were in its dir, and left metrics.json "trained"."""
    import psgd.run
    from psgd import signals

    def ctrl_c(*args):  # where the test's Trainer is made, after fit
        raise KeyboardInterrupt

    monkeypatch.setattr(psgd.run, "final_test", ctrl_c)
    monkeypatch.setattr(signals, "received", None)
    for run_dir, job in ((tmp_path / "run", True), (tmp_path / "api", False)):
        overrides = (f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=1", *TINY)
        if job:  # as train.py runs it
            cfg = job_config(run_dir, monkeypatch, *overrides)
        else:  # psgd.run.train called from Python (a notebook): Hydra has no job
            from hydra.core.hydra_config import HydraConfig

            monkeypatch.setattr(HydraConfig.instance(), "cfg", None)
            cfg = compose_cfg(*overrides)
        try:  # (a KeyboardInterrupt left to pytest would stop the whole test run)
            train(cfg, run_dir)
            pytest.fail("train returned")
        except KeyboardInterrupt:
            code = "KeyboardInterrupt"  # a script would say "before training started; nothing was written"
        except SystemExit as e:
            code = e.code
        # the script exits as a shell reports Ctrl-C; Python's caller gets Ctrl-C's own exception (it got
        # SystemExit: a notebook showed "SystemExit: 130", and `except KeyboardInterrupt` missed it)
        assert code == (130 if job else "KeyboardInterrupt")
        assert capsys.readouterr().err.strip() == f"psgd: interrupted; finished epochs are kept in {run_dir}"
        m = json.loads((run_dir / "metrics.json").read_text())
        assert m["status"] == "interrupted" and len(m["history"]) == 1


def job_config(run_dir: Path, monkeypatch, *overrides: str):
    """The config as Hydra hands it to a job (psgd.cli.run_job) whose output dir is `run_dir`."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
    hydra = HydraConfig.instance()
    monkeypatch.setattr(hydra, "cfg", None)  # the singleton is restored after the test
    hydra.set_config(cfg)
    return cfg


def test_ctrl_c_before_training_leaves_no_run_dir_for_the_script_to_report(tmp_path, monkeypatch, capsys):
    """Ctrl-C before fit (the data being read) goes on to the script (command_line.exit_interrupted says
    so) once the dir Hydra made is gone. (The job's train() is stood in for, to stop it on cue.)"""
    import psgd.cli as cli

    run_dir = tmp_path / "run"
    cfg = job_config(run_dir, monkeypatch)

    def stopped(cfg, run_dir: Path):
        (run_dir / ".hydra").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "train", stopped)
    try:  # (a KeyboardInterrupt left to pytest would stop the whole test run)
        cli.run_job(cfg)
        pytest.fail("run_job returned")
    except KeyboardInterrupt:
        code = "KeyboardInterrupt"
    except SystemExit as e:
        code = e.code
    assert code == "KeyboardInterrupt" and not run_dir.exists() and capsys.readouterr().err == ""


def test_a_signal_while_a_bad_value_is_reported_still_leaves_no_run_dir(tmp_path, monkeypatch):
    """Under torchrun the agent SIGTERMs the other workers once the first has said a bad value and
    exited: one that was still working out its error line took it before removing the dir Hydra made
    (the signal stood in for here by the line's own work raising KeyboardInterrupt). The dir goes first."""
    import psgd.cli as cli
    from psgd.config import ConfigError

    run_dir = tmp_path / "run"
    cfg = job_config(run_dir, monkeypatch)

    def bad_value(cfg, run_dir: Path):
        (run_dir / ".hydra").mkdir(parents=True)
        (run_dir / "train.log").write_text("")
        raise ConfigError("workers=3 trainer.num_nodes=1 do not match torchrun's 2 processes per node")

    def signalled(e, run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "train", bad_value)
    monkeypatch.setattr(cli, "error_line", signalled)
    try:  # (a KeyboardInterrupt left to pytest would stop the whole test run)
        cli.run_job(cfg)
        pytest.fail("run_job returned")
    except KeyboardInterrupt:
        pass
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "script,workers,sig",
    [
        pytest.param("train.py", 1, signal.SIGINT, id="ctrl-c-train.py"),
        pytest.param("sweep.py", 1, signal.SIGINT, id="ctrl-c-sweep.py", marks=pytest.mark.slow),  # as sigterm-sweep.py
        pytest.param("train.py", 2, signal.SIGINT, id="ctrl-c-2-workers"),
        pytest.param("sweep.py", 1, signal.SIGTERM, id="sigterm-sweep.py"),
        # ~6-8 s each, the same path as sigterm-sweep.py's and ctrl-c's with the scripts' own signal
        pytest.param("train.py", 1, signal.SIGTERM, id="sigterm-train.py", marks=pytest.mark.slow),
        pytest.param("train.py", 2, signal.SIGTERM, id="sigterm-2-workers", marks=pytest.mark.slow),
    ],
)
def test_ctrl_c_while_starting_up_is_one_line_and_leaves_nothing(tiny_data, tmp_path, script, workers, sig):
    """Ctrl-C in the first seconds (the checks, torch loading) printed a traceback of whatever was
    loading (torch's operator registry, scipy's docstrings ...); SIGTERM ended the script without a word
    (and, once Hydra had made the run dir, left it without results). With 2 workers psgd's fork server
    is importing too by then (psgd.forkserver): it says nothing and ends with the script."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / script),
            f"workers={workers}",
            f"data.root={tiny_data}",
            "data.val_split=0",
            f"hydra.run.dir={out}",
            f"hydra.sweep.dir={out}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(1.0 if workers == 1 else 2.0)  # still loading: torch alone takes longer (the server starts at ~1 s)
    os.killpg(proc.pid, sig)
    _, stderr = ended(proc, 60)
    assert proc.returncode == 128 + sig, stderr  # 130, 143: as a shell reports the signal
    how = " (SIGTERM)" if sig == signal.SIGTERM else ""
    assert stderr.strip().splitlines() == [f"psgd: interrupted{how} before training started; nothing was written"]
    assert not out.exists()
    assert gone_within_session(proc.pid, 10), "a process of the run outlived it"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_hydra_sets_up_the_job_leaves_no_run_dir(tiny_data, tmp_path, sig):
    """Between making the run dir and calling the job, Hydra saves the job's config and opens its log:
    a signal there (under torchrun the agent's SIGTERM, sent once another worker had said a bad value
    and exited, to a worker a second behind it) left the dir with .hydra/ and the log, no results, and
    "nothing was written" said of it. Signals wait through Hydra's setup now, and the job removes the
    dir. The signal is sent on cue, from where Hydra saves the config (a sitecustomize)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, hydra.core.utils as u\n"
        "save = u._save_config\n"
        "def signalled(*a, **k):\n"
        f"    os.kill(os.getpid(), {int(sig)})\n"
        "    return save(*a, **k)\n"
        "u._save_config = signalled\n"
    )
    out = tmp_path / "out"
    path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), f"data.root={tiny_data}", "data.val_split=0", f"hydra.run.dir={out}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )
    how = " (SIGTERM)" if sig == signal.SIGTERM else ""
    assert proc.returncode == 128 + sig, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [f"psgd: interrupted{how} before training started; nothing was written"]
    assert not out.exists(), sorted(str(p.relative_to(out)) for p in out.rglob("*"))


def gone_within_session(session: int, seconds: float) -> bool:
    """Every process of the session (process group) `session` has ended within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(session, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


TORCH_IMPORT_SPY = """
import atexit, runpy, signal, sys

seen = []


class Spy:  # on the meta path: notes the signal mask when torch is first imported, imports nothing
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        return None


sys.meta_path.insert(0, Spy())
report = sys.argv.pop()
atexit.register(lambda: open(report, "w").write(repr(seen)))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize(
    "script,sweep",
    [("train.py", []), pytest.param("sweep.py", ["workers=1,2"], marks=pytest.mark.slow)],  # the same load_training
    ids=["train.py", "sweep.py"],
)
def test_torch_is_first_imported_with_ctrl_c_and_sigterm_held(tmp_path, script, sweep):
    """A Ctrl-C inside torch's import can abort the process (pybind11) or, caught as an ImportError by a
    check that skips what it cannot judge, leave numpy half-loaded: a clean clone's CI run of
    test_ctrl_c_while_starting_up[ctrl-c-sweep.py] ended in "ImportError: cannot load module more than
    once per process", exit 1. sweep.py's checks of each job on this machine imported torch before
    load_training held the signals; now both scripts import it first with them held."""
    seen = tmp_path / "mask"
    out = [f"hydra.run.dir={tmp_path / 'out'}", f"hydra.sweep.dir={tmp_path / 'out'}"]
    args = [str(ROOT / script), *sweep, f"data.root={tmp_path / 'nodata'}", "data.download=false", *out, str(seen)]
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_IMPORT_SPY, *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode in (1, 2), proc.stderr  # the missing data: the run, or the sweep's jobs, failed
    masks = eval(seen.read_text())
    assert len(masks) == 1 and {int(signal.SIGINT), int(signal.SIGTERM)} <= set(masks[0]), masks


@pytest.mark.distributed
@pytest.mark.slow  # ~25 s each; resuming to the uninterrupted weights over workers is also run by test_model_averaging
@pytest.mark.parametrize("inside_an_epoch", [False, True], ids=["epoch-end", "inside-an-epoch"])
def test_ddp_resume_ends_with_the_same_weights_as_an_uninterrupted_run(tiny_data, tmp_path, inside_an_epoch):
    """From an epoch's checkpoint, or from the run dir of a run trainer.max_steps cut inside an epoch (16 steps
    an epoch per worker; 20: the second's fourth, which the resume trains again from its start)."""
    common = [
        "workers=2",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=2",
        *TINY,
    ]  # dropout on: reseeded per epoch
    straight = tmp_path / "straight"
    proc = run_cli("train.py", *common, "checkpoint_every_epoch=true", f"hydra.run.dir={straight}")
    assert proc.returncode == 0, proc.stderr
    checkpoint = straight / "checkpoints" / "epoch0.ckpt"
    if inside_an_epoch:
        checkpoint = tmp_path / "cut"
        proc = run_cli("train.py", *common, "trainer.max_steps=20", f"hydra.run.dir={checkpoint}")
        assert proc.returncode == 0, proc.stderr
    resumed = tmp_path / "resumed"
    proc = run_cli("train.py", *common, f"ckpt_path={checkpoint}", f"hydra.run.dir={resumed}")
    assert proc.returncode == 0, proc.stderr
    a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((resumed / "metrics.json").read_text())["epochs"] == 2


@pytest.mark.slow  # ~15 s: two train.py runs; each check is a unit test (tests/unit/test_resume.py)
def test_a_resume_that_would_not_follow_the_command_line_is_one_line(tiny_data, tmp_path):
    # the checks themselves (another model, a file that is not a checkpoint, another schedule or
    # worker count) are unit tests in tests/unit/test_resume.py; here one of them, end to end
    first = one_epoch_run(tiny_data, tmp_path / "first")
    # the same model with another lr schedule: resuming would restore the checkpoint's (before, a
    # 1-epoch cosine run resumed with trainer.max_epochs=2 trained its second epoch at lr 0)
    second = tmp_path / "second"
    longer = ["trainer.max_epochs=2", f"ckpt_path={first}"]
    proc = run_cli("train.py", f"data.root={tiny_data}", "data.val_split=0", *longer, f"hydra.run.dir={second}", *TINY)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"psgd: error: ckpt_path='{first}' cannot be resumed with trainer.max_epochs=2 under a cosine decay "
        "(the checkpoint's run had 1: its cosine reaches lr 0 there): resuming restores its optimizer and lr "
        "schedule as they were, which would not follow this change; resume with the checkpoint's settings, add "
        "scheduler.restart=true to go on from its weights and optimizer state under this run's schedule, or start "
        f"a new run from its weights alone with init_weights={first}, leaving ckpt_path out"
    ]
    assert not second.exists()


@pytest.mark.distributed
@pytest.mark.slow  # ~12 s; the check is unit-tested (test_resume.py), and the default run has a refused resume above
def test_a_resume_on_another_dataset_is_one_line_and_leaves_no_run_dir(tiny_data, tmp_path):
    first = one_epoch_run(tiny_data, tmp_path / "first")
    # the same shapes on another dataset (forgot data=fashion_mnist, or added it): the dataset is in the checkpoint
    third = tmp_path / "third"
    other_data = ["data=fashion_mnist", f"ckpt_path={first}", f"hydra.run.dir={third}"]
    proc = run_cli("train.py", f"data.root={tiny_data}", "data.val_split=0", *other_data, *TINY)
    assert not third.exists()
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"psgd: error: ckpt_path='{first}' was trained with data=mnist and this run has data=fashion_mnist: it "
        "would go on with other samples than its run trained and validated on; resume with data=mnist"
    ], proc.stderr


@pytest.mark.slow  # ~20 s: four processes at once on 2 cores
def test_two_runs_started_at_once_do_not_collide(tiny_data, tmp_path):
    # default output dirs (microsecond timestamps) and free rendezvous ports, chosen independently
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PSGD_OUTPUTS": str(tmp_path / "outputs")}
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "workers=2",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=1",
        *TINY,
    ]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1][-500:] for r in results]
    runs = sorted((tmp_path / "outputs").glob("*/*/metrics.json"))
    assert len(runs) == 2
    assert all(json.loads(r.read_text())["status"] == "completed" for r in runs)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "strategy,partition",
    [
        # all slow: the default run has uneven shards for each strategy in its own test file: DDP's
        # lockstep in test_ddp (sizes), model averaging in test_model_averaging (sizes), HogWild in
        # test_hogwild (sizes); the partitions themselves have unit tests
        pytest.param("ddp", ["data.partition=by_label"], marks=pytest.mark.slow),
        pytest.param("ddp", ["data.partition=dirichlet", "data.dirichlet_alpha=0.3"], marks=pytest.mark.slow),
        pytest.param(
            "model_averaging", ["data.partition=dirichlet", "data.dirichlet_alpha=0.3"], marks=pytest.mark.slow
        ),
        pytest.param("hogwild", ["data.partition=dirichlet", "data.dirichlet_alpha=0.3"], marks=pytest.mark.slow),
    ],
    ids=["ddp-by_label", "ddp-dirichlet", "model_averaging-dirichlet", "hogwild-dirichlet"],
)
def test_uneven_shards_never_hang(tiny_data, tmp_path, strategy, partition):
    # (sizes and by_label for the other strategies are covered in their own test files)
    run_dir = tmp_path / "run"
    proc = run_cli(
        "train.py",
        f"strategy={strategy}",
        "workers=2",
        f"data.root={tiny_data}",
        "data.val_split=0",
        "trainer.max_epochs=2",
        "record_shards=true",
        f"hydra.run.dir={run_dir}",
        *partition,
        *TINY,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    sizes = [len(torch.load(run_dir / "shards" / f"epoch1_rank{r}.pt")) for r in range(2)]
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["status"] == "completed" and m["epochs"] == 2
    if strategy == "ddp":  # lockstep: both take the smaller shard's number of steps
        assert abs(sizes[0] - sizes[1]) < 16
    else:  # each worker its own whole shard
        assert sum(sizes) == 512


@pytest.mark.parametrize(
    "workers,strategy,lr,remedy",
    # slow (the default run's 8 minutes): the check is the module's own, which the default run meets in a sweep's
    # diverged job (test_sweep.py); with 2 workers both must also stop together
    [
        pytest.param(1, "ddp", [], "lower optimizer.lr (the run's lr is 10000) or warm up", marks=pytest.mark.slow),
        pytest.param(
            2,
            "ddp",
            [],
            "lower optimizer.lr (the run's lr is 10000) or warm up",
            marks=[pytest.mark.distributed, pytest.mark.slow],
        ),
        # HogWild's workers all write to one model; the lr named is the one it ran, after lr_scaling (slow: the
        # check is the module's, as under DDP)
        pytest.param(
            2,
            "hogwild",
            ["lr_scaling=linear", "optimizer.lr=5e3"],
            "lower optimizer.lr (the run's lr is 10000) or warm up",
            marks=[pytest.mark.distributed, pytest.mark.slow],
        ),
    ],
    ids=["in-process", "ddp-2", "hogwild-2-scaled"],
)
def test_a_diverged_run_stops_with_one_line(tiny_data, tmp_path, workers, strategy, lr, remedy):
    # before, a NaN loss trained on to the last epoch and "completed" at chance accuracy
    run_dir = tmp_path / "run"
    proc = run_cli(
        "train.py",
        f"workers={workers}",
        f"strategy={strategy}",
        f"data.root={tiny_data}",
        "data.val_split=0",
        *(lr or ["optimizer.lr=1e4"]),
        "trainer.max_epochs=5",
        f"hydra.run.dir={run_dir}",
        *TINY,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("psgd: error: training diverged: the mean training loss of epoch 1 is nan"), proc.stderr
    assert remedy in lines[-1]
    assert "Traceback" not in proc.stderr
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["status"] == "failed" and m["error"] == lines[-1].removeprefix("psgd: error: ")
    assert m.get("history", []) == []  # stopped in the epoch that diverged, not 4 epochs later


class FailsAloneOnRank1(L.Callback):
    """Worker 1 fails on its own after its first step (an error, or SIGKILL as from the OOM killer),
    while worker 0 waits on it in a collective (of a gloo group of this callback's: DDP's own group
    stays open while its reducer holds it). Worker 1 closes that group first and outlives worker 0,
    whose collective then lost its peer. torch reports the process that exits first: without psgd's
    launcher, worker 0's gloo error."""

    def __init__(self, how: str):
        self.how = how

    def on_train_start(self, trainer, pl_module):
        self.pids = trainer.strategy.all_gather(torch.tensor(os.getpid())).tolist()
        self.group = dist.new_group(backend="gloo")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx != 0:
            return
        if trainer.global_rank == 0:
            dist.barrier(group=self.group)  # waits for worker 1, which never comes
        elif self.how == "killed":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torch's SIGTERM to the survivors: not the cause
            self.close_then_outlive_worker_0()
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            atexit.register(self.close_then_outlive_worker_0)  # runs before psgd's own teardown (last in, first out)
            raise ValueError("a failure of worker 1 alone")

    def close_then_outlive_worker_0(self):
        group, self.group = self.group, None
        dist.destroy_process_group(group)
        del group  # its sockets close: worker 0's barrier fails with "Connection closed by peer"
        # until worker 0 has exited and torch's launcher has reaped it: the launcher has then seen worker 0's
        # failure first, as when worker 0's collective fails first (on a loaded machine it could wake only
        # once both had exited, and take either)
        stat = Path(f"/proc/{self.pids[0]}/stat")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and stat.exists():
            time.sleep(0.05)


@pytest.mark.distributed
# slow: a killed worker is reported by the same launcher code (its recorded failure, or the signal)
@pytest.mark.parametrize("how", ["raised", pytest.param("killed", marks=pytest.mark.slow)])
def test_a_worker_failing_alone_is_the_one_reported_not_the_peer_that_lost_it(tiny_data, tmp_path, how):
    # spawn: worker 1 waits for worker 0 to be reaped by the launcher (FailsAloneOnRank1), which only a
    # spawned worker is (psgd's fork server reaps its own children); the launcher's code is the same
    overrides = ["workers=2", "strategy.start_method=spawn", "trainer.max_epochs=1"]
    cfg = compose_cfg(f"data.root={tiny_data}", "data.val_split=0", *overrides, *TINY)
    with pytest.raises((ProcessRaisedException, ProcessExitedException)) as e:
        train(cfg, tmp_path / "run", callbacks=[FailsAloneOnRank1(how)])
    assert e.value.error_index == 1
    if how == "raised":
        assert str(e.value).strip().splitlines()[-1] == "ValueError: a failure of worker 1 alone"
    else:
        assert isinstance(e.value, ProcessExitedException) and e.value.signal_name == "SIGKILL"
    # what worker 0 got (gloo's "Connection closed by peer" or the like, worded by torch's version) is kept as the cause
    assert e.value.__cause__.error_index == 0 and lost_a_peer(str(e.value.__cause__)), str(e.value.__cause__)


MEMCG = Path("/sys/fs/cgroup/memory")  # cgroup v1's memory controller: a memory limit for one run


@contextlib.contextmanager
def memory_cgroup(limit: int, tmp_path: Path):
    """A cgroup v1 memory group limited to `limit` bytes, named after the test's own folder. It is removed
    at the end once the processes it held are gone (up to 10 s): a process that outlives its run by a
    moment kept it, and the next test in the same pytest worker, which used to take the same name (the
    worker's pid), failed to make it."""
    group = MEMCG / f"psgd-test-{os.getpid()}-{tmp_path.name}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit))
        yield group
    finally:
        processes_gone(group)
        with contextlib.suppress(OSError):
            group.rmdir()


def in_cgroup(group: Path, *command: str) -> list[str]:
    """`command`, run in the cgroup `group` (its process moved there before it starts)."""
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" "$@"', *command]


def processes_gone(group: Path, within_s: float = 10) -> bool:
    """Whether the cgroup `group` holds no process, waiting up to `within_s` for it to empty."""
    deadline = time.monotonic() + within_s
    while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not (group / "cgroup.procs").read_text().strip()


HOG_MODEL = """
import torch
import torch.distributed as dist
from torch import nn


class Hog(nn.Module):
    \"\"\"A user's network that holds 400 MB in each worker.\"\"\"

    def __init__(self, in_channels=1, num_classes=10, **lab_cnn_settings):
        super().__init__()
        self.fc, self.hog = nn.Linear(in_channels * 28 * 28, num_classes), None

    def forward(self, x):
        if self.hog is None and dist.is_initialized():
            self.hog = torch.ones(100_000_000)
        return self.fc(x.flatten(1))
"""


@pytest.mark.slow  # ~20 s; needs root and cgroup v1's memory controller (the development VM has both)
@pytest.mark.skipif(
    not (hasattr(os, "geteuid") and os.geteuid() == 0 and os.access(MEMCG, os.W_OK)),
    reason="needs root and a writable cgroup v1 memory controller to give a run a memory limit",
)
def test_a_run_out_of_memory_loses_a_worker_not_the_launcher_and_says_so(tiny_data, tmp_path):
    """Four workers in a 1.7 GB memory cgroup, each holding 400 MB of a user's network: the kernel's OOM
    killer ends a worker, not the launcher (the largest process, whose death the user would see only as the
    shell's "Killed"), and the run ends with one line saying so, marked failed, no worker left."""
    env = {**os.environ, **user_code(tmp_path, "hog_net", HOG_MODEL)}
    with memory_cgroup(1_700_000_000, tmp_path) as group:
        run_dir = tmp_path / "run"
        args = [
            sys.executable,
            str(ROOT / "train.py"),
            "workers=4",
            f"data.root={tiny_data}",
            "data.val_split=0",
            "quiet=true",
        ]
        args += ["trainer.max_epochs=1", f"hydra.run.dir={run_dir}", "model._target_=hog_net.Hog", "model.name=hog"]
        proc = subprocess.run(in_cgroup(group, *args), capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "was killed by the kernel's out-of-memory killer" in lines[-1] and "use fewer workers" in lines[-1]
        m = json.loads((run_dir / "metrics.json").read_text())
        assert m["status"] == "failed" and m["error"] == lines[-1].removeprefix("psgd: error: ")
        assert processes_gone(group), "a worker outlived the run"


@contextlib.contextmanager
def small_disk(where: Path, size: str):
    """A tmpfs of `size` mounted at `where` (root only); skips the test where it cannot be mounted."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.slow  # ~20 s; needs root to mount a small tmpfs
@pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0), reason="needs root to mount a small tmpfs")
def test_a_full_disk_is_one_line_and_the_last_checkpoint_stays_whole(tiny_data, tmp_path):
    """Two workers on a disk with room for one checkpoint: epoch 2's does not fit. The run ends with one
    line naming the file, marked failed, with epoch 1's last.ckpt whole, and resumes from it elsewhere.
    It was Hydra's traceback (the record's own write failed while it was marked), and Lightning's copy
    from the system's temp dir left a truncated last.ckpt."""
    with small_disk(tmp_path / "disk", "2600k") as disk:
        run_dir = disk / "run"
        common = ["workers=2", f"data.root={tiny_data}", "data.val_split=0", "trainer.max_epochs=3", "quiet=true"]
        proc = run_cli("train.py", *common, f"hydra.run.dir={run_dir}")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
        last = run_dir / "checkpoints" / "last.ckpt"
        assert lines[0] == f"psgd: error: cannot write {last}: No space left on device"
        m = json.loads((run_dir / "metrics.json").read_text())
        assert m["status"] == "failed" and m["error"] == lines[0].removeprefix("psgd: error: ")
        assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]
        assert torch.load(last, weights_only=True)["epoch"] == 0
        resumed = tmp_path / "resumed"
        proc = run_cli("train.py", *common, f"ckpt_path={run_dir}", f"hydra.run.dir={resumed}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert [h["epoch"] for h in json.loads((resumed / "metrics.json").read_text())["history"]] == [1, 2, 3]


def test_a_run_stopped_while_its_workers_start_leaves_its_record(tiny_data, tmp_path):
    """SIGTERM to a 2-worker run's process group after Hydra made its run dir, before any epoch ended, left the dir
    without metrics.json (a 1-worker run wrote one): the launcher writes the record, marked interrupted."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, f"data.root={tiny_data}", "data.val_split=0", "workers=2", *TINY)
    deadline = time.monotonic() + 60
    while not (run_dir / ".hydra" / "config.yaml").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the workers are still starting: the first epoch ends seconds later
    os.killpg(proc.pid, signal.SIGTERM)
    _, stderr = ended(proc, 60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert f"psgd: interrupted (SIGTERM); no epoch had finished ({run_dir})" in stderr.splitlines()
    m = json.loads((run_dir / "metrics.json").read_text())
    assert (m["status"], m["epochs"], m["history"], m["strategy"], m["world_size"]) == ("interrupted", 0, [], "ddp", 2)
