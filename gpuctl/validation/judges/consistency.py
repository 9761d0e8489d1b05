"""Golden config: the same firmware, software and GPU settings across a node group.

A cluster-level pass after the fleet step (:func:`judge_consistency`), over small per-node
records (:class:`NodeFacts`) that the node's worker extracts from outputs it has parsed anyway
(:func:`node_facts`). Each item is one check, ``config.<item>``:

============== =========================================== ====== ============================
item           read from                                   per    a difference is
============== =========================================== ====== ============================
vbios          ``nvidia-smi -q -x``: VBIOS Version          GPU    FAIL
ecc            ECC Mode, Current                           GPU    FAIL
mig            MIG Mode, Current                           GPU    FAIL
persistence    Persistence Mode                            GPU    WARN (off: ``gpu.persistence``)
power_limit    Current (enforced) Power Limit              GPU    WARN (cluster.yml sets none)
app_clocks     Applications Clocks (graphics, memory)      GPU    WARN (cluster.yml sets none)
cuda           CUDA Version (the driver's CUDA API)         node   FAIL
hca_firmware   ``ibstat``: Firmware version                HCA    FAIL
kernel         ``uname -r``                                node   FAIL
doca           ``ofed_info -s`` (DOCA-OFED nodes only)     node   FAIL
nccl           nccl-tests' ``NCCL version`` line           node   against ``software.nccl``
============== =========================================== ====== ============================

Not here: the driver version (``gpu.driver`` judges it against ``software.driver.version``,
which every GPU node has), the CUDA toolkit pin
(``software.cuda`` is the toolkit; nvidia-smi shows the driver's CUDA version, set by the driver),
the DOCA pin (``ofed_info`` prints the OFED bundle's version, not DOCA's).

The rule. Values are compared within a class: the node group and GPU model for GPU values, the
node group for node values, the node group, HCA type and firmware family (the firmware's first
number: 28 is ConnectX-7) for HCA firmware. Every GPU (HCA, node) that shows a value is one vote;
the value with more than half of the votes is the golden one:

- a node whose every value is the golden one: one OK per item (not one per GPU); a class of
  one node has nothing to compare with and gets no OK (its GPUs are still compared with each
  other, so a difference between them is reported), as a bundle of node-check is judged again;
- a node with another value: FAIL (WARN for persistence and power limit), naming its value, the
  GPUs or HCAs that have it, and the golden value with how many others have it;
- no value has more than half of the votes (two nodes that differ, a tie): every node of the
  class gets WARN "differs, cannot tell which is right": no node is drained on a coin toss;
- a value the node does not show is no vote, never taken as agreeing: missing from a readable
  output while its peers show it, it is UNKNOWN for that node; a probe that failed or was not
  read is UNKNOWN already from the node's own judges (``gpu.*`` for nvidia-smi, ``ib.*`` for
  ibstat, :func:`judge_config_probes` for ``uname -r`` and ``ofed_info -s``: ``config.kernel``
  and ``config.doca`` UNKNOWN) and adds nothing here. A GPU setting that no GPU of the class
  shows (MIG mode on an L40S, ECC mode on a GeForce) is not judged.

A pinned value is judged against its pin, not the majority: the NCCL release the nccl-tests
output shows (only when it prints ``NCCL version``) against ``software.nccl``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Evidence, Outputs, node_judge, record, usable_parse
from gpuctl.validation.parsers.infiniband import ibstat_of
from gpuctl.validation.parsers.kernel import OFED_INFO, UNAME, release_of
from gpuctl.validation.parsers.nccl import nccl_version_of
from gpuctl.validation.parsers.nvsmi_gpu import smi_of
from gpuctl.validation.parsing import ParseResult
from gpuctl.validation.plausible import finite
from gpuctl.validation.probes import collects, probes_for
from gpuctl.validation.results import CheckResult, Verdict, worst


@dataclass(frozen=True, slots=True)
class Item:
    """One compared value: ``config.<key>``, its name in messages, what one value belongs to
    (``gpu``, ``hca``, ``node``), the verdict of a difference, and whether a GPU model may
    not show it at all (then a class where no GPU shows it is not judged)."""

    key: str
    label: str
    per: str
    differs: Verdict = Verdict.FAIL
    optional: bool = False


ITEMS: dict[str, Item] = {
    i.key: i
    for i in (
        Item("vbios", "VBIOS", "gpu"),
        Item("ecc", "ECC mode", "gpu", optional=True),
        Item("mig", "MIG mode", "gpu", optional=True),
        Item("persistence", "persistence mode", "gpu", Verdict.WARN, optional=True),
        Item("power_limit", "power limit", "gpu", Verdict.WARN, optional=True),
        Item("app_clocks", "applications clocks", "gpu", Verdict.WARN, optional=True),
        Item("cuda", "CUDA", "node"),
        Item("hca_firmware", "firmware", "hca"),
        Item("kernel", "kernel", "node"),
        Item("doca", "OFED", "node"),
        Item("nccl", "NCCL", "node"),
    )
}
PINNED = frozenset({"nccl"})


@dataclass(frozen=True, slots=True)
class Fact:
    """One value of one node: the item, the GPU or HCA it belongs to (None: the node's), the
    value as shown (None: not shown) and, for HCAs, what else two values must share to be
    compared (type and firmware family)."""

    item: str
    subject: str | None
    value: str | None
    peers: str = ""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What :func:`judge_consistency` compares of one node (small and picklable: a worker
    process returns it). An output that failed or was not read gives no facts: the node's
    own judges have made it UNKNOWN (``gpu.*``, ``ib.*``, ``config.kernel``, ``config.doca``)."""

    facts: tuple[Fact, ...] = ()


# ------------------------------------------------------------------------------------------
# Per node: the facts, and the node judge of the two probes only this judge reads


def node_facts(exp: NodeExpectation, outputs: Outputs) -> NodeFacts:
    """The node's facts from its outputs (each parsed once: the node judges parsed them)."""
    facts: list[Fact] = []
    collected = {p.kind for p in probes_for(exp)}
    if "smi-xml" in collected:
        smi = _recognised(outputs, "smi-xml") or _recognised(outputs, "smi-q")
        if smi is not None:  # else the GPU judge has said why (gpu.* UNKNOWN)
            facts += _smi_facts(smi)
    if "ibstat" in collected:
        ibstat = _recognised(outputs, "ibstat")
        if ibstat is not None:  # else the InfiniBand judge has said why
            facts += _hca_facts(ibstat)
    for kind, item in ((UNAME, "kernel"), (OFED_INFO, "doca")):
        if kind in collected:
            result = _recognised(outputs, kind)
            if result is not None and outputs[kind].rc in (0, None):  # else judge_config_probes
                facts.append(Fact(item, None, release_of(result.data).release))
    if exp.nccl_version is not None and "nccl" in collected:
        result = _recognised(outputs, "nccl")
        shown = _text(nccl_version_of(result.data)) if result is not None else None
        if shown is not None:  # most runs do not print it (NCCL_DEBUG=VERSION does)
            facts.append(Fact("nccl", None, shown))
    return NodeFacts(tuple(facts))


@node_judge(UNAME, OFED_INFO)
def judge_config_probes(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    """``config.kernel`` / ``config.doca`` UNKNOWN where ``uname -r`` / ``ofed_info -s`` gave
    nothing usable; the comparison itself is :func:`judge_consistency`'s."""
    out: list[CheckResult] = []
    for kind, item in ((UNAME, "kernel"), (OFED_INFO, "doca")):
        if collects(exp, kind):
            out += usable_parse(exp, evidence, (kind,), f"config.{item}")[1]
    return out


def _recognised(outputs: Outputs, kind: str) -> ParseResult | None:
    out = outputs.get(kind)
    if out is None or out.failure() is not None:
        return None
    result = out.parse_as(kind)
    return result if result.recognised else None


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _smi_facts(result: ParseResult) -> list[Fact]:
    # the records of parsers/nvsmi_gpu.py and parsers/infiniband.py carry what is compared
    smi = record(result, smi_of)
    facts = [Fact("cuda", None, _text(smi.cuda_version))]
    for gpu in smi.gpus:
        subject = gpu.subject
        watts = finite(gpu.power_limit_w)
        facts += (
            Fact("vbios", subject, _text(gpu.vbios_version)),
            Fact("ecc", subject, _text(gpu.ecc_mode)),
            Fact("mig", subject, _text(gpu.mig_mode)),
            Fact("persistence", subject, _text(gpu.persistence_mode)),
            Fact("power_limit", subject, None if watts is None else f"{watts:g} W"),
            Fact("app_clocks", subject, _app_clocks(gpu.applications_clocks_mhz)),
        )
    return facts


def _app_clocks(clocks: tuple[float | None, float | None] | None) -> str | None:
    graphics, memory = (finite(v) for v in clocks) if clocks is not None else (None, None)
    if graphics is None or memory is None:
        return None
    return f"graphics {graphics:g} MHz, memory {memory:g} MHz"


def _hca_facts(result: ParseResult) -> list[Fact]:
    facts: list[Fact] = []
    for name, ca in record(result, ibstat_of).cas.items():
        firmware = _text(ca.firmware_version)
        kind = _text(ca.ca_type) or "HCA"
        family = f" (firmware {firmware.split('.', 1)[0]}.x)" if firmware else ""
        facts.append(Fact("hca_firmware", name, firmware, f"{kind}{family}"))
    return facts


# ------------------------------------------------------------------------------------------
# The cluster: each class against its golden value


Part = tuple[Verdict, str, Any]  # verdict, message, expected value


def judge_consistency(
    facts: Mapping[str, NodeFacts], exps: Mapping[str, NodeExpectation]
) -> list[CheckResult]:
    """The ``config.*`` results of every node with facts: one per node and item."""
    parts: dict[tuple[str, str], list[Part]] = {}
    classes: dict[tuple[str, str], dict[str, list[Fact]]] = {}
    for node, nf in facts.items():
        exp = exps.get(node)
        if exp is None:
            continue
        group, gpus = f"group {exp.group}", f"group {exp.group} ({exp.gpu_model or 'no GPU model'})"
        for fact in nf.facts:
            per = ITEMS[fact.item].per
            label = (
                gpus if per == "gpu" else group if per == "node" else f"{group}, {fact.peers} HCAs"
            )
            classes.setdefault((fact.item, label), {}).setdefault(node, []).append(fact)
    for (item, label), members in sorted(classes.items()):
        judged = (
            _judge_pinned(exps, members) if item in PINNED else _judge_class(item, label, members)
        )
        for node, part in judged:
            parts.setdefault((node, item), []).append(part)
    out: list[CheckResult] = []
    for (node, item), found in sorted(parts.items()):
        verdict = worst(v for v, _, _ in found)
        shown = [p for p in found if p[0] is verdict] or found
        expected = next((e for v, _, e in shown if e is not None), None)
        out.append(
            CheckResult(
                check=f"config.{item}",
                node=node,
                verdict=verdict,
                message="; ".join(m for _, m, _ in shown),
                expected=expected,
                source="software.nccl" if item in PINNED else None,
            )
        )
    return out


def _names(facts: Iterable[Fact]) -> str:
    return ", ".join(f.subject or "?" for f in facts)


def _unit(item: Item) -> str:
    return {"gpu": "GPU", "hca": "HCA"}.get(item.per, "node")


def _judge_class(
    key: str, label: str, members: Mapping[str, Sequence[Fact]]
) -> list[tuple[str, Part]]:
    item = ITEMS[key]
    votes = Counter(f.value for fs in members.values() for f in fs if f.value is not None)
    if not votes and item.optional:
        return []  # no GPU of the class shows it: not a setting of these GPUs
    golden, top = votes.most_common(1)[0] if votes else ("", 0)
    decided = top * 2 > sum(votes.values())
    holders: dict[str, set[str]] = {}  # value -> the nodes that show it
    for node, fs in members.items():
        for f in fs:
            if f.value is not None:
                holders.setdefault(f.value, set()).add(node)
    showing = set().union(*holders.values())
    out: list[tuple[str, Part]] = []
    for node, fs in sorted(members.items()):
        missing = [f for f in fs if f.value is None]
        shown = [f for f in fs if f.value is not None]
        odd = [f for f in shown if f.value != golden]
        if missing:
            where = f" for {_names(missing)}" if item.per != "node" else ""
            out.append((node, (Verdict.UNKNOWN, f"{item.label} not shown{where}", None)))
        if not shown:
            continue
        if not decided:
            part: Part = (Verdict.WARN, _undecided(item, label, shown, holders), None)
        elif odd:
            part = (item.differs, _odd(item, label, golden, fs, odd, holders, node), golden)
        elif len(showing) < 2:
            continue  # nothing to compare with (node-check, a group of one): no OK either
        else:
            part = (Verdict.OK, _agrees(item, label, golden, shown, holders, node), None)
        out.append((node, part))
    return out


def _others(holders: Mapping[str, Set[str]], value: str, node: str) -> int:
    """How many nodes besides ``node`` show ``value``."""
    nodes = holders.get(value, set())
    return len(nodes) - (node in nodes)


def _agrees(
    item: Item,
    label: str,
    golden: str,
    shown: Sequence[Fact],
    holders: Mapping[str, Set[str]],
    node: str,
) -> str:
    others = _others(holders, golden, node)
    what = f"{item.label} {golden}"
    if item.per != "node":
        what += f" on all {len(shown)} {_unit(item)}s" if len(shown) > 1 else f" on {_names(shown)}"
    if others == 0:
        return f"{what} (the only node of {label} showing it)"
    return f"{what}, as on the other {others} node{'s' if others != 1 else ''} of {label}"


def _odd(
    item: Item,
    label: str,
    golden: str,
    facts: Sequence[Fact],
    odd: Sequence[Fact],
    holders: Mapping[str, Set[str]],
    node: str,
) -> str:
    by_value: dict[str, list[Fact]] = {}
    for f in odd:
        by_value.setdefault(f.value or "", []).append(f)
    if item.per == "node":
        head = ", ".join(f"{item.label} {v}" for v in by_value)
    else:
        every = f"all {len(facts)} {_unit(item)}s" if len(facts) > 1 else None
        head = f"{item.label} " + ", ".join(
            f"{v} on {every if len(fs) == len(facts) and every else _names(fs)}"
            for v, fs in by_value.items()
        )
    others = _others(holders, golden, node)
    here = [f for f in facts if f.value == golden]
    who = []
    if others:
        who.append(f"the other {others} node{'s' if others != 1 else ''} of {label}")
    if here:
        who.append(f"{_names(here)} of this node")
    verb = "has" if len(who) == 1 and not others and len(here) == 1 else "have"
    return f"{head}; {' and '.join(who)} {verb} {golden}"


def _undecided(
    item: Item, label: str, shown: Sequence[Fact], holders: Mapping[str, Set[str]]
) -> str:
    mine = sorted({f.value or "" for f in shown})
    counts = ", ".join(
        f"{v} on {len(ns)} node{'s' if len(ns) != 1 else ''}"
        for v, ns in sorted(holders.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    )
    return (
        f"{item.label} differs, cannot tell which is right: {', '.join(mine)} here; "
        f"{label} has {counts}"
    )


def _nccl_parts(version: str) -> tuple[str, str | None]:
    """("2.26.2", "12.8") of "2.26.2-1+cuda12.8" (a package version) or "2.26.2+cuda12.8"
    (what NCCL prints): the release and the CUDA it was built for (None: not shown)."""
    release, _, cuda = version.partition("+")
    return release.split("-", 1)[0], cuda.removeprefix("cuda") or None


def _judge_pinned(
    exps: Mapping[str, NodeExpectation], members: Mapping[str, Sequence[Fact]]
) -> list[tuple[str, Part]]:
    out: list[tuple[str, Part]] = []
    for node, fs in sorted(members.items()):
        pin = exps[node].nccl_version
        for f in fs:
            if pin is None or f.value is None:
                continue
            (want, want_cuda), (got, got_cuda) = _nccl_parts(pin), _nccl_parts(f.value)
            ok = got == want and (want_cuda is None or got_cuda is None or got_cuda == want_cuda)
            said = "as pinned" if ok else "expected"
            verdict = Verdict.OK if ok else Verdict.FAIL
            out.append((node, (verdict, f"NCCL {f.value}, {said} {pin} (software.nccl)", pin)))
    return out
