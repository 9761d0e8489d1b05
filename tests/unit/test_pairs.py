"""Pairing nodes for ib_write_bw: properties of the circle method and of the retest rounds."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given
from hypothesis import strategies as st

from gpuctl.validation.pairs import covered, retest, round_robin, rounds_to_cover, schedule

names = st.lists(
    st.text(alphabet="abcdefgh0123456789", min_size=1, max_size=6), unique=True, max_size=40
)


def _no_node_twice(rounds: list[list[tuple[str, str]]]) -> None:
    for rnd in rounds:
        nodes = [n for pair in rnd for n in pair]
        assert len(nodes) == len(set(nodes)), rnd
        assert all(a != b for a, b in rnd)


@given(names)
def test_round_robin_meets_every_pair_exactly_once_and_no_node_twice_a_round(
    nodes: list[str],
) -> None:
    rounds = round_robin(nodes)
    _no_node_twice(rounds)
    met = [frozenset(pair) for rnd in rounds for pair in rnd]
    assert len(met) == len(set(met))
    assert set(met) == {frozenset(p) for p in combinations(nodes, 2)}
    n = len(nodes)
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)


@given(names)
def test_the_default_schedule_tests_every_node_in_one_or_two_rounds(nodes: list[str]) -> None:
    rounds = schedule(nodes)
    _no_node_twice(rounds)
    if len(nodes) >= 2:
        assert covered(rounds) == set(nodes)
    else:
        assert rounds == []
    assert len(rounds) == rounds_to_cover(len(nodes))
    # with an odd count exactly one node sits out each round
    for rnd in rounds:
        assert len(rnd) == len(nodes) // 2


@given(names, st.integers(min_value=0, max_value=50))
def test_more_rounds_are_the_next_rounds_of_the_same_tournament(
    nodes: list[str], count: int
) -> None:
    rounds = schedule(nodes, count)
    assert rounds == round_robin(nodes)[:count]
    _no_node_twice(rounds)


@given(names)
def test_every_node_is_server_in_about_half_its_pairs(nodes: list[str]) -> None:
    served = dict.fromkeys(nodes, 0)
    met = dict.fromkeys(nodes, 0)
    for rnd in round_robin(nodes):
        for server, client in rnd:
            served[server] += 1
            met[server] += 1
            met[client] += 1
    assert all(abs(served[n] - met[n] / 2) <= 1 for n in nodes), served


def test_two_and_three_nodes() -> None:
    assert schedule(["a", "b"]) == [[("a", "b")]]
    rounds = schedule(["a", "b", "c"])
    assert len(rounds) == 2
    assert covered(rounds) == {"a", "b", "c"}


pairs_of = st.sets(
    st.tuples(st.sampled_from("abcdefgh"), st.sampled_from("abcdefgh"))
    .filter(lambda p: p[0] != p[1])
    .map(frozenset),
    max_size=20,
)


@given(names, names, pairs_of)
def test_retest_pairs_each_suspect_with_a_fresh_good_node(
    suspects: list[str], good: list[str], tested: set[frozenset[str]]
) -> None:
    rounds = retest(suspects, good, tested)
    _no_node_twice(rounds)
    assert all(frozenset(p) not in tested for rnd in rounds for p in rnd)
    wanted = [s for s in dict.fromkeys(suspects) if s not in good]
    if good:
        clients = [c for rnd in rounds for _, c in rnd]
        assert len(clients) == len(set(clients))  # each suspect at most once
        assert all(s in good for rnd in rounds for s, _ in rnd)
        # every suspect that has a good node it has not been tested with gets a retest
        for s in wanted:
            if any(frozenset((g, s)) not in tested for g in good if g != s):
                assert s in clients, (s, rounds)
    else:
        # nobody passed yet: suspects meet each other, once, in one round
        assert len(rounds) <= 1
        assert all(a in wanted and b in wanted for rnd in rounds for a, b in rnd)


def test_retest_without_a_good_node_pairs_suspects_that_have_not_met() -> None:
    # three nodes, c is bad: rounds (b, c) and (a, c) failed; a and b never met
    tested = {frozenset("bc"), frozenset("ac")}
    assert retest(["a", "b", "c"], [], tested) == [[("a", "b")]]
    # a and b passed: c is tested against one of them (not again with one it met)
    assert retest(["c"], ["a", "b"], tested | {frozenset("ab")}) == []
    assert retest(["c"], ["a", "b", "d"], tested) == [[("d", "c")]]


# ------------------------------------------------------------------------------------------
# Partners outside --limit, and the loopback


def test_a_partner_is_in_service_not_excluded_and_did_not_fail_its_last_validation() -> None:
    from gpuctl.slurm import SlurmNode
    from gpuctl.validation.pairs import partner_refusal

    idle = SlurmNode(frozenset({"IDLE"}))
    assert partner_refusal("gpu003", idle, None) is None  # never validated, in service
    assert partner_refusal("gpu003", idle, True) is None
    assert partner_refusal("gpu003", idle, False) == "failed its last validation"
    assert partner_refusal("gpu003", idle, True, {"gpu003"}) == "in the same rollout batch"
    assert partner_refusal("gpu003", None, True) == "not in scontrol show node"
    ours = SlurmNode(frozenset({"IDLE", "DRAIN"}), "gpuctl: gpu.count 7 GPUs")
    assert partner_refusal("gpu003", ours, True) == "drained (gpuctl: gpu.count 7 GPUs)"
    theirs = SlurmNode(frozenset({"IDLE", "DRAIN"}), "maintenance")
    assert partner_refusal("gpu003", theirs, True) == "drained (maintenance)"
    for flags in ({"DOWN"}, {"IDLE", "*"}, {"IDLE", "NOT_RESPONDING"}, {"MAINT"}, {"IDLE", "~"}):
        why = partner_refusal("gpu003", SlurmNode(frozenset(flags)), True)
        assert why is not None, flags


def test_idle_partners_are_ranked_first() -> None:
    from gpuctl.slurm import SlurmNode
    from gpuctl.validation.pairs import rank_partners

    slurm = {
        "a": SlurmNode(frozenset({"MIXED"})),
        "b": SlurmNode(frozenset({"IDLE"})),
        "c": SlurmNode(frozenset({"ALLOCATED"})),
        "d": SlurmNode(frozenset({"IDLE"})),
    }
    assert rank_partners(["a", "b", "c", "d"], slurm) == ["b", "d", "a", "c"]
    # a node whose last validation passed comes before one gpuctl has not validated
    assert rank_partners(["a", "b", "c", "d"], slurm, {"c": True, "d": True}) == [
        "d",
        "c",
        "b",
        "a",
    ]


@given(names, names)
def test_partner_rounds_test_each_node_once_no_partner_twice_a_round(
    nodes: list[str], partners: list[str]
) -> None:
    from gpuctl.validation.pairs import partner_rounds

    rounds = partner_rounds(nodes, partners)
    _no_node_twice(rounds)
    good = [p for p in partners if p not in nodes]
    if not good:
        assert rounds == []
        return
    assert sorted(c for rnd in rounds for _, c in rnd) == sorted(nodes)
    assert all(s in good for rnd in rounds for s, _ in rnd)


def test_loopback_pairs_each_hca_with_the_one_half_the_count_away() -> None:
    from gpuctl.validation.pairs import loopback_hcas

    eight = [f"mlx5_{i}" for i in range(8)]
    got = loopback_hcas(eight)
    assert got[:4] == [("mlx5_4", "mlx5_0"), ("mlx5_5", "mlx5_1"), ("mlx5_6", "mlx5_2"),
                       ("mlx5_7", "mlx5_3")]  # fmt: skip
    assert got[4] == ("mlx5_0", "mlx5_4")
    assert sorted(c for _, c in got) == eight  # every HCA is a client once
    assert all(s != c for s, c in got)
    assert loopback_hcas(["mlx5_0", "mlx5_1"]) == [("mlx5_1", "mlx5_0"), ("mlx5_0", "mlx5_1")]
    assert loopback_hcas(["mlx5_0"]) == [("mlx5_0", "mlx5_0")]  # one HCA serves itself
