"""Every fault the lab can inject, seen by `gpuctl validate` on exactly the faulty node.

The shared provisioned lab of tests/lab/conftest.py has three compute nodes, so a bad
ib_write_bw pair can be retested against a third node and blamed on the right one. For each
fault: inject it on gpu002, validate the whole cluster, and assert that gpu002 is the only
failed node, that the check the fault is about failed there with the right reason, and that
every other failed check of gpu002 is one the fault explains. Then `--drain-failed` drains
gpu002 in Slurm with that reason, and after the fault is cleared (and the node rebooted where
the fault wrote kernel log lines) a passing validation resumes it. The table of faults, checks
and verdicts is in docs/validate.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from lab_helpers import ProvisionedLab, sh

from gpuctl.config import load_cluster
from gpuctl.lab import lab
from gpuctl.slurm import covers, reason_checks
from gpuctl.validation.api import ValidateResult, drain_failed, validate

pytestmark = [pytest.mark.lab, pytest.mark.slow]

NODE = "gpu002"


@dataclass(frozen=True)
class Case:
    fault: str
    value: str
    check: str  # the check the fault is about
    reason: str  # a piece of that check's message
    level: str = "quick"
    also: frozenset[str] = frozenset()  # other checks the fault may fail on the node
    kernel: bool = False  # writes kernel log lines: reboot after clearing
    warn: str | None = None  # a check that must show a warning on the node
    name: str | None = None  # the test id where one fault has several cases
    # further faults injected with it, each (fault, value, check, reason) failing as its own
    # (one validation for several faults at the same level: CI time)
    more: tuple[tuple[str, str, str, str], ...] = ()

    @property
    def id(self) -> str:
        return self.name or self.fault


NCCL = frozenset(
    {"nccl.busbw", "nccl.busbw.fleet", "nccl.errors", "nccl.wrong"}
    | {
        f"nccl.{name}.{check}"
        for name in ("all_gather", "reduce_scatter", "alltoall", "sendrecv")
        for check in ("busbw", "busbw.fleet", "errors", "wrong")
    }
)
FABRIC = frozenset({"fabricmanager.active", "fabricmanager.version"})
CASES = [
    Case(
        "gpu_lost",
        "3",
        "gpu.count",
        "7 GPUs visible, expected 8",
        also=frozenset({"topology.gpus", "topology.nvlink", "xid", "xid.fallen_off_bus"}),
        kernel=True,
    ),
    Case("xid", "79:2", "xid", "79", kernel=True, also=frozenset({"xid.fallen_off_bus"})),
    Case("ecc", "1", "gpu.remap", "", also=frozenset({"xid", "gpu.ecc"}), kernel=True),
    Case(
        "nvlink_degraded",
        "0-1:2",
        "topology.nvlink",
        "GPU0",
        also=frozenset({"gpu.nvlink", "xid"}),
        kernel=True,
    ),
    Case("pcie_degraded", "2", "gpu.pcie.width", "x8"),
    # PCIe AER: an uncorrectable error on GPU2's link, read from the kernel log
    Case("pcie_aer", "2:nonfatal", "pcie.aer", "uncorrectable (non-fatal)", kernel=True),
    Case("ib_port_down", "mlx5_3", "ib.port.state", "state Down", also=frozenset({"ib.port.rate"})),
    # with it, in the same run: two adapters in each other's PCIe slots, so GPU1's and GPU6's
    # rail adapters (nics[].rails) sit across the CPUs from them in topo -m
    Case(
        "ib_rate",
        "mlx5_2:200",
        "ib.port.rate",
        "200",
        also=frozenset({"topology.rail"}),
        more=(
            (
                "nic_slots_swapped",
                "mlx5_1,mlx5_6",
                "topology.rail",
                "GPU1's rail adapter mlx5_1 is SYS from it, mlx5_6 PIX",
            ),
        ),
    ),
    # golden config: one node's firmware differs from the other two's
    Case(
        "firmware",
        "gpu=96.00.99.00.01",
        "config.vbios",
        "VBIOS 96.00.99.00.01 on all 8 GPUs",
        name="firmware-vbios",
    ),
    Case(
        "firmware",
        "mlx5_2=28.39.1002",
        "config.hca_firmware",
        "firmware 28.39.1002 on mlx5_2",
        name="firmware-hca",
    ),
    # the service keeps running in the lab; what fails is the GPUs' fabric registration
    Case("fabricmanager_failed", "", "gpu.fabric", "In Progress", also=FABRIC),
    # the running service logged the version it started with; the fabric never comes up
    Case("fabricmanager_version", "570.133.20", "gpu.fabric", "In Progress", also=FABRIC),
    # throttled clocks are a warning by themselves; the bandwidth they cost fails
    Case(
        "clocks_throttled",
        "all",
        "nccl.busbw",
        "< 460",
        level="standard",
        warn="gpu.clocks",
        also=NCCL,
    ),
    Case("nccl_slow", "0.5", "nccl.busbw", "< 460", level="standard", also=NCCL),
    # an InfiniBand port that goes down under load (its counters read around ib_write_bw)
    # and, in the same run, writes through the same adapter 5 us slower (ib_write_lat after
    # ib_write_bw on every pair; the retests clear the partners); another port with bit errors
    # left after FEC (mlxlink -m -c, read after the tests); peer access refused between GPU5
    # and its peers (topo -p2p; nvbandwidth's pairs with GPU5 N/A)
    Case(
        "ib_link_flaps",
        "mlx5_2",
        "ib.port.errors",
        "port 1 LinkDownedCounter +",
        level="standard",
        also=frozenset({"ib.write_lat", "ib.link.ber", "topology.p2p", "p2p.read", "p2p.write"}),
        more=(
            ("ib_latency", "mlx5_2:5", "ib.write_lat", "99th percentile 6.2 us > 4.2 us"),
            ("ib_ber", "mlx5_4:1E-9", "ib.link.ber", "Symbol BER 1.0E-9"),
            ("p2p_disabled", "5", "topology.p2p", "peer reads CNS (Chipset not supported)"),
        ),
    ),
    # wrong results from NCCL and, in the same run, one GPU's copies to and from the host at half
    # speed, its PCIe link at full width (nvbandwidth, the one DCGM 4 ships; nvidia-smi shows
    # nothing wrong)
    Case(
        "nccl_wrong",
        "3",
        "nccl.wrong",
        "",
        level="standard",
        also=NCCL | {"pcie.h2d", "pcie.d2h"},
        more=(("pcie_copy_slow", "2", "pcie.h2d", "< 48"),),
    ),
    # one collective slow, the others (all_reduce among them) as they were: alltoall loads every
    # GPU pair's path, where a ring all_reduce does not show a slow one; with it, NVLink error
    # counters that grow during the GPU tests (read before and after them)
    Case(
        "nccl_collective_slow",
        "alltoall:0.6",
        "nccl.alltoall.busbw",
        "< 324",
        level="standard",
        also=frozenset({"nccl.alltoall.busbw.fleet", "gpu.nvlink.errors"}),
        more=(("nvlink_errors", "3:5", "gpu.nvlink.errors", "link 5 Replay Errors +"),),
    ),
    # the PCIe tree (lspci): ACS redirection on the switch port above GPU2, and mlx5_3's link
    # trained down to x8 (nvidia-smi and ibstat see nothing wrong); GPU3's copies with its
    # peers over NVSwitch at half speed (nvbandwidth device_to_device); and GPU5's memory that
    # its adapter cannot register (GPUDirect RDMA, as without nvidia-peermem): four faults, one
    # run
    Case(
        "pcie_acs",
        "2",
        "pcie.acs",
        "above GPU2",
        level="standard",
        also=frozenset({"pcie.nic.link", "p2p.read", "p2p.write", "gpudirect.write_bw"}),
        more=(
            ("nic_pcie_degraded", "mlx5_3", "pcie.nic.link", "x8 at 32 GT/s, below x16"),
            ("p2p_slow", "3", "p2p.read", "GPU3 197."),
            (
                "gpudirect_broken",
                "5",
                "gpudirect.write_bw",
                "could not register GPU5's memory (Couldn't allocate MR",
            ),
        ),
    ),
    Case(
        "slow_node",
        "0.5",
        "nccl.busbw",
        "< 460",
        level="standard",
        # every bandwidth: the GPUs' copies with the host and with each other too
        also=NCCL
        | {"ib.write_bw", "ib.write_bw.fleet", "pcie.h2d", "pcie.d2h", "p2p.read", "p2p.write"}
        | {"gpudirect.write_bw"},
    ),
]


@pytest.fixture
def cluster(provisioned_lab: ProvisionedLab) -> Path:
    return provisioned_lab.cluster


def _failed_checks(result: ValidateResult, node: str) -> dict[str, list[str]]:
    report = next(n for n in result.report.nodes if n.node == node)
    out: dict[str, list[str]] = {}
    for c in report.checks:
        if c.verdict.value in ("fail", "unknown"):
            out.setdefault(c.check, []).append(c.message)
    return out


def _drained() -> dict[str, str]:
    res = sh(lab.address_of("ctl01"), 'sinfo -R -h -N -o "%N|%E"')
    assert res.returncode == 0, res.stderr
    return dict(ln.split("|", 1) for ln in res.stdout.splitlines() if "|" in ln)


def test_healthy_lab_passes_quick_and_standard(cluster: Path, tmp_path: Path) -> None:
    for level in ("quick", "standard"):
        res = validate(load_cluster(cluster), level=level, out=tmp_path / level)
        bad = {n: _failed_checks(res, n) for n in res.nodes}
        assert res.failed_nodes == [], bad


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fault_fails_the_right_check_on_the_right_node(
    cluster: Path, tmp_path: Path, case: Case
) -> None:
    lab.inject_fault(NODE, case.fault, case.value)
    for fault, value, _, _ in case.more:
        lab.inject_fault(NODE, fault, value)
    try:
        res = validate(load_cluster(cluster), level=case.level, out=tmp_path / "faulty")
        failed = _failed_checks(res, NODE)
        assert res.failed_nodes == [NODE], {n: _failed_checks(res, n) for n in res.failed_nodes}
        for _, _, check, reason in ((case.fault, case.value, case.check, case.reason), *case.more):
            assert check in failed, failed
            assert any(reason in m for m in failed[check]), failed[check]
        assert set(failed) - {case.check} <= case.also, failed
        if case.warn is not None:
            node = next(n for n in res.report.nodes if n.node == NODE)
            assert any(c.check == case.warn and c.verdict.value == "warn" for c in node.checks)

        drained = drain_failed(load_cluster(cluster), res.report)
        assert not drained.failed, drained.to_json()
        reason = _drained().get(NODE, "")
        # Slurm keeps gpuctl's reason: its prefix, then the checks that failed here (by their
        # family, "nccl.*", where their ids do not fit Slurm's 255 bytes)
        assert reason.startswith("gpuctl: "), reason
        named = reason_checks(reason, "gpuctl:")
        assert named, reason
        assert all(any(covers(n, c) for c in failed) for n in named), (reason, sorted(failed))
    finally:
        lab.clear_faults(NODE)
        if case.kernel:
            lab.reboot(NODE)
    # the whole cluster again: ib_write_bw needs the other nodes
    again = validate(load_cluster(cluster), level=case.level, out=tmp_path / "cleared")
    assert again.failed_nodes == [], _failed_checks(again, NODE)
    resumed = drain_failed(load_cluster(cluster), again.report)
    assert not resumed.failed, resumed.to_json()
    assert NODE not in _drained()
