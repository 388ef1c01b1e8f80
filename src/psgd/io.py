"""File writing: atomic writes of text, JSON, CSV and torch objects, and one-line messages on stderr.
A leaf module: it imports no other psgd module."""

import csv
import errno
import json
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path
from typing import IO, Any

# the errors of a write that failed for want of room on the disk (or in a quota), not for anything in the run
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


def say(line: str) -> None:
    """Write `line` and its newline to stderr in one write, so that lines of processes writing at once
    do not interleave."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def failed_write(e: OSError) -> str:
    """An OSError's reason and file as a line shows them: `No space left on device: '<file>'`."""
    return f"{e.strerror}: '{e.filename}'" if e.filename else (e.strerror or str(e))


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """A file to write `path` through: a temp file in the same folder, synced and renamed over `path` once
    written, so that a reader (or a resume after a crash) finds the old file or the new one, never part of
    one, and a failed write leaves no temp file. The file gets the permissions open() would give.

    Raises:
        OSError: the write failed; it names `path` where the failing call named no file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, mode.replace("w", "x")) as f:  # a new file, as `mode` would open it
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def remove_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Remove (and return) the temp files under `folder` of atomic_file writes whose writer was killed.
    Call it only once nothing writes there any more."""
    left = [p for p in Path(folder).glob("**/.*.tmp") if p.is_file()]
    for p in left:
        p.unlink(missing_ok=True)
    return left


def write_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """torch.save `obj` to `path` atomically, serialised in memory first so that a full disk is the OSError
    it is (torch's own writer reports it as a position mismatch)."""
    import torch  # here, not at the top: the command line imports this module and must not load torch

    buffer = BytesIO()
    torch.save(obj, buffer)
    with atomic_file(path, "wb") as f:
        f.write(buffer.getbuffer())


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2) + "\n")


def write_csv(path: str | os.PathLike, header: list[str], rows: list[list[Any]]) -> None:
    with atomic_file(path) as f:
        csv.writer(f).writerows([header, *rows])


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())
