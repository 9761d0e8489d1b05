"""Which side of a failed ib_write_bw pair is to blame, and the causes gpuctl can name.

A cluster-level pass over every node's results, after the per-node judges and the fleet step
(:func:`assign_blame`). Pure: the partners come in as data (:func:`pair_peers` reads them from a
bundle's meta.json, where the collector records each HCA's ``peer`` and ``peer_hca``).

A failed pair does not say which of its two nodes is at fault; the collector's retests
(:func:`gpuctl.validation.pairs.retest`) test each suspect again with a node that passed, and
this pass decides what is left, per failed ``ib.write_bw`` result (and ``ib.write_lat``, the
latency measured on the same pair right after it) of node A on HCA a, measured with node B on
HCA b (docs/validate.md, "Which side of a failed pair is to blame"):

1. Self-evidence first: what a node shows about its own HCA in the same run (``ib.port``,
   ``ib.port.state``, ``ib.port.rate``, ``ib.port.link_layer``, ``ib.duplicate`` FAIL on that
   HCA, or the node not reachable). B shows a fault and A none: A's result becomes WARN ("pair
   with B failed; B's mlx5_0/1 ... (B's own evidence)") and does not fail A. A shows one: the
   FAIL stays A's.
2. Neither shows one: other pairs decide. B passed with another node in this run and A did
   not: A is the common factor, the FAIL stays. A passed with another node: WARN.
3. Nothing decides (two nodes, one pair, no self-evidence; or both passed elsewhere): WARN on
   both sides, "cannot be decided", never a drain: gpuctl drains no node whose fault is not
   shown. The verdict says to run again with a third node.

A partner outside the run (a known-good partner for a node under ``--limit``) or the node
itself (a loopback between its own HCAs) is not judged here: the result stays the node's. A
result without a recorded partner is left as it is. The fleet-relative result of the same HCA
(``ib.write_bw.fleet``) follows its pair result.

Causes: where a node shows why a failure happened, the failure says so. Fabric Manager of
another version than the driver (``fabricmanager.version`` FAIL) is the cause of its GPUs'
fabric state (``gpu.fabric``) and of the service not running (``fabricmanager.active``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuctl.validation.bundle import read_node_meta
from gpuctl.validation.expect import split_port
from gpuctl.validation.judges.infiniband import with_partner
from gpuctl.validation.probes import perftest_kind
from gpuctl.validation.results import CheckResult, Verdict


@dataclass(frozen=True, slots=True)
class Peer:
    """The other side of one HCA's ib_write_bw measurement: its node and HCA."""

    node: str
    hca: str


# node -> its HCA -> the partner its recorded ib_write_bw result was measured with
Peers = Mapping[str, Mapping[str, Peer]]

BANDWIDTH, LATENCY = "ib.write_bw", "ib.write_lat"
PAIR_CHECKS = (BANDWIDTH, "ib.write_bw.fleet")
# what a node shows about its own HCA: a failure of one of these on the HCA of the pair
SELF_CHECKS = frozenset(
    {"ib.port", "ib.port.state", "ib.port.rate", "ib.port.link_layer", "ib.duplicate"}
)


def pair_peers(
    bundle: Path, nodes: Iterable[str], prefix: str = perftest_kind("")
) -> dict[str, dict[str, Peer]]:
    """The partner of each node's ib_write_bw outputs, as the collector recorded it in the
    node's meta.json (``perftest-<hca>``: ``peer``, ``peer_hca``; ``prefix``
    ``perftest.lat.``: its ib_write_lat outputs); nodes and HCAs without a readable record are
    left out."""
    out: dict[str, dict[str, Peer]] = {}
    for node in nodes:
        meta, _ = read_node_meta(bundle, node)
        probes = meta.get("probes") if meta is not None else None
        if not isinstance(probes, dict):
            continue
        for kind, record in probes.items():
            if not isinstance(kind, str) or not kind.startswith(prefix):
                continue
            if not isinstance(record, dict):
                continue
            peer, peer_hca = record.get("peer"), record.get("peer_hca")
            if isinstance(peer, str) and isinstance(peer_hca, str) and peer and peer_hca:
                out.setdefault(node, {})[kind[len(prefix) :]] = Peer(peer, peer_hca)
    return out


def _on_hca(result: CheckResult, hca: str) -> bool:
    """Whether ``result`` is about the adapter port ``hca`` (``mlx5_0``: ``mlx5_0/1`` too;
    ``mlx4_0:2``: ``mlx4_0/2``)."""
    subject = result.subject or ""
    device, port = split_port(hca)
    if device != hca:
        return subject in (hca, f"{device}/{port}")
    return subject == hca or subject.startswith(f"{hca}/")


def self_evidence(results: Sequence[CheckResult], hca: str) -> CheckResult | None:
    """The first failure a node shows about its own HCA ``hca`` (or about being reached)."""
    for r in results:
        if r.verdict is not Verdict.FAIL:
            continue
        if r.check == "node.reachable" or (r.check in SELF_CHECKS and _on_hca(r, hca)):
            return r
    return None


def _said(r: CheckResult) -> str:
    where = f" {r.subject}" if r.subject else ""
    return f"{r.check}{where}: {r.message}"


def _passed_with_other(
    results: Sequence[CheckResult], peers: Mapping[str, Peer], other: str, check: str
) -> str | None:
    """A node (not ``other``) this node's ``check`` (ib.write_bw, ib.write_lat) passed with in
    this run, or None."""
    for r in results:
        if r.check != check or r.verdict is not Verdict.OK or r.subject is None:
            continue
        peer = peers.get(r.subject)
        if peer is not None and peer.node != other:
            return peer.node
    return None


def _threshold_failure(r: CheckResult, check: str) -> bool:
    """A pair result of ``check`` that failed its threshold: a bandwidth below its floor, a
    latency above its limit (not a number no link can carry: a lie)."""
    if r.check != check or r.verdict is not Verdict.FAIL or r.subject is None:
        return False
    if not isinstance(r.measured, int | float) or not isinstance(r.expected, int | float):
        return False
    return r.measured > r.expected if check == LATENCY else r.measured < r.expected


def _verdict_for(
    node: str,
    hca: str,
    peer: Peer,
    per_node: Mapping[str, Sequence[CheckResult]],
    peers: Peers,
    check: str = BANDWIDTH,
) -> tuple[Verdict, str] | None:
    """The pair result of ``node``'s ``hca`` with ``peer``: (verdict, what decided it), or
    None to leave it as it is (the FAIL is the node's)."""
    mine = per_node[node]
    theirs = per_node.get(peer.node)
    if theirs is None or peer.node == node:
        return None  # a partner outside the run (known good) or a loopback: the node's own
    if self_evidence(mine, hca) is not None:
        return None
    evidence = self_evidence(theirs, peer.hca)
    if evidence is not None:
        return (
            Verdict.WARN,
            f"pair with {peer.node} failed; {peer.node}'s {_said(evidence)} "
            f"({peer.node}'s own evidence): not charged to {node}",
        )
    mine_ok = _passed_with_other(mine, peers.get(node, {}), peer.node, check)
    theirs_ok = _passed_with_other(theirs, peers.get(peer.node, {}), node, check)
    if theirs_ok and not mine_ok:
        return None  # the partner passed with another node, this node with none
    if mine_ok and not theirs_ok:
        return (
            Verdict.WARN,
            f"pair with {peer.node} failed; {node} passed with {mine_ok}: "
            f"{peer.node} is the suspect",
        )
    also = (
        f"both passed with other nodes ({mine_ok}, {theirs_ok})"
        if mine_ok and theirs_ok
        else "no self-evidence on either side and no other pair to compare"
    )
    return (
        Verdict.WARN,
        f"pair with {peer.node} failed; which side is at fault cannot be decided ({also}): "
        "not drained; run again with a third node",
    )


def assign_blame(
    per_node: MutableMapping[str, list[CheckResult]],
    peers: Peers,
    lat_peers: Peers | None = None,
) -> None:
    """Charge each failed ib_write_bw pair (and ib_write_lat pair: ``lat_peers``) to the side
    its evidence shows, and name the causes gpuctl can see (module docstring); changes
    ``per_node``'s lists in place."""
    _charge(per_node, peers, BANDWIDTH, PAIR_CHECKS)
    _charge(per_node, lat_peers or {}, LATENCY, (LATENCY,))
    name_causes(per_node)


def _charge(
    per_node: MutableMapping[str, list[CheckResult]],
    peers: Peers,
    check: str,
    follow: tuple[str, ...],
) -> None:
    """:func:`assign_blame` for one pair check; ``follow``: the checks whose verdict on the
    same HCA follows the decision (the check and its fleet-relative result)."""
    decided: dict[tuple[str, str], tuple[Verdict, str]] = {}
    for node, results in per_node.items():
        for r in results:
            if not _threshold_failure(r, check):
                continue
            assert r.subject is not None  # noqa: S101 - _threshold_failure checks it
            peer = peers.get(node, {}).get(r.subject)
            if peer is None:
                continue
            outcome = _verdict_for(node, r.subject, peer, per_node, peers, check)
            if outcome is not None:
                decided[(node, r.subject)] = outcome
    for node, results in per_node.items():
        own = peers.get(node, {})
        for i, r in enumerate(results):
            if r.check not in follow or r.subject is None:
                continue
            peer = own.get(r.subject)
            change = decided.get((node, r.subject))
            if change is not None and r.verdict is Verdict.FAIL:
                verdict, why = change
                r = dataclasses.replace(r, verdict=verdict, message=f"{r.message}; {why}")
            if peer is not None and r.check == check:
                r = with_partner(r, peer.node, peer.hca)
            results[i] = r


def name_causes(per_node: MutableMapping[str, list[CheckResult]]) -> None:
    """A failure whose cause the node shows says it: Fabric Manager of another version than
    the driver fails the GPUs' fabric state and the service."""
    for results in per_node.values():
        cause = next(
            (
                r
                for r in results
                if r.check == "fabricmanager.version" and r.verdict is Verdict.FAIL
            ),
            None,
        )
        if cause is None:
            continue
        for i, r in enumerate(results):
            if r.check in ("gpu.fabric", "fabricmanager.active") and r.verdict is Verdict.FAIL:
                results[i] = dataclasses.replace(
                    r, message=f"{r.message}; cause: {cause.message} (fabricmanager.version)"
                )
