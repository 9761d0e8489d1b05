"""NVIDIA Fabric Manager: ``systemctl status``, its journal, and ``/var/log/fabricmanager.log``.

One kind, ``fabricmanager``, for the three places Fabric Manager (FM) reports its state:

- ``systemctl status nvidia-fabricmanager`` (header ``● nvidia-fabricmanager.service - ...``,
  ``Active:``/``Main PID:``/``Process:`` lines, then the last journal lines of the unit);
- ``journalctl -u nvidia-fabricmanager`` (``Mon DD HH:MM:SS host ident[pid]: message``);
- ``/var/log/fabricmanager.log`` (``[Mon DD YYYY HH:MM:SS] [LEVEL] [tid N] message``, with
  multi-line payloads and ``Fabric Manager Log initializing at:`` lines at each start).

Data (docs/parse.md has the full contract)::

    source:           "status" | "journal" | "log"
    active:           bool | None   (only ``systemctl status`` says whether FM runs now)
    state:            str | None    ("active (running)", "failed", "inactive (dead)", ...)
    exit_status:      int | None    (what systemd shows: ``code=exited, status=N/...``)
    version:          str | None    ("535.161.08", from the FM log's start banner)
    errors:           [{timestamp, message}]
    warnings:         [{timestamp, message}]
    nvswitch_errors:  [{severity, error, pci, physical_id, port, timestamp}]

What the judges read of it: :func:`fabric_manager_of` (a :class:`FabricManager`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import to_int
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

KIND = "fabricmanager"

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
# /var/log/fabricmanager.log: "[Dec 19 2024 19:17:49] [ERROR] [tid 1374] detected ..."
_LOG_START = re.compile(rf"\[{_MONTH} [ \d]?\d \d{{4}} ")
_LOG = re.compile(
    rf"\[(?P<ts>{_MONTH} [ \d]?\d \d{{4}} \d{{2}}:\d{{2}}:\d{{2}})\] \[(?P<level>[A-Z]+)\]"
    r"(?: \[tid (?P<tid>\d+)\])? ?(?P<msg>.*)$"
)
_LOG_INIT = re.compile(r"Fabric Manager Log initializing at: ")
# journal: "Sep 18 03:19:01 ubuntu2404 nvidia-fabricmanager-start.sh[4753]: message"
_JOURNAL = re.compile(
    rf"(?P<ts>{_MONTH} [ \d]\d \d{{2}}:\d{{2}}:\d{{2}}(?:\.\d+)?"
    r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:?\d{2}|Z)?)"
    r" (?P<host>\S+) (?P<ident>[^\s\[\]:]+)(?:\[(?P<pid>\d+)\])?: (?P<msg>.*)$"
)
# systemctl status
_HEADER = re.compile(
    r"(?:[\u25cf\u00d7\u25cb\u21bb*] )?(?P<unit>nvidia-fabricmanager(?:\.service)?)(?: - .*)?$"
)
_ACTIVE = re.compile(r"Active: (?P<state>.+?)(?: since (?P<since>.+))?$")
_MAIN_PID = re.compile(r"Main PID: (?P<pid>\d+)(?: \((?P<detail>.*)\))?$")
_PROCESS = re.compile(r"Process: (?P<pid>\d+) .*\((?P<detail>code=[^)]*)\)$")
_EXITED = re.compile(r"code=exited, status=(?P<status>\d{1,9})(?!\d)(?:/[\w-]+)?")
_UNIT_MISSING = re.compile(r"Unit nvidia-fabricmanager(?:\.service)? could not be found")
_JOB_FAILED = re.compile(r"Job for nvidia-fabricmanager(?:\.service)? failed\b")
_VERSION = re.compile(r"Fabric Manager version (?:is : )?(?P<version>\d+\.\d+(?:\.\d+)*)")
_NVSWITCH = re.compile(
    r"detected NVSwitch (?P<sev>non-fatal|fatal) error (?P<num>\d{1,9})(?!\d)", re.I
)
_NVSWITCH_PCI = re.compile(r"pci bus id (?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f.]+)")
_NVSWITCH_PHYS = re.compile(r"physical id (?P<id>\d{1,9})(?!\d)")
_NVSWITCH_PORT = re.compile(r"\bport (?P<port>\d{1,9})(?!\d)")
_ERROR_TEXT = re.compile(
    r"failed!|failed with error|\berror\b|\bfatal\b|do(?:es)?n'?t match|Failed to start", re.I
)
_WARNING_TEXT = re.compile(r"\bwarn(?:ing)?\b", re.I)
_ACTIVE_WORDS = {
    "active": True,
    "reloading": True,
    "inactive": False,
    "failed": False,
    "activating": False,
    "deactivating": False,
    "maintenance": False,
}


def _systemd_failure(msg: str) -> bool:
    """A systemd line about the unit that reports a failure."""
    exited = _EXITED.search(msg)
    if exited and exited.group("status") != "0":
        return True
    return bool(
        re.search(r"code=(?:killed|dumped)|Failed with result|Failed to start|start-limit", msg)
    )


def _nvswitch_error(msg: str, timestamp: str | None) -> dict[str, Any] | None:
    m = _NVSWITCH.search(msg)
    if m is None:
        return None
    pci = _NVSWITCH_PCI.search(msg)
    phys = _NVSWITCH_PHYS.search(msg)
    port = _NVSWITCH_PORT.search(msg, m.end())
    return {
        "severity": m.group("sev").lower(),
        "error": to_int(m.group("num")),
        "pci": pci.group("pci") if pci else None,
        "physical_id": to_int(phys.group("id")) if phys else None,
        "port": to_int(port.group("port")) if port else None,
        "timestamp": timestamp,
    }


@parser(
    KIND,
    description="Fabric Manager: systemctl status, its journal, or /var/log/fabricmanager.log",
)
def parse_fabricmanager(text: str) -> ParseResult:
    lines = clean(text).split("\n")
    problems: list[str] = []
    errors: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    nvswitch: list[dict[str, Any]] = []
    version: str | None = None
    header = False
    state: str | None = None
    active: bool | None = None
    main_exit: int | None = None  # systemctl status "Main PID: N (code=exited, status=N/...)"
    process_exit: int | None = None  # the last "Process: N ExecStart...=... (code=exited, ...)"
    journal_exit: int | None = None  # from systemd journal lines
    journal_fm = 0  # journal lines that are about Fabric Manager
    log_lines = 0
    cut_lines = 0
    missing: str | None = None
    job_failed: str | None = None

    def classify(msg: str, timestamp: str | None, level: str | None, ident: str | None) -> None:
        nonlocal version
        vm = _VERSION.search(msg)
        if vm:
            version = vm.group("version")
        entry = {"timestamp": timestamp, "message": msg}
        switch = _nvswitch_error(msg, timestamp)
        if switch is not None:
            nvswitch.append(switch)
        if level is not None:  # the FM log's own level decides
            if level in ("ERROR", "FATAL", "CRITICAL"):
                errors.append(entry)
            elif level in ("WARNING", "WARN"):
                warnings.append(entry)
            return
        if ident == "systemd":
            if _systemd_failure(msg):
                errors.append(entry)
            return
        if switch is not None or _ERROR_TEXT.search(msg):
            errors.append(entry)
        elif _WARNING_TEXT.search(msg):
            warnings.append(entry)

    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if _UNIT_MISSING.search(line):
            missing = line
            continue
        m = _LOG.match(line)
        if m:
            log_lines += 1
            classify(m.group("msg").strip(), m.group("ts"), m.group("level"), None)
            continue
        if _LOG_START.match(line):  # starts like an FM log line but does not parse
            log_lines += 1
            problems.append(
                f"line {number}: Fabric Manager log line not understood: {line[:160]!r}"
            )
            continue
        if _LOG_INIT.match(line):
            log_lines += 1
            continue
        m = _JOURNAL.match(line)
        if m:
            ident = m.group("ident")
            msg = m.group("msg").strip()
            if (
                "fabricmanager" in ident
                or "fabric manager" in msg.lower()
                or ("fabricmanager" in msg)
            ):
                journal_fm += 1
            if msg.endswith(("…", ">")) and not msg.endswith(("->", "=>", " >")):
                cut_lines += 1
            timestamp = m.group("ts")
            inner = _LOG.match(msg)  # FM logging to syslog repeats its own "[ts] [LEVEL]" prefix
            if inner:
                classify(inner.group("msg").strip(), timestamp, inner.group("level"), None)
                continue
            classify(msg, timestamp, None, ident)
            exited = _EXITED.search(msg)
            if exited and ident == "systemd":
                journal_exit = to_int(exited.group("status"))
            continue
        if _HEADER.match(line):
            header = True
            continue
        m = _ACTIVE.match(line)
        if m:
            words = m.group("state").split()
            active = _ACTIVE_WORDS.get(words[0]) if words else None
            state = re.sub(r"\s*\(Result: [^)]*\)", "", m.group("state")).strip() or None
            if active is None:
                problems.append(f"line {number}: unknown unit state in {line[:120]!r}")
            continue
        m = _MAIN_PID.match(line)
        if m:
            exited = _EXITED.search(m.group("detail") or "")
            if exited:
                main_exit = to_int(exited.group("status"))
            continue
        m = _PROCESS.match(line)
        if m:
            exited = _EXITED.search(m.group("detail"))
            if exited:
                process_exit = to_int(exited.group("status"))
            continue
        if _JOB_FAILED.search(line):  # "systemctl start/restart" refused: a systemd failure
            errors.append({"timestamp": None, "message": line})
            job_failed = job_failed or line
            continue
        vm = _VERSION.search(line)  # "nv-fabricmanager --version" output
        if vm:
            version = vm.group("version")

    is_status = header or state is not None
    if is_status:
        source = "status"
        if state is None:
            problems.append("systemctl status output without an 'Active:' line (cut short?)")
    elif journal_fm:
        source = "journal"
    elif log_lines:
        source = "log"
    else:
        if missing is not None:
            return unrecognised(KIND, f"Fabric Manager is not installed: {missing[:120]!r}")
        if job_failed is not None:
            return unrecognised(
                KIND,
                f"only a systemctl error message, no Fabric Manager output: {job_failed[:160]!r}",
            )
        if not any(raw.strip() for raw in lines):
            return unrecognised(KIND, "empty input")
        if any(raw.strip() == "-- No entries --" for raw in lines):
            return unrecognised(KIND, "the journal has no entries ('-- No entries --')")
        return unrecognised(KIND, "no Fabric Manager status, journal or log lines found")
    if cut_lines:
        problems.append(
            f"{cut_lines} journal line(s) cut short by the pager ('>' or '…' at the end);"
            " run with --no-pager -l for full lines"
        )
    status_exit = main_exit if main_exit is not None else process_exit
    exit_status = status_exit if source == "status" and status_exit is not None else journal_exit
    if source != "status":
        active, state = None, None
    data = {
        "source": source,
        "active": active,
        "state": state,
        "exit_status": exit_status,
        "version": version,
        "errors": errors,
        "warnings": warnings,
        "nvswitch_errors": nvswitch,
    }
    return ParseResult(KIND, True, data, tuple(problems))


# ------------------------------------------------------------------------------------------
# What the judges read


@dataclass(frozen=True, slots=True)
class FabricManager:
    """Fabric Manager as the judges read it: ``active`` True/False only where ``systemctl
    status`` says so (None otherwise), the unit's state, FM's version, and its error lines,
    each as the evidence shows it (its entry in the data, ``{'timestamp': ..., 'message':
    ...}``, printed)."""

    active: bool | None
    state: str | None
    version: str | None
    errors: tuple[str, ...]


def fabric_manager_of(data: Mapping[str, Any]) -> FabricManager:
    """The record of :func:`parse_fabricmanager`'s data."""
    active, errors = data.get("active"), data.get("errors")
    return FabricManager(
        active=active if isinstance(active, bool) else None,
        state=data.get("state"),
        version=data.get("version"),
        errors=tuple(str(e) for e in errors) if isinstance(errors, Iterable) else (),
    )
