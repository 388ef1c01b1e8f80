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

from psgd.errors import DataError


def read_idx(path: str) -> np.ndarray:
    """Parse an IDX (LeCun) uint8 file, gzipped or not; a damaged file is a one-line DataError."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            data = f.read()
        if data[:3] != b"\0\0\x08":
            raise ValueError("not an IDX uint8 file")
        dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(data[3])]
        return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)
    except (OSError, EOFError, ValueError, IndexError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read {path}: {e} (file truncated or corrupted: delete it and download again)") from e


class _ReadsGzip:
    """MNIST-family mixin: accept and read the downloaded .gz files without extracting them (under
    <root>/<class name>/raw, as torchvision has them)."""

    def _path(self, stem: str) -> str:
        plain = os.path.join(self.raw_folder, stem)
        return plain if os.path.exists(plain) else plain + ".gz"

    def _check_exists(self) -> bool:
        return all(os.path.exists(self._path(os.path.splitext(name)[0])) for name, _ in self.resources)

    def _load_data(self) -> tuple[Tensor, Tensor]:
        prefix = "train" if self.train else "t10k"
        images = read_idx(self._path(f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(self._path(f"{prefix}-labels-idx1-ubyte"))
        return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))


class MNIST(_ReadsGzip, tvd.MNIST):
    pass


class FashionMNIST(_ReadsGzip, tvd.FashionMNIST):
    pass


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
    None when every file is there."""
    top = Path(root)
    if not top.is_dir():
        return "a file, not a folder" if top.exists() else "no such folder"
    if name == "cifar10":
        listed = [*CIFAR10.train_list, *CIFAR10.test_list, [CIFAR10.meta["filename"], CIFAR10.meta["md5"]]]
        files = {f"{CIFAR10.base_folder}/{f}": md5 for f, md5 in listed}
    else:  # the .gz names, read as they are or extracted beside them
        files = {f"{_CLASSES[name].__name__}/raw/{f}": None for f, _ in _CLASSES[name].resources}
    missing = [f for f in files if not (top / f).is_file() and not (top / f.removesuffix(".gz")).is_file()]
    if missing or not verify_md5 or name != "cifar10":
        return _some("missing", missing)
    wrong = _some(
        "md5 sum not CIFAR10's for", [f for f, md5 in files.items() if not check_integrity(str(top / f), md5)]
    )
    return wrong and f"{wrong}: a damaged download, or a copy made locally (then set data.verify_md5=false)"


def _some(what: str, files: list[str]) -> str | None:
    if not files:
        return None
    more = f" and {len(files) - 1} more file(s)" if len(files) > 1 else ""
    return f"{what} {files[0]}{more}"


def _new_folders(name: str, root: str) -> list[Path]:
    """The folders a download of `name` into `root` makes that are not there yet, deepest first."""
    top = Path(root).absolute()
    cls = _CLASSES[name]
    below = [top / cls.base_folder] if name == "cifar10" else [top / cls.__name__ / "raw", top / cls.__name__]
    return [p for p in (*below, top, *top.parents) if not p.exists()]


def load_split(
    name: str, root: str, train: bool, download: bool = True, verify_md5: bool = True
) -> tuple[Tensor, Tensor]:
    """Decode one split into (uint8 images N x C x H x W, int64 labels N).

    Raises:
        DataError: the files are missing, damaged or cannot be downloaded; one line naming the file and the fix.
    """
    root = os.path.expanduser(str(root))
    kwargs = {"verify_md5": verify_md5} if name == "cifar10" else {}
    new = _new_folders(name, root)
    try:
        ds = _CLASSES[name](root, train=train, download=download, **kwargs)
    except DataError:
        raise
    except (RuntimeError, URLError, OSError) as e:
        for folder in new:  # a failed download leaves no empty folder behind (a mistyped data.root)
            with contextlib.suppress(OSError):  # not empty: a partial file is kept for the user to look at
                folder.rmdir()
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        # torchvision's "Error downloading <file>:" has each mirror's reason below it: the last one says why
        why = f"{lines[0]} {lines[-1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
        missing = what_is_missing(name, root, verify_md5)  # torchvision's "Dataset not found" names no file
        if download:
            why, fix = (f"{missing}; download: {why}" if missing else why), "run once with network access"
        else:  # torchvision's "You can use download=True ...": psgd's own setting is said below
            why = missing or re.sub(r"\s*You can use download=True.*", "", why) or why
            fix = "drop data.download=false and run once with network access"
        raise DataError(
            f"dataset {name} not found or unreadable under {os.path.abspath(root)} ({why}); set data.root=<dir> or "
            f"PSGD_DATA=<dir> to where it lives, or {fix} so it can be downloaded"
        ) from e
    except Exception as e:  # pickle/format errors from a damaged CIFAR batch
        raise DataError(f"dataset {name} under {os.path.abspath(root)} is corrupted ({type(e).__name__}: {e})") from e
    images = torch.as_tensor(np.asarray(ds.data))
    # MNIST family: N x H x W; CIFAR: N x H x W x C
    images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)
    return images.contiguous(), torch.as_tensor(np.asarray(ds.targets), dtype=torch.int64)
