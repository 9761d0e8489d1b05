"""Node basics that break jobs (issue 18, point 6): the hardware slurmd finds against the
NodeName line gpuctl wrote, and the file systems cluster.yml requires.

- ``node.cpus`` / ``node.memory`` (``slurmd -C``, standard and long, compute nodes): fewer CPUs
  or less memory than slurm.conf declares FAIL. Slurm itself refuses such a node when slurmd
  registers: "any node with less than the configured resources" is set INVALID unless
  ``SlurmdParameters=config_overrides`` (slurm.conf(5)), which gpuctl does not write; the job
  queue stops using it with a reason like "Low RealMemory" or "Low socket*core*thread count"
  and an operator learns it from a drained node, not from the validation that should have
  seen the failed DIMM or the CPUs lost with a BIOS change. More CPUs than declared, or the
  same number in another layout (sockets x cores x threads), WARN: Slurm schedules what
  slurm.conf says, so the rest idles or CPU binding follows a wrong layout.
- ``node.mount`` (``df`` of the required paths, every level), one result per path: FAIL when
  the path is no mount of its own (df shows the parent file system: the NFS mount failed and
  jobs write to the root disk), when its type differs from ``fstype``, when fewer than
  ``min_free_gib`` GiB are free, and when df cannot stat it at all; UNKNOWN when df did not
  finish (a hung network file system keeps it waiting) or printed no row.
- ``node.clock`` (``date -u +%s.%N``, standard and long): the node's clock against gpuctl's,
  the collector having recorded when it sent the command and when the answer came back. The
  node's time is compared with the middle of that window, which it lies within whatever the
  network did, so half the window is the uncertainty: off by more than ``clock_offset_max_s``
  (default 1 s, data/health.yml) beyond it FAIL, within it even at the window's edges OK, else
  UNKNOWN (the round trip was too slow to tell). No recorded window: UNKNOWN.
- ``node.hugepages`` (``/proc/meminfo``, standard and long, where a node group asks for a
  pool): a default hugepage size other than ``size_kib`` or fewer than ``min_total`` of them
  FAIL (a job that maps hugepages then fails or falls back to normal pages); not shown UNKNOWN.
"""

from __future__ import annotations

from gpuctl.validation.expect import ExpectedMount, NodeExpectation
from gpuctl.validation.judges.base import Evidence, finding, node_judge, usable_parse
from gpuctl.validation.parsers.node import CLOCK, DF, MEMINFO, Filesystem, filesystems_of
from gpuctl.validation.parsers.slurm import SLURMD_CONF, SlurmdHardware, slurmd_hardware_of
from gpuctl.validation.results import CheckResult, Verdict

SLURM_CONF_SOURCE = (
    "slurm.conf(5): a node with less than its configured resources is set INVALID "
    "(SlurmdParameters=config_overrides, which gpuctl does not set)"
)
GIB = 1024**3
DEFAULT_CLOCK_OFFSET_S = 1.0


@node_judge(SLURMD_CONF)
def judge_node_resources(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    declared = (("node.cpus", exp.slurm_cpu), ("node.memory", exp.slurm_memory_mb))
    wanted = [check for check, value in declared if value is not None]
    result, unknown = usable_parse(exp, evidence, [SLURMD_CONF], wanted[0])
    if result is None or unknown:  # not run, failed, not recognised, or cut off: each UNKNOWN
        return [finding(exp, check, Verdict.UNKNOWN, unknown[0].message) for check in wanted]
    out: list[CheckResult] = []
    hw = slurmd_hardware_of(result.data)
    if exp.slurm_cpu is not None:
        out.append(_cpus(exp, exp.slurm_cpu, hw))
    if exp.slurm_memory_mb is not None:
        out.append(_memory(exp, exp.slurm_memory_mb, hw))
    return out


def _cpus(exp: NodeExpectation, declared: tuple[int, int, int], hw: SlurmdHardware) -> CheckResult:
    sockets, cores, threads = declared
    want = sockets * cores * threads
    layout = f"{sockets} x {cores} x {threads}"
    if hw.cpus is None:
        return finding(exp, "node.cpus", Verdict.UNKNOWN, "slurmd -C shows no CPUs=")
    kw = {"measured": hw.cpus, "expected": want, "source": SLURM_CONF_SOURCE}
    if hw.cpus < want:
        return finding(
            exp,
            "node.cpus",
            Verdict.FAIL,
            f"slurmd -C finds {hw.cpus} CPUs; slurm.conf declares {want} ({layout} sockets x "
            "cores x threads): Slurm sets the node INVALID (Low socket*core*thread count)",
            **kw,
        )
    if hw.cpus > want:
        return finding(
            exp,
            "node.cpus",
            Verdict.WARN,
            f"slurmd -C finds {hw.cpus} CPUs; slurm.conf declares {want}: Slurm schedules "
            f"only {want}",
            **kw,
        )
    found = (hw.sockets, hw.cores_per_socket, hw.threads_per_core)
    if None in found:
        return finding(
            exp, "node.cpus", Verdict.OK, f"{hw.cpus} CPUs as declared (layout not shown)", **kw
        )
    if found != declared:
        shown = " x ".join(str(n) for n in found)
        return finding(
            exp,
            "node.cpus",
            Verdict.WARN,
            f"{hw.cpus} CPUs as declared, but laid out {shown} (sockets x cores x threads), "
            f"not {layout}: CPU binding and the GPUs' socket affinity follow slurm.conf",
            **kw,
        )
    return finding(exp, "node.cpus", Verdict.OK, f"{hw.cpus} CPUs ({layout})", **kw)


def _memory(exp: NodeExpectation, declared: int, hw: SlurmdHardware) -> CheckResult:
    if hw.memory_mb is None:
        return finding(exp, "node.memory", Verdict.UNKNOWN, "slurmd -C shows no RealMemory=")
    kw = {
        "measured": hw.memory_mb,
        "expected": declared,
        "unit": "MiB",
        "source": SLURM_CONF_SOURCE,
    }
    if hw.memory_mb < declared:
        return finding(
            exp,
            "node.memory",
            Verdict.FAIL,
            f"slurmd -C finds {hw.memory_mb} MiB; slurm.conf declares RealMemory={declared}: "
            "Slurm sets the node INVALID (Low RealMemory)",
            **kw,
        )
    return finding(
        exp,
        "node.memory",
        Verdict.OK,
        f"{hw.memory_mb} MiB, RealMemory={declared} declared",
        **kw,
    )


@node_judge(DF)
def judge_mounts(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    output = evidence.get(DF)
    why = "not collected (df)" if output is None else output.failure()
    if output is not None and why == "timed out":
        why = "df timed out (a network file system that does not answer keeps it waiting)"
    result = output.parse_as(DF) if output is not None and why is None else None
    if result is not None and not result.recognised:
        why = f"df: output not recognised ({'; '.join(result.problems)[:200]})"
    if result is None or why is not None:
        return [
            finding(exp, "node.mount", Verdict.UNKNOWN, why or "df: no output", subject=m.path)
            for m in exp.mounts
        ]
    rows: dict[str, Filesystem] = {}
    for row in filesystems_of(result.data):
        rows.setdefault(row.file, row)
    rc = output.rc if output is not None else None
    return [_mount(exp, m, rows.get(m.path), rc) for m in exp.mounts]


def _mount(
    exp: NodeExpectation, want: ExpectedMount, row: Filesystem | None, rc: int | None
) -> CheckResult:
    def result(verdict: Verdict, message: str, **kw: object) -> CheckResult:
        return finding(exp, "node.mount", verdict, message, subject=want.path, **kw)

    if row is None:
        if rc not in (0, None):  # df names the path it cannot stat on stderr and exits 1
            return result(Verdict.FAIL, f"df cannot stat {want.path} (exit {rc}): no such path?")
        return result(Verdict.UNKNOWN, f"df printed no row for {want.path}")
    if row.target != want.path:
        return result(
            Verdict.FAIL,
            f"not mounted: {want.path} is a directory on {row.target or '?'} "
            f"({row.fstype or '?'}), not a file system of its own",
            measured=row.target,
            expected=want.path,
        )
    if want.fstype is not None and row.fstype != want.fstype:
        return result(
            Verdict.FAIL,
            f"{want.path} is {row.fstype or '?'}, cluster.yml wants {want.fstype}",
            measured=row.fstype,
            expected=want.fstype,
        )
    free = f"{row.avail_bytes / GIB:.1f} GiB free" if row.avail_bytes is not None else ""
    if want.min_free_gib is not None:
        if row.avail_bytes is None:
            return result(Verdict.UNKNOWN, f"df shows no free space for {want.path}")
        gib = row.avail_bytes / GIB
        kw = {"measured": round(gib, 3), "expected": want.min_free_gib, "unit": "GiB"}
        if gib < want.min_free_gib:
            return result(
                Verdict.FAIL,
                f"{want.path}: {free}, at least {want.min_free_gib:g} GiB wanted",
                **kw,
            )
        return result(Verdict.OK, f"{want.path} mounted ({row.fstype}), {free}", **kw)
    return result(Verdict.OK, f"{want.path} mounted ({row.fstype})" + (f", {free}" if free else ""))


@node_judge(CLOCK)
def judge_clock(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    result, unknown = usable_parse(exp, evidence, [CLOCK], "node.clock")
    if result is None or unknown:
        return unknown
    ran = evidence[CLOCK].ran
    if ran is None:
        return [
            finding(exp, "node.clock", Verdict.UNKNOWN, "clock: no time recorded for when date ran")
        ]
    epoch = result.data.get("epoch")
    if not isinstance(epoch, float):
        return [finding(exp, "node.clock", Verdict.UNKNOWN, "clock: no time shown")]
    sent, received = ran
    half = (received - sent) / 2
    offset = epoch - (sent + received) / 2
    limit = float(exp.thresholds.get("clock_offset_max_s") or DEFAULT_CLOCK_OFFSET_S)
    source = exp.sources.get("clock_offset_max_s")
    said = f"clock {offset:+.3f} s from gpuctl's (+/- {half:.3f} s, half the round trip)"
    kw = {"measured": round(offset, 3), "expected": limit, "unit": "s", "source": source}
    if abs(offset) - half > limit:
        return [
            finding(
                exp,
                "node.clock",
                Verdict.FAIL,
                f"{said}: more than {limit:g} s off (munge, Slurm and the Xid window use it)",
                **kw,
            )
        ]
    if abs(offset) + half <= limit:
        return [finding(exp, "node.clock", Verdict.OK, f"{said}, within {limit:g} s", **kw)]
    return [
        finding(
            exp,
            "node.clock",
            Verdict.UNKNOWN,
            f"{said}: the round trip was too slow to tell whether it is within {limit:g} s",
            **kw,
        )
    ]


@node_judge(MEMINFO)
def judge_hugepages(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    result, unknown = usable_parse(exp, evidence, [MEMINFO], "node.hugepages")
    if result is None or unknown or exp.hugepages is None:
        return unknown
    size_kib, least = exp.hugepages
    values = result.data.get("values") or {}
    size, total = values.get("Hugepagesize"), values.get("HugePages_Total")
    if not isinstance(size, int) or not isinstance(total, int):
        return [
            finding(
                exp,
                "node.hugepages",
                Verdict.UNKNOWN,
                "meminfo: no Hugepagesize or HugePages_Total",
            )
        ]
    kw = {"measured": total, "expected": least}
    if size != size_kib:
        return [
            finding(
                exp,
                "node.hugepages",
                Verdict.FAIL,
                f"default hugepage size {size} kB, cluster.yml wants {size_kib} kB "
                f"({total} reserved)",
                **kw,
            )
        ]
    if total < least:
        return [
            finding(
                exp,
                "node.hugepages",
                Verdict.FAIL,
                f"{total} hugepages of {size} kB reserved, at least {least} wanted",
                **kw,
            )
        ]
    free = values.get("HugePages_Free")
    shown = f", {free} free" if isinstance(free, int) else ""
    return [
        finding(
            exp,
            "node.hugepages",
            Verdict.OK,
            f"{total} hugepages of {size} kB reserved{shown}, at least {least} wanted",
            **kw,
        )
    ]
