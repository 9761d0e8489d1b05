"""SIMULATED: the GPUs under sustained load (the burn level): ``nvidia-smi dmon``'s samples, what
DCGM's targeted stress and power runs leave behind, and the faults that only show under load.
Standard library only (runs inside lab nodes).

A stress run (``dcgmi diag -r targeted_stress|targeted_power``) takes its ``test_duration`` in
real time and records, per node, until when the GPUs are loaded and how many seconds of stress
they have had (``load.json`` in the simulator's state directory). What reads that state:

- ``nvidia-smi dmon`` (:func:`dmon`): idle or loaded values per sample, in the layout of the
  R535+ driver with ``-o DT`` (tests/fixtures/nvidia-smi/dmon-pucvmet-DT-interrupted.txt:
  ``#Date`` and ``Time`` columns of 13 and 9 characters, then every column right-aligned in 7,
  ``pviol`` in %, ``tviol`` 0 or 1);
- the clock event counters of ``nvidia-smi -q -x`` (:func:`hw_thermal_us`);
- all_reduce_perf's busbw (:func:`nccl_drift`).

Faults: ``thermal_throttle=GPU`` (under load the GPU reaches its slowdown temperature: dmon
shows it hot, clocks down and ``tviol`` 1, and a quarter of its stress time is counted as HW
thermal slowdown); ``nccl_drift=PCT`` (every stress run the node has had since the fault was
set takes PCT % off the next all_reduce runs' busbw: a node that degrades as it stays loaded).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .common import Faults, Gpu, Profile, digest, read_state_file, visible_gpus, write_state_file
from .mft import state_dir

LOAD_FILE = "load-{node}.json"  # per node: lab tests run several nodes on one state directory
GROUPS = "pucv"  # the metric groups simulated (power/temperature, utilisation, clocks, violations)
_COLUMNS = {
    "p": (("pwr", "W"), ("gtemp", "C"), ("mtemp", "C")),
    "u": (("sm", "%"), ("mem", "%"), ("enc", "%"), ("dec", "%"), ("jpg", "%"), ("ofa", "%")),
    "c": (("mclk", "MHz"), ("pclk", "MHz")),
    "v": (("pviol", "%"), ("tviol", "bool")),
}
THROTTLED_SHARE = 0.25  # of a throttled GPU's stress time, counted as HW thermal slowdown


def _file(node: str) -> str:
    return LOAD_FILE.format(node="".join(c if c.isalnum() or c in "-_" else "_" for c in node))


def _state(node: str) -> dict[str, Any]:
    return read_state_file(state_dir(), _file(node))


def stress(node: str, seconds: int) -> None:
    """One stress run of ``seconds``: the GPUs loaded until it ends, then counted."""
    directory = state_dir()
    mine = dict(_state(node))
    mine["until"] = time.time() + seconds
    write_state_file(directory, _file(node), mine)
    time.sleep(seconds)
    mine["stress_s"] = float(mine.get("stress_s", 0.0)) + seconds
    mine["ends"] = [*list(mine.get("ends") or [])[-999:], time.time()]
    mine["until"] = 0.0
    write_state_file(directory, _file(node), mine)


def _throttled(faults: Faults, gpu: Gpu) -> bool:
    value = faults.get("thermal_throttle")
    return value is not None and gpu.physical in value


def hw_thermal_us(faults: Faults, node: str, gpu: Gpu) -> int:
    """The GPU's HW thermal slowdown counter (us) from its stress time so far."""
    if not _throttled(faults, gpu):
        return 0
    return int(float(_state(node).get("stress_s", 0.0)) * THROTTLED_SHARE * 1_000_000)


def nccl_drift(faults: Faults, node: str) -> float:
    """The busbw factor of the node's all_reduce runs after the stress runs it has had since
    the fault was set."""
    fault = faults.get("nccl_drift")
    if not fault:
        return 1.0
    since = float(fault["since"])
    runs = sum(1 for end in _state(node).get("ends") or () if float(end) > since)
    return float((1.0 - float(fault["pct"]) / 100.0) ** runs)


def _values(profile: Profile, faults: Faults, node: str, gpu: Gpu, loaded: bool) -> list[str]:
    spec = profile["gpus"]
    clocks = spec["clocks_mhz"]
    jitter = digest(node, "dmon", gpu.physical) % 3
    hot = loaded and _throttled(faults, gpu)
    if loaded:
        power = int(float(spec["power_limit_w"]) * (0.82 if hot else 0.94)) + jitter
        temp = (88 if hot else 63) + jitter
        pclk = int(clocks["graphics_max"]) * (7 if hot else 10) // 10
        sm, mem = 100, 41 + jitter
    else:
        power = int(float(spec["idle_power_w"])) + jitter
        temp = int(spec["idle_temp_c"]) + jitter
        pclk, sm, mem = int(clocks["graphics_idle"]), 0, 0
    by_name = {
        "pwr": power,
        "gtemp": temp,
        "mtemp": temp + 6,
        "sm": sm,
        "mem": mem,
        "enc": 0,
        "dec": 0,
        "jpg": 0,
        "ofa": 0,
        "mclk": int(clocks["memory"]),
        "pclk": pclk,
        "pviol": 0,
        "tviol": 1 if hot else 0,
    }
    return [str(by_name[name]) for name in _names(GROUPS)]


def _names(groups: str) -> list[str]:
    return [name for g in groups for name, _ in _COLUMNS[g]]


def dmon_usage(groups: str) -> str | None:
    """Why ``-s groups`` is not simulated, or None."""
    bad = sorted({g for g in groups if g not in _COLUMNS})
    return f"metric groups not simulated in the gpuctl lab: {''.join(bad)}" if bad else None


def dmon(
    profile: Profile,
    faults: Faults,
    node: str,
    groups: str,
    options: str,
    delay: int,
    count: int | None,
    write: Callable[[str], None],
    indices: Sequence[int] | None = None,
) -> None:
    """Print dmon's header, then a line per GPU (``indices``: those) every ``delay`` seconds,
    ``count`` times."""
    date, clock = "D" in options, "T" in options
    names = [(n, u) for g in groups for n, u in _COLUMNS[g]]
    head, units = "", ""
    if date:
        head, units = "#Date".ljust(13), "#YYYYMMDD".ljust(13)
    if clock:
        head += ("Time" if date else "#Time").ljust(9)
        units += ("HH:MM:SS" if date else "#HH:MM:SS").ljust(9)
    if date or clock:
        head += f"{'gpu':>7}"
        units += f"{'Idx':>7}"
    else:
        head, units = f"#{'gpu':>4}", f"#{'Idx':>4}"
    head += "".join(f"{n:>7}" for n, _ in names)
    units += "".join(f"{u:>7}" for _, u in names)
    write(head + "\n" + units + "\n")
    gpus = [g for g in visible_gpus(profile, faults, node) if indices is None or g.index in indices]
    sample = 0
    while count is None or sample < count:
        if sample:
            time.sleep(delay)
        now = time.time()
        loaded = now < float(_state(node).get("until", 0.0))
        stamp = ""
        if date:
            stamp += f" {time.strftime('%Y%m%d', time.localtime(now))}    "
        if clock:
            stamp += f"{time.strftime('%H:%M:%S', time.localtime(now))} "
        width = 7 if (date or clock) else 5
        lines = [
            stamp
            + f"{gpu.index:>{width}}"
            + "".join(f"{v:>7}" for v in _select(profile, faults, node, gpu, loaded, groups))
            for gpu in gpus
        ]
        write("\n".join(lines) + "\n")
        sample += 1


def _select(
    profile: Profile, faults: Faults, node: str, gpu: Gpu, loaded: bool, groups: str
) -> Sequence[str]:
    every = dict(zip(_names(GROUPS), _values(profile, faults, node, gpu, loaded), strict=True))
    return [every[n] for n in _names(groups)]


def dmon_main(
    profile: Profile,
    faults: Faults,
    node: str,
    args: Sequence[str],
    out: Callable[[str], None],
    err: Callable[[str], None],
) -> int:
    """``nvidia-smi dmon [-s GROUPS] [-o D|T|DT] [-d SECONDS] [-c COUNT]``."""
    groups, options, delay, count, only = "puc", "", 1, None, ""
    pairs = {"-s": "groups", "--select": "groups", "-o": "options", "--options": "options"}
    pairs |= {"-i": "only", "--id": "only"}
    pairs |= {"-d": "delay", "--delay": "delay", "-c": "count", "--count": "count"}
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        key = pairs.get(name)
        if key is None or (not eq and i + 1 >= len(args)):
            err(f"Invalid combination of input arguments: {args[i]}\n")
            return 2
        if not eq:
            value, i = args[i + 1], i + 1
        i += 1
        if key in ("delay", "count"):
            if not value.isdigit() or int(value) < 1:
                err(f"Invalid value for {name}: {value}\n")
                return 2
            if key == "delay":
                delay = int(value)
            else:
                count = int(value)
        elif key == "groups":
            groups = value
        elif key == "only":
            only = value
        else:
            options = value.upper()
    why = dmon_usage(groups)
    if why is not None:
        err(why + "\n")
        return 2
    present = {str(g.index) for g in visible_gpus(profile, faults, node)}
    asked = [part for part in only.split(",") if part] if only else sorted(present, key=int)
    if any(part not in present for part in asked):
        err(f"No devices were found with ID {','.join(p for p in asked if p not in present)}\n")
        return 6
    dmon(profile, faults, node, groups, options, delay, count, out, [int(p) for p in asked])
    return 0


def stress_params(args: Sequence[str], test: str) -> int | None:
    """``-p <test>.test_duration=N`` (several ``;``-separated); None when not given or bad."""
    for i, arg in enumerate(args):
        if arg in ("-p", "--parameters") and i + 1 < len(args):
            for part in args[i + 1].split(";"):
                key, _, value = part.partition("=")
                if key.strip() == f"{test}.test_duration" and value.strip().isdigit():
                    return int(value)
    return None
