"""Bad input through train.py: one clear line, a non-zero exit, no traceback and no result dir.

(Every check itself is unit-tested in tests/unit/test_config.py; these run the CLI path end to end.)"""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, ThreadsAtExit, compose_cfg, run_cli, user_code

from psgd.config import DirInUse
from psgd.run import train

CASES = [
    (["trainer.devices=0"], "trainer.devices=0"),
    (["workers=2", "data.partition=sizes", "data.partition_sizes=[0.5,0.4]"], "sum to 1"),
    (["model=singa_cnn", "data=cifar10"], "model=singa_cnn does not fit data=cifar10"),
    # before any worker starts
    (["workers=2", "stragglers.slowdown=[1,2,3]"], "stragglers.slowdown=[1, 2, 3] is invalid with 2 workers"),
    # found once the data is read, still before anything is written (it used to train zero steps)
    (["data.drop_last=true", "data.batch_size=1024"], "no training batch for worker 0 (512 samples) of 1"),
    # values psgd passes on to Lightning's Trainer unchecked: Lightning's reason, in one line
    (["trainer.precision=fp8"], "Lightning refuses a trainer setting: Precision 'fp8' is invalid. Allowed"),
    (  # checked by Lightning once it has the data: inside fit (in the workers: a slow test below)
        ["trainer.limit_val_batches=0.01", "quiet=true"],  # quiet: no Trainer banner before the line
        "Lightning refuses a setting: You requested to check 0.01 of the `val_dataloader` but 0.01 * 1 < 1.",
    ),
    pytest.param(["+trainer.foo=1"], "unexpected keyword argument 'foo'", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("overrides,fragment", CASES, ids=[" ".join(getattr(c, "values", c)[0]) for c in CASES])
def test_bad_value_is_one_line_and_nonzero_exit(tiny_data, tmp_path, overrides, fragment):
    run_dir = tmp_path / "outputs" / "run"  # as a first run's outputs/<date>/<time>: Hydra makes outputs/ too
    proc = run_cli(
        "train.py", f"data.root={tiny_data}", "data.val_split=0", f"hydra.run.dir={run_dir}", *overrides, timeout=120
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("psgd: error: ") and fragment in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "outputs").exists()  # nothing written as a result, no empty folder left either
    assert tmp_path.is_dir()  # the folder that was there before stays


MISTYPED = [
    ("train.py", ["model=resnet50"], "model=resnet50 is unknown (did you mean model=wide_resnet?); model can be: "),
    ("train.py", ["trainer.max_epoch=3"], "Could not override 'trainer.max_epoch' (did you mean trainer.max_epochs?)"),
    ("train.py", ["workers=1,2"], "To sweep over it, add --multirun to your command line"),
    ("train.py", ["-m", "workers=1,2", "strategy=ddp,hogwlid"], "strategy=hogwlid is unknown"),  # as sweep.py
    ("sweep.py", ["-m", "workers=1,2", "strategy=ddp,hogwlid"], "strategy=hogwlid is unknown"),
    # a value psgd refuses, in any job: it used to run the jobs before it first
    (
        "sweep.py",
        ["-m", "data.batch_size=64,0", "workers=1,2"],
        "data.batch_size=0 is invalid: Input should be greater than or equal to 1 (in the job data.batch_size=0 "
        "workers=1; no job was",
    ),
    # a checkpoint that is not there: every job used to start, fail on it and be reported failed
    (
        "sweep.py",
        ["-m", "workers=1,2", "init_weights=nowhere"],
        "init_weights='nowhere' is invalid: no checkpoint at nowhere (give a run dir, a .ckpt file or a weights file",
    ),
    pytest.param(  # the same check as init_weights's above (checkpoint_file, for each of config.GIVE); ~5 s
        "sweep.py",
        ["-m", "seed=0,1", "ckpt_path=nowhere"],
        "ckpt_path='nowhere' is invalid: no checkpoint at nowhere",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize(
    "script,overrides,fragment", MISTYPED, ids=[" ".join(getattr(c, "values", c)[1]) for c in MISTYPED]
)
def test_a_mistyped_choice_or_key_is_one_line_and_no_job_runs(tiny_data, tmp_path, script, overrides, fragment):
    """Hydra's own report of these is ~10 lines and exit code 1; psgd checks the command line first
    (also every job of a sweep, before the first one starts)."""
    out = tmp_path / "out"
    dirs = [f"hydra.run.dir={out}", f"hydra.sweep.dir={out}"]
    proc = run_cli(script, f"data.root={tiny_data}", "data.val_split=0", *dirs, *overrides, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("psgd: error: ") and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and not out.exists()


@pytest.mark.parametrize(
    "every_job",
    [pytest.param(True, marks=pytest.mark.slow), False],  # slow: the same check as the other's, ~5 s
    ids=["every-job", "one-job"],
)
def test_a_sweeps_missing_dataset_is_one_line_before_any_job(tiny_data, tmp_path, every_job):
    """A mistyped data.root in a sweep failed every job in turn (each trying the download again), where a
    single run says it in one line before anything starts; the sweep exited 1 with a report of failures.
    A root missing in only some jobs is said naming the first such job."""
    out, nowhere = tmp_path / "out", tmp_path / "nowhere"
    if every_job:
        roots, job = str(nowhere), ""
    else:
        roots, job = f"{tiny_data},{nowhere}", f"in the job workers=1 data.root={nowhere}; "
    proc = run_cli(
        "sweep.py", "-m", "workers=1,2", f"data.root={roots}", "data.val_split=0", "data.download=false",
        f"hydra.sweep.dir={out}", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    said = f"psgd: error: dataset mnist not found or unreadable under {nowhere}"
    assert len(lines) == 1 and lines[0].startswith(said), lines
    assert lines[0].endswith(f"({job}no job was started)"), lines
    assert not out.exists() and not nowhere.exists() and "psgd: [1/" not in proc.stdout


def test_a_sweeps_job_without_a_training_batch_is_one_line_before_any_job(tiny_data, tmp_path):
    """Found only with the data read: the sweep ran its first job, then failed the second as it started."""
    out = tmp_path / "out"
    proc = run_cli(
        "sweep.py", "-m", "workers=1,2", "data.batch_size=300", "data.drop_last=true", f"data.root={tiny_data}",
        "data.val_split=0", f"hydra.sweep.dir={out}", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("psgd: error: no training batch for worker 0 (256 samples)"), lines
    assert lines[0].endswith("(in the job workers=2; no job was started)"), lines
    assert not out.exists() and "psgd: [1/" not in proc.stdout


def test_a_sweeps_damaged_cifar10_is_one_line_before_any_job(tiny_data, tmp_path):
    """The generated CIFAR10 files are all there but are not the real ones (their md5 sums differ): every
    job failed on them in turn, each trying a download again."""
    out = tmp_path / "out"
    proc = run_cli(
        "sweep.py", "-m", "workers=1,2", "data=cifar10", f"data.root={tiny_data}", "data.val_split=0",
        "data.download=false", f"hydra.sweep.dir={out}", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "md5 sum not CIFAR10's" in lines[0] and "data.verify_md5=false" in lines[0], lines
    assert lines[0].endswith("(no job was started)") and not out.exists() and "psgd: [1/" not in proc.stdout


@pytest.mark.parametrize(
    "script,overrides,line",
    [
        ("train.py", ["workers=0"], "psgd: error: workers=0 is invalid: Input should be greater than or equal to 1"),
        (
            "sweep.py",
            ["-m", "optimizer.lr=0.1,-1"],
            "psgd: error: optimizer.lr=-1 is invalid: Input should be greater than 0"
            " (in the job optimizer.lr=-1; no job was started)",
        ),
    ],
)
def test_a_value_that_needs_no_machine_is_reported_before_torch_loads(tmp_path, script, overrides, line):
    """Such a value was reported only after torch and Lightning had loaded (~4.5 s on 2 cores); Python's
    own import log (PYTHONPROFILEIMPORTTIME) shows what loaded before the line."""
    out = tmp_path / "out"
    dirs = [f"hydra.run.dir={out}", f"hydra.sweep.dir={out}"]
    proc = run_cli(script, *dirs, *overrides, timeout=120, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 2
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    assert "omegaconf" in imported and "psgd.config" in imported  # the log is there
    assert not [m for m in imported if m.split(".")[0] in ("torch", "pytorch_lightning", "torchvision")]
    said = [ln for ln in proc.stderr.splitlines() if not ln.startswith("import time:")]
    assert said == [line] and not out.exists()


@pytest.mark.parametrize("script", ["train.py", "sweep.py"])
def test_a_dir_holding_earlier_results_is_refused_and_left_as_it_was(tiny_data, tmp_path, script):
    """Reusing a hydra.run.dir (or sweep dir) used to overwrite the earlier run's config, record and
    checkpoints, and mix two runs' TensorBoard curves in one dir."""
    earlier = tmp_path / "earlier"
    record = earlier / ("metrics.json" if script == "train.py" else "0/metrics.json")
    files = {record: '{"status": "completed", "test_acc": 0.99}', earlier / ".hydra" / "config.yaml": "seed: 0\n"}
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    dirs = [f"hydra.run.dir={earlier}", f"hydra.sweep.dir={earlier}"]
    proc = run_cli(script, f"data.root={tiny_data}", "data.val_split=0", *dirs, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(f"psgd: error: {earlier} holds an earlier "), proc.stderr
    assert {p: p.read_text() for p in files} == files
    assert sorted(str(p.relative_to(earlier)) for p in earlier.rglob("*")) == sorted(
        {".hydra", ".hydra/config.yaml", str(record.relative_to(earlier)), *(["0"] if script == "sweep.py" else [])}
    )


def _used_run_dir(path):
    """A dir as a finished run leaves it: its record, a checkpoint and TensorBoard events."""
    files = {
        path / "metrics.json": '{"status": "completed", "test_acc": 0.99}',
        path / "checkpoints" / "last.ckpt": "weights",
        path / "tensorboard" / "events.out.tfevents.1.host": "events",
    }
    for p, text in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return files


def test_train_from_python_refuses_a_run_dir_holding_earlier_results(tiny_data, tmp_path):
    """psgd.run.train(cfg, run_dir) has no command-line check in front of it: it used to write its
    checkpoints, events and metrics.json over the earlier run's."""
    earlier = tmp_path / "earlier"
    files = _used_run_dir(earlier)
    with pytest.raises(DirInUse) as refused:
        train(compose_cfg(f"data.root={tiny_data}", "data.val_split=0", "quiet=true"), earlier)
    assert str(refused.value).startswith(f"{earlier} holds an earlier run's results (metrics.json)")
    assert "set run_dir to a new folder" in str(refused.value)
    assert {p: p.read_text() for p in files} == files
    assert sorted(p for p in earlier.rglob("*") if p.is_file()) == sorted(files)


def test_a_used_run_dir_is_refused_in_the_job_when_the_command_line_check_is_skipped(tiny_data, tmp_path):
    """One of Hydra's flags (--config-name) skips psgd's command-line check; the job itself still
    refuses the dir before training, so the earlier record, checkpoints and events stay as they were
    (Hydra has rewritten only its .hydra config by then)."""
    earlier = tmp_path / "earlier"
    files = _used_run_dir(earlier)
    proc = run_cli(
        "train.py",
        "--config-name=train",
        f"data.root={tiny_data}",
        "data.val_split=0",
        f"hydra.run.dir={earlier}",
        "quiet=true",
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"psgd: error: {earlier} holds an earlier run's results (metrics.json), which this run would "
        f"overwrite: set hydra.run.dir to a new folder, or delete that one (ckpt_path={earlier} resumes that run "
        "in a new folder)"
    ], proc.stderr
    assert {p: p.read_text() for p in files} == files
    assert not (earlier / "tensorboard" / "hparams.yaml").exists()


def test_missing_dataset_names_the_path_and_the_fix(tmp_path):
    outputs = tmp_path / "outputs"  # the default run dir, outputs/<date>/<time>
    (outputs / "2026-01-02" / "03-04-05-000000").mkdir(parents=True)  # an earlier day's run
    env = {"PSGD_OUTPUTS": str(outputs)}
    proc = run_cli("train.py", f"data.root={tmp_path / 'empty'}", "data.download=false", timeout=120, env=env)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / "empty") in lines[0] and "PSGD_DATA" in lines[0], proc.stderr
    # neither the run's dir nor a date folder that held only it is left; other runs' folders stay
    assert sorted(p.relative_to(outputs).as_posix() for p in outputs.rglob("*")) == [
        "2026-01-02",
        "2026-01-02/03-04-05-000000",
    ]


@pytest.mark.distributed
@pytest.mark.slow  # ~14 s; a worker's error comes back as the resume refusal below does (run.raised_in_worker)
def test_a_value_lightning_refuses_inside_the_workers_is_one_line_and_leaves_no_run_dir(tiny_data, tmp_path):
    """Lightning checks limit_*_batches against the batches only inside fit, in every worker: its reason
    comes back as psgd's one line (before: a worker's traceback, exit code 1).
    The failed workers let go of the process group before Python shuts down, as finished ones do: its
    threads (pt_gloo_runloop) used to outlive the exit hooks, and now and then one of them still letting go
    of the last all-reduce's tensors aborted the worker ("terminate called without an active exception"
    on stderr, 1 run in ~15; the thread count below fails every run without the fix)."""
    run_dir, threads = tmp_path / "run", ThreadsAtExit(tmp_path)
    # spawn: a spawned worker shuts Python down at its exit (a fork server's child leaves by os._exit)
    overrides = ["workers=2", "strategy.start_method=spawn", "trainer.limit_train_batches=0.01", "quiet=true"]
    overrides.append(f"hydra.run.dir={run_dir}")
    proc = run_cli("train.py", f"data.root={tiny_data}", "data.val_split=0", *overrides, timeout=180, env=threads.env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "psgd: error: Lightning refuses a setting: You requested to check 0.01 of the `train_dataloader` but "
        "0.01 * 2 < 1. Please increase the `limit_train_batches` argument. Try at least `limit_train_batches=0.5`"
    ], proc.stderr
    assert not run_dir.exists()
    assert len(threads.processes()) >= 3  # train.py and its two workers (and multiprocessing's resource tracker)
    assert not threads.gloo_left(), threads.processes()


@pytest.mark.parametrize("script", ["train.py", "sweep.py"])
def test_help_says_what_the_script_does_and_a_closed_pipe_ends_it_quietly(script):
    import subprocess
    import sys

    from conftest import ROOT

    proc = run_cli(script, "--help", timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith(f"psgd {script}: "), proc.stderr
    assert f"python {script} -m " in proc.stdout or f"python {script} [group=choice" in proc.stdout
    assert "\nworkers: 1\n" in proc.stdout and "\n  max_epochs: " in proc.stdout  # the keys, with their defaults
    assert (
        "\n  optimizer.lr: Learning rate of one worker" in proc.stdout
    )  # and every key of the schema, with its meaning
    # `python sweep.py --help | head -1`: the reader leaves before the help is written
    reader_gone = subprocess.Popen(
        [sys.executable, str(ROOT / script), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    reader_gone.stdout.close()
    assert reader_gone.wait(timeout=60) in (0, 141)  # 0: the help fitted in the pipe before it closed
    assert reader_gone.stderr.read() == ""  # it was Python's BrokenPipeError traceback


@pytest.mark.distributed
@pytest.mark.parametrize(
    "overrides,line",
    [  # found by the command line's check (before torch loads), and by check() in train (torchrun's counts)
        pytest.param(  # ~10 s; the waiting and its SIGTERM are unit-tested (tests/unit/test_command_line.py)
            ["workers=0"],
            "psgd: error: workers=0 is invalid: Input should be greater than or equal to 1",
            marks=pytest.mark.slow,
        ),
        (["workers=3"], "psgd: error: workers=3 trainer.num_nodes=1 do not match torchrun's 2 processes per node"),
        # found as the run reads its files (a checkpoint, the dataset): every worker read them, and each said it
        pytest.param(  # ~13 s: as the dataset's line (slow too) and the counts' above, once per machine
            ["workers=2", "init_weights=nowhere"],
            "psgd: error: init_weights='nowhere' is invalid: no checkpoint at",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["workers=2", "data.root=nowhere", "data.download=false"],
            "psgd: error: dataset mnist not found or unreadable under ",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_bad_value_under_torchrun_is_said_once(tiny_data, tmp_path, overrides, line):
    """Every torchrun worker finds the same bad value: each used to print it, and a worker the agent
    stopped first (once another had exited) printed "interrupted (SIGTERM) before training started"
    instead, in any order. The first worker of the machine says it now, the others stay quiet."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(ROOT / "train.py")]
    proc = subprocess.run(
        [*cmd, f"data.root={tiny_data}", "data.val_split=0", f"hydra.run.dir={out}", "quiet=true", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode != 0
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("psgd:")]
    assert len(said) == 1 and said[0].startswith(line), proc.stderr[-3000:]
    assert not out.exists()


SLOW_HYDRA_SETUP = """
import os, time
if "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ:
    import hydra.core.utils as hydra_utils
    set_up_logs = hydra_utils.configure_log
    def slowly(*args, **kwargs):  # Hydra has made the run dir and not yet opened its log file in it
        time.sleep(float(os.environ["SET_UP_SECONDS"].split(",")[int(os.environ["LOCAL_RANK"])]))
        return set_up_logs(*args, **kwargs)
    hydra_utils.configure_log = slowly
"""


@pytest.mark.distributed
@pytest.mark.slow  # ~12 s each: a torchrun pair, one of whose workers sets its run dir up seconds late
@pytest.mark.parametrize("seconds", ["4,1", "0,3"], ids=["first-worker-late", "other-worker-late"])
def test_a_bad_value_under_torchrun_leaves_the_run_dir_to_a_worker_still_setting_it_up(tiny_data, tmp_path, seconds):
    """Every torchrun worker finds the same bad value. One that found it took the run dir away while another
    worker, whose Hydra had made the dir, had not yet opened its log file there: that worker failed with
    Hydra's traceback ("Unable to configure handler 'file'"), and with the machine's first worker late no
    psgd line was said (seen once in CI: the file check of init_weights comes right at the job's start)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_HYDRA_SETUP)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(ROOT / "train.py")]
    proc = subprocess.run(
        [
            *cmd,
            f"data.root={tiny_data}",
            "data.val_split=0",
            f"hydra.run.dir={out}",
            "quiet=true",
            "workers=2",
            "init_weights=nowhere",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PYTHONWARNINGS": "ignore",
            "PYTHONPATH": os.pathsep.join([str(hook), *sys.path]),
            "SET_UP_SECONDS": seconds,
        },
    )
    assert "Unable to configure handler" not in proc.stderr, proc.stderr[-3000:]
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("psgd:")]
    assert said == [
        "psgd: error: init_weights='nowhere' is invalid: no checkpoint at nowhere (give a run dir, a .ckpt file "
        "or a weights file such as weights/rank0.pt)"
    ], proc.stderr[-3000:]
    assert not out.exists()


BUGGY_MODEL = '''
from torch import nn


class Buggy(nn.Module):
    """A user's network with a bug that shows only in its fifth training step."""

    def __init__(self, in_channels=1, num_classes=10, **lab_cnn_settings):
        super().__init__()
        self.fc, self.calls = nn.Linear(in_channels * 28 * 28, num_classes), 0

    def forward(self, x):
        self.calls += self.training
        if self.calls == 5:
            raise ValueError("a bug deep in my model")
        return self.fc(x.flatten(1))
'''


@pytest.mark.parametrize(
    "launch",
    [
        "in-process",
        # ~15 s each; the worker's line and log are unit-tested (tests/unit/test_launcher.py)
        pytest.param("ddp-2", marks=[pytest.mark.distributed, pytest.mark.slow]),
        pytest.param("torchrun-2", marks=[pytest.mark.distributed, pytest.mark.slow]),
    ],
)
def test_a_bug_in_a_users_model_is_one_line_and_its_whole_traceback_is_kept(tiny_data, tmp_path, launch):
    """A bug in the user's own code (here a model of theirs) is not one of psgd's errors: its line says
    where the whole traceback is. Before, one worker printed Hydra's abridged report; two workers' run
    said 'worker rank 0 failed: ValueError: ...' with the traceback nowhere; under torchrun each worker
    printed Hydra's report of the whole stack, interleaved (319 lines with torchrun's own)."""
    env = user_code(tmp_path, "buggy_net", BUGGY_MODEL)
    run_dir = tmp_path / "run"
    workers = 1 if launch == "in-process" else 2
    over = [f"workers={workers}", "model._target_=buggy_net.Buggy", "model.name=buggy", f"hydra.run.dir={run_dir}"]
    args = [f"data.root={tiny_data}", "data.val_split=0", "quiet=true", "data.batch_size=16", *over]
    if launch == "torchrun-2":
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        proc = subprocess.run(
            [*torchrun, str(ROOT / "train.py"), *args],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "PYTHONWARNINGS": "ignore", **env},
        )
    else:
        proc = run_cli("train.py", *args, env=env)
    assert proc.returncode != 0 if launch == "torchrun-2" else proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("psgd:")]
    if launch == "in-process":
        assert proc.stderr.strip().splitlines() == lines  # nothing else
    # each worker that met the bug (with DDP both do, at the same step) says it, naming its own log
    logs = {"in-process": ["error.log"], "ddp-2": ["error.log"], "torchrun-2": ["error.log", "error.rank1.log"]}[launch]
    assert 1 <= len(lines) <= len(logs)
    tracebacks = (proc.stdout + proc.stderr).count("Traceback (most recent call last)")
    assert tracebacks == (1 if launch == "torchrun-2" else 0)  # torchrun's own ChildFailedError only
    for ln in lines:
        rank = "worker rank [01] failed: " if workers == 2 else ""
        log = rf"{re.escape(str(run_dir))}/error(\.rank1)?\.log"
        assert re.fullmatch(rf"psgd: error: {rank}ValueError: a bug deep in my model \(traceback in {log}\)", ln), ln
    where = next(n for n, text in enumerate(BUGGY_MODEL.splitlines(), 1) if "raise ValueError" in text)
    for name in logs[: len(lines)]:
        log = (run_dir / name).read_text()
        assert f'buggy_net.py", line {where}, in forward' in log
        assert log.rstrip().endswith("ValueError: a bug deep in my model")
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["status"] == "failed" and m["error"] == next(ln for ln in lines if ln.endswith("error.log)")).removeprefix(
        "psgd: error: "
    )
