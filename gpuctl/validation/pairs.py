"""Pairing nodes for ib_write_bw: rounds in which no node runs two tests at once.

Pure functions (no I/O). The circle method (round-robin tournament scheduling) gives, for n
nodes, n-1 rounds (n even) in which every node meets every other node exactly once; with an
odd count a placeholder joins and its partner sits the round out. gpuctl runs only as many of
those rounds as it takes for every node to be tested at least once (one round for an even
count, two for an odd one), unless asked for more.

A pair is ``(server, client)``: ib_write_bw's server runs on the first node, the client on the
second, pointing at the server's address.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

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
