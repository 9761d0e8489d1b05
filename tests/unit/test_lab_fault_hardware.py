"""A lab fault that names hardware its node's profile lacks is refused
(gpuctl.lab.sim.faults.hardware_problem): it would change nothing, and the next validation
would pass."""

from __future__ import annotations

import pytest

from gpuctl.lab.sim import profiles
from gpuctl.lab.sim.faults import hardware_problem, names_hardware, parse_value

H100 = profiles.load("hgx-h100-ndr")  # 8 GPUs, NV18, mlx5_0..mlx5_7
L40S = profiles.load("l40s-pcie")  # 8 GPUs, no NVLink, mlx5_0..mlx5_1
ONE = profiles.load("single-gpu")  # 1 GPU, no HCA


def problem(profile: dict[str, object], name: str, value: str) -> str | None:
    return hardware_problem(name, parse_value(name, value), profile, "gpu001")


@pytest.mark.parametrize(
    ("profile", "name", "value", "says"),
    [
        (H100, "ecc", "9", "ecc: gpu001 has no GPU 9; its GPUs are 0-7 (8x NVIDIA H100"),
        (H100, "gpu_lost", "3,8,12", "gpu_lost: gpu001 has no GPU 8, 12; its GPUs are 0-7"),
        (H100, "xid", "79:2,13:8", "xid: gpu001 has no GPU 8"),
        (H100, "pcie_degraded", "8:8", "pcie_degraded: gpu001 has no GPU 8"),
        (H100, "nvlink_degraded", "7-8", "nvlink_degraded: gpu001 has no GPU 8"),
        (H100, "clocks_throttled", "1,9", "clocks_throttled: gpu001 has no GPU 9"),
        (H100, "firmware", "gpu9=96.00.99.00.01", "firmware: gpu001 has no GPU 9"),
        (ONE, "ecc", "1", "ecc: gpu001 has no GPU 1; its GPUs are 0 (1x "),
        (H100, "ib_port_down", "mlx5_9", "its HCAs are mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4"),
        (L40S, "ib_rate", "mlx5_1:200,mlx5_2:200", "ib_rate: gpu001 has no HCA mlx5_2"),
        (L40S, "firmware", "mlx5_3=28.39.1002", "firmware: gpu001 has no HCA mlx5_3"),
        (ONE, "ib_port_down", "mlx5_0", "ib_port_down: gpu001 has no HCA (profile single-gpu)"),
        (ONE, "firmware", "hca=28.39.1002", "firmware: gpu001 has no HCA"),
        (L40S, "nvlink_degraded", "0-1", "nvlink_degraded: gpu001 has no NVLink (8x"),
        (H100, "nvlink_degraded", "0-1:18", None),
        (profiles.load("a100-hdr"), "nvlink_degraded", "0-1:18", "have 12 NVLinks each, not 18"),
    ],
)
def test_faults_on_hardware_the_profile_lacks(
    profile: dict[str, object], name: str, value: str, says: str | None
) -> None:
    found = problem(profile, name, value)
    if says is None:
        assert found is None
    else:
        assert found is not None
        assert says in found
        assert "\n" not in found


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ecc", "7"),
        ("gpu_lost", "0,7"),
        ("xid", "79:7"),
        ("clocks_throttled", "all"),
        ("ib_port_down", "mlx5_0,mlx5_7:Disabled"),
        ("ib_rate", "mlx5_3:200"),
        ("firmware", "gpu=96.00.99.00.01,gpu7=96.00.99.00.01,hca=28.39.1002,mlx5_7=28.39.1002"),
        ("nccl_slow", "0.5"),
        ("no_reboot", ""),
        ("fabricmanager_failed", ""),
    ],
)
def test_faults_on_hardware_the_profile_has(name: str, value: str) -> None:
    assert problem(H100, name, value) is None


def test_which_faults_name_hardware() -> None:
    assert names_hardware("ecc", parse_value("ecc", "0"))
    assert names_hardware("ib_rate", parse_value("ib_rate", "mlx5_0:200"))
    assert names_hardware("clocks_throttled", parse_value("clocks_throttled", "all"))
    assert names_hardware("firmware", parse_value("firmware", "gpu=96.00.99.00.01"))
    assert not names_hardware("firmware", parse_value("firmware", "fabricmanager=570.1.2"))
    assert not names_hardware("no_reboot", parse_value("no_reboot", ""))
    assert not names_hardware("slow_node", parse_value("slow_node", "0.5"))
