"""GPU nodes: the driver, its devices and persistence daemon, Fabric Manager, NCCL and
nccl-tests, DCGM (roles nvidia_driver, fabric_manager, nccl, dcgm)."""

# ruff: noqa: S101 - pytest test module: assert is how it reports

from __future__ import annotations

import pytest

from gpuctl.acceptance import expect
from gpuctl.acceptance.plugin import (
    Node,
    assert_packages,
    assert_services,
    fail,
    not_applicable,
)
from gpuctl.validation.parsing import parse

pytestmark = pytest.mark.applies_to("gpu")


def test_driver_packages_pinned_and_held(node: Node) -> None:
    specs = node.expected(expect.driver_packages, node.vars, node.family)
    assert_packages(node, "NVIDIA driver packages", specs)


def test_driver_loaded_at_pinned_version(node: Node) -> None:
    """nvidia-smi answers, every GPU on the pinned driver, the group's count and model."""
    want = node.expected(expect.driver_version, node.vars)
    gpu = node.expected(expect.gpu_spec, node.vars)
    out = node.check_output("nvidia-smi", "--query-gpu=index,driver_version,name", "--format=csv")
    parsed = parse("smi-csv", out)
    if not parsed.recognised or parsed.problems:
        fail(f"{node.name}: nvidia-smi output not understood: {parsed.problems}\n{out}")
    rows = parsed.data["values"]
    drivers = sorted({str(r.get("driver_version")) for r in rows})
    names = sorted({str(r.get("name")) for r in rows})
    assert drivers == [want], f"{node.name}: loaded driver {drivers}, pinned {want}"
    assert len(rows) == gpu["count"], f"{node.name}: {len(rows)} GPUs, expected {gpu['count']}"
    product = gpu.get("product_name")
    if product:
        assert names == [product], f"{node.name}: GPUs {names}, expected {product}"


def test_device_nodes(node: Node) -> None:
    """/dev/nvidia0..N-1 and /dev/nvidiactl are character devices."""
    gpu = node.expected(expect.gpu_spec, node.vars)
    paths = [f"/dev/nvidia{i}" for i in range(int(gpu["count"]))] + ["/dev/nvidiactl"]
    problems = []
    for path in paths:
        found = node.stat(path)
        if found is None:
            problems.append(f"{path} is missing")
        elif found[3] != "character special file":
            problems.append(f"{path} is a {found[3]}, not a character device")
    assert not problems, f"{node.name}: " + "; ".join(problems)


def test_persistenced_active(node: Node) -> None:
    if not node.expected(expect.persistenced_enabled, node.vars):
        not_applicable("nvidia_driver_persistenced is false")
    assert_services(node, ["nvidia-persistenced"])


def _fabric_manager_node(node: Node) -> None:
    if "nvswitch" not in node.groups:
        not_applicable(f"{node.name} has no NVSwitch (not in group nvswitch)")
    if not node.expected(expect.fabric_manager_enabled, node.vars):
        not_applicable(f"fabric_manager_enabled is false for {node.name}")


def test_fabric_manager_at_driver_version(node: Node) -> None:
    """Fabric Manager packages at exactly the driver's version, held."""
    _fabric_manager_node(node)
    fm = node.expected(expect.fabric_manager_version, node.vars)
    driver = node.expected(expect.driver_version, node.vars)
    assert fm == driver, (
        f"rendered fabric_manager_version {fm} differs from nvidia_driver_version {driver}"
    )
    specs = node.expected(expect.fabric_manager_packages, node.vars, node.family)
    assert_packages(node, "Fabric Manager packages", specs)


def test_fabric_manager_binary_version(node: Node) -> None:
    """nv-fabricmanager itself reports the driver's version."""
    _fabric_manager_node(node)
    driver = node.expected(expect.driver_version, node.vars)
    out = node.check_output("nv-fabricmanager", "--version")
    reported = expect.fabric_manager_reported_version(out)
    if reported is None:
        fail(f"{node.name}: no version in `nv-fabricmanager --version`: {out.strip()!r}")
    assert reported == driver, f"{node.name}: Fabric Manager {reported}, driver {driver}"


def test_fabric_manager_active(node: Node) -> None:
    _fabric_manager_node(node)
    assert_services(node, ["nvidia-fabricmanager"])


def test_nccl_packages_pinned_and_held(node: Node) -> None:
    specs = node.expected(expect.nccl_packages, node.vars, node.family)
    assert_packages(node, "NCCL packages", specs)


def test_nccl_tests_built(node: Node) -> None:
    """/opt/nccl-tests/current -> the pinned release, its all_reduce_perf, linked on PATH."""
    tests = node.expected(expect.nccl_tests, node.vars)
    if not tests.enabled:
        not_applicable("nccl_tests_enabled is false")
    problems = []
    target = node.run("readlink", tests.current)
    if target.rc != 0:
        problems.append(f"{tests.current} is not a symbolic link ({target.describe()})")
    elif target.stdout.strip().rstrip("/") != tests.prefix:
        problems.append(f"{tests.current} points at {target.stdout.strip()}, not {tests.prefix}")
    binary = f"{tests.current}/build/{tests.binary}"
    if node.run("test", "-f", binary, "-a", "-x", binary).rc != 0:
        problems.append(f"{binary} is not an executable file")
    on_path = f"{tests.bin_dir}/{tests.binary}"
    if node.run("test", "-x", on_path).rc != 0:
        problems.append(f"{on_path} is missing")
    assert not problems, f"{node.name}: " + "; ".join(problems)


def test_dcgm_packages_pinned_and_held(node: Node) -> None:
    specs = node.expected(expect.dcgm_packages, node.vars, node.family)
    assert_packages(node, "DCGM packages", specs)


def test_dcgm_active(node: Node) -> None:
    assert_services(node, ["nvidia-dcgm"])
