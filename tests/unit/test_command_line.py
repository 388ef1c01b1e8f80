"""The command-line check train.py and sweep.py run before Hydra: what Hydra would refuse is one line
naming the bad value and what is allowed; anything Hydra accepts passes untouched."""

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import CONF

from psgd import console, signals
from psgd.command_line import command_line_problem
from psgd.overrides import shell_override

BAD = [
    (["model=resnet50"], "model=resnet50 is unknown (did you mean model=wide_resnet?); model can be: lab_cnn, mlp"),
    (["strategy=hogwlid"], "strategy=hogwlid is unknown (did you mean strategy=hogwild?)"),
    (["+experiment=nope"], "experiment=nope is unknown; experiment can be: communication, dist_tuto, dli_cifar"),
    # Hydra's own message, with psgd's did-you-mean
    (["trainer.max_epoch=3"], "Could not override 'trainer.max_epoch' (did you mean trainer.max_epochs?); "),
    (["lr=0.1"], "Could not override 'lr' (did you mean optimizer.lr?); "),
    (["trainer.max_epoch=3"], "To append to your config use +trainer.max_epoch=3"),
    (["model=wide_resnet", "model.drop=0.1"], "Could not override 'model.drop' (did you mean model.dropout?)"),
    (["model.hidden=64"], "Could not override 'model.hidden'"),
    (["workers=1,2"], "Ambiguous value for argument 'workers=1,2'; 1. To use it as a list, use key=[value1,value2]"),
    (["workers=1,2"], "To sweep over it, add --multirun to your command line"),
    (["foo"], "Error parsing override 'foo'; missing EQUAL"),
    # the shell does not expand ~ after data.root= (not a variable name), and Hydra's lexer refuses it
    (["data.root=~/data"], "LexerNoViableAltException: data.root=~/data"),
    # a user's folder with a non-ASCII letter or a #: Hydra's lexer refuses it unquoted
    (["data.root=/data/run#1"], "LexerNoViableAltException: data.root=/data/run#1"),
    (["-m", "data.root=/d/ä,/d/b"], "LexerNoViableAltException: data.root=/d/ä,/d/b"),
    (["+trainer.max_epochs=2"], "An item is already at 'trainer.max_epochs'"),
    (["hydra.job.chdir=maybe"], "Error merging override hydra.job.chdir=maybe; Value 'maybe' is not a valid bool"),
    (["-m", "workers=1,2", "hydra.sweeper.max_batch_size=abc"], "hydra.sweeper.max_batch_size=abc; Value"),
    (["-m", "workers=1,2", "strategy=ddp,hogwlid"], "strategy=hogwlid is unknown"),
    # more jobs than are composed one by one: every value is still composed once
    (["-m", "seed=range(0,100)", "strategy=ddp,hogwild,model_averaging,hogwlid"], "strategy=hogwlid is unknown"),
    (["model=null"], "Config group override must be a string or a list. Got NoneType"),
    (["experiment=null"], "Config group override must be a string or a list. Got NoneType"),
    (["-m", "model=null,mlp"], "Config group override must be a string or a list"),
    (["workers=interval(1,4)"], "Sweep parameters 'workers=interval(1,4)' requires --multirun"),
    # a glob's jobs are composed as Hydra makes them: each choice it matches
    (["-m", "experiment=glob(dli_fashion_*)", "data=cifar1O"], "data=cifar1O is unknown (did you mean data=cifar10?)"),
]


@pytest.mark.parametrize("argv,expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_mistyped_choice_or_key_is_one_line_naming_it_and_what_is_allowed(argv, expected):
    problem = command_line_problem("train", argv, CONF)
    assert problem is not None and expected in problem
    assert "\n" not in problem


@pytest.mark.parametrize(
    "argv",
    [
        # a model class of the user's that takes no dropout
        ["model._target_=mymodels.Net", "model.name=mine", "~model.dropout", "~model.batch_norm"],
        ["~optimizer.momentum", "~optimizer.nesterov"],  # SGD's defaults then
        ["-m", "seed=0,1", "~model.dropout"],
    ],
)
def test_a_model_or_optimizer_argument_may_be_removed_or_added(argv):
    assert command_line_problem("train", argv, CONF) is None


def test_a_setting_removed_is_one_line():
    from psgd.config import checked_runs

    problem = command_line_problem("train", ["~workers"], CONF, job_check=lambda jobs: checked_runs(jobs, False)[0])
    assert problem == "workers is missing"


def test_the_sweep_config_is_checked_the_same_way():
    assert "data=imagenet is unknown" in command_line_problem("sweep", ["data=mnist,imagenet"], CONF)


@pytest.mark.parametrize(
    "argv",
    [
        ["hydra.job.chdir=true", "trainer.max_epochs=${workers}"],  # hydra keys, interpolations
        ["-m", "workers=range(1,3)", "optimizer.lr=0.1,0.2"],
        ["++trainer.max_epochs=2", "+trainer.new_key=1", "~trainer.new_key"],  # a key the command line added
        ["~experiment"],  # a group chosen by no default
        ["hydra.output_subdir=null"],  # one run: no .hydra/ in its dir (no report reads it)
        ["data.partition_sizes=[0.5,0.4]"],  # composes; psgd's own config check reports the sum later
        ["--cfg", "job", "model=resnet50"],  # Hydra's own flags: left to Hydra
        ["-m", "--multirun", "seed=0,1"],  # the same mode twice
        ["optimizer.lr=0.1", "optimizer.lr=0.3"],  # one run: the last value, as Hydra takes it (no sweep lost)
        ["-m", "optimizer.lr=0.3", "optimizer.lr=0.1,0.2"],  # the sweep is the value kept
    ],
)
def test_what_hydra_accepts_or_judges_itself_passes(argv):
    assert command_line_problem("train", argv, CONF) is None


def test_the_jobs_of_a_glob_sweep_are_each_checked():
    from psgd.config import sweep_values_problem

    argv = ["-m", "optimizer=glob(*)", "optimizer.lr=-1"]  # adam, novograd, sgd: each refuses it
    problem = command_line_problem("sweep", argv, CONF, job_check=sweep_values_problem)
    assert problem is not None and problem.startswith("optimizer.lr=-1 is invalid: Input should be greater than 0")
    assert command_line_problem("sweep", ["-m", "optimizer=glob(*)"], CONF, job_check=sweep_values_problem) is None


@pytest.fixture
def conf_with_my_preset(tmp_path):
    """psgd's conf plus a preset of the user's own whose sweep has a mistyped value."""
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "experiment" / "mine.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      workers: 1,2\n      strategy: ddp,hogwlid\n"
    )
    return conf


def test_a_presets_own_sweep_is_checked_before_any_job(conf_with_my_preset):
    problem = command_line_problem("sweep", ["-m", "experiment=mine"], conf_with_my_preset)
    assert problem is not None and problem.startswith("strategy=hogwlid is unknown (did you mean strategy=hogwild?)")


def test_the_command_line_replaces_a_presets_sweep_of_the_same_key(conf_with_my_preset):
    assert command_line_problem("sweep", ["-m", "experiment=mine", "strategy=ddp,hogwild"], conf_with_my_preset) is None
    # a preset's sweep applies to multiruns only: without -m Hydra (and the check) ignore it
    assert command_line_problem("train", ["experiment=mine"], conf_with_my_preset) is None
    # the shipped presets' sweeps all compose
    for preset in ("psgd_lab", "dist_tuto", "hogwild_lab", "threadpool_mlp"):
        assert command_line_problem("sweep", ["-m", f"experiment={preset}"], CONF) is None


def test_an_output_dir_that_cannot_be_made_is_one_line_before_anything_runs(tmp_path, monkeypatch):
    # Hydra stopped with a traceback when it made the run dir
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")
    problem = command_line_problem("train", [f"hydra.run.dir={a_file}/run"], CONF)
    assert problem == (
        f"cannot write results to {a_file}/run: Not a directory in {a_file}; "
        "set PSGD_OUTPUTS=<dir> or hydra.run.dir=<dir>"
    )
    monkeypatch.setenv("PSGD_OUTPUTS", f"{a_file}/out")
    assert "hydra.sweep.dir=<dir>" in command_line_problem("sweep", ["-m", "seed=0,1"], CONF)
    # a writable place passes, and the check leaves nothing behind
    monkeypatch.setenv("PSGD_OUTPUTS", str(tmp_path / "new" / "outputs"))
    assert command_line_problem("train", [], CONF) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.txt"]  # the probe is gone too


@pytest.mark.skipif(not Path("/proc/1").is_dir(), reason="needs Linux /proc")
def test_a_folder_where_nothing_can_be_made_is_one_line():
    problem = command_line_problem("train", ["hydra.run.dir=/proc/1/psgd-run"], CONF)
    assert problem.startswith("cannot write results to /proc/1/psgd-run: ") and "in /proc/1;" in problem


@pytest.mark.parametrize(
    "value", ["/data/mnist", "/home/jürgen/my data", "~/data", "/data/run#1", "it's", 'a"b$HOME!', "C:\\d\\", "q\\'x"]
)
def test_a_suggested_override_reads_back_as_the_same_value_through_the_shell_and_hydra(value):
    """The commands psgd's messages suggest (quote this value, resume with ckpt_path=<dir>) work when pasted."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    words = shlex.split(shell_override("data.root", value))
    assert len(words) == 1 and OverridesParser.create().parse_overrides(words)[0].value() == value
    assert command_line_problem("train", words, CONF) is None


def test_a_dir_holding_an_earlier_runs_results_is_refused_before_hydra_writes_into_it(tmp_path, monkeypatch):
    """Hydra would rewrite the earlier run's .hydra config and psgd its metrics.json, checkpoints and
    TensorBoard events (two runs' curves mixed in one dir)."""
    run = tmp_path / "run"
    assert command_line_problem("train", [f"hydra.run.dir={run}"], CONF) is None  # new
    (run / ".hydra").mkdir(parents=True)
    (run / "train.log").write_text("")
    assert command_line_problem("train", [f"hydra.run.dir={run}"], CONF) is None  # no record: nothing finished
    (run / "metrics.json").write_text('{"status": "completed", "epochs": 3}')
    assert command_line_problem("train", [f"hydra.run.dir={run}"], CONF) == (
        f"{run} holds an earlier run's results (metrics.json), which this run would overwrite: "
        f"set hydra.run.dir to a new folder, or delete that one (ckpt_path={run} resumes that run in a new folder)"
    )
    spaced = tmp_path / "my run ü"  # the resume it suggests is quoted as the shell and Hydra need
    (spaced / "metrics.json").parent.mkdir()
    (spaced / "metrics.json").write_text('{"status": "failed"}')
    problem = command_line_problem("train", [f"hydra.run.dir='{spaced}'"], CONF)
    assert problem.endswith(f"(\"ckpt_path='{spaced}'\" resumes that run in a new folder)")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # torchrun restarted the job's workers: it goes on there
    assert command_line_problem("train", [f"hydra.run.dir={run}"], CONF) is None

    sweep = tmp_path / "sweep"
    assert command_line_problem("sweep", ["-m", "seed=0,1", f"hydra.sweep.dir={sweep}"], CONF) is None
    (sweep / "0").mkdir(parents=True)
    (sweep / "0" / "metrics.json").write_text('{"status": "failed"}')
    (sweep / "report.md").write_text("")
    assert command_line_problem("sweep", ["-m", "seed=0,1", f"hydra.sweep.dir={sweep}"], CONF) == (
        f"{sweep} holds an earlier sweep's results, which this sweep would "
        "overwrite: set hydra.sweep.dir to a new folder, or delete that one"
    )


def test_a_value_psgd_refuses_in_any_job_of_a_sweep_is_one_line_before_any_job_runs(tmp_path, monkeypatch):
    from psgd.config import checked_runs, sweep_values_problem

    line = ["-m", "optimizer.lr=0.1,-1", "workers=1,2", "seed=3"]
    assert command_line_problem("sweep", line, CONF, job_check=sweep_values_problem) == (
        "optimizer.lr=-1 is invalid: Input should be greater than 0 (in the job optimizer.lr=-1 workers=1; no job was "
        "started)"
    )
    # a warm-up longer than training is refused only in combination: each job is checked whole
    line = ["-m", "scheduler=warmup", "scheduler.warmup_epochs=2,4", "trainer.max_epochs=3"]
    assert "scheduler.warmup_epochs=4 is invalid with trainer.max_epochs=3" in command_line_problem(
        "sweep", line, CONF, job_check=sweep_values_problem
    )
    assert command_line_problem("sweep", ["-m", "optimizer.lr=0.1,0.2"], CONF, job_check=sweep_values_problem) is None
    # the job as typed, not with the escapes of Hydra's sweeper (00\:00\:00\:00)
    line = ["-m", "trainer.max_time=00:00:00:00,00:01:00:00"]
    assert command_line_problem("sweep", line, CONF, job_check=sweep_values_problem).endswith(
        "(in the job trainer.max_time=00:00:00:00; no job was started)"
    )
    # a key only some jobs lack (SGD's momentum under NovoGrad) names the job that lacks it, and not "+" as the
    # way out: NovoGrad's class refuses momentum
    line = ["-m", "optimizer=sgd,novograd", "optimizer.momentum=0,0.9"]
    assert command_line_problem("sweep", line, CONF).endswith(
        "Key 'momentum' is not in struct (in the job optimizer=novograd optimizer.momentum=0; no job was started)"
    )
    # a model that cannot take a job's dataset: it used to fail only when that job's turn came
    line = ["-m", "model=lab_cnn,singa_cnn", "data=mnist,cifar10"]
    assert command_line_problem("sweep", line, CONF, job_check=sweep_values_problem) == (
        "model=singa_cnn does not fit data=cifar10 (3x32x32): mat1 and mat2 shapes cannot be multiplied (2x1250 and "
        "800x500) (in the job model=singa_cnn data=cifar10; no job was started)"
    )
    line = ["-m", "model=mlp", "model.hidden=64,0"]  # a value the model's class refuses
    assert command_line_problem("sweep", line, CONF, job_check=sweep_values_problem) == (
        "model.hidden=0 is invalid: must be an integer >= 1 (hidden units) (in the job model.hidden=0; no job was "
        "started)"
    )
    # one that no job has is said without a job
    assert "+optimizer.momentm=0; " in command_line_problem("sweep", ["-m", "optimizer.momentm=0,0.9"], CONF)
    # where there is no SLURM, submitit's launcher failed with a traceback and left the sweep's dir
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    slurm = ["-m", "hydra/launcher=psgd_slurm", "optimizer.lr=0.1,-1"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    assert command_line_problem("sweep", slurm, CONF, job_check=sweep_values_problem) == (
        "hydra/launcher=psgd_slurm submits each job to SLURM, and this machine has no srun on its PATH: run the "
        "sweep on a SLURM login node, or leave hydra/launcher out to run the jobs here"
    )
    # on a SLURM login node, jobs that SLURM runs elsewhere are checked there, with that machine's GPUs
    # and environment ...
    (tmp_path / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "srun").chmod(0o755)
    assert command_line_problem("sweep", slurm, CONF, job_check=sweep_values_problem) is None
    # ... but a value that means the same on any machine is found here, before any job is submitted
    assert command_line_problem("sweep", slurm, CONF, job_check=lambda jobs: checked_runs(jobs, True)[0]) == (
        "optimizer.lr=-1 is invalid: Input should be greater than 0 (in the job optimizer.lr=-1; no job was started)"
    )


def test_a_job_whose_worker_would_get_no_batch_is_one_line_before_any_job_runs(tiny_data, monkeypatch):
    """These were found only when the job's turn came, with the dataset read (`sweep.py -m workers=1,4
    data.batch_size=16384 data.drop_last=true` on MNIST trained job 1, then failed job 2); now the sweep
    reads each dataset once and deals every job's shards before the first job starts."""
    import psgd.data.datamodule
    from psgd.run_checks import sweep_data_problem

    reads = []
    real = psgd.data.datamodule.load_split
    monkeypatch.setattr(psgd.data.datamodule, "load_split", lambda *a, **k: reads.append(a[:3]) or real(*a, **k))

    def problem(*overrides: str) -> str | None:
        reads.clear()
        return command_line_problem(
            "sweep",
            ["-m", f"data.root={tiny_data}", "data.val_split=0", *overrides],
            CONF,
            job_check=sweep_data_problem,
        )

    # 512 training samples: 171 per worker of 3, fewer than one batch of 200, dropped
    assert problem("data.batch_size=200", "data.drop_last=true", "workers=1,2,3") == (
        "no training batch for worker 0 (171 samples), worker 1 (171 samples), worker 2 (170 samples) of 3 with "
        "512 training samples, data.partition=iid, data.batch_size=200 and data.drop_last=true: use a smaller "
        "data.batch_size, data.drop_last=false or at most 2 workers (in the job workers=3; no job was started)"
    )
    assert len(reads) == 2  # the training and the test split, once for the three jobs
    # a partition that leaves a worker no sample depends on the labels and the seed
    assert problem("data.partition=dirichlet", "data.dirichlet_alpha=0.01", "workers=2,8") == (
        "data.partition=dirichlet: dirichlet_alpha=0.01 left worker(s) [1] with no samples; use a larger alpha or "
        "another seed (in the job workers=8; no job was started)"
    )
    # a final test of no batch (256 test samples: 4 batches of 64)
    assert problem("data.eval_batch_size=64", "trainer.limit_test_batches=0.5,0.1").startswith(
        "trainer.limit_test_batches=0.1 is invalid: the test set is 4 batch(es) of data.eval_batch_size=64"
    )
    # jobs that all have batches pass, each dataset read once
    assert problem("workers=1,2,3", "data.batch_size=64,128", "data=mnist,fashion_mnist") is None
    assert sorted(reads) == sorted(
        (name, str(tiny_data), train) for name in ("mnist", "fashion_mnist") for train in (True, False)
    )


TORCHRUN_WORKER = {"TORCHELASTIC_RUN_ID": "job", "RANK": "1", "LOCAL_RANK": "1"}


@pytest.mark.parametrize(
    "env,agent_stops,said,waited",
    [
        ({}, False, True, False),  # not under torchrun: said at once
        ({**TORCHRUN_WORKER, "RANK": "2", "LOCAL_RANK": "0"}, False, True, False),  # a machine's first worker
        ({**TORCHRUN_WORKER, "RANK": "5"}, True, False, False),  # another one, stopped by the agent: quiet
        (TORCHRUN_WORKER, False, True, True),  # another one the agent did not stop in time: says it too
    ],
)
def test_a_problem_every_torchrun_worker_finds_is_said_by_the_machines_first(
    monkeypatch, capsys, env, agent_stops, said, waited
):
    for key in TORCHRUN_WORKER:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(console, "AGENT_STOPS_WITHIN_S", 0.5)
    monkeypatch.setattr(signals, "received", None)  # interrupt() records the signal there
    previous = signal.signal(signal.SIGTERM, signals.interrupt)  # as train.py's interrupt_on_sigterm() does
    agent = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)) if agent_stops else None
    try:
        if agent:
            agent.start()
        start = time.monotonic()
        with pytest.raises(SystemExit) as exited:
            console.fail("workers=0 is invalid", every_worker_finds_it=True)
        took = time.monotonic() - start
    finally:
        if agent:
            agent.join()
        signal.signal(signal.SIGTERM, previous)
    assert exited.value.code == 2
    assert capsys.readouterr().err == ("psgd: error: workers=0 is invalid\n" if said else "")
    assert (took >= 0.5) == waited  # the first worker does not wait for anyone


SPEAKERS = """
import multiprocessing, sys
from psgd.io import say

def speak(i, barrier):
    barrier.wait()  # all at once, as workers refusing the same thing
    for n in range(1000):
        say(f"psgd: error: worker {i} line {n} " + "x" * 120)

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=speak, args=(i, barrier)) for i in range(4)]
    [p.start() for p in procs]
    [p.join() for p in procs]
"""


def test_lines_said_by_several_processes_at_once_stay_whole(tmp_path):
    """Two workers saying their error line at the same moment printed "...`:psgd: error: ...`" on one
    line, then two newlines (print writes a line's text and its newline apart, and stderr passes each
    write straight on): a test's expected line was not found. A line is now one write."""
    script = tmp_path / "speakers.py"
    script.write_text(SPEAKERS)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 4000
    assert all(re.fullmatch(r"psgd: error: worker \d line \d+ x{120}", line) for line in lines), [
        line for line in lines if not re.fullmatch(r"psgd: error: worker \d line \d+ x{120}", line)
    ][:3]
