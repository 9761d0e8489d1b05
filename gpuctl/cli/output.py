"""Consoles, the rendering of errors and where library logging goes. Human text goes to stderr,
machine output to stdout.

Every console gpuctl makes has emoji codes off (rich would print the PCI address ``0000:ab:00``
with an emoji for ``:ab:``) and no highlighting; text that comes from a node, from Slurm or from
a file is passed through :func:`literal` (markup escaped, control characters made visible), so
it is printed exactly as it was.

Library logging (paramiko logs from its transport thread, with tracebacks, when a node resets
its SSH connection during a reboot) never reaches the terminal: :func:`library_logs_routed`
(the CLI's error boundary, around every command) catches every record and every uncaught
exception of a thread; they are kept in memory, shown only after the traceback of an internal
error (exit 70), and written to a log file once a command names one (:func:`log_to`: a
rollout's ``gpuctl.log``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape

from gpuctl.errors import ConfigError, GpuctlError
from gpuctl.validation.results import printable

KEPT_RECORDS = 50


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def out_console() -> Console:
    console = Console(highlight=False, emoji=False)
    if not console.is_terminal:  # piped: do not crop tables to 80 columns
        console = Console(highlight=False, emoji=False, width=160)
    return console


def literal(text: str) -> str:
    """``text`` (from a node, Slurm or a file) for a console: printed as it is, never as markup,
    emoji or terminal control sequences."""
    return escape(printable(text))


def print_error(exc: GpuctlError) -> None:
    """One line per problem: ``file:line:col: path: message``."""
    console = err_console()
    if isinstance(exc, ConfigError) and exc.problems:
        for problem in exc.problems:
            console.print(f"[red]error[/red]: {escape(str(problem))}")
        n = len(exc.problems)
        console.print(f"{n} problem{'s' if n != 1 else ''} found")
    else:
        console.print(f"[red]error[/red]: {escape(str(exc))}")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


class LibraryLog(logging.Handler):
    """What libraries log while a command runs, away from the terminal: the last
    :data:`KEPT_RECORDS` records in memory, and every record in the file :meth:`open` names."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s")
        )
        self.kept: deque[str] = deque(maxlen=KEPT_RECORDS)
        self.path: Path | None = None
        self._file: TextIO | None = None
        self._file_lock = threading.Lock()

    def open(self, path: Path) -> None:
        """Append every record from now on (and the ones kept so far) to ``path`` (0600)."""
        with self._file_lock:
            if self._file is not None:
                if self.path == path:
                    return
                self._file.close()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._file = os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")
            self.path = path
            for text in self.kept:
                self._file.write(text + "\n")
            self._file.flush()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # a record that cannot be formatted says so, never raises
            text = f"{record.name}: unformattable log record {record.msg!r}"
        self.kept.append(text)
        with self._file_lock:
            if self._file is not None:
                try:
                    self._file.write(text + "\n")
                    self._file.flush()
                except OSError:
                    self._file = None  # a full disk must not stop the command

    def thread_exception(self, args: threading.ExceptHookArgs) -> None:
        """``threading.excepthook``: a thread's uncaught exception is logged here, not printed."""
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "?"
        logging.getLogger("gpuctl.threads").error(
            "uncaught exception in thread %s",
            name,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
        )

    def close(self) -> None:
        with self._file_lock:
            if self._file is not None:
                self._file.close()
                self._file = None
        super().close()


_current: LibraryLog | None = None


@contextmanager
def library_logs_routed() -> Iterator[LibraryLog]:
    """For the ``with`` block: every log record that reaches the root logger, every record of a
    logger without handlers (``logging.lastResort``) and every uncaught exception of a thread
    goes to a :class:`LibraryLog` instead of stderr."""
    global _current
    handler = LibraryLog()
    root = logging.getLogger()
    saved = (logging.lastResort, threading.excepthook, _current)
    root.addHandler(handler)
    logging.lastResort = handler
    threading.excepthook = handler.thread_exception
    _current = handler
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        logging.lastResort, threading.excepthook, _current = saved
        handler.close()


def log_to(path: Path) -> None:
    """Write what libraries log from now on to ``path`` as well (no-op outside the CLI)."""
    if _current is not None:
        # the log is for diagnosis: a directory that refuses it changes nothing else
        with contextlib.suppress(OSError):
            _current.open(path)
