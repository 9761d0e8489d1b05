"""Pairing nodes for ib_write_bw: rounds in which no node runs two tests at once.

Pure functions (no I/O). The circle method (round-robin tournament scheduling) gives, for n
nodes, n-1 rounds (n even) in which every node meets every other node exactly once; with an
odd count a placeholder joins and its partner sits the round out. gpuctl runs only as many of
those rounds as it takes for every node to be tested at least once (one round for an even
count, two for an odd one), unless asked for more.

A pair is ``(server, client)``: ib_write_bw's server runs on the first node, the client on the
second, pointing at the server's address.

Partners (``validate --limit``): a node under test with no other node of its fabric in the run
is measured against a partner, a node of the same fabric outside the limit that is known to be
good (:func:`partner_refusal` says the rule), as the client of a pair whose server is the
partner (:func:`partner_rounds`); the partner is not judged. Where there is none, the node is
measured against itself (:func:`loopback_hcas`: server on one of its HCAs, client on another,
as AzureHPC's health checks pair ``mlx5_ib<i>`` with ``mlx5_ib<i+4>``; a node with one HCA runs
both on that HCA, as their single-device test does, which proves the adapter but no cable).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from gpuctl.slurm import SlurmNode

Pair = tuple[str, str]
Round = list[Pair]


def round_robin(nodes: Sequence[str]) -> list[Round]:
    """Every round of the circle method: each unordered pair of nodes exactly once.

    ``nodes`` are distinct names. Roles alternate between rounds so that each node is server
    about as often as client.
    """
    names = list(nodes)
    if len(set(names)) != len(names):
        raise ValueError("node names must be distinct")
    if len(names) < 2:
        return []
    slots: list[str | None] = list(names)
    if len(slots) % 2:
        slots.append(None)  # the bye: its partner sits the round out
    n = len(slots)
    rounds: list[Round] = []
    for r in range(n - 1):
        pairs: Round = []
        for i in range(n // 2):
            a, b = slots[i], slots[n - 1 - i]
            if a is None or b is None:
                continue
            # Berger tables: the fixed node serves every other round, the rotating pairs
            # serve by position; every node then serves within one of half its pairs
            first = r % 2 == 0 if i == 0 else i % 2 == 1
            pairs.append((a, b) if first else (b, a))
        rounds.append(pairs)
        # keep slot 0 fixed, rotate the others one place clockwise
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def rounds_to_cover(count: int) -> int:
    """How many circle-method rounds test every one of ``count`` nodes at least once."""
    if count < 2:
        return 0
    return 1 if count % 2 == 0 else 2


def schedule(nodes: Sequence[str], rounds: int | None = None) -> list[Round]:
    """The first ``rounds`` rounds (default: just enough that every node is tested)."""
    full = round_robin(nodes)
    want = rounds_to_cover(len(nodes)) if rounds is None else max(0, rounds)
    return full[: min(want, len(full))]


def retest(
    suspects: Sequence[str], good: Sequence[str], tested: Set[frozenset[str]] = frozenset()
) -> list[Round]:
    """Rounds that test each suspect (a node whose last pair failed) again, with a partner it
    has not been tested with (``tested``: the pairs run so far).

    A failed pair does not say which of its two nodes is at fault; testing each again with a
    node known to be good does. Each suspect is the client of at most one pair, against a good
    node (rounds are added while fresh good partners are busy). With no good node yet, suspects
    that have not met are paired with each other, one round: those that pass are good nodes
    for the next call. No node appears twice in a round; no pair in ``tested`` is repeated.
    """
    good_set = set(good)
    pending = [s for s in dict.fromkeys(suspects) if s not in good_set]
    partners = list(dict.fromkeys(good))
    if not pending:
        return []
    if not partners:
        rnd: Round = []
        used: set[str] = set()
        for i, a in enumerate(pending):
            if a in used:
                continue
            for b in pending[i + 1 :]:
                if b not in used and frozenset((a, b)) not in tested:
                    rnd.append((a, b))
                    used.update((a, b))
                    break
        return [rnd] if rnd else []
    rounds: list[Round] = []
    while pending:
        rnd = []
        busy: set[str] = set()
        later: list[str] = []
        for suspect in pending:
            fresh = [g for g in partners if frozenset((g, suspect)) not in tested]
            free = [g for g in fresh if g not in busy]
            if free:
                rnd.append((free[0], suspect))
                busy.add(free[0])
            elif fresh:
                later.append(suspect)  # its fresh partners serve others this round
        if not rnd:
            break
        rounds.append(rnd)
        pending = later
    return rounds


def covered(rounds: Sequence[Round]) -> set[str]:
    """Every node that takes part in at least one pair."""
    return {node for rnd in rounds for pair in rnd for node in pair}


# ------------------------------------------------------------------------------------------
# Partners outside --limit, and the loopback where there is none


def partner_refusal(
    node: str,
    slurm: SlurmNode | None,
    last_passed: bool | None,
    exclude: Set[str] = frozenset(),
) -> str | None:
    """Why ``node`` (outside --limit, on the fabric of a node under test) cannot be its
    partner, or None when it can: it must not be in ``exclude`` (the rollout batch), must be in
    service in Slurm (a record, not drained by anyone, not down, not responding, not held) and
    must not have failed its last validation (``last_passed``: gpuctl's validation history;
    None: gpuctl has not validated it, and a node in service that nobody drained counts as
    good)."""
    if node in exclude:
        return "in the same rollout batch"
    if slurm is None:
        return "not in scontrol show node"
    if slurm.is_drained:
        return f"drained ({slurm.reason or 'no reason given'})"
    held = slurm.hold_reason()
    if held is not None:
        return held
    if last_passed is False:
        return "failed its last validation"
    return None


def rank_partners(
    nodes: Sequence[str],
    slurm: Mapping[str, SlurmNode],
    passed: Mapping[str, bool] | None = None,
) -> list[str]:
    """``nodes`` best first: those whose last validation passed (``passed``: gpuctl's
    validation history) before those gpuctl has not validated, idle ones first within each
    (no job is disturbed), else in their order."""
    record = passed or {}
    return sorted(
        nodes,
        key=lambda n: (0 if record.get(n) is True else 1, 0 if "IDLE" in slurm[n].flags else 1),
    )


def partner_rounds(nodes: Sequence[str], partners: Sequence[str]) -> list[Round]:
    """Rounds of ``(partner, node)`` pairs that test each of ``nodes`` once against one of
    ``partners`` (the server), no partner in two pairs of a round; [] without partners."""
    names = list(dict.fromkeys(nodes))
    good = list(dict.fromkeys(p for p in partners if p not in names))
    if not good:
        return []
    rounds: list[Round] = []
    for start in range(0, len(names), len(good)):
        chunk = names[start : start + len(good)]
        rounds.append([(good[i], node) for i, node in enumerate(chunk)])
    return rounds


def loopback_hcas(hcas: Sequence[str]) -> list[tuple[str, str]]:
    """``(server HCA, client HCA)`` of a node measured against itself: each HCA is the client
    once, against the HCA half the count away (AzureHPC: mlx5_ib0 with mlx5_ib4, ... on an
    8-HCA node); a lone HCA serves itself."""
    names = list(dict.fromkeys(hcas))
    n = len(names)
    if n == 1:
        return [(names[0], names[0])]
    return [(names[(i + max(1, n // 2)) % n], names[i]) for i in range(n)]
