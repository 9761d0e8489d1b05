"""``nvidia-smi nvlink -s`` / ``--status``: per GPU, each NVLink's speed or ``<inactive>``.

The GPU lines are those of :mod:`gpuctl.validation.parsers.nvsmi_tables` (``GPU n: name (UUID:
...)``); a line under a GPU that is no link line is that GPU's message (``NVML: Unable to
retrieve NVLink information as all links are inActive``). Contract: docs/parse.md.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import number, to_int
from gpuctl.validation.parsers.nvsmi_tables import (
    GPU_LINE,
    LINK_LINE,
    nonblank_lines,
    uuid_or_none,
)
from gpuctl.validation.parsing import ParseResult, parser, unrecognised

_LINK_SPEED = re.compile(r"(\d+(?:\.\d+)?)\s*GB/s")
# Every GPU of a fleet prints the same few link numbers and states ("Link 3: 25 GB/s"): what a
# short one reads as is remembered (bounded caches of pure functions of the text)
_SHORT = 40
_short_int = functools.lru_cache(maxsize=1024)(to_int)


def _read_link_state(value: str) -> tuple[int | float | None, bool | None]:
    """``25 GB/s`` -> (25, True), ``<inactive>`` -> (None, False), else (None, None)."""
    sm = _LINK_SPEED.fullmatch(value)
    if sm:
        return number(sm.group(1)), True
    return None, False if value == "<inactive>" else None


_short_link_state = functools.lru_cache(maxsize=1024)(_read_link_state)


@parser(
    "nvlink",
    description="nvidia-smi nvlink -s: per GPU, each NVLink's speed or <inactive>",
)
def parse_nvlink(text: str) -> ParseResult:
    kind = "nvlink"
    lines = nonblank_lines(text)
    if not lines:
        return unrecognised(kind, "empty input")
    problems: list[str] = []
    gpus: list[dict[str, Any]] = []
    gpu_indexes: set[int | None] = set()
    gpu_links: list[set[int]] = []  # the link numbers of each GPU in gpus, for repeats
    link_lines = 0
    nvlink_messages = 0
    for line in lines:
        # each pattern starts with its literal word (a faster test first)
        gm = GPU_LINE.fullmatch(line) if line.startswith("GPU") else None
        lm = None if gm or not line.startswith("Link") else LINK_LINE.fullmatch(line)
        index = to_int(gm.group(1)) if gm else None
        if gm and index is None:
            problems.append(f"GPU line with an unreadable index: {line[:80]!r}")
        elif gm:
            if index in gpu_indexes:
                problems.append(f"GPU {index} appears twice")
            gpu_indexes.add(index)
            gpus.append(
                {
                    "index": index,
                    "name": gm.group(2) or None,
                    "uuid": uuid_or_none(gm.group(3)),
                    "links": [],
                    "message": None,
                }
            )
            gpu_links.append(set())
        elif lm:
            link_lines += 1
            if not gpus:
                problems.append(f"link line before any GPU line: {line[:80]!r}")
                continue
            gpu = gpus[-1]
            number_text, value = lm.group(1), lm.group(2)
            link = _short_int(number_text) if len(number_text) <= _SHORT else to_int(number_text)
            if link is None:
                problems.append(f"GPU {gpu['index']}: unreadable link number {line[:80]!r}")
                continue
            if link in gpu_links[-1]:
                problems.append(f"GPU {gpu['index']}: link {link} appears twice")
            gpu_links[-1].add(link)
            speed, active = (
                _short_link_state(value) if len(value) <= _SHORT else _read_link_state(value)
            )
            if active is None:
                problems.append(f"GPU {gpu['index']} link {link}: cannot read {value[:40]!r}")
            gpu["links"].append({"link": link, "speed_gbs": speed, "active": active})
        elif gpus and not gpus[-1]["links"] and gpus[-1]["message"] is None:
            gpus[-1]["message"] = line
            if "nvlink" in line.lower():
                nvlink_messages += 1
            problems.append(f"GPU {gpus[-1]['index']}: {line[:160]}")
        else:
            problems.append(f"unexpected line: {line[:80]!r}")
    if not gpus:
        return unrecognised(kind, f"no 'GPU n: …' line; first line: {lines[0][:120]!r}")
    if link_lines == 0 and nvlink_messages == 0:
        return unrecognised(kind, "GPU lines but no 'Link n:' lines (nvidia-smi -L output?)")
    counts = sorted({len(g["links"]) for g in gpus if g["links"]})
    for gpu in gpus:
        numbers = sorted(x["link"] for x in gpu["links"])
        if not numbers and gpu["message"] is None:
            problems.append(f"GPU {gpu['index']}: no link lines")
        elif numbers and numbers != list(range(len(numbers))):  # 0..n-1 without gaps
            problems.append(f"GPU {gpu['index']}: link numbers are not 0..{numbers[-1]}")
    if len(counts) > 1:
        problems.append(f"GPUs list different numbers of links: {counts}")
    all_links = [x for g in gpus for x in g["links"]]
    data = {
        "gpu_count": len(gpus),
        "gpus": gpus,
        "link_count": len(all_links),
        "active_links": sum(1 for x in all_links if x["active"] is True),
        "inactive_links": sum(1 for x in all_links if x["active"] is False),
    }
    return ParseResult(kind, True, data, tuple(problems))


@dataclass(frozen=True, slots=True)
class NvlinkGpu:
    """A GPU of ``nvlink -s`` as the judges read it: index and UUID as printed, the numbers of
    its links and of those shown ``<inactive>``."""

    index: int | None
    uuid: str | None
    links: tuple[int | None, ...]
    inactive: tuple[int | None, ...]


def nvlink_gpus_of(data: Mapping[str, Any]) -> tuple[NvlinkGpu, ...]:
    """The record of :func:`parse_nvlink`'s data."""
    return tuple(_nvlink_gpu(g, g.get("links") or ()) for g in data.get("gpus") or ())


def _nvlink_gpu(gpu: Mapping[str, Any], links: Sequence[Mapping[str, Any]]) -> NvlinkGpu:
    numbers = tuple(x.get("link") for x in links)
    down = tuple(x.get("link") for x in links if x.get("active") is False)
    return NvlinkGpu(gpu.get("index"), gpu.get("uuid"), numbers, down)
