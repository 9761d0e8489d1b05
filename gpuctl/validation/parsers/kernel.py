"""Kernel log lines about GPUs: NVRM Xid events, "fallen off the bus", NVSwitch SXid events,
and the PCIe Advanced Error Reporting (AER) lines of every device (GPUs, NICs, switch ports).

One kind, ``xid``, for the kernel ring buffer in any of the usual shapes: ``dmesg``,
``dmesg -T`` (ctime), ``dmesg --time-format iso``, ``dmesg --decode`` (``kern  :warn  :``
facility/level prefix), ``dmesg -r`` (``<4>`` raw level), ``journalctl -k`` (``Mon DD HH:MM:SS
host kernel:``, ``-o short-iso`` or the bare ``kernel:`` tag) and ``journalctl -o cat`` (no
prefix at all). Lines that are not GPU events are ignored; a line that starts like an Xid or
SXid line but cannot be read is a problem. Every line is looked at once (linear time).

Data (docs/parse.md has the full contract)::

    events:          [{pci, xid, message, timestamp, pid, process, gpu}]   one per Xid line
    fallen_off_bus:  [{pci, timestamp}]        one per GPU (PCI address), first time seen
    sxid:            [{pci, sxid, message, severity, link, timestamp}]  NVSwitch error lines
    counts:          {"<xid>": number of events}
    aer:             [{pci, driver, severity, type, agent, device, status, errors, first,
                       timestamp}]          one per "PCIe Bus Error" line
    aer_received:    [{port, source, severity, multiple, timestamp}]  one per "AER: ... error
                                            received" line of the port that took the message
    iommu:           {default_domain, set_by, groups, timestamp} | null   the boot's IOMMU mode

What the judges read of it: :func:`kernel_log_of` (a :class:`KernelLog`).

Two one-line kinds sit here too, read for the golden-config comparison
(:mod:`gpuctl.validation.judges.consistency`): ``uname`` (``uname -r``, data ``{release}``) and
``ofed-info`` (``ofed_info -s``, data ``{name, version, release}``: ``MLNX_OFED_LINUX``,
``23.07-0.5.1.2``, ``MLNX_OFED_LINUX-23.07-0.5.1.2``); the judges read both through
:func:`release_of`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import to_int
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

KIND = "xid"

_HEX = "[0-9A-Fa-f]"
_PCI = rf"{_HEX}{{4}}:{_HEX}{{2}}:{_HEX}{{2}}(?:\.[0-7])?"

# "NVRM: Xid (PCI:0000:19:00): 48, pid=..., name=..., message" (old drivers: no "PCI:")
_XID = re.compile(
    rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_PCI})\): (?P<xid>\d{{1,9}})(?:, ?(?P<rest>.*))?$"
)
_PID_NAME = re.compile(
    r"pid=(?P<pid>'?<unknown>'?|\d{1,12}), name=(?P<name>.*?)(?:, (?P<msg>.*))?$"
)
# "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link ..."
_SXID = re.compile(rf"SXid \((?:PCI:)?(?P<pci>{_PCI})\): (?P<sxid>\d{{1,9}})(?:, ?(?P<rest>.*))?$")
_SEVERITY = re.compile(r"(?P<sev>Non-fatal|Fatal)\b", re.IGNORECASE)
_LINK = re.compile(r"\bLink (?P<link>\d{1,6})\b")
# "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus." (also "GPU at PCI:0000:01:00:")
_BUS = re.compile(rf"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI}):? .*fallen off the bus")
_GPU_INDEX = re.compile(r"\bGPU(?P<index>\d{1,4})\b")

# Line prefixes. Each entry: (regex, group holding the timestamp or None). Applied in a loop so
# that stacked prefixes ("kern  :warn  : [Sun Feb 23 16:24:18 2025] ...") are peeled off.
_RAW_LEVEL = re.compile(r"<\d{1,3}>")
_DECODE = re.compile(r"[a-z]{2,8} *:[a-z]{2,7} *: ")
_MONOTONIC = re.compile(r"\[ *(?P<ts>\d+\.\d+)\] ?")
_CTIME = re.compile(
    r"\[(?P<ts>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})\] ?"
)
_ISO = re.compile(r"(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}[,.]\d+(?:[+-]\d{2}:?\d{2}|Z)?) ")
# The journal's "kernel" tag; a line a process logged under that identifier (containers, the
# gpuctl lab) prints it with the process id: "kernel[4711]: "
_JOURNAL = re.compile(
    r"(?P<ts>[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}(?:\.\d+)?"
    r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:?\d{2}|Z)?)"
    r" \S+ kernel(?:\[\d+\])?: "
)
_KERNEL_TAG = re.compile(r"kernel(?:\[\d+\])?: ")

_BANNERS = (
    "dmesg: read kernel buffer failed",
    "No journal files were found",
    "No journal files were opened",
    "Failed to get journal",
)


def _strip_prefix(line: str) -> tuple[str, str | None, bool]:
    """(rest of the line, timestamp as printed or None, whether a kernel-log prefix was seen)."""
    timestamp: str | None = None
    seen = False
    pos = 0
    m = _RAW_LEVEL.match(line, pos)
    if m:
        pos, seen = m.end(), True
    m = _DECODE.match(line, pos)
    if m:
        pos, seen = m.end(), True
    for pattern in (_MONOTONIC, _CTIME, _ISO, _JOURNAL):
        m = pattern.match(line, pos)
        if m:
            return line[m.end() :], m.group("ts"), True
    m = _KERNEL_TAG.match(line, pos)
    if m:
        return line[m.end() :], None, True
    return line[pos:], timestamp, seen


def _bus_key(pci: str | None) -> str | None:
    """PCI address without the function (".0"), lower case: Xid lines print no function."""
    if pci is None:
        return None
    return pci.split(".", 1)[0].lower()


def _xid_event(m: re.Match[str], timestamp: str | None) -> dict[str, Any]:
    rest = m.group("rest")
    pid: int | None = None
    process: str | None = None
    message: str | None = rest.strip() if rest is not None else None
    if rest is not None:
        pm = _PID_NAME.match(rest)
        if pm:
            pid_text = pm.group("pid")
            pid = to_int(pid_text)
            name = pm.group("name").strip()
            process = None if name in ("", "<unknown>", "'<unknown>'") else name
            msg = pm.group("msg")
            message = msg.strip() if msg is not None else None
    if message == "":
        message = None
    gm = _GPU_INDEX.search(message) if message else None
    return {
        "pci": m.group("pci"),
        "xid": to_int(m.group("xid")),
        "message": message,
        "timestamp": timestamp,
        "pid": pid,
        "process": process,
        "gpu": to_int(gm.group("index")) if gm else None,
    }


def _sxid_event(m: re.Match[str], timestamp: str | None) -> dict[str, Any] | None:
    """One entry per severity line; the "Data {...}" and "Severity N Engine ..." detail lines
    that accompany it carry no severity and give None (not an entry, not a problem)."""
    rest = (m.group("rest") or "").strip()
    if rest.startswith(("Data {", "Data{", "Severity ")):
        return None
    sm = _SEVERITY.match(rest)
    lm = _LINK.search(rest)
    return {
        "pci": m.group("pci"),
        "sxid": to_int(m.group("sxid")),
        "message": rest or None,
        "severity": sm.group("sev").lower() if sm else None,
        "link": to_int(lm.group("link")) if lm else None,
        "timestamp": timestamp,
    }


# PCIe AER (drivers/pci/pcie/aer.c). The device's driver and address lead each line; since
# Linux 4.19 the port's own messages carry "AER: ", from 6.x some detail lines do too. The event:
#   "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
#   (before 4.17: "..., type=Physical Layer, id=00e0(Receiver ID)"; 6.9 on: severity=Correctable,
#   "Uncorrectable (Non-Fatal)"), then its details:
#   "nvidia 0000:3b:00.0:   device [10de:2330] error status/mask=00000001/0000e000"
#   "nvidia 0000:3b:00.0:    [ 0] RxErr                  (First)"
# and the root port that received the message:
#   "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0" (before 4.17:
#   "... received: id=0010"; 6.9 on: "AER: Correctable error message received from 0000:01:00.0")
_DEV = rf"(?P<driver>[A-Za-z0-9_.\-]{{1,40}}) (?P<pci>{_PCI}):"
_AER_BUS = re.compile(
    rf"{_DEV} (?:AER: )?PCIe Bus Error: severity=(?P<sev>[^,]{{1,40}}),"
    rf" type=(?P<type>[^,]{{1,40}}), ?(?:id=(?P<id>{_HEX}{{4}}))?\((?P<agent>[^)]{{1,40}})\)"
)
_AER_DEVICE = re.compile(
    rf"{_DEV} (?:AER: )? *device \[(?P<ids>{_HEX}{{4}}:{_HEX}{{4}})\] error status/mask="
    rf"(?P<status>{_HEX}{{8}})/(?P<mask>{_HEX}{{8}})"
)
_AER_BIT = re.compile(
    rf"{_DEV} (?:AER: )? *\[ ?(?P<bit>\d{{1,2}})\] (?P<name>[A-Za-z][^(]{{0,60}}?)"
    r" *(?P<first>\(First\))?$"
)
_AER_RECEIVED = re.compile(
    rf"{_DEV} AER: (?P<multi>Multiple )?(?P<sev>[A-Za-z]{{1,20}}(?: \((?:Non-)?Fatal\))?) error"
    rf" (?:message )?received(?::| from) (?:id=(?P<id>{_HEX}{{4}})|(?P<src>{_PCI}))"
)

# "iommu: Default domain type: Translated" (a trailing blank on 5.x), "... Passthrough (set via
# kernel command line)"; and each device an IOMMU driver takes: "pci 0000:00:01.0: Adding to
# iommu group 0" (none: no IOMMU is active, whatever the default domain type says)
_IOMMU_DOMAIN = re.compile(
    r"iommu: Default domain type: (?P<type>[A-Za-z\-]{1,20})(?: \(set via (?P<by>[^)]{1,60})\))?"
)
_IOMMU_GROUP = "to iommu group"

# a time inside the message: "kernel: [68183.615790] pcieport ..." (a journal that kept the
# kernel's own time) and dmesg -H's relative "[  +0.000844] "
_INNER_TIME = re.compile(r"\[ *\+?\d{1,12}\.\d{1,9}\] ?")


def aer_severity(text: str) -> str | None:
    """``corrected``, ``nonfatal`` or ``fatal`` for the kernel's words (Corrected/Correctable,
    Uncorrected/Uncorrectable (Non-Fatal) or (Fatal)); None for any other."""
    word = text.strip().lower()
    if word in ("corrected", "correctable"):
        return "corrected"
    if word in ("uncorrected (non-fatal)", "uncorrectable (non-fatal)"):
        return "nonfatal"
    if word in ("uncorrected (fatal)", "uncorrectable (fatal)"):
        return "fatal"
    return None


class _AerReader:
    """The AER lines of one log: events, their detail lines, the ports' received lines."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self._open: dict[str, dict[str, Any]] = {}  # device -> its last event, for details

    def feed(self, rest: str, timestamp: str | None, number: int, problems: list[str]) -> bool:
        """Read ``rest`` if it is an AER line (True), else leave it (False)."""
        if rest.startswith("["):  # a journal line that kept dmesg's time, or dmesg -H's
            m = _INNER_TIME.match(rest)
            if m is not None:
                rest = rest[m.end() :]
        if "PCIe Bus Error" in rest:
            m = _AER_BUS.match(rest)
            if m is None:
                problems.append(f"line {number}: AER line not understood: {rest[:160]!r}")
                return True
            event: dict[str, Any] = {
                "pci": m["pci"].lower(),
                "driver": m["driver"],
                "severity": aer_severity(m["sev"]),
                "severity_text": m["sev"].strip(),
                "type": m["type"].strip(),
                "agent": m["agent"].strip(),
                "device": None,
                "status": None,
                "errors": [],
                "first": None,
                "timestamp": timestamp,
            }
            if event["severity"] is None:
                problems.append(f"line {number}: AER severity not understood: {m['sev']!r}")
            self.events.append(event)
            self._open[event["pci"]] = event
            return True
        if "AER: " in rest and "received" in rest:
            m = _AER_RECEIVED.match(rest)
            if m is None:
                return False
            self.received.append(
                {
                    "port": m["pci"].lower(),
                    "source": m["src"].lower() if m["src"] else None,
                    "severity": aer_severity(m["sev"]),
                    "multiple": m["multi"] is not None,
                    "timestamp": timestamp,
                }
            )
            return True
        if not self._open or "[" not in rest:
            return False
        m = _AER_DEVICE.match(rest) or _AER_BIT.match(rest)
        if m is None:
            return False
        found = self._open.get(m["pci"].lower())
        if found is None:
            return False
        event = found
        if "ids" in m.groupdict():
            event["device"] = m["ids"].lower()
            event["status"] = m["status"].lower()
        else:
            name = m["name"].strip()
            event["errors"].append(name)
            if m["first"]:
                event["first"] = name
        return True


@parser(
    KIND,
    description="Kernel log: NVRM Xid events, GPUs fallen off the bus, NVSwitch SXid events",
)
def parse_xid(text: str) -> ParseResult:
    lines = clean(text).split("\n")
    events: list[dict[str, Any]] = []
    fallen: list[dict[str, Any]] = []
    fallen_keys: set[str | None] = set()
    sxid: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    problems: list[str] = []
    prefixed = 0
    nonblank = 0
    unknown_prefix = 0
    banner: str | None = None
    aer = _AerReader()
    iommu: dict[str, Any] | None = None
    iommu_groups = 0

    def fell(pci: str | None, timestamp: str | None) -> None:
        key = _bus_key(pci)
        if key not in fallen_keys:
            fallen_keys.add(key)
            fallen.append({"pci": key, "timestamp": timestamp})

    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        nonblank += 1
        rest, timestamp, seen = _strip_prefix(line)
        prefixed += seen
        if banner is None and any(b in line for b in _BANNERS):
            banner = line
        if ("AER" in rest or "PCIe Bus Error" in rest or aer.events) and aer.feed(
            rest, timestamp, number, problems
        ):
            continue
        if "iommu" in rest:
            if _IOMMU_GROUP in rest:
                iommu_groups += 1
                continue
            m = _IOMMU_DOMAIN.search(rest)
            if m is not None:
                iommu = {"default_domain": m["type"], "set_by": m["by"], "timestamp": timestamp}
                continue
        at = rest.find("NVRM: Xid")
        if at >= 0:
            unknown_prefix += at > 0
            m = _XID.search(rest, at)
            event = _xid_event(m, timestamp) if m is not None else None
            if event is None or event["xid"] is None:
                problems.append(f"line {number}: Xid line not understood: {line[:160]!r}")
                continue
            events.append(event)
            key = str(event["xid"])
            counts[key] = counts.get(key, 0) + 1
            if event["xid"] == 79 or "fallen off the bus" in (event["message"] or ""):
                fell(event["pci"], timestamp)
            continue
        at = rest.find("SXid (")
        if at >= 0:
            m = _SXID.search(rest, at)
            entry = _sxid_event(m, timestamp) if m is not None else None
            if m is None or (entry is not None and entry["sxid"] is None):
                problems.append(f"line {number}: SXid line not understood: {line[:160]!r}")
                continue
            if entry is not None:
                sxid.append(entry)
            continue
        if "fallen off the bus" in rest and "NVRM" in rest:
            m = _BUS.search(rest)
            if m is None:
                problems.append(f"line {number}: 'fallen off the bus' without a PCI address")
                fell(None, timestamp)
            else:
                fell(m.group("pci"), timestamp)

    if unknown_prefix:
        problems.append(
            f"{unknown_prefix} Xid line(s) have a prefix that is not a known timestamp format"
            " (timestamp null)"
        )
    data = {
        "events": events,
        "fallen_off_bus": fallen,
        "sxid": sxid,
        "counts": counts,
        "aer": aer.events,
        "aer_received": aer.received,
        "iommu": None if iommu is None else {**iommu, "groups": iommu_groups},
    }
    if events or fallen or sxid or aer.events or aer.received:
        return ParseResult(KIND, True, data, tuple(problems))
    if problems:  # only unreadable Xid/SXid lines: it is a kernel log, but nothing was read
        return ParseResult(KIND, True, data, tuple(problems))
    if nonblank == 0:
        return unrecognised(KIND, "empty input")
    if any(raw.strip() == "-- No entries --" for raw in lines):
        return unrecognised(KIND, "the journal has no entries ('-- No entries --')")
    if banner is not None and prefixed * 2 < nonblank:
        return unrecognised(KIND, f"no kernel log, only an error message: {banner[:160]!r}")
    if prefixed and prefixed * 2 >= nonblank:
        return ParseResult(KIND, True, data, ())
    return unrecognised(
        KIND, "no Xid/SXid lines and the text does not look like a kernel log (dmesg/journal)"
    )


# ------------------------------------------------------------------------------------------
# What the judges read


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One NVRM Xid line: the GPU's PCI address, the Xid, the message after it (None: the
    line has none; "" when the entry has no message at all) and the timestamp as printed
    (None: the line had none)."""

    pci: str | None
    xid: int | None
    message: str | None
    timestamp: str | None


@dataclass(frozen=True, slots=True)
class FallenOffBus:
    """A GPU that fell off the bus (``pci`` None: the line named no PCI address)."""

    pci: str | None
    timestamp: str | None


@dataclass(frozen=True, slots=True)
class AerEvent:
    """One PCIe AER error a device reported (a ``PCIe Bus Error`` line and its details):
    ``severity`` ``corrected``, ``nonfatal`` or ``fatal`` (None: words not understood, as
    printed in ``severity_text``), ``device`` the vendor:device id when the details show it."""

    pci: str
    driver: str
    severity: str | None
    severity_text: str
    type: str
    agent: str
    device: str | None
    errors: tuple[str, ...]
    timestamp: str | None


@dataclass(frozen=True, slots=True)
class AerReceived:
    """A port's ``AER: ... error received`` line: the error's source (None: shown only as a
    requester id) and its severity."""

    port: str
    source: str | None
    severity: str | None
    multiple: bool
    timestamp: str | None


@dataclass(frozen=True, slots=True)
class IommuMode:
    """The boot's IOMMU default domain type (``Translated``, ``Passthrough``, ...), what set it
    (``kernel command line``; None: the kernel's default) and how many devices joined an IOMMU
    group (0: no IOMMU is active)."""

    default_domain: str
    set_by: str | None
    groups: int


@dataclass(frozen=True, slots=True)
class KernelLog:
    """The kernel log's GPU events and every device's PCIe AER errors, as the judges read them."""

    events: tuple[XidEvent, ...]
    fallen_off_bus: tuple[FallenOffBus, ...]
    aer: tuple[AerEvent, ...] = ()
    aer_received: tuple[AerReceived, ...] = ()
    iommu: IommuMode | None = None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def kernel_log_of(data: Mapping[str, Any]) -> KernelLog:
    """The record of :func:`parse_xid`'s data."""
    return KernelLog(
        events=tuple(
            XidEvent(
                pci=ev.get("pci"),
                xid=ev["xid"] if isinstance(ev.get("xid"), int) else None,
                message=ev.get("message", ""),
                timestamp=_text(ev.get("timestamp")),
            )
            for ev in data.get("events") or ()
        ),
        fallen_off_bus=tuple(
            FallenOffBus(pci=ev.get("pci"), timestamp=_text(ev.get("timestamp")))
            for ev in data.get("fallen_off_bus") or ()
        ),
        aer=tuple(
            AerEvent(
                pci=str(ev.get("pci")),
                driver=str(ev.get("driver")),
                severity=_text(ev.get("severity")),
                severity_text=str(ev.get("severity_text")),
                type=str(ev.get("type")),
                agent=str(ev.get("agent")),
                device=_text(ev.get("device")),
                errors=tuple(str(e) for e in ev.get("errors") or ()),
                timestamp=_text(ev.get("timestamp")),
            )
            for ev in data.get("aer") or ()
        ),
        aer_received=tuple(
            AerReceived(
                port=str(ev.get("port")),
                source=_text(ev.get("source")),
                severity=_text(ev.get("severity")),
                multiple=bool(ev.get("multiple")),
                timestamp=_text(ev.get("timestamp")),
            )
            for ev in data.get("aer_received") or ()
        ),
        iommu=_iommu_of(data.get("iommu")),
    )


def _iommu_of(value: Any) -> IommuMode | None:
    if not isinstance(value, Mapping) or not isinstance(value.get("default_domain"), str):
        return None
    groups = value.get("groups")
    return IommuMode(
        default_domain=value["default_domain"],
        set_by=_text(value.get("set_by")),
        groups=groups if isinstance(groups, int) and not isinstance(groups, bool) else 0,
    )


# ------------------------------------------------------------------------------------------
# The running kernel (``uname -r``) and the RDMA driver stack (``ofed_info -s``): one line each,
# read for the golden-config comparison (gpuctl.validation.judges.consistency)

UNAME = "uname"
OFED_INFO = "ofed-info"

# A kernel release as uname -r prints it: "6.1.0-31-amd64", "5.15.0-1053-nvidia",
# "4.18.0-553.el8_10.x86_64", "6.18.44-fc-v1045": digits.digits, then no blank.
_RELEASE = re.compile(r"\d{1,4}\.\d{1,4}(?:[.\-+~_][0-9A-Za-z.\-+~_]{0,120})?")
# ofed_info -s: the bundle name and its version, with a trailing colon:
# "MLNX_OFED_LINUX-23.07-0.5.1.2:" (MLNX_OFED), "OFED-internal-24.10-1.1.4:" (DOCA-OFED).
_OFED = re.compile(r"(?P<name>[A-Za-z][A-Za-z_\-]{0,60}?)-(?P<version>\d[0-9A-Za-z.\-_]{0,80}):?")


def _one_line(text: str) -> str | None:
    """The only non-blank line of ``text``; None when there is none or more than one."""
    lines = [line.strip() for line in clean(text).split("\n") if line.strip()]
    return lines[0] if len(lines) == 1 else None


@parser(UNAME, description="uname -r: the running kernel's release")
def parse_uname(text: str) -> ParseResult:
    line = _one_line(text)
    if line is None:
        return unrecognised(UNAME, "expected one line, the kernel release (uname -r)")
    if not _RELEASE.fullmatch(line):
        return unrecognised(UNAME, f"not a kernel release: {line[:160]!r}")
    return ParseResult(UNAME, True, {"release": line}, ())


@parser(OFED_INFO, description="ofed_info -s: the MLNX_OFED / DOCA-OFED bundle and its version")
def parse_ofed_info(text: str) -> ParseResult:
    line = _one_line(text)
    m = _OFED.fullmatch(line) if line is not None else None
    if m is None:
        return unrecognised(
            OFED_INFO, "expected one line NAME-VERSION: (ofed_info -s), e.g. MLNX_OFED_LINUX-23.07"
        )
    data = {"name": m["name"], "version": m["version"], "release": f"{m['name']}-{m['version']}"}
    return ParseResult(OFED_INFO, True, data, ())


@dataclass(frozen=True, slots=True)
class Release:
    """One version line as the golden-config judge reads it (``uname -r``: the kernel release;
    ``ofed_info -s``: bundle name and version, as printed without the colon). None: not shown."""

    release: str | None


def release_of(data: Mapping[str, Any]) -> Release:
    """The record of :func:`parse_uname`'s or :func:`parse_ofed_info`'s data."""
    return Release(release=_text(data.get("release")))
