"""psgd's fork server (psgd.forkserver): which jobs get it, how it starts, what a worker takes over."""

import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, compose_cfg

from psgd import forkserver
from psgd.config import ConfigError, check, check_values, resolve_start_method

pytestmark = pytest.mark.skipif(not forkserver.available(), reason="no fork servers on this platform")


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["workers=2"], True),  # DDP on CPU: the default
        (["trainer.devices=4"], True),
        (["workers=2", "strategy=model_averaging"], True),
        (["workers=2", "strategy=hogwild"], True),
        (["workers=1"], False),  # in-process: no worker to start
        (["workers=1", "strategy.ddp_for_one_worker=true"], True),
        (["workers=1", "strategy=model_averaging"], True),  # one worker process: the 1-worker job of a sweep
        (["workers=1", "strategy=hogwild"], True),
        (["workers=2", "strategy.start_method=spawn"], False),
        (["workers=2", "trainer.accelerator=gpu"], False),  # spawn on GPU
        (["workers=2", "trainer.num_nodes=2"], False),  # torchrun / srun start them
    ],
)
def test_the_server_is_started_early_only_for_jobs_whose_workers_it_will_start(overrides, expected):
    assert forkserver.will_use_server(check_values(compose_cfg(*overrides))) is expected


def test_under_torchrun_no_server_is_started(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "1")
    monkeypatch.setenv("RANK", "0")
    assert not forkserver.will_use_server(check_values(compose_cfg("workers=2")))


@pytest.mark.parametrize(
    "overrides,accelerator,method",
    [
        (["workers=2"], "cpu", "forkserver"),
        (["workers=2"], "gpu", "spawn"),
        (["workers=2", "strategy.start_method=spawn"], "cpu", "spawn"),
        (["workers=2", "strategy=model_averaging"], "cpu", "forkserver"),
        (["workers=2", "strategy=hogwild"], "cpu", "forkserver"),
    ],
)
def test_null_start_method_is_the_fork_server_on_cpu_and_spawn_on_gpu(overrides, accelerator, method):
    assert resolve_start_method(check_values(compose_cfg(*overrides)).strategy, accelerator) == method


def test_the_fork_server_on_gpu_is_one_line():
    with pytest.raises(ConfigError, match=r"^strategy.start_method=forkserver is invalid on GPU: CUDA cannot"):
        resolve_start_method(check_values(compose_cfg("workers=2", "strategy.start_method=forkserver")).strategy, "gpu")


def test_the_plan_carries_the_resolved_start_method():
    assert check(compose_cfg("workers=2", "trainer.accelerator=cpu")).start_method == "forkserver"
    assert check(compose_cfg("workers=2", "trainer.accelerator=cpu", "strategy.start_method=spawn")).start_method == (
        "spawn"
    )


SERVER = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys, time
    from multiprocessing import forkserver as mp_forkserver
    from psgd import forkserver
    forkserver.start()
    pid = mp_forkserver._forkserver._forkserver_pid
    # this process: Ctrl-C handled as before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ignored = int(next(ln for ln in open(f"/proc/{pid}/status") if ln.startswith("SigIgn:")).split()[1], 16)
    # a process through it: it forks once its imports are done
    child = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(0,))
    child.start()
    child.join()
    same_adj = open(f"/proc/{pid}/oom_score_adj").read() == open("/proc/self/oom_score_adj").read()
    sigint = bool(ignored & (1 << (signal.SIGINT - 1)))
    print(pid, sigint, same_adj, child.exitcode)
    sys.stdout.flush()
    forkserver.start()  # running: the same server
    assert mp_forkserver._forkserver._forkserver_pid == pid
    """
)


def test_the_server_ignores_ctrl_c_keeps_the_launchers_oom_standing_and_ends_with_it():
    proc = subprocess.run([sys.executable, "-c", SERVER], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    pid, sigint_ignored, same_oom_score_adj, child_exit = proc.stdout.split()
    # its workers offer themselves to the OOM killer first (psgd.process.prepare_worker), not the server: its
    # death ends every worker's run (test_a_killed_fork_server_ends_the_run_saying_so_and_takes_its_workers)
    assert (sigint_ignored, same_oom_score_adj, child_exit) == ("True", "True", "0")
    for _ in range(100):  # it ends once its launcher has
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            break
        __import__("time").sleep(0.1)
    else:
        pytest.fail("the fork server outlived its launcher")


def test_a_worker_takes_its_launchers_environment_and_ctrl_c_handling(monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "12345")
    state = forkserver.launcher_state()
    assert state["environ"]["MASTER_PORT"] == "12345" and state["sigint_ignored"] is False
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setenv("LEFT_FROM_THE_SERVER", "x")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a fork-server child starts
    try:
        forkserver.adopt_launcher_state(state)
        assert os.environ["MASTER_PORT"] == "12345" and "LEFT_FROM_THE_SERVER" not in os.environ
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        forkserver.adopt_launcher_state({**state, "sigint_ignored": True})  # a background job's worker
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("launcher,here", [([], True), (["hydra/launcher=psgd_slurm"], False)])
def test_a_sweep_whose_jobs_run_elsewhere_starts_no_server_here(launcher, here):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        first = compose(config_name="sweep", overrides=["workers=2", *launcher], return_hydra_config=True)
    assert forkserver.runs_jobs_here(first) is here


PREPARED = textwrap.dedent(
    """
    import logging, os
    from psgd.process import prepare_worker
    os.environ["PSGD_QUIET"] = "1"
    prepare_worker()
    print(open("/proc/self/oom_score_adj").read().strip(), logging.getLogger("pytorch_lightning").level)
    """
)


def test_a_worker_is_the_oom_victim_and_quiet_where_its_run_is():
    proc = subprocess.run([sys.executable, "-c", PREPARED], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    adj, level = proc.stdout.split()
    assert int(adj) >= 500 and int(level) == logging.WARNING
