"""Slurm: slurmctld on the controller, slurmd on compute nodes, the rendered configuration in
/etc/slurm, nodes registered and usable (roles slurm_controller, slurm_node)."""

# ruff: noqa: S101 - pytest test module: assert is how it reports

from __future__ import annotations

import difflib

import pytest

from gpuctl.acceptance import expect
from gpuctl.acceptance.plugin import Node, assert_packages, assert_services, fail
from gpuctl.slurm import SlurmNode, show_argv
from gpuctl.validation.parsing import parse


@pytest.mark.applies_to("role_controller")
def test_slurm_controller_packages(node: Node) -> None:
    specs = node.expected(expect.slurm_packages, node.vars, node.family, "controller")
    assert_packages(node, "Slurm controller packages", specs)


@pytest.mark.applies_to("role_controller")
def test_slurmctld_active(node: Node) -> None:
    assert_services(node, ["slurmctld"])


@pytest.mark.applies_to("role_controller")
def test_slurmctld_answers(node: Node) -> None:
    out = node.check_output("scontrol", "ping")
    assert " is UP" in out, f"{node.name}: scontrol ping: {out.strip()}"


@pytest.mark.applies_to("role_compute")
def test_slurm_node_packages(node: Node) -> None:
    specs = node.expected(expect.slurm_packages, node.vars, node.family, "compute")
    assert_packages(node, "Slurm node packages", specs)


@pytest.mark.applies_to("role_compute")
def test_slurmd_active(node: Node) -> None:
    assert_services(node, ["slurmd"])


@pytest.mark.applies_to("role_compute")
def test_slurm_reaches_controller(node: Node) -> None:
    """From the node, the controller answers (munge authenticates across nodes)."""
    out = node.check_output("scontrol", "ping")
    assert " is UP" in out, f"{node.name}: scontrol ping: {out.strip()}"


@pytest.mark.applies_to("role_compute")
def test_slurm_node_state(node: Node) -> None:
    """The controller has the node in service, with the group's GPUs as gres."""
    out = node.check_output(*show_argv(node.name))
    parsed = parse("scontrol-node", out)
    records = [n for n in parsed.data.get("nodes", []) if n.get("NodeName") == node.name]
    if not parsed.recognised or not records:
        fail(f"{node.name}: scontrol show node not understood: {parsed.problems}\n{out}")
    record = records[0]
    state, flags = record.get("state"), set(record.get("state_flags") or [])
    slurm = SlurmNode.from_record(record)
    bad = slurm.is_down or slurm.is_drained  # gpuctl.slurm: the one meaning of these states
    reason = f", reason: {record.get('reason')}" if record.get("reason") else ""
    assert state, f"{node.name}: no Slurm state in scontrol show node"
    assert not bad, f"{node.name}: Slurm state {state} {sorted(flags)}{reason}"
    if "gpu" in node.groups:
        gpu = node.expected(expect.gpu_spec, node.vars)
        assert record.get("gres_gpus") == gpu["count"], (
            f"{node.name}: Slurm gres {record.get('gres')}, expected {gpu['count']} GPUs"
        )


@pytest.mark.applies_to("role_controller", "role_compute")
@pytest.mark.parametrize("name", expect.SLURM_CONFIG_FILES)
def test_slurm_config_matches_render(node: Node, name: str) -> None:
    """/etc/slurm/<name> is byte for byte the rendered file (absent where none is rendered)."""
    rendered = node.rendered / "slurm" / name
    path = f"{expect.SLURM_CONF_DIR}/{name}"
    if not (node.rendered / "slurm" / "slurm.conf").is_file():
        fail(f"no rendered slurm/slurm.conf beside the inventory ({node.rendered})")
    if not rendered.is_file():
        assert not node.exists(path), f"{node.name}: {path} exists, but gpuctl renders none"
        return
    want = rendered.read_text(encoding="utf-8")
    result = node.run("cat", path)
    if result.rc != 0:
        fail(f"{node.name}: {path}: {result.describe()}")
    if result.stdout != want:
        diff = difflib.unified_diff(
            want.splitlines(), result.stdout.splitlines(), "rendered", path, lineterm="", n=1
        )
        shown = "\n".join(list(diff)[:30])
        fail(f"{node.name}: {path} differs from the rendered {name}:\n{shown}")
