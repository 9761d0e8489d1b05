"""``nvidia-smi nvlink -e``: each NVLink's error counters, per GPU.

What it prints (driver 535, A100; tests/fixtures/nvidia-smi/nvlink-e-*.txt)::

    GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-fde0a018-...)
    <TAB> Link 0: Replay Errors: 0
    <TAB> Link 0: Recovery Errors: 0
    <TAB> Link 0: CRC Errors: 0
    (blank line after each link)

Newer drivers print other counters in the same ``Link <n>: <name>: <count>`` form (driver 595 on
Blackwell: ``Rx Errors``, ``Link recovery failed events``, ``Symbol Errors``, ...; names from
a public runbook, no capture of that format is in tests/fixtures yet): every such line is kept,
its name as printed and as a key (``"Replay Errors"`` -> ``replay_errors``).

Data (docs/parse.md)::

    gpus: [{index, name, uuid, message, links: [{link, counters: {key: count | null}}]}]
    names: {key: name as printed}

A count that is not a whole number (``N/A``) is null, with a problem. What the judges read of
it: :func:`nvlink_errors_of` (an :class:`NvlinkErrors`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import to_count, to_int
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

KIND = "nvlink-errors"
_GPU = re.compile(r"GPU\s+(\d+):\s+(.*?)\s*(?:\(UUID:\s*([^)]*?)\s*\))?")
_COUNTER = re.compile(r"Link\s+(\d+):\s*([A-Za-z][A-Za-z0-9 /()_.\-]{0,80}?)\s*:\s*(\S+)")
_LINK_ONLY = re.compile(r"Link\s+(\d+):.*")


def counter_key(name: str) -> str:
    """``"Replay Errors"`` -> ``"replay_errors"``: lower case, runs of other characters as one
    underscore."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


# The GPUs of a fleet print the same counter names, link numbers and (mostly zero) counts: what
# a short text reads as is remembered (bounded caches of pure functions of the text)
_SHORT = 40
_key = functools.lru_cache(maxsize=1024)(counter_key)  # names: at most 81 characters
_short_int = functools.lru_cache(maxsize=1024)(to_int)
_short_count = functools.lru_cache(maxsize=4096)(to_count)


@parser(KIND, description="nvidia-smi nvlink -e: per GPU, each NVLink's error counters")
def parse_nvlink_errors(text: str) -> ParseResult:
    lines = [stripped for line in clean(text).split("\n") if (stripped := line.strip())]
    if not lines:
        return unrecognised(KIND, "empty input")
    problems: list[str] = []
    gpus: list[dict[str, Any]] = []
    gpu_indexes: set[int | None] = set()
    entries: dict[int | None, dict[str, Any]] = {}  # the last GPU's links, by number
    names: dict[str, str] = {}
    counters = 0
    for line in lines:
        # each pattern starts with its literal word (a faster test first)
        gm = _GPU.fullmatch(line) if line.startswith("GPU") else None
        cm = None if gm or not line.startswith("Link") else _COUNTER.fullmatch(line)
        if gm:
            index = to_int(gm.group(1))
            if index in gpu_indexes:
                problems.append(f"GPU {index} appears twice")
            gpu_indexes.add(index)
            gpus.append(
                {
                    "index": index,
                    "name": gm.group(2) or None,
                    "uuid": (gm.group(3) or None),
                    "message": None,
                    "links": [],
                }
            )
            entries = {}
        elif cm and gpus:
            counters += 1
            gpu, number_text = gpus[-1], cm.group(1)
            link = _short_int(number_text) if len(number_text) <= _SHORT else to_int(number_text)
            name, value = cm.group(2), cm.group(3)
            key = _key(name)
            names.setdefault(key, name)
            entry = entries.get(link)
            if entry is None:
                entry = entries[link] = {"link": link, "counters": {}}
                gpu["links"].append(entry)
            count = _short_count(value) if len(value) <= _SHORT else to_count(value)
            if count is None:
                problems.append(f"GPU {gpu['index']} link {link}: {name}: not a count: {value!r}")
            if key in entry["counters"]:
                problems.append(f"GPU {gpu['index']} link {link}: {name} appears twice")
            entry["counters"][key] = count
        elif gpus and _LINK_ONLY.fullmatch(line):
            problems.append(f"GPU {gpus[-1]['index']}: cannot read {line[:120]!r}")
        elif gpus and not gpus[-1]["links"] and gpus[-1]["message"] is None:
            gpus[-1]["message"] = line[:200]  # "NVLink not supported", a driver error
            problems.append(f"GPU {gpus[-1]['index']}: {line[:160]}")
        else:
            problems.append(f"unexpected line: {line[:120]!r}")
    if not gpus:
        return unrecognised(KIND, f"no 'GPU n: ...' line; first line: {lines[0][:120]!r}")
    if counters == 0 and all(g["message"] is None for g in gpus):
        return unrecognised(KIND, "GPU lines but no 'Link n: <counter>: <count>' lines")
    return ParseResult(KIND, True, {"gpus": gpus, "names": names}, tuple(problems))


@dataclass(frozen=True, slots=True)
class NvlinkErrorsGpu:
    """One GPU: index and UUID as printed, ``(link, counter key) -> count`` (None: not a
    number), and the line printed instead of links (None when it has links)."""

    index: int | None
    uuid: str | None
    counts: Mapping[tuple[int, str], int | None]
    message: str | None


@dataclass(frozen=True, slots=True)
class NvlinkErrors:
    """``nvlink -e`` as the judges read it: the GPUs, and each counter key's printed name."""

    gpus: tuple[NvlinkErrorsGpu, ...]
    names: Mapping[str, str]


def nvlink_errors_of(data: Mapping[str, Any]) -> NvlinkErrors:
    """The record of :func:`parse_nvlink_errors`'s data."""
    gpus = []
    for gpu in data.get("gpus") or ():
        counts: dict[tuple[int, str], int | None] = {}
        for entry in gpu.get("links") or ():
            link = entry.get("link")
            if isinstance(link, int):
                for key, value in (entry.get("counters") or {}).items():
                    counts[(link, str(key))] = value if isinstance(value, int) else None
        gpus.append(NvlinkErrorsGpu(gpu.get("index"), gpu.get("uuid"), counts, gpu.get("message")))
    names = data.get("names")
    return NvlinkErrors(tuple(gpus), dict(names) if isinstance(names, Mapping) else {})
