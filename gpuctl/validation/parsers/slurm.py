"""Slurm: ``sinfo`` (default, ``-R``, custom ``-o``/``-O``/``%all``), ``scontrol show node``,
``slurmd -C``.

Data shapes (documented in docs/parse.md):

``sinfo``::

    format: "default" | "reason" | "custom"
    header: bool                      # False when the header line was absent (format inferred)
    columns: [str]                    # header names as printed
    rows: default -> [{partition, default, avail, timelimit, nodes, state, state_flags,
                       nodelist}]
          reason  -> [{reason, user, timestamp, nodelist}]
          custom  -> [{<header name lower-cased>: value}]

``scontrol-node``::

    nodes: [{<Key as printed>: value, ..., state, state_flags, gres, gres_gpus,
             reason, reason_user, reason_time}]

What the judges read of ``scontrol-node``: :func:`scontrol_nodes_of` (:class:`ScontrolNode`).

``slurmd-conf``::

    node: {<Key>: value}              # numbers parsed (CPUs=192 -> 192)
    uptime_seconds: int | None        # UpTime=D-HH:MM:SS
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import (
    count_of,
    looks_numeric,
    number,
    plausible,
    to_float,
    to_int,
)
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

SINFO = "sinfo"
SCONTROL_NODE = "scontrol-node"
SLURMD_CONF = "slurmd-conf"

# sinfo state suffixes (sinfo(1) "NODE STATE CODES")
STATE_FLAGS = "*~#!%$@^-+"
_DEFAULT_COLUMNS = ["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "NODELIST"]
_SINFO_COLUMNS = {
    "PARTITION",
    "AVAIL",
    "TIMELIMIT",
    "NODES",
    "STATE",
    "NODELIST",
    "HOSTNAMES",
    "REASON",
    "USER",
    "TIMESTAMP",
    "CPUS",
    "GRES",
    "MEMORY",
    "S:C:T",
    "SOCKETS",
    "CORES",
    "THREADS",
    "NODES(A/I/O/T)",
    "CPUS(A/I/O/T)",
    "FREE_MEM",
    "CPU_LOAD",
    "AVAIL_FEATURES",
    "ACTIVE_FEATURES",
    "GRES_USED",
    "JOB_SIZE",
    "ROOT",
    "OVERSUBSCRIBE",
    "GROUPS",
    "NODE_ADDR",
    "TMP_DISK",
    "WEIGHT",
    "STATECOMPACT",
    "STATELONG",
}
_AVAIL = {"up", "down", "drain", "inact", "inactive", "n/a"}
_TIMESTAMP = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}|Unknown|None)$")
_PLACEHOLDERS = {"", "N/A", "(null)", "None", "n/a"}
_BANNER = re.compile(
    r"(slurm_load_|Unable to contact slurm controller|error:|Invalid|not found|"
    r"command not found|Permission denied)",
    re.IGNORECASE,
)


def _value(text: str) -> str | None:
    text = text.strip()
    return None if text in _PLACEHOLDERS else text


def split_state(raw: str) -> tuple[str | None, list[str]]:
    """``drain*`` -> ("drain", ["*"]); ``idle~`` -> ("idle", ["~"])."""
    raw = raw.strip()
    flags: list[str] = []
    while raw and raw[-1] in STATE_FLAGS:
        flags.insert(0, raw[-1])
        raw = raw[:-1]
    return (raw or None), flags


def _banner_lines(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if _BANNER.search(line)]


# ------------------------------------------------------------------------------------------
# sinfo


def _is_header(tokens: list[str]) -> bool:
    if not tokens:
        return False
    known = sum(1 for t in tokens if t.upper() in _SINFO_COLUMNS)
    shaped = all(re.fullmatch(r"[A-Z0-9_:()/%#.\-]+", t) for t in tokens)
    return shaped and known >= 1 and known * 2 >= len(tokens)


def _default_row(tokens: list[str], problems: list[str]) -> dict[str, Any]:
    partition, avail, timelimit, nodes, state, nodelist = tokens
    state_base, flags = split_state(state)
    count = number(nodes)
    if not isinstance(count, int):
        problems.append(f"NODES is not a number: {nodes!r}")
        count = None
    return {
        "partition": partition.rstrip("*") or None,
        "default": partition.endswith("*"),
        "avail": _value(avail),
        "timelimit": _value(timelimit),
        "nodes": count,
        "state": state_base,
        "state_flags": flags,
        "nodelist": _value(nodelist),
    }


def _reason_row(tokens: list[str], after: int) -> dict[str, Any] | None:
    """REASON has spaces; the ``after`` (3: USER TIMESTAMP NODELIST, or 1: NODELIST) do not."""
    if after not in (1, 3) or len(tokens) < after + 1:
        return None
    tail = [_value(t) for t in tokens[len(tokens) - after :]]
    user, timestamp = (tail[0], tail[1]) if after == 3 else (None, None)
    return {
        "reason": " ".join(tokens[: len(tokens) - after]),
        "user": user,
        "timestamp": timestamp,
        "nodelist": tail[-1],
    }


def _column_starts(header_line: str, names: list[str]) -> list[int]:
    starts: list[int] = []
    pos = 0
    for name in names:
        at = header_line.find(name, pos)
        if at < 0:
            return []
        starts.append(at)
        pos = at + len(name)
    return starts


def _custom_keys(names: list[str]) -> list[str]:
    keys: list[str] = []
    seen: dict[str, int] = {}
    for name in names:
        key = name.strip().lower()
        seen[key] = seen.get(key, 0) + 1
        keys.append(key if seen[key] == 1 else f"{key}_{seen[key]}")
    return keys


# custom-format columns whose values are names, even when they look like numbers
_NAME_COLUMNS = {
    "partition",
    "nodelist",
    "hostnames",
    "node_addr",
    "reservation",
    "user",
    "groups",
    "version",
    "cluster",
    "reason",
    "avail_features",
    "active_features",
}


def _custom_value(text: str, key: str) -> Any:
    """Custom-format cell: placeholders -> None, whole numbers -> int, CPU_LOAD -> float."""
    value = _value(text)
    if value is None:
        return None
    if key.split("_")[0] in _NAME_COLUMNS or re.sub(r"_\d+$", "", key) in _NAME_COLUMNS:
        return value
    if re.fullmatch(r"\d+", value):
        return to_int(value)  # None past 30 digits: unknown, not the text
    if key.startswith("cpu_load") and re.fullmatch(r"\d+\.\d+", value):
        return to_float(value)
    return value


def _parse_custom(
    header: str, body: list[str], problems: list[str]
) -> tuple[list[str], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    if "|" in header:
        names = [n.strip() for n in header.split("|")]
        while names and not names[-1]:
            names.pop()
        keys = _custom_keys(names)
        for number_, line in enumerate(body, start=1):
            cells = [c.strip() for c in line.split("|")]
            while len(cells) > len(keys) and not cells[-1]:
                cells.pop()
            if len(cells) != len(keys):
                problems.append(
                    f"row {number_}: {len(cells)} fields for {len(keys)} columns (cut off?)"
                )
                cells += [""] * (len(keys) - len(cells))
                cells = cells[: len(keys)]
            rows.append({k: _custom_value(c, k) for k, c in zip(keys, cells, strict=True)})
        return names, rows
    names = header.split()
    keys = _custom_keys(names)
    starts = _column_starts(header, names)
    for number_, line in enumerate(body, start=1):
        tokens = line.split()
        if len(tokens) == len(keys):
            rows.append({k: _custom_value(t, k) for k, t in zip(keys, tokens, strict=True)})
            continue
        if starts:
            cells = []
            for i, start in enumerate(starts):
                end = starts[i + 1] if i + 1 < len(starts) else len(line)
                cells.append(line[start:end] if start < len(line) else "")
            rows.append({k: _custom_value(c, k) for k, c in zip(keys, cells, strict=True)})
            if len(tokens) < len(keys):
                problems.append(f"row {number_}: fewer fields than columns (empty or cut off)")
            continue
        problems.append(f"row {number_}: {len(tokens)} fields for {len(keys)} columns")
    return names, rows


@parser(
    SINFO,
    description="sinfo: partitions/nodes and their states (default, -R, custom -o/-O formats)",
)
def parse_sinfo(text: str) -> ParseResult:
    text = clean(text).replace("\t", " ")
    lines = [line.rstrip() for line in text.split("\n") if line.strip()]
    if not lines:
        return unrecognised(SINFO, "empty input")
    problems: list[str] = []
    header_index = next((i for i, line in enumerate(lines) if _header_tokens(line)), None)
    if header_index is None:
        return _sinfo_headerless(lines)
    if header_index > 0:
        skipped = lines[:header_index]
        if not re.match(r"^\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4}$", skipped[0].strip()):
            problems.append(f"{header_index} line(s) before the header ignored")
    header = lines[header_index]
    body = [line for line in lines[header_index + 1 :] if line != header]
    tokens = header.split()
    data: dict[str, Any]
    if tokens == _DEFAULT_COLUMNS:
        rows = []
        for number_, line in enumerate(body, start=1):
            fields = line.split()
            if len(fields) != 6:
                problems.append(f"row {number_}: {len(fields)} fields, expected 6: {line[:80]!r}")
                continue
            rows.append(_default_row(fields, problems))
        data = {"format": "default", "header": True, "columns": tokens, "rows": rows}
    elif tokens[:1] == ["REASON"] and len(tokens) in (2, 4) and "|" not in header:
        rows = []
        for number_, line in enumerate(body, start=1):
            row = _reason_row(line.split(), len(tokens) - 1)
            if row is None:
                problems.append(f"row {number_}: not a reason row: {line[:80]!r}")
                continue
            rows.append(row)
        data = {"format": "reason", "header": True, "columns": tokens, "rows": rows}
    else:
        names, rows = _parse_custom(header, body, problems)
        data = {"format": "custom", "header": True, "columns": names, "rows": rows}
    if not data["rows"]:
        problems.append("header only: no rows")
    return ParseResult(kind=SINFO, recognised=True, data=data, problems=tuple(problems))


def _header_tokens(line: str) -> bool:
    if "|" in line:
        return _is_header([t.strip() for t in line.split("|") if t.strip()])
    return _is_header(line.split())


def _sinfo_headerless(lines: list[str]) -> ParseResult:
    """``sinfo -h`` or a pasted row without its header: infer the format from the values."""
    problems: list[str] = []
    split = [line.split() for line in lines]
    if all(len(t) == 6 and t[1].lower() in _AVAIL and isinstance(number(t[3]), int) for t in split):
        rows = [_default_row(t, problems) for t in split]
        problems.append("no header line: columns inferred as the default sinfo format")
        data = {"format": "default", "header": False, "columns": _DEFAULT_COLUMNS, "rows": rows}
        return ParseResult(kind=SINFO, recognised=True, data=data, problems=tuple(problems))
    if all(len(t) >= 4 and _TIMESTAMP.match(t[-2]) for t in split):
        reason_rows = [_reason_row(t, 3) for t in split]
        rows = [r for r in reason_rows if r is not None]
        problems.append(
            "no header line: columns inferred as sinfo -R (REASON USER TIMESTAMP NODELIST)"
        )
        data = {
            "format": "reason",
            "header": False,
            "columns": ["REASON", "USER", "TIMESTAMP", "NODELIST"],
            "rows": rows,
        }
        return ParseResult(kind=SINFO, recognised=True, data=data, problems=tuple(problems))
    banners = _banner_lines(lines)
    if banners:
        return unrecognised(SINFO, f"no sinfo table, only an error: {banners[0][:200]}")
    return unrecognised(SINFO, "no sinfo header (PARTITION/NODELIST/REASON ...) and no sinfo rows")


# ------------------------------------------------------------------------------------------
# scontrol show node

_WHOLE_LINE_KEYS = ("OS", "Reason", "Comment", "Extra")  # printed alone; values have spaces
_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_]*)=")
_REASON = re.compile(r"^(.*?)\s*\[([^\[\]@]*)@([^\[\]]*)\]\s*$")


def _key_values(line: str) -> list[tuple[str, str]]:
    stripped = line.strip()
    for key in _WHOLE_LINE_KEYS:
        if stripped.startswith(key + "="):
            return [(key, stripped[len(key) + 1 :])]
    matches = list(_KEY.finditer(stripped))
    out: list[tuple[str, str]] = []
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(stripped)
        out.append((match.group(1), stripped[match.end() : end]))
    return out


def _gres_gpus(gres: str | None) -> int | None:
    """Total GPUs in a Gres string: ``gpu:h100:8(S:0-1),gpu:a100:2`` -> 10."""
    if not gres:
        return None
    total = 0
    found = False
    for item in re.split(r",(?![^()]*\))", gres):
        parts = re.sub(r"\(.*\)$", "", item.strip()).split(":")
        if parts and parts[0] == "gpu":
            count = number(parts[-1]) if len(parts) > 1 else None
            if isinstance(count, int):
                total += count
                found = True
    return plausible(total) if found else None


def _node_record(pairs: list[tuple[str, str]], problems: list[str]) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for key, raw in pairs:
        if key in node:
            problems.append(f"{key} appears twice in one node")
        node[key] = _value(raw)
    name = node.get("NodeName")
    state_raw = node.get("State")
    state: str | None = None
    flags: list[str] = []
    if isinstance(state_raw, str):
        words = [split_state(word) for word in state_raw.split("+")]
        state = words[0][0]
        flags = [word for word, _ in words[1:] if word]
        flags += [symbol for _, symbols in words for symbol in symbols]
    else:
        problems.append(f"node {name}: no State=")
    reason = node.get("Reason")
    reason_text = reason_user = reason_time = None
    if isinstance(reason, str):
        match = _REASON.match(reason)
        if match:
            reason_text = match.group(1) or None
            reason_user = match.group(2) or None
            reason_time = match.group(3) or None
        else:
            reason_text = reason
    gres = node.get("Gres")
    node.update(
        {
            "state": state,
            "state_flags": flags,
            "gres": gres if isinstance(gres, str) else None,
            "gres_gpus": _gres_gpus(gres if isinstance(gres, str) else None),
            "reason": reason_text,
            "reason_user": reason_user,
            "reason_time": reason_time,
        }
    )
    return node


@parser(
    SCONTROL_NODE,
    description="scontrol show node: per-node key=value fields, state flags, GRES, reason",
)
def parse_scontrol_node(text: str) -> ParseResult:
    text = clean(text)
    lines = text.split("\n")
    if not text.strip():
        return unrecognised(SCONTROL_NODE, "empty input")
    problems: list[str] = []
    blocks: list[list[tuple[str, str]]] = []
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("NodeName="):
            blocks.append([])
        pairs = _key_values(line)
        if not blocks:
            if pairs:
                problems.append(f"fields before the first NodeName=: {stripped[:60]!r}")
            continue
        if not pairs:
            problems.append(f"unparsed line: {stripped[:80]!r}")
            continue
        blocks[-1].extend(pairs)
    if not blocks:
        banners = _banner_lines(lines)
        if banners:
            return unrecognised(SCONTROL_NODE, f"no node record, only: {banners[0][:200]}")
        return unrecognised(SCONTROL_NODE, "no 'NodeName=' record")
    if not any(key in ("State", "CPUTot", "Arch") for block in blocks for key, _ in block):
        return unrecognised(
            SCONTROL_NODE, "NodeName= line without State=/CPUTot=/Arch=: not scontrol show node"
        )
    nodes = [_node_record(block, problems) for block in blocks]
    for node in nodes:
        if "Partitions" not in node and "CfgTRES" not in node:
            problems.append(f"node {node.get('NodeName')}: record looks cut off")
    data = {"nodes": nodes}
    return ParseResult(kind=SCONTROL_NODE, recognised=True, data=data, problems=tuple(problems))


@dataclass(frozen=True, slots=True)
class ScontrolNode:
    """A node of ``scontrol show node`` as the judges read it: ``NodeName``, the base state
    (``idle``), the other state words and symbols (``DRAIN``, ``*``), the reason text."""

    name: str | None
    state: str | None
    state_flags: tuple[str, ...]
    reason: str | None

    def state_record(self) -> dict[str, Any]:
        """State and reason by the data's keys, as :meth:`gpuctl.slurm.SlurmNode.from_record`
        reads a record."""
        return {"state": self.state, "state_flags": list(self.state_flags), "reason": self.reason}


def scontrol_nodes_of(data: Mapping[str, Any]) -> tuple[ScontrolNode, ...]:
    """The records of :func:`parse_scontrol_node`'s data."""
    return tuple(
        ScontrolNode(
            name=node.get("NodeName"),
            state=node.get("state"),
            state_flags=tuple(f) if isinstance(f := node.get("state_flags"), Iterable) else (),
            reason=node.get("reason"),
        )
        for node in data.get("nodes") or ()
    )


# ------------------------------------------------------------------------------------------
# slurmd -C


def uptime_seconds(text: str | None) -> int | None:
    """``2-00:08:02`` -> 173282; ``10:00:00`` -> 36000; anything else -> None."""
    if not text:
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d\d):(\d\d)", text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = (to_int(g or "0") for g in match.groups())
    if days is None or hours is None or minutes is None or seconds is None:
        return None
    return plausible(days * 86400 + hours * 3600 + minutes * 60 + seconds)


@parser(
    SLURMD_CONF,
    description="slurmd -C: the node's detected hardware as a slurm.conf NodeName line",
)
def parse_slurmd_conf(text: str) -> ParseResult:
    text = clean(text)
    if not text.strip():
        return unrecognised(SLURMD_CONF, "empty input")
    problems: list[str] = []
    node: dict[str, Any] = {}
    started = False
    for line in text.split("\n"):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("NodeName="):
            if started:
                problems.append("more than one NodeName= line: only the first is read")
                break
            started = True
        if not started:
            continue
        pairs = _key_values(stripped)
        if not pairs:
            problems.append(f"unparsed line: {stripped[:80]!r}")
            continue
        for key, raw in pairs:
            value = _value(raw)
            parsed = number(value) if value is not None else None
            if parsed is None and looks_numeric(value):  # 5,000 digits, 1e400, nan: unknown
                problems.append(f"{key}= is not a plausible number: {(value or '')[:40]!r}")
                node[key] = None
            else:
                node[key] = parsed if parsed is not None else value
    if not started:
        if re.search(r"(^|\s|/)slurmd\s+-C\b", text):
            return unrecognised(SLURMD_CONF, "only the command line 'slurmd -C', no output")
        return unrecognised(SLURMD_CONF, "no 'NodeName=' line")
    if any(key in node for key in ("State", "CPUTot", "CPUAlloc", "Arch")):
        return unrecognised(
            SLURMD_CONF, "a node record with State=/CPUTot=: scontrol or slurm.conf, not slurmd -C"
        )
    for key in ("CPUs", "RealMemory"):
        if key not in node:
            problems.append(f"no {key}= (output cut off?)")
    uptime = node.get("UpTime")
    data = {
        "node": node,
        "uptime_seconds": uptime_seconds(uptime) if isinstance(uptime, str) else None,
    }
    return ParseResult(kind=SLURMD_CONF, recognised=True, data=data, problems=tuple(problems))


@dataclass(frozen=True, slots=True)
class SlurmdHardware:
    """What ``slurmd -C`` found on the node: CPUs, their layout, memory in MiB (None: not
    shown). ``sockets`` counts every board's (``Boards`` x ``SocketsPerBoard``, or the older
    ``Sockets=``)."""

    cpus: int | None
    sockets: int | None
    cores_per_socket: int | None
    threads_per_core: int | None
    memory_mb: int | None


def slurmd_hardware_of(data: Mapping[str, Any]) -> SlurmdHardware:
    """The record of :func:`parse_slurmd_conf`'s data."""
    node = data.get("node")
    node = node if isinstance(node, Mapping) else {}

    def count(key: str) -> int | None:
        return count_of(node.get(key), least=1)

    per_board, boards = count("SocketsPerBoard"), count("Boards") or 1
    sockets = per_board * boards if per_board is not None else count("Sockets")
    return SlurmdHardware(
        cpus=count("CPUs"),
        sockets=sockets,
        cores_per_socket=count("CoresPerSocket"),
        threads_per_core=count("ThreadsPerCore"),
        memory_mb=count("RealMemory"),
    )
