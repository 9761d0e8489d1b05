"""The burn level: acceptance of new hardware for a duration (``--level burn --duration 4h``).

A node at burn runs every probe of ``long`` (``dcgmi diag -r 4`` in place of ``-r 3``), then
the burn loop (:mod:`gpuctl.validation.burn_collect` runs it, on the node's own connection):

- ``nvidia-smi -q -x`` (``smi-xml.burn-start``): the GPUs' clock event counters before;
- ``nvidia-smi dmon -i <GPUs> -s pucv -o DT -d <interval> -c <samples>`` (``dmon``, and
  ``dmon.1`` ... for GPUs 4-7 ...: one per four GPUs, the most some drivers' dmon monitors) for
  the duration, alongside the rest: power, temperatures, utilisation, clocks and violations per
  GPU over time, the time series of the report;
- ``all_reduce_perf`` at 8 GiB over every GPU (``nccl.burn0``), then, until the duration is
  over, one DCGM stress run (``dcgmi diag -r targeted_stress``, then ``targeted_power``, in
  turn; ``dcgm-diag.burnN``) and another all_reduce run (``nccl.burnN``);
- ``nvidia-smi -q -x`` again (``smi-xml.burn-end``) and the kernel log (``xid.burn-end``).

Judged (:mod:`gpuctl.validation.judges.burn`): every run of the loop at its floor and none
more than ``nccl_drift_max_pct`` below the node's best earlier run (drift), every DCGM stress
run passing, no thermal slowdown, hardware slowdown or power brake time added to a GPU's clock
event counters, no GPU at its slowdown temperature in dmon's samples, no Xid the kernel logged
during the tests, and dmon's samples covering the duration. The rules are data/burn.yml.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from gpuctl.errors import UsageError
from gpuctl.resources import load_data
from gpuctl.validation.expect import NodeExpectation

DMON_KIND = "dmon"
SMI_START, SMI_END = "smi-xml.burn-start", "smi-xml.burn-end"
XID_END = "xid.burn-end"
STRESS_TESTS = ("targeted_stress", "targeted_power")  # in turn, the first one first
# all_reduce at the size the busbw floor is defined at (the nccl probe's -e: 8 GiB)
NCCL_SIZE = "8G"
NCCL_TIMEOUT_S = 180
# DCGM's start-up and its plugins' set-up around the test's own duration
STRESS_SLACK_S = 300
SMI_TIMEOUT_S = 60
XID_TIMEOUT_S = 30
MAX_CYCLES = 2000  # a loop of 7 days at the shortest stress runs stays below it
# dmon's metric groups: p power and temperatures, u utilisation, c clocks, v violations
DMON_GROUPS = "pucv"

_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(?:(\d+)([smhd]))+")
_PART = re.compile(r"(\d+)([smhd])")


@dataclasses.dataclass(frozen=True, slots=True)
class Rules:
    """data/burn.yml, typed."""

    dmon_interval_s: int
    stress_min_s: int
    stress_max_s: int
    nccl_drift_max_pct: float
    min_samples_pct: float
    duration_min_s: int
    duration_max_s: int


def rules() -> Rules:
    data: Mapping[str, Any] = load_data("burn.yml")
    return Rules(
        dmon_interval_s=int(data["dmon_interval_s"]),
        stress_min_s=int(data["stress_min_s"]),
        stress_max_s=int(data["stress_max_s"]),
        nccl_drift_max_pct=float(data["nccl_drift_max_pct"]),
        min_samples_pct=float(data["min_samples_pct"]),
        duration_min_s=int(data["duration_min_s"]),
        duration_max_s=int(data["duration_max_s"]),
    )


def parse_duration(text: str) -> int:
    """``4h``, ``90m``, ``1h30m``, ``2d``, ``600s`` -> seconds; anything else is a usage error,
    and so is a duration outside data/burn.yml's bounds."""
    value = text.strip().lower()
    if not _DURATION.fullmatch(value):
        raise UsageError(
            f"--duration: {text!r} is not a duration (a number with s, m, h or d: 4h, 90m, 1h30m)"
        )
    seconds = sum(int(n) * _UNIT[u] for n, u in _PART.findall(value))
    bounds = rules()
    if not bounds.duration_min_s <= seconds <= bounds.duration_max_s:
        raise UsageError(
            f"--duration: {text!r} is {seconds} s; the burn runs "
            f"{bounds.duration_min_s} s to {bounds.duration_max_s} s"
        )
    return seconds


def check_asked(level: str | None, duration_given: bool) -> None:
    """The burn level comes with its duration, and a duration with the burn level only."""
    if (level == "burn") != duration_given:
        raise UsageError(
            "--level burn needs --duration (4h, 90m)"
            if level == "burn"
            else "--duration is the burn's: give it with --level burn"
        )


def show_duration(seconds: float) -> str:
    """``14400`` -> ``4h``, ``5400`` -> ``1h30m``, ``75`` -> ``1m15s``."""
    left, parts = round(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def with_burn(exps: dict[str, NodeExpectation], seconds: int | None) -> dict[str, NodeExpectation]:
    """The expectations with the burn's duration (judged against it: dmon's samples cover it);
    ``exps`` itself without one."""
    if seconds is None:
        return exps
    return {n: dataclasses.replace(e, burn_s=seconds) for n, e in exps.items()}


def dmon_samples(duration_s: int, interval_s: int) -> int:
    """How many samples dmon takes to cover ``duration_s`` (one more: both ends)."""
    return max(1, duration_s // max(1, interval_s)) + 1


# nvidia-smi(1) and dmon's help of R390 to R535 (nvidia-utils-390 ... -535, Ubuntu's archive):
# "Monitoring is limited to a maximum of 4 devices. If no devices are specified, then up to
# first 4 supported devices under natural enumeration ... are used"; R545 and later say 16, and
# a longer -i list is cut to the first N. One dmon per four GPUs, each naming its GPUs (-i), is
# within the limit of every driver
DMON_MAX_GPUS = 4


def dmon_groups(gpu_count: int) -> list[tuple[int, ...]]:
    """The GPUs of each dmon the loop runs: 0-3, 4-7, ..."""
    every = list(range(gpu_count))
    return [tuple(every[i : i + DMON_MAX_GPUS]) for i in range(0, gpu_count, DMON_MAX_GPUS)]


def dmon_kind(group: int) -> str:
    """The output kind of the dmon of GPU group ``group``: ``dmon``, ``dmon.1``, ..."""
    return DMON_KIND if group == 0 else f"{DMON_KIND}.{group}"


def dmon_argv(duration_s: int, interval_s: int, gpus: tuple[int, ...]) -> tuple[str, ...]:
    return (
        "nvidia-smi",
        "dmon",
        "-i",
        ",".join(str(g) for g in gpus),
        "-s",
        DMON_GROUPS,
        "-o",
        "DT",
        "-d",
        str(interval_s),
        "-c",
        str(dmon_samples(duration_s, interval_s)),
    )


def stress_seconds(left_s: float, r: Rules) -> int:
    """One stress run's length: half the time left, within data/burn.yml's bounds."""
    return int(max(r.stress_min_s, min(r.stress_max_s, left_s // 2)))


def stress_argv(cycle: int, seconds: int | str) -> tuple[str, ...]:
    test = STRESS_TESTS[cycle % len(STRESS_TESTS)]
    return ("dcgmi", "diag", "-r", test, "-p", f"{test}.test_duration={seconds}")


def nccl_argv(gpus: int | str) -> tuple[str, ...]:
    return ("all_reduce_perf", "-b", NCCL_SIZE, "-e", NCCL_SIZE, "-f", "2", "-g", str(gpus))


def stress_kind(cycle: int) -> str:
    return f"dcgm-diag.burn{cycle}"


def nccl_kind(cycle: int) -> str:
    return f"nccl.burn{cycle}"


_CYCLE = re.compile(r"(?:dcgm-diag|nccl)\.burn(\d{1,6})")


def cycle_of(kind: str) -> int | None:
    """The cycle of a burn loop's output kind (``nccl.burn3`` -> 3), None for other kinds."""
    hit = _CYCLE.fullmatch(kind)
    return int(hit.group(1)) if hit else None


def shown_commands() -> dict[str, list[tuple[str, ...]]]:
    """The loop's commands by parser kind, with placeholders (`gpuctl parse list`, docs)."""
    dmon = ("nvidia-smi", "dmon", "-i", "<gpus>", "-s", DMON_GROUPS, "-o", "DT", "-d", "<interval>")
    return {
        DMON_KIND: [(*dmon, "-c", "<samples>")],
        "dcgm-diag": [stress_argv(i, "<s>") for i in range(len(STRESS_TESTS))],
        "nccl": [nccl_argv("<gpus>")],
    }
