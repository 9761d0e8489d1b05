"""``lspci -vvv`` (as root): each device's place in the PCIe tree, link and ACS settings.

One kind, ``lspci``, for the verbose listing of pciutils 3.x with or without ``-D`` (domain)
and ``-nn`` (numeric ids), whole or filtered with ``-d`` (validation runs ``-d ::0604``, the PCI
bridges, and ``-d 15b3:``, the NVIDIA/Mellanox adapters: kinds ``lspci.bridges`` and
``lspci.nics``). Only what the judges read is taken from each block; every other line is
skipped. A filter that matches nothing prints nothing: empty output is not recognised (as for
every parser); the ACS judge decides what an empty answer of lspci means.

Data (docs/parse.md has the full contract)::

    devices: [{address, class, name, bus: {primary, secondary, subordinate} | null,
               port_type, link_cap: {speed_gts, width} | null,
               link_status: {speed_gts, width, speed_downgraded, width_downgraded} | null,
               acs_ctl: {flag: bool} | null, driver, access_denied}]

What the judges read of it: :func:`pci_devices_of` (a tuple of :class:`PciDevice`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import to_float, to_int
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

KIND = "lspci"

_HEX = "[0-9a-fA-F]"
# "0000:17:01.0 PCI bridge: Broadcom / LSI PEX890xx ..." (-D), "17:01.0 PCI bridge: ..." and
# with -nn "17:01.0 PCI bridge [0604]: Broadcom / LSI PEX890xx ... [1000:c030] (rev b0)"
_HEADER = re.compile(
    rf"(?P<addr>(?:{_HEX}{{4}}:)?{_HEX}{{2}}:{_HEX}{{2}}\.[0-7]) (?P<cls>[^:\[]{{1,80}}?)"
    rf"(?: \[{_HEX}{{4}}\])?: (?P<name>.*)"
)
_BUS = re.compile(
    rf"Bus: primary=(?P<p>{_HEX}{{2}}), secondary=(?P<s>{_HEX}{{2}}),"
    rf" subordinate=(?P<u>{_HEX}{{2}})"
)
# "Capabilities: [68] Express (v2) Downstream Port (Slot+), MSI 00"; old: "Express Endpoint,"
_EXPRESS = re.compile(
    r"Express (?:\(v\d\) )?(?P<type>[A-Za-z][A-Za-z/\- ]{1,60}?)(?: \(Slot[+-]\))?,"
)
# "LnkCap:\tPort #1, Speed 32GT/s, Width x16, ..."; "LnkSta:\tSpeed 16GT/s (downgraded), Width
# x4 (ok)" (pciutils 3.8 on), "LnkSta: Speed 8GT/s, Width x16, TrErr- ..." (before)
_SPEED = re.compile(r"Speed (?P<speed>[0-9.]{1,5}|unknown)GT/s(?: \((?P<sflag>ok|downgraded)\))?")
_WIDTH = re.compile(r"Width x(?P<width>\d{1,2})(?: \((?P<wflag>ok|downgraded)\))?")
_FLAG = re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9]{0,20})(?P<state>[+-])(?=\s|$)")


def _hex(text: str) -> int | None:
    return to_int(f"0x{text}", hex_prefix=True)


def _address(text: str) -> str:
    """Lower case, with the domain (``17:01.0`` -> ``0000:17:01.0``)."""
    text = text.lower()
    return text if text.count(":") == 2 else f"0000:{text}"


# A fleet's lspci listings repeat the same link, bus and ACS lines (the same hardware, the same
# states): what one such line reads as is remembered (bounded caches of pure functions of the
# line; callers get a copy). A longer line is read afresh.
_CACHED_LINE = 200


def _read_link(line: str, status: bool) -> dict[str, Any]:
    speed = _SPEED.search(line)
    width = _WIDTH.search(line)
    out: dict[str, Any] = {
        "speed_gts": to_float(speed["speed"]) if speed else None,
        "width": to_int(width["width"]) if width else None,
    }
    if status:
        out["speed_downgraded"] = bool(speed and speed["sflag"] == "downgraded")
        out["width_downgraded"] = bool(width and width["wflag"] == "downgraded")
    return out


_link_cached = functools.lru_cache(maxsize=2048)(_read_link)


def _link(line: str, status: bool) -> dict[str, Any]:
    if len(line) > _CACHED_LINE:
        return _read_link(line, status)
    return dict(_link_cached(line, status))


def _read_bus(line: str) -> dict[str, Any] | None:
    b = _BUS.match(line)
    if b is None:
        return None
    return {"primary": _hex(b["p"]), "secondary": _hex(b["s"]), "subordinate": _hex(b["u"])}


_bus_cached = functools.lru_cache(maxsize=2048)(_read_bus)


def _bus(line: str) -> dict[str, Any] | None:
    """The bus numbers of a ``Bus:`` line; None when it shows none."""
    if len(line) > _CACHED_LINE:
        return _read_bus(line)
    bus = _bus_cached(line)
    return None if bus is None else dict(bus)


def _read_acs(line: str) -> dict[str, bool]:
    return {f["name"]: f["state"] == "+" for f in _FLAG.finditer(line)}


_acs_cached = functools.lru_cache(maxsize=1024)(_read_acs)


def _acs(line: str) -> dict[str, bool]:
    """The flags of an ``ACSCtl:`` line (``SrcValid+`` -> True)."""
    if len(line) > _CACHED_LINE:
        return _read_acs(line)
    return dict(_acs_cached(line))


def _new(m: re.Match[str]) -> dict[str, Any]:
    return {
        "address": _address(m["addr"]),
        "class": m["cls"].strip(),
        "name": m["name"].strip(),
        "bus": None,
        "port_type": None,
        "link_cap": None,
        "link_status": None,
        "acs_ctl": None,
        "driver": None,
        "access_denied": False,
    }


# The lines the parser reads: every unindented line (a device line, or not lspci at all) and the
# indented lines it takes facts from; the regex engine skips the rest of a block (an HGX's
# whole listing is ~17,000 lines, of which ~3,000 are read). Each match starts at the newline
# before its line (a literal first character: the engine skips to the next newline quickly);
# the text is read with a newline put before its first line.
_READ = re.compile(
    r"\n(?:(?P<top>\S[^\n]*)"
    r"|[ \t]++(?:Capabilities: (?P<cap>[^\n]*)|LnkCap:(?P<lnkcap>[^\n]*)"
    r"|LnkSta:(?P<lnksta>[^\n]*)|(?P<bus>Bus: [^\n]*)|ACSCtl:(?P<acs>[^\n]*)"
    r"|Kernel driver in use:(?P<driver>[^\n]*)))"
)


@parser(KIND, description="lspci -vvv: PCIe tree (bridges' bus ranges), link states, ACS")
def parse_lspci(text: str) -> ParseResult:
    devices: list[dict[str, Any]] = []
    problems: list[str] = []
    current: dict[str, Any] | None = None
    other = 0
    for m in _READ.finditer("\n" + clean(text)):
        key = m.lastgroup  # the one group that matched: the line's kind
        if key == "top":
            top = m["top"]
            h = _HEADER.fullmatch(top.rstrip())
            if h is None:
                other += 1
                current = None
                if len(problems) < 20:
                    problems.append(f"not an lspci device line: {top[:120]!r}")
                continue
            current = _new(h)
            devices.append(current)
            continue
        if current is None:
            continue
        rest = m[m.lastindex or 0]  # that group's text
        if key == "cap":
            if "<access denied>" in rest:
                current["access_denied"] = True
            elif "Express" in rest and current["port_type"] is None:
                e = _EXPRESS.search(rest)
                if e is not None:
                    current["port_type"] = e["type"].strip()
        elif key == "lnkcap":
            current["link_cap"] = _link(rest, status=False)
        elif key == "lnksta":
            current["link_status"] = _link(rest, status=True)
        elif key == "bus":
            bus = _bus(rest)
            if bus is not None:
                current["bus"] = bus
        elif key == "acs":
            current["acs_ctl"] = _acs(rest)
        else:
            current["driver"] = rest.strip() or None
    data = {"devices": devices}
    if not devices and not other:
        return unrecognised(KIND, "empty input (an lspci -d filter that matched no device)")
    if not devices and other:
        return unrecognised(KIND, f"no lspci device lines ({problems[0] if problems else ''})")
    return ParseResult(KIND, True, data, tuple(problems))


# ------------------------------------------------------------------------------------------
# What the judges read


@dataclass(frozen=True, slots=True)
class Link:
    """A link's speed (GT/s) and width (lanes); None where lspci did not show it."""

    speed_gts: float | None
    width: int | None


@dataclass(frozen=True, slots=True)
class PciDevice:
    """One device of ``lspci -vvv``: ``secondary``/``subordinate`` the bus range below a bridge
    (None for an endpoint), ``acs_ctl`` the ACS control flags (None: no ACS capability shown)."""

    address: str
    device_class: str
    name: str
    secondary: int | None
    subordinate: int | None
    port_type: str | None
    link_cap: Link | None
    link_status: Link | None
    acs_ctl: Mapping[str, bool] | None
    access_denied: bool

    @property
    def domain(self) -> str:
        return self.address.split(":", 1)[0]

    def below(self, address: str) -> bool:
        """Whether ``address`` (a device's, ``dddd:bb:dd.f``) is in this bridge's bus range."""
        if self.secondary is None or self.subordinate is None:
            return False
        domain, bus = address.split(":")[:2]
        number = _hex(bus)
        return (
            domain == self.domain
            and number is not None
            and self.secondary <= number <= self.subordinate
        )


def _link_of(value: Any) -> Link | None:
    if not isinstance(value, Mapping):
        return None
    speed = value.get("speed_gts")
    width = value.get("width")
    return Link(
        speed_gts=speed if isinstance(speed, int | float) and not isinstance(speed, bool) else None,
        width=width if isinstance(width, int) else None,
    )


def pci_devices_of(data: Mapping[str, Any]) -> tuple[PciDevice, ...]:
    """The record of :func:`parse_lspci`'s data."""
    out: list[PciDevice] = []
    for dev in data.get("devices") or ():
        bus = dev.get("bus") if isinstance(dev.get("bus"), Mapping) else {}
        acs = dev.get("acs_ctl")
        out.append(
            PciDevice(
                address=str(dev.get("address")),
                device_class=str(dev.get("class")),
                name=str(dev.get("name")),
                secondary=bus.get("secondary") if bus else None,
                subordinate=bus.get("subordinate") if bus else None,
                port_type=dev.get("port_type") if isinstance(dev.get("port_type"), str) else None,
                link_cap=_link_of(dev.get("link_cap")),
                link_status=_link_of(dev.get("link_status")),
                acs_ctl={str(k): bool(v) for k, v in acs.items()}
                if isinstance(acs, Mapping)
                else None,
                access_denied=bool(dev.get("access_denied")),
            )
        )
    return tuple(out)
