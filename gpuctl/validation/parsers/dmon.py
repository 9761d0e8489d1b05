"""``nvidia-smi dmon``: samples of every GPU over time, one line per GPU per interval.

Layouts (tests/fixtures/nvidia-smi/dmon-*.txt): a header of column names and a line of units,
both starting with ``#``, then one line per GPU and sample; ``-o D``/``-o T`` add ``Date``
(YYYYMMDD) and ``Time`` (HH:MM:SS) before ``gpu``; the columns depend on ``-s`` (p: pwr gtemp
mtemp; u: sm mem enc dec, jpg ofa on newer drivers; c: mclk pclk; v: pviol in %, tviol as
0/1; m: fb bar1 ccpm; e: sbecc dbecc pci; t: rxpci txpci) and on ``--gpm-metrics``. A value
the GPU does not report is ``-``. dmon prints its header again from time to time; a header
with other columns is a problem. Columns are read by their names, never by position.

Data (docs/parse.md)::

    columns: [str], units: [str]
    samples: [{gpu: int, date: str | null, time: str | null,
               values: {column: number | null}}]

A line whose words do not match the header (an interrupted sample: ``^C``) is left out, with
a problem. What the judges read: :func:`dmon_of`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.numbers import number, to_int
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

KIND = "dmon"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_:]{0,31}")
_DATE = re.compile(r"\d{8}")
_TIME = re.compile(r"\d{2}:\d{2}:\d{2}")
_TEXT_COLUMNS = ("date", "time")
MAX_SAMPLES = 2_000_000  # 8 GPUs sampled every second for three days


def _header(line: str) -> list[str] | None:
    """The column names of a ``#`` header line that names ``gpu``; None for another line."""
    words = line.lstrip("#").split()
    names = [w.lower() for w in words]
    if "gpu" not in names or not all(_NAME.fullmatch(w) for w in words):
        return None
    return names


@parser(KIND, description="nvidia-smi dmon: per-GPU samples over time (power, temperature, clocks)")
def parse_dmon(text: str) -> ParseResult:
    lines = clean(text).splitlines()
    columns: list[str] | None = None
    units: list[str] = []
    samples: list[dict[str, Any]] = []
    problems: list[str] = []
    expect_units = False
    for number_, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            names = _header(line)
            if names is not None:
                if columns is not None and names != columns:
                    problems.append(f"line {number_}: a header with other columns: {line[:120]!r}")
                    return ParseResult(KIND, True, _data(columns, units, samples), tuple(problems))
                columns, expect_units = names, True
            elif expect_units and columns is not None:
                units, expect_units = line.lstrip("#").split(), False
            continue
        expect_units = False
        if columns is None:
            continue  # before the header: what dmon never prints (a shell's lines)
        words = line.split()
        if len(words) != len(columns):
            problems.append(
                f"line {number_}: {len(words)} words for {len(columns)} columns: {line[:120]!r}"
            )
            continue
        sample = _sample(columns, words)
        if isinstance(sample, str):
            problems.append(f"line {number_}: {sample}")
            continue
        if len(samples) >= MAX_SAMPLES:
            problems.append(f"more than {MAX_SAMPLES} samples: the rest not read")
            break
        samples.append(sample)
    if columns is None:
        return unrecognised(KIND, "no dmon header (a '#' line naming the gpu column)")
    return ParseResult(KIND, True, _data(columns, units, samples), tuple(problems))


def _data(columns: list[str], units: list[str], samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {"columns": columns, "units": units, "samples": samples}


def _sample(columns: Sequence[str], words: Sequence[str]) -> dict[str, Any] | str:
    sample: dict[str, Any] = {"gpu": None, "date": None, "time": None, "values": {}}
    for name, word in zip(columns, words, strict=True):
        if name == "gpu":
            sample["gpu"] = to_int(word)
            if sample["gpu"] is None:
                return f"gpu is not an index: {word[:20]!r}"
        elif name in _TEXT_COLUMNS:
            shape = _DATE if name == "date" else _TIME
            if not shape.fullmatch(word):
                return f"{name} is not a {name}: {word[:20]!r}"
            sample[name] = word
        else:
            sample["values"][name] = None if word == "-" else number(word)
    return sample


@dataclass(frozen=True, slots=True)
class DmonSample:
    gpu: int
    date: str | None
    time: str | None
    values: Mapping[str, int | float | None]


@dataclass(frozen=True, slots=True)
class Dmon:
    """dmon's samples as the judges read them: the columns shown, each sample in order."""

    columns: tuple[str, ...]
    samples: tuple[DmonSample, ...]

    def of_gpu(self, gpu: int) -> tuple[DmonSample, ...]:
        return tuple(s for s in self.samples if s.gpu == gpu)

    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({s.gpu for s in self.samples}))


def _value(v: Any) -> int | float | None:
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def dmon_of(data: Mapping[str, Any]) -> Dmon:
    columns = tuple(str(c) for c in data.get("columns") or ())
    samples: list[DmonSample] = []
    for s in data.get("samples") or ():
        if not isinstance(s, Mapping):
            continue
        gpu = s.get("gpu")
        if not isinstance(gpu, int) or isinstance(gpu, bool):
            continue
        values = s.get("values") if isinstance(s.get("values"), Mapping) else {}
        samples.append(
            DmonSample(
                gpu,
                s.get("date") if isinstance(s.get("date"), str) else None,
                s.get("time") if isinstance(s.get("time"), str) else None,
                {str(k): _value(v) for k, v in (values or {}).items()},
            )
        )
    return Dmon(columns, tuple(samples))


def merge_dmon(parts: Sequence[Dmon]) -> Dmon:
    """Several dmons' samples as one (the burn loop runs one per four GPUs); the columns the
    first shows (every dmon of a run is asked for the same ones)."""
    if len(parts) == 1:
        return parts[0]
    return Dmon(parts[0].columns, tuple(s for p in parts for s in p.samples))
