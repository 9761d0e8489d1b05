"""The lab's RoCE QoS: the ``mlnx_qos`` stand-in (gpuctl/lab/sim/qos.py) and the simulated
sysfs of a RoCE node (gpuctl/lab/sim/sysroot.py), run against the roce_qos role's own script.

The stand-in prints what the real ``mlnx_qos -i`` printed in the captures under
tests/fixtures/ib/mlnx_qos-*.out (there the tool's tabs appear as spaces, so the comparison
expands tabs). The script (playbooks/roles/roce_qos/files/gpuctl-roce-qos) runs for real with
GPUCTL_ROCE_QOS_ROOT at the sysroot :func:`sysroot.write` made for a RoCE profile, and a
``mlnx_qos`` on PATH that calls the stand-in as a node's launcher does: on a fresh node ``check``
reports drift, ``apply`` fixes it, a second ``check`` finds nothing.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT
from test_roce_qos_script import SCRIPT, SYSTEM_PATH, SYSTEM_TOOLS, render_conf

from gpuctl.lab.sim import profiles, qos, standin, sysroot
from gpuctl.validation.capture import capture_output

FIXTURES = ROOT / "tests" / "fixtures" / "ib"
FRESH = FIXTURES / "mlnx_qos-i-fresh-port-trust-pcp-pfc-off.out"
DSCP = FIXTURES / "mlnx_qos-i-trust-dscp-pfc-off.out"
ROLE = ROOT / "playbooks" / "roles" / "roce_qos"
ROCE_PROFILES = ("a100-roce", "l40s-pcie")
WANTED_PFC = "0,0,0,1,0,0,0,0"  # the role's default: PFC on priority 3


def _shape(text: str) -> list[str]:
    """The lines with every number replaced: what stays when only the values differ."""
    return [re.sub(r"\d+", "N", line) for line in text.expandtabs(8).splitlines()]


def _profile(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(profiles.profile_json(name))
    return data


# --- the stand-in's output against the real captures --------------------------------------


def test_fresh_port_prints_the_real_capture() -> None:
    text = qos.report(qos.DEFAULT_TRUST, qos.DEFAULT_PFC)
    assert text.expandtabs(8) == capture_output(FRESH)
    assert "\tpriority    0   1" in text  # the tool prints tabs (python/mlnx_qos)


def test_trust_dscp_prints_the_real_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path))
    profile = _profile("a100-roce")
    run = qos.mlnx_qos_main(profile, {}, "n1", ["-i", "ens12f0np0", "--trust", "dscp"])
    assert (run.status, run.stderr) == (0, "")
    assert run.stdout.expandtabs(8) == capture_output(DSCP)


def test_pfc_report_has_the_captures_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path))
    profile = _profile("a100-roce")
    qos.mlnx_qos_main(profile, {}, "n1", ["-i", "ens12f0np0", "--pfc", WANTED_PFC])
    run = qos.mlnx_qos_main(profile, {}, "n1", ["--interface=ens12f0np0", "--trust=dscp"])
    assert run.status == 0
    assert _shape(run.stdout) == _shape(capture_output(DSCP))  # same lines, other values
    assert "\tenabled     0   0   0   1   0   0   0   0   \n" in run.stdout
    # the script's parse (sed/awk in gpuctl-roce-qos) reads back what was set
    trust = re.search(r"^Priority trust state: *(.*)$", run.stdout, re.M)
    enabled = re.search(r"^\s*enabled\s+(.*)$", run.stdout, re.M)
    assert trust is not None
    assert trust.group(1) == "dscp"
    assert enabled is not None
    assert ",".join(enabled.group(1).split()) == WANTED_PFC


def test_state_is_kept_per_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path))
    profile = _profile("a100-roce")
    qos.mlnx_qos_main(profile, {}, "n1", ["-i", "ens75f0np0", "-f", WANTED_PFC])
    state = json.loads((tmp_path / qos.STATE_FILE).read_text())
    assert state == {"ens75f0np0": {"trust": "pcp", "pfc": [0, 0, 0, 1, 0, 0, 0, 0]}}
    other = qos.mlnx_qos_main(profile, {}, "n1", ["-i", "ens12f0np0"])
    assert other.stdout.expandtabs(8) == capture_output(FRESH)  # untouched port: fresh


@pytest.mark.parametrize(
    ("args", "status", "stdout", "stderr"),
    [
        ([], 1, "Interface name is required\n", ""),
        (["-i", "eth9"], 1, "", "OSError: Netlink error: No such device (19)\n"),
        (["-i", "ens12f0np0", "--pfc", "0,0,1"], 1, "pfc list must have 8 items\n", ""),
        (["-i", "ens12f0np0", "--pfc", "0,0,0,0,0,0,0,0,1"], 1, "Too many items for PFC\n", ""),
        (["-i", "ens12f0np0", "--pfc", "0,2,0,0,0,0,0,0"], 1, "Bad value for PFC", ""),
        (
            ["-i", "ens12f0np0", "--trust", "l2"],
            1,
            "Invalid trust state command. Refer to the help.\n",
            "",
        ),
        (["-i", "ens12f0np0", "--bogus"], 2, "", "mlnx_qos: error: no such option: --bogus"),
        (["-i", "ens12f0np0", "--prio_tc", "0,0,0,0,1,1,1,1"], 1, "", "is not simulated"),
        (["ens12f0np0"], 1, "Bad arguments\n", ""),
    ],
)
def test_bad_command_lines_answer_as_the_real_tool(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    status: int,
    stdout: str,
    stderr: str,
) -> None:
    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path))
    run = qos.mlnx_qos_main(_profile("a100-roce"), {}, "n1", args)
    assert run.status == status
    assert run.stdout.startswith(stdout)
    assert stderr in run.stderr
    assert not (tmp_path / qos.STATE_FILE).exists()  # nothing set


def test_infiniband_ports_are_no_dcb_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path))
    profile = _profile("a100-hdr")
    netdev = profile["nics"]["ports"][0]["netdev"]
    assert qos.mlnx_qos_main(profile, {}, "n1", ["-i", netdev]).status == 1


def test_registered_as_a_stand_in_of_mlnx_tools() -> None:
    assert "mlnx_qos" in standin.TOOLS
    specs = yaml.safe_load((ROOT / "gpuctl" / "lab" / "repo_packages.yml").read_text())
    tools = next(p for p in specs["packages"] if p["name"] == "mlnx-tools")
    assert "mlnx_qos" in tools["bin"]


# --- the simulated sysfs ------------------------------------------------------------------


def test_sysroot_only_for_roce_profiles(tmp_path: Path) -> None:
    for name in ("a100-hdr", "single-gpu"):
        sysroot.write(tmp_path / name, _profile(name))
        assert not (tmp_path / name).exists(), name


@pytest.mark.parametrize("name", ROCE_PROFILES)
def test_sysroot_layout(tmp_path: Path, name: str) -> None:
    profile = _profile(name)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "environment").write_text('LANG="C.UTF-8"')  # no final newline
    sysroot.write(tmp_path, profile)
    sysroot.write(tmp_path, profile)  # a second `lab up`: nothing doubles
    base = tmp_path / sysroot.SYSROOT.lstrip("/")
    for port in profile["nics"]["ports"]:
        dev, netdev = port["name"], port["netdev"]
        assert os.listdir(base / f"sys/class/infiniband/{dev}/device/net") == [netdev]
        assert os.listdir(base / f"sys/class/infiniband/{dev}/ports") == ["1"]
        ecn = base / f"sys/class/net/{netdev}/ecn"
        for point in ("roce_np", "roce_rp"):
            values = [(ecn / point / "enable" / str(p)).read_text() for p in range(8)]
            assert values == ["1\n"] * 8
        assert (ecn / "roce_np/cnp_dscp").read_text() == "48\n"
        assert (ecn / "roce_np/cnp_802p_prio").read_text() == "6\n"
        cm = base / f"sys/kernel/config/rdma_cm/{dev}/ports/1"
        assert (cm / "default_roce_mode").read_text() == "RoCE v2\n"
        assert (cm / "default_roce_tos").read_text() == "0\n"
    env = (tmp_path / "etc/environment").read_text().splitlines()
    assert env[0] == 'LANG="C.UTF-8"'
    assert env.count(f"GPUCTL_ROCE_QOS_ROOT={sysroot.SYSROOT}") == 1
    assert all(line.startswith("#") or "=" in line for line in env)
    assert any("SIMULATION" in line for line in env)
    sudoers = tmp_path / "etc/sudoers.d/gpuctl-lab-sim"
    assert stat.S_IMODE(sudoers.stat().st_mode) == 0o440
    assert 'Defaults env_keep += "GPUCTL_ROCE_QOS_ROOT"' in sudoers.read_text().splitlines()
    assert "SIMULATION" in sudoers.read_text()
    service = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__roce_qos_service"]
    dropin = tmp_path / f"etc/systemd/system/{service}.service.d/gpuctl-lab-sim.conf"
    lines = dropin.read_text().splitlines()
    assert "[Service]" in lines
    assert f"Environment=GPUCTL_ROCE_QOS_ROOT={sysroot.SYSROOT}" in lines
    assert "SIMULATION" in dropin.read_text()


def test_sysroot_keeps_what_was_written(tmp_path: Path) -> None:
    profile = _profile("a100-roce")
    sysroot.write(tmp_path, profile)
    tos = tmp_path / sysroot.SYSROOT.lstrip("/") / "sys/kernel/config/rdma_cm/mlx5_0/ports/1"
    (tos / "default_roce_tos").write_text("104\n")
    sysroot.write(tmp_path, profile)
    assert (tos / "default_roce_tos").read_text() == "104\n"


# --- the role's script on a simulated RoCE node --------------------------------------------

# Tools that would change the real host, first on PATH: they fail, and log that they ran.
REFUSE = '#!/bin/sh\necho "$(basename "$0") $*" >> {log}\nexit 1\n'


class RoceNode:
    """A node root with the lab's hardware files, its sysroot and a stand-in ``mlnx_qos``."""

    def __init__(self, base: Path, name: str) -> None:
        self.root = base / "root"
        self.bin = base / "bin"
        self.conf = base / "roce-qos.conf"
        self.refused = base / "refused.log"
        self.profile = _profile(name)
        hardware = self.root / "etc/gpuctl-lab/hardware.json"
        hardware.parent.mkdir(parents=True)
        hardware.write_text(profiles.profile_json(name))
        sysroot.write(self.root, self.profile)
        self.hardware = hardware
        self.bin.mkdir()
        # the node's /usr/bin/mlnx_qos as the lab's package installs it, on this python
        launcher = self.bin / "mlnx_qos"
        text = standin.launcher(str(ROOT), "gpuctl.lab.sim")
        launcher.write_text(text.replace("#!/usr/bin/python3", f"#!{sys.executable}", 1))
        launcher.chmod(0o755)
        for tool in SYSTEM_TOOLS:
            (self.bin / tool).write_text(REFUSE.format(log=shlex.quote(str(self.refused))))
            (self.bin / tool).chmod(0o755)
        self.refused.write_text("")
        devices = [p["name"] for p in self.profile["nics"]["ports"]]
        self.conf.write_text(render_conf(roce_qos_devices=devices))

    def run(self, mode: str) -> subprocess.CompletedProcess[str]:
        # GPUCTL_ROCE_QOS_ROOT: what the node's /etc/environment gives the script; the
        # GPUCTL_SIM_* paths: the node's own files, under this test's root
        env = {
            "PATH": f"{self.bin}:{SYSTEM_PATH}",
            "GPUCTL_SIM_PROFILE": str(self.hardware),
            "GPUCTL_SIM_FAULTS": str(self.root / "var/lib/gpuctl-lab-sim/faults.json"),
            "GPUCTL_SIM_NODE": "node1",
            "LC_ALL": "C",
            "GPUCTL_ROCE_QOS_ROOT": str(self.root / sysroot.SYSROOT.lstrip("/")),
            "GPUCTL_ROCE_QOS_CONF": str(self.conf),
            "GPUCTL_ROCE_QOS_WAIT_S": "0",
        }
        return subprocess.run(
            [str(SCRIPT), mode], env=env, capture_output=True, text=True, timeout=120, check=False
        )


@pytest.mark.parametrize("name", ROCE_PROFILES)
def test_script_check_apply_check_on_a_fresh_roce_node(tmp_path: Path, name: str) -> None:
    node = RoceNode(tmp_path, name)
    ports = [(p["name"], p["netdev"]) for p in node.profile["nics"]["ports"]]

    first = node.run("check")
    assert first.returncode == 1, first.stderr
    assert first.stderr == ""
    drift = [line for line in first.stdout.splitlines() if line.startswith("drift:")]
    assert drift == [
        line
        for dev, nd in ports
        for line in (
            f"drift: {dev} ({nd}) trust is 'pcp', wants 'dscp'",
            f"drift: {dev} ({nd}) pfc is '0,0,0,0,0,0,0,0', wants '{WANTED_PFC}'",
            f"drift: {dev} port 1 default_roce_tos is '0', wants '104'",
        )
    ]
    assert "note:" not in first.stdout  # every sysfs file the script reads is there

    applied = node.run("apply")
    assert applied.returncode == 0, applied.stderr
    assert applied.stderr == ""
    assert len([line for line in applied.stdout.splitlines() if line.startswith("applied:")]) == (
        3 * len(ports)
    )

    second = node.run("check")
    assert (second.returncode, second.stdout, second.stderr) == (0, "", "")
    state = json.loads((node.root / "var/lib/gpuctl-lab-sim" / qos.STATE_FILE).read_text())
    assert state == {nd: {"trust": "dscp", "pfc": [0, 0, 0, 1, 0, 0, 0, 0]} for _, nd in ports}
    assert node.refused.read_text() == ""  # no modprobe, no mount under the fake root

    again = node.run("apply")  # nothing left to do
    assert (again.returncode, again.stdout) == (0, "")
