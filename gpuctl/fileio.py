"""The one way gpuctl replaces a file, and the one way it reads a file it did not write.

``write_atomic``: the temporary file is created exclusively (``O_CREAT | O_EXCL``, random name,
never through a link) in the target's own folder, given its final mode before any byte is
written, then renamed over the target. A symlink planted at the target or at a guessable
temporary name is replaced, never followed; a reader sees the old file or the new one.

``read_inside``: read a file that must lie inside ``root`` (a bundle sent by someone else): a
symlink anywhere on the way, a path that leaves ``root``, or anything but a regular file is
refused, and at most ``limit`` bytes are read.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

SECRET_FILE_MODE = 0o600
SECRET_DIR_MODE = 0o700


class UnsafePath(OSError):
    """A path that leaves its folder, goes through a symlink or is not a regular file."""


class TooLarge(OSError):
    """A file larger than its reader's limit (refused before it is read)."""


def read_regular(path: Path, *, limit: int) -> bytes:
    """The bytes of the regular file ``path`` of at most ``limit`` bytes. A device, a FIFO or a
    socket (``/dev/zero``) raises UnsafePath and a larger file TooLarge, both before anything
    is read; a directory raises IsADirectoryError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{path}: not a regular file (a device, a pipe or a socket)")
        if st.st_size > limit:
            raise TooLarge(f"{path}: larger than {limit} bytes")
        data = _read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while being read
        raise TooLarge(f"{path}: larger than {limit} bytes")
    return data


def _read_up_to(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def decode_json(data: bytes) -> Any:
    """The JSON document in ``data``; ValueError saying why not: ``not UTF-8``, ``not JSON
    (nested too deep)`` (Python's recursion limit, never a RecursionError), ``not JSON (...)``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("not JSON (nested too deep)") from None
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path,
    data: bytes | str,
    *,
    mode: int = 0o644,
    durable: bool = False,
    dir_mode: int | None = None,
) -> None:
    """Replace ``path`` with ``data`` atomically, at file mode ``mode``.

    ``dir_mode`` is given to folders this call creates (secrets: 0700). ``durable`` fsyncs the
    file and its folder (state that must survive a crash).
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    parent = path.parent
    if dir_mode is None:
        parent.mkdir(parents=True, exist_ok=True)
    else:
        parent.mkdir(parents=True, exist_ok=True, mode=dir_mode)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(parent)


def read_inside(root: Path, rel: str | Path, *, limit: int) -> bytes:
    """Bytes of the regular file ``root/rel``, at most ``limit`` of them.

    Raises ``UnsafePath`` for an absolute ``rel``, a ``..`` step, a symlink at any step below
    ``root``, or something that is not a regular file; ``FileNotFoundError`` when absent.
    """
    rel_path = Path(rel)
    if rel_path.is_absolute() or ".." in rel_path.parts or not rel_path.parts:
        raise UnsafePath(f"{rel}: not a path inside {root}")
    current = root
    for part in rel_path.parts[:-1]:
        current = current / part
        st = os.lstat(current)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePath(f"{rel}: {part} is a link or not a folder")
    return _read_regular_at(current / rel_path.parts[-1], None, rel, limit)


def open_folder(path: Path) -> int:
    """A descriptor of the folder ``path`` (for :func:`read_in_folder`), never through a link
    at its last step (UnsafePath); the caller closes it."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise UnsafePath(f"{path}: a symlink (never followed in a bundle)") from None
        raise


def read_in_folder(folder: int, name: str, *, limit: int, shown: str | None = None) -> bytes:
    """:func:`read_inside` for a file directly in the folder open as ``folder``
    (:func:`open_folder`): one system call to open it instead of a walk from the root, for a
    reader of many files in one folder. ``name`` is a plain file name; ``shown`` names the
    file in errors (default ``name``)."""
    if not name or "/" in name or name in (".", ".."):
        raise UnsafePath(f"{shown or name}: not a file name")
    return _read_regular_at(name, folder, shown or name, limit)


def _read_regular_at(path: str | Path, folder: int | None, rel: str | Path, limit: int) -> bytes:
    """Bytes of the regular file ``path`` (relative to the folder descriptor ``folder`` when
    given), at most ``limit``; never through a link; ``rel`` names it in errors."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{rel}: a symlink (never followed in a bundle)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{rel}: not a regular file")
        return _read_up_to(fd, limit)
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts); how a reader tells a run
    that was killed (``kill -9``, a crash, a reboot) from one still going."""
    if pid <= 0:  # 0 and -1 would name process groups
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
