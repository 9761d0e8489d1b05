"""Fabric nodes: the RDMA stack, its devices, nvidia-peermem where the rdma role loads it,
IPoIB addresses, opensm; the validation tools on GPU and fabric nodes (roles rdma,
validation_tools)."""

# ruff: noqa: S101 - pytest test module: assert is how it reports

from __future__ import annotations

import pytest

from gpuctl.acceptance import expect
from gpuctl.acceptance.plugin import Node, assert_packages, fail, not_applicable


@pytest.mark.applies_to("rdma")
def test_rdma_stack_packages(node: Node) -> None:
    specs = node.expected(expect.rdma_packages, node.vars, node.family)
    stack = node.expected(expect.rdma_stack, node.vars)
    assert_packages(node, f"RDMA stack ({stack})", specs)


@pytest.mark.applies_to("rdma")
def test_rdma_devices_present(node: Node) -> None:
    """Every RDMA device of the node group is there (``ibstat -l``)."""
    wanted = node.vars.get("rdma_devices")
    if not isinstance(wanted, list) or not wanted:
        fail(f"{node.name}: rdma_devices is missing from the rendered inventory")
    listed = set(node.check_output("ibstat", "-l").split())
    missing = [d for d in wanted if d not in listed]
    assert not missing, (
        f"{node.name}: RDMA devices missing: {missing} (ibstat -l: {sorted(listed)})"
    )


@pytest.mark.applies_to("rdma")
def test_nvidia_peermem_loaded(node: Node) -> None:
    """nvidia-peermem loaded and loaded at boot where the rdma role loads it: rdma_peermem on a
    GPU node with DOCA-OFED, or an inbox kernel that exports the peer memory API."""
    if not node.expected(expect.peermem_wanted, node.vars):
        not_applicable(f"rdma_peermem is off or {node.name} has no GPUs")
    stack = node.expected(expect.rdma_stack, node.vars)
    api = False
    if stack == "inbox":
        found = node.run("grep", "-qw", expect.PEER_MEMORY_SYMBOL, "/proc/kallsyms")
        if found.rc not in (0, 1):
            fail(f"{node.name}: cannot read the kernel's symbols: {found.describe()}")
        api = found.rc == 0
    if not node.expected(expect.peermem_loads, node.vars, api):
        not_applicable(
            f"inbox RDMA stack and the kernel has no peer memory API "
            f"({expect.PEER_MEMORY_SYMBOL}): GPUDirect RDMA goes through DMA-BUF"
        )
    problems = []
    if not node.exists(expect.PEERMEM_SYSFS):
        problems.append(f"nvidia-peermem is not loaded ({expect.PEERMEM_SYSFS} missing)")
    conf = node.run("cat", expect.PEERMEM_MODULES_LOAD)
    if conf.rc != 0 or "nvidia-peermem" not in conf.stdout.split():
        problems.append(f"{expect.PEERMEM_MODULES_LOAD} does not load nvidia-peermem at boot")
    assert not problems, f"{node.name}: " + "; ".join(problems)


@pytest.mark.applies_to("rdma")
def test_ipoib_addresses(node: Node) -> None:
    entries = node.vars.get("rdma_ipoib") or []
    if not entries:
        not_applicable(f"no IPoIB address for {node.name}")
    problems = []
    for entry in entries:
        device, address = str(entry["device"]), str(entry["address"])
        net = node.run("ls", f"/sys/class/infiniband/{device}/device/net")
        netdevs = net.stdout.split() if net.rc == 0 else []
        if not netdevs:
            problems.append(f"{device} has no network interface ({net.describe()})")
            continue
        shown = node.run("ip", "-o", "-4", "addr", "show", "dev", netdevs[0])
        if shown.rc != 0 or f" {address} " not in f" {shown.stdout} ":
            problems.append(f"{netdevs[0]} ({device}) does not have {address}")
    assert not problems, f"{node.name}: " + "; ".join(problems)


@pytest.mark.applies_to("rdma")
def test_opensm(node: Node) -> None:
    """opensm installed and enabled where it runs; started where an IB management device is."""
    if not node.expected(expect.opensm_enabled, node.vars):
        not_applicable(f"{node.name} runs no subnet manager")
    assert_packages(node, "subnet manager", [expect.PackageSpec("opensm")])
    umad = node.exists("/sys/class/infiniband_mad/abi_version")
    problems = node.service_problems("opensm") if umad else []
    if not umad:
        enabled = node.run("systemctl", "is-enabled", "opensm.service").stdout.strip()
        if enabled != "enabled":
            problems.append(f"opensm is not enabled ({enabled or 'unknown unit'})")
    assert not problems, f"{node.name}: " + "; ".join(problems)


@pytest.mark.applies_to("gpu", "rdma")
def test_validation_tools(node: Node) -> None:
    """The tools gpuctl's validation runs: installed, and on PATH."""
    specs = node.expected(expect.validation_tool_packages, node.vars, node.family)
    problems = node.package_problems(specs)
    for command in expect.VALIDATION_COMMANDS:
        if node.sh(f"command -v {command}").rc != 0:
            problems.append(f"{command} is not on PATH")
    assert not problems, f"{node.name}: validation tools:\n  " + "\n  ".join(problems)


@pytest.mark.applies_to("gpu")
def test_perftest_with_cuda(node: Node) -> None:
    """software.perftest: the tag built with CUDA under /opt/perftest-cuda/<tag>, the current
    link pointing at it, its ib_write_bw there (what the GPUDirect RDMA check runs)."""
    version = node.expected(expect.perftest_cuda_version, node.vars)
    if version is None:
        not_applicable(f"software.perftest is not set, or {node.name} has no GPUs with RDMA NICs")
    prefix = f"{expect.PERFTEST_CUDA_DIR}/{version}"
    problems = []
    current = node.run("readlink", "-f", f"{expect.PERFTEST_CUDA_DIR}/current")
    if current.rc != 0 or current.stdout.strip() != prefix:
        problems.append(f"{expect.PERFTEST_CUDA_DIR}/current does not point at {prefix}")
    if node.run("test", "-x", f"{prefix}/bin/ib_write_bw").rc != 0:
        problems.append(f"{prefix}/bin/ib_write_bw is missing or not executable")
    built = node.run("grep", "-q", "^#define HAVE_CUDA 1", f"{prefix}/config.h")
    if built.rc != 0:
        problems.append(f"{prefix}/config.h does not define HAVE_CUDA: built without CUDA")
    assert not problems, f"{node.name}: perftest with CUDA: " + "; ".join(problems)
