"""MNIST, FashionMNIST and CIFAR10 through torchvision's dataset classes, decoded once into tensors.

torchvision's own download code is kept. Two departures, both for files that are already there:
the MNIST family reads the downloaded ``.gz`` files directly instead of extracting copies beside
them (so a read-only data folder works), and CIFAR10's md5 check can be turned off for locally
made copies in CIFAR's format (``data.verify_md5=false``).
"""

import contextlib
import gzip
import os
import pickle
import re
from pathlib import Path
from urllib.error import URLError

import numpy as np
import torch
from torch import Tensor
from torchvision import datasets as tvd
from torchvision.datasets.utils import check_integrity


class DataError(RuntimeError):
    """A dataset that is missing, truncated or corrupted; the message is one line with the fix."""


def read_idx(path: str) -> np.ndarray:
    """Parse an IDX (LeCun) uint8 file, gzipped or not; a damaged file is a one-line DataError."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read {path}: {e} (file truncated or corrupted: delete it and download again)") from e
    if len(data) < 8 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataError(f"{path} is not an IDX uint8 file (corrupted? delete it and download again)")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    if len(data) - offset != int(np.prod(dims)):
        raise DataError(
            f"{path} holds {len(data) - offset} bytes of data, expected {int(np.prod(dims))} for shape {dims} "
            "(file truncated: delete it and download again)"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


class _ReadsGzip:
    """MNIST-family mixin: accept and read the downloaded .gz files without extracting them."""

    folder: str

    @property
    def raw_folder(self) -> str:
        return os.path.join(self.root, self.folder, "raw")

    def _path(self, stem: str) -> str:
        plain = os.path.join(self.raw_folder, stem)
        return plain if os.path.exists(plain) else plain + ".gz"

    def _check_exists(self) -> bool:
        return all(os.path.exists(self._path(os.path.splitext(name)[0])) for name, _ in self.resources)

    def _load_data(self) -> tuple[Tensor, Tensor]:
        prefix = "train" if self.train else "t10k"
        images = read_idx(self._path(f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(self._path(f"{prefix}-labels-idx1-ubyte"))
        if len(images) != len(labels):
            raise DataError(f"{self.raw_folder}: {len(images)} images but {len(labels)} labels")
        return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))


class MNIST(_ReadsGzip, tvd.MNIST):
    folder = "MNIST"


class FashionMNIST(_ReadsGzip, tvd.FashionMNIST):
    folder = "FashionMNIST"


class CIFAR10(tvd.CIFAR10):
    """torchvision's CIFAR10 whose md5 check can be skipped for locally made copies."""

    def __init__(self, *args, verify_md5: bool = True, **kwargs):
        self.verify_md5 = verify_md5
        super().__init__(*args, **kwargs)

    def _check_integrity(self) -> bool:
        if self.verify_md5:
            return super()._check_integrity()
        folder = os.path.join(self.root, self.base_folder)
        return all(os.path.exists(os.path.join(folder, name)) for name, _ in self.train_list + self.test_list)

    def _load_meta(self) -> None:
        if self.verify_md5:
            return super()._load_meta()
        with open(os.path.join(self.root, self.base_folder, self.meta["filename"]), "rb") as f:
            self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}


_CLASSES = {"mnist": MNIST, "fashion_mnist": FashionMNIST, "cifar10": CIFAR10}


def what_is_missing(name: str, root: str, verify_md5: bool = True) -> str | None:
    """What of dataset `name` is not under `root` as torchvision expects it, in a few words: the folder,
    the files that are missing, or (CIFAR10 with verify_md5) those whose md5 sum is not the real one's;
    None when every file is there. Looked at only after loading failed, to say which file it was."""
    top = Path(root)
    if not top.is_dir():
        return "a file, not a folder" if top.exists() else "no such folder"
    if name == "cifar10":
        folder = top / CIFAR10.base_folder
        expected = [*CIFAR10.train_list, *CIFAR10.test_list, [CIFAR10.meta["filename"], CIFAR10.meta["md5"]]]
        missing = [f"{CIFAR10.base_folder}/{f}" for f, _ in expected if not (folder / f).is_file()]
        if missing or not verify_md5:
            return _some("missing", missing)
        wrong = [f"{CIFAR10.base_folder}/{f}" for f, md5 in expected if not check_integrity(str(folder / f), md5)]
        found = _some("md5 sum not CIFAR10's for", wrong)
        return found and f"{found}: a damaged download, or a copy made locally (then set data.verify_md5=false)"
    cls = _CLASSES[name]
    raw = top / cls.folder / "raw"
    names = [f for f, _ in cls.resources]  # the .gz names; read as they are or extracted beside them
    missing = [f"{cls.folder}/raw/{f}" for f in names if not (raw / f).is_file() and not (raw / f[:-3]).is_file()]
    return _some("missing", missing)


def _some(what: str, files: list[str]) -> str | None:
    if not files:
        return None
    more = f" and {len(files) - 1} more file(s)" if len(files) > 1 else ""
    return f"{what} {files[0]}{more}"


def _dirs_around(root: str) -> set[Path]:
    """The folders a dataset download may make: `root`, its parents, and two levels below it."""
    top = Path(root).absolute()
    below = [p for p in (*top.glob("*"), *top.glob("*/*")) if p.is_dir()] if top.is_dir() else []
    return {*(p for p in (top, *top.parents) if p.is_dir()), *below}


def _remove_new_empty_dirs(root: str, before: set[Path]) -> None:
    for d in sorted(_dirs_around(root) - before, key=lambda p: len(p.parts), reverse=True):  # deepest first
        with contextlib.suppress(OSError):  # not empty (a partial file is kept for the user to look at)
            d.rmdir()


def load_split(
    name: str, root: str, train: bool, download: bool = True, verify_md5: bool = True
) -> tuple[Tensor, Tensor]:
    """Decode one split into (uint8 images N x C x H x W, int64 labels N)."""
    if name not in _CLASSES:
        raise DataError(f"unknown dataset {name!r}; allowed: {', '.join(_CLASSES)}")
    root = os.path.expanduser(str(root))
    kwargs = {"verify_md5": verify_md5} if name == "cifar10" else {}
    before = _dirs_around(root) if download else None  # only a download makes folders (a large root: slow glob)
    try:
        ds = _CLASSES[name](root, train=train, download=download, **kwargs)
    except DataError:
        raise
    except (RuntimeError, URLError, OSError) as e:
        if before is not None:  # a download that failed leaves no empty <root>/MNIST/raw behind
            _remove_new_empty_dirs(root, before)
        where = os.path.abspath(root)
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        first = lines[0]
        if first.endswith(":") and len(lines) > 1:  # torchvision's "Error downloading <file>:", each
            first = f"{first} {lines[-1]}"  # mirror's reason below it: the last one's says why
        if not download:  # torchvision's "You can use download=True ...": psgd's own setting below says it
            first = re.sub(r"\s*You can use download=True.*", "", first) or first
        fetch = (
            "run once with network access" if download else "drop data.download=false and run once with network access"
        )
        missing = what_is_missing(name, root, verify_md5)
        if missing:  # torchvision's "Dataset not found or corrupted." does not say which file
            first = f"{missing}; download: {first}" if download else missing
        raise DataError(
            f"dataset {name} not found or unreadable under {where} ({first}); set data.root=<dir> or "
            f"PSGD_DATA=<dir> to where it lives, or {fetch} so it can be downloaded"
        ) from e
    except Exception as e:  # pickle/format errors from a damaged CIFAR batch
        raise DataError(f"dataset {name} under {os.path.abspath(root)} is corrupted ({type(e).__name__}: {e})") from e
    images = torch.as_tensor(np.asarray(ds.data))
    if images.ndim == 3:  # MNIST family: N x H x W
        images = images.unsqueeze(1)
    else:  # CIFAR: N x H x W x C
        images = images.permute(0, 3, 1, 2)
    labels = torch.as_tensor(np.asarray(ds.targets), dtype=torch.int64)
    return images.contiguous(), labels
