"""Shared fixtures: small datasets generated in the formats torchvision reads, and config composition."""

import gzip
import os
import pickle
import re
import signal
import subprocess
import sys
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

# OpenMP threads that find no work sleep at once instead of spinning: the suite runs two tests at a time
# (pytest.ini's -n 2) on as few as 2 cores, where spinning threads take the cores the other test needs. Read
# when torch loads OpenMP, so set before any test imports torch; the runs the tests start inherit it. No test
# times training (the benchmarks/ scripts keep OpenMP's default).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
SHARED_DATA = (ROOT / ".." / "shared" / "data").resolve()


def class_images(labels: np.ndarray, size: int, channels: int, seed: int) -> np.ndarray:
    """Learnable images: class k lights up a bar at a class-specific position, plus noise."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    images = rng.integers(0, 60, size=(n, size, size, channels), dtype=np.uint8)
    band = max(1, size // 12)
    for i, k in enumerate(labels):
        row = 2 + int(k) * band
        images[i, row : row + band, 2 : size - 2, :] = 255
    return images


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def make_mnist_like(root: Path, folder: str, n_train: int = 512, n_test: int = 256, seed: int = 0) -> Path:
    """Write MNIST-format .gz files as torchvision lays them out: root/<folder>/raw/*.gz."""
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.permutation(np.arange(n) % 10).astype(np.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte.gz", class_images(labels, 28, 1, seed + n)[..., 0])
        write_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return root


def make_cifar_like(root: Path, per_batch: int = 40, n_test: int = 60, seed: int = 0) -> Path:
    """Write CIFAR-10's python-pickle batches (data_batch_1..5, test_batch, batches.meta)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for j, name in enumerate(names):
        n = n_test if name == "test_batch" else per_batch
        labels = rng.permutation(np.arange(n) % 10)
        images = class_images(labels, 32, 3, seed + j).transpose(0, 3, 1, 2).reshape(n, 3072)
        with open(folder / name, "wb") as f:
            pickle.dump({"data": images, "labels": labels.tolist(), "batch_label": name}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, f)
    return root


@pytest.fixture
def offline(monkeypatch):
    """Every MNIST-family download raises, as urllib does without a network."""

    def download(*args, **kwargs):
        raise URLError("no network")

    monkeypatch.setattr("torchvision.datasets.mnist.download_and_extract_archive", download)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """A data root holding small MNIST, FashionMNIST and CIFAR10 look-alikes."""
    root = tmp_path_factory.mktemp("data")
    make_mnist_like(root, "MNIST", seed=1)
    make_mnist_like(root, "FashionMNIST", seed=2)
    make_cifar_like(root, seed=3)
    return root


# sitecustomize for ThreadsAtExit: imported first by every process of a run (train.py, its workers), its exit
# hook is registered before any other, so it runs last, after psgd's, and records the threads still running
_THREADS_AT_EXIT = """
import atexit, os

def _record():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    with open(os.path.join(os.environ["PSGD_TEST_THREADS_AT_EXIT"], str(os.getpid())), "w") as f:
        f.write(" ".join(names))

atexit.register(_record)
"""


class ThreadsAtExit:
    """The threads each process of a run still has when its last exit hook has run, just before Python
    shuts down (Linux: /proc/self/task): pass `env` to the run, then read `gloo_left`."""

    def __init__(self, folder: Path):
        self.site, self.out = folder / "site", folder / "threads"
        self.site.mkdir(parents=True)
        self.out.mkdir()
        (self.site / "sitecustomize.py").write_text(_THREADS_AT_EXIT)
        path = [str(self.site), *filter(None, [os.environ.get("PYTHONPATH")])]
        self.env = {"PYTHONPATH": os.pathsep.join(path), "PSGD_TEST_THREADS_AT_EXIT": str(self.out)}

    def processes(self) -> dict[str, list[str]]:
        """Thread names by pid, for every process of the run that exited through Python's exit."""
        return {p.name: p.read_text().split() for p in self.out.iterdir()}

    def gloo_left(self) -> list[str]:
        """The pids whose process group's threads (torch's gloo workers, gloo's socket loop) outlived
        every exit hook."""
        return [pid for pid, names in self.processes().items() if {"pt_gloo_runloop", "gloo_tcp_loop"} & set(names)]


# for a run a test stops and waits for: Python prints every thread's stack when it gets SIGABRT (`ended`)
DUMPS_STACKS = {"PYTHONFAULTHANDLER": "1"}


def ended(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """`proc.communicate(timeout=timeout)` for a run that should end by then (told to stop, or short). One
    still running then gets SIGABRT (its session, where it has one of its own), and the test fails
    showing where its threads were: started with DUMPS_STACKS in its environment, Python prints every
    thread's stack."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGABRT)
        except OSError:  # not a session of its own
            proc.send_signal(signal.SIGABRT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        stacks = (err or "").split("\nExtension modules:")[0]  # (the list of loaded C modules that ends the dump)
        pytest.fail(f"still running after the test's {timeout:g} s wait; its threads then:\n{stacks[-8000:]}")


def own_lines(output: str) -> list[str]:
    """The lines of a process's output without gloo's "[Gloo] Rank 0 is connected to 1 peer ranks. ..."
    that torch 2.10's gloo prints from C++ as a group forms (two ranks' lines may cut into each other)."""
    return [
        line
        for line in output.splitlines()
        if "[Gloo] Rank" not in line and not re.match(r"\d+ is connected to \d+ peer ranks", line)
    ]


def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def user_code(tmp_path: Path, module: str, source: str) -> dict[str, str]:
    """A user's own code, as a run imports it: `source` written to <tmp_path>/usercode/<module>.py; returns
    the environment entry that puts that folder first on a run's PYTHONPATH (for run_cli's `env`)."""
    folder = tmp_path / "usercode"
    folder.mkdir(exist_ok=True)
    (folder / f"{module}.py").write_text(source)
    return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def run_cli(
    script: str, *overrides: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run train.py / sweep.py as a user would, in a fresh process."""
    full_env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / script), *overrides],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
