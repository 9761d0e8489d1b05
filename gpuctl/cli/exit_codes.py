"""Exit codes of every gpuctl command (documented in README.md)."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    """Success."""
    CHECK_FAILED = 1
    """The command ran, and a check it ran failed."""
    CONFIG = 2
    """Usage, configuration or environment error: bad options, an invalid cluster.yml, a file
    that exists, a machine that cannot do what was asked (not root, a tool missing)."""
    INTERNAL = 70
    """A bug in gpuctl (EX_SOFTWARE); a traceback is printed. Kept apart from 1 so that a crash
    is never mistaken for a failed check."""
    INTERRUPTED = 130
    """Interrupted (Ctrl-C / SIGINT)."""
