"""gpuctl.slurm: the one Slurm model that validate's --drain-failed, node-check, the multi-node
run and the rollout share.

Before the model there were three copies that disagreed; each test marked "disagreed" pins one
such case, and says which caller decided otherwise before (its test would have failed there).
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import ROOT

from gpuctl.rollout.backend import BackendError
from gpuctl.slurm import (
    DOWN,
    DRAINED,
    HELD,
    NOT_RESPONDING,
    NotUnderstood,
    Owner,
    SlurmNode,
    read_nodes,
    show_argv,
    state_words,
    update_argv,
)
from gpuctl.validation import multinode, multinode_collect, nodecheck
from gpuctl.validation import slurm as validate_slurm
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict

FIXTURE = (
    ROOT
    / "tests"
    / "fixtures"
    / "slurm"
    / "scontrol-show-node-idle-drain-gres-count-lower-rtx3090.txt"
)
NODE = "gpu002"


def _record(state: str, reason: str | None = None) -> dict[str, Any]:
    """A `scontrol show node` record as gpuctl's parser returns it for ``State=<state>``."""
    text = FIXTURE.read_text(encoding="utf-8").split("# ---\n", 1)[1]
    text = text.replace("yigou-dev-102-68", NODE).replace("State=IDLE+DRAIN", f"State={state}")
    record = read_nodes(text)[NODE]
    record["reason"] = reason
    return record


def _failing() -> NodeReport:
    return NodeReport(NODE, (CheckResult("xid", NODE, Verdict.FAIL, "Xid 79 on GPU3"),))


def _passing() -> NodeReport:
    return NodeReport(NODE, (CheckResult("xid", NODE, Verdict.OK, "none"),))


# ------------------------------------------------------------------------------------------
# The state words


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("IDLE", ("IDLE",)),
        ("IDLE+DRAIN", ("IDLE", "DRAIN")),
        ("IDLE*+DRAIN", ("IDLE", "DRAIN", "*")),
        ("DOWN*", ("DOWN", "*")),
        ("idle~", ("idle", "~")),
        ("MIXED+COMPLETING+NOT_RESPONDING", ("MIXED", "COMPLETING", "NOT_RESPONDING")),
        ("", ()),
    ],
)
def test_state_words_split_on_plus_and_the_short_forms_symbols(
    text: str, words: tuple[str, ...]
) -> None:
    assert state_words(text) == words


def test_the_word_sets_do_not_overlap() -> None:
    assert not DRAINED & DOWN
    assert not DRAINED & HELD
    assert not DOWN & HELD
    assert NOT_RESPONDING <= DOWN


def test_a_node_from_the_parser_and_a_node_from_words_agree() -> None:
    parsed = SlurmNode.from_record(_record("IDLE*+DRAIN", "maintenance"))
    assert parsed == SlurmNode(frozenset({"IDLE*", "DRAIN"}), "maintenance")
    assert parsed.flags == frozenset({"IDLE", "DRAIN", "*"})
    assert parsed.text == "IDLE+DRAIN+*"  # as printed, for node-check and multinode
    assert parsed.state == "*+DRAIN+IDLE"  # sorted, for the rollout's messages
    assert parsed.is_drained
    assert parsed.is_down
    assert not parsed.responding


def test_lower_case_words_mean_the_same() -> None:
    node = SlurmNode(frozenset({"idle", "drained"}))
    assert node.flags == frozenset({"IDLE", "DRAINED"})
    assert node.is_drained


# ------------------------------------------------------------------------------------------
# Down: one definition for every caller


def _callers(state: str, reason: str | None = None) -> dict[str, Any]:
    """How each caller treats a node in ``state``."""
    record = _record(state, reason)
    failing = ValidationReport("lab", "quick", (_failing(),))
    return {
        "multinode": multinode.slurm_exclusion(record),
        "node-check fails": nodecheck.slurm_plan(_failing(), record),
        "node-check passes": nodecheck.slurm_plan(_passing(), record),
        "rollout": SlurmNode.from_record(record).hold_reason(),
        "validate fails": validate_slurm.plan(failing, {NODE: record}),
    }


@pytest.mark.parametrize(
    "state",
    [
        # disagreed: node-check drained it (DOWN was only DOWN, FAIL, FAILING there)
        "IDLE+NOT_RESPONDING",
        "IDLE*",
        # disagreed: the rollout updated it (not held there), node-check drained it
        "FUTURE",
        "UNKNOWN",
        # disagreed: multinode measured it, node-check drained it
        "IDLE+POWERED_DOWN",
        # disagreed: only the rollout knew POWERED_DOWN, none the symbol
        "IDLE~",
        # disagreed: in service for all three (acceptance's test_slurm_node_state fails it)
        "IDLE+INVALID_REG",
        # disagreed: the rollout said "not in service", the others "down"
        "IDLE+FAIL",
        "DOWN",
    ],
)
def test_a_down_node_is_down_for_every_caller(state: str) -> None:
    node = SlurmNode.from_record(_record(state))
    assert node.is_down
    assert not node.is_drained
    got = _callers(state)
    verdict, message = got["multinode"]
    assert verdict is Verdict.UNKNOWN
    assert message == f"not measured: Slurm state {node.text}"
    assert got["node-check fails"].action == "none"
    assert got["node-check fails"].detail == f"left as it is: already {node.text} (no reason)"
    assert got["node-check passes"].action == "none"
    assert got["node-check passes"].detail.startswith(f"left {node.text}: not drained")
    assert got["rollout"] == f"down ({node.state})"


@pytest.mark.parametrize("state", ["IDLE", "MIXED", "ALLOCATED", "IDLE+COMPLETING"])
def test_a_node_in_service_is_in_service_for_every_caller(state: str) -> None:
    got = _callers(state)
    assert got["multinode"] is None
    assert got["node-check fails"].action == "drain"
    assert got["node-check passes"].detail == "in service"
    assert got["rollout"] is None
    assert [a.action for a in got["validate fails"]] == ["drain"]


def test_down_and_drained_is_both_for_every_caller() -> None:
    got = _callers("DOWN+DRAIN", "bad psu")
    assert got["multinode"] == (Verdict.UNKNOWN, "not measured: Slurm state DOWN+DRAIN (bad psu)")
    assert got["node-check fails"].detail == "left as it is: already DOWN+DRAIN (bad psu)"
    assert got["rollout"] == "drained by someone else: bad psu"
    assert [a.detail for a in got["validate fails"]] == [
        "left alone: drained by someone else (bad psu)"
    ]


def test_a_state_still_joined_by_plus_is_split_for_every_caller() -> None:
    # disagreed: validate and multinode read `state` as one word, the rollout split it
    record = {"state": "IDLE+DRAIN", "state_flags": [], "reason": "maintenance"}
    assert multinode.slurm_exclusion(record) == (
        Verdict.WARN,
        "not in the multi-node run: drained in Slurm (maintenance)",
    )
    assert nodecheck.slurm_plan(_failing(), record).action == "none"
    failing = ValidationReport("lab", "quick", (_failing(),))
    assert [a.action for a in validate_slurm.plan(failing, {NODE: record})] == ["none"]
    assert SlurmNode.from_record(record).is_drained


def test_a_state_word_with_its_symbol_is_split_for_every_caller() -> None:
    # disagreed: "IDLE*" as one word was in service for the rollout (it split only on "+")
    record: dict[str, Any] = {"state": "IDLE*", "state_flags": [], "reason": None}
    assert SlurmNode.from_record(record).is_down
    assert not SlurmNode.from_record(record).responding
    result = multinode.slurm_exclusion(record)
    assert result is not None
    assert result[0] is Verdict.UNKNOWN


def test_other_administrative_states_hold_the_node_but_are_not_down() -> None:
    for state in ("IDLE+MAINT", "IDLE+REBOOT_REQUESTED", "IDLE+POWERING_UP", "IDLE#"):
        node = SlurmNode.from_record(_record(state))
        assert node.is_held
        assert not node.is_down
        assert node.hold_reason() == f"not in service ({node.state})"


def test_only_not_responding_is_what_the_rollout_waits_out() -> None:
    assert SlurmNode(frozenset({"IDLE", "NOT_RESPONDING"})).only_not_responding
    assert not SlurmNode(frozenset({"IDLE", "DRAIN", "NOT_RESPONDING"})).only_not_responding
    assert not SlurmNode(frozenset({"DOWN", "*"})).only_not_responding
    assert not SlurmNode(frozenset({"IDLE"})).only_not_responding


# ------------------------------------------------------------------------------------------
# Resume only what you drained


def test_each_tool_owns_only_its_own_drains() -> None:
    validate = validate_slurm.OWNER
    node_check = nodecheck.OWNER
    rollout = Owner("gpuctl rollout: nic-firmware 28.41.1000", exact=True)
    reasons = {
        "gpuctl: xid 79": validate,
        "gpuctl node-check: xid 79": node_check,
        "gpuctl rollout: nic-firmware 28.41.1000": rollout,
    }
    for reason, owner in reasons.items():
        node = SlurmNode(frozenset({"IDLE", "DRAIN"}), reason)
        assert [o for o in (validate, node_check, rollout) if node.drained_by(o)] == [owner]
    # a rollout owns exactly its reason: not another version's, not an operator's edit of it
    assert not SlurmNode(
        frozenset({"IDLE", "DRAIN"}), "gpuctl rollout: nic-firmware 28.41.1000 (checked)"
    ).drained_by(rollout)
    for owner in (validate, node_check, rollout):
        assert not SlurmNode(frozenset({"IDLE", "DRAIN"}), "maintenance").drained_by(owner)
        assert not SlurmNode(frozenset({"IDLE", "DRAIN"})).drained_by(owner)
        # not drained (resumed by someone): nothing to resume, whatever the reason says
        assert not SlurmNode(frozenset({"IDLE"}), "gpuctl: xid 79").drained_by(validate)


def test_a_passing_node_is_resumed_by_the_tool_that_drained_it_only() -> None:
    passing = ValidationReport("lab", "quick", (_passing(),))
    ours = _record("IDLE+DRAIN", "gpuctl: xid 79")
    theirs = _record("IDLE+DRAIN", "gpuctl node-check: xid 79")
    assert [a.action for a in validate_slurm.plan(passing, {NODE: ours})] == ["resume"]
    assert [a.action for a in validate_slurm.plan(passing, {NODE: theirs})] == ["none"]
    assert nodecheck.slurm_plan(_passing(), theirs).action == "resume"
    assert nodecheck.slurm_plan(_passing(), ours).action == "none"


# ------------------------------------------------------------------------------------------
# The scontrol argv


def test_one_update_argv() -> None:
    assert update_argv("gpu002", "drain", "gpuctl: x") == (
        "scontrol",
        "update",
        "nodename=gpu002",
        "state=drain",
        "reason=gpuctl: x",
    )
    assert update_argv("gpu002", "resume") == (
        "scontrol",
        "update",
        "nodename=gpu002",
        "state=resume",
    )
    assert show_argv() == ("scontrol", "show", "node")
    assert show_argv("gpu002") == ("scontrol", "show", "node", "gpu002")
    with pytest.raises(ValueError, match="not a host name"):
        update_argv("gpu002 state=resume", "drain", "x")
    with pytest.raises(ValueError, match="needs a reason"):
        update_argv("gpu002", "drain", "")


def test_the_rollout_never_hands_scontrol_a_name_that_is_not_a_host_name() -> None:
    # disagreed: the rollout built its own argv and passed any name through
    from gpuctl.rollout.cluster import ClusterBackend

    backend = object.__new__(ClusterBackend)  # no transport: the argv is refused first
    with pytest.raises(BackendError, match="not a host name"):
        backend.drain("gpu002 state=resume", "gpuctl rollout: x 1")
    with pytest.raises(BackendError, match="not a host name"):
        backend.resume("gpu002 x=y")


def test_output_that_is_not_a_node_record_is_not_understood() -> None:
    with pytest.raises(NotUnderstood):
        read_nodes("slurm_load_node error: Unable to contact slurm controller\n")
    why = multinode_collect.slurm_records("garbage\n")
    assert isinstance(why, str)
    assert why.startswith("scontrol show node: output not understood (")
