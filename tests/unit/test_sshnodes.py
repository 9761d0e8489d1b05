"""benchmarks/sshnodes.py: the layout and files it writes (pure), its own stand-ins, and (as root
with openssh-server, marked slow) a real bring-up and teardown of sshd-only nodes."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from ClusterShell.NodeSet import NodeSet
from helpers import ROOT

from gpuctl.config import load_cluster_text
from gpuctl.lab.sim import profiles
from gpuctl.validation.parsing import parse

sys.path.insert(0, str(ROOT / "benchmarks"))

import sshnodes
import validate_quick_64 as bench

LAB_NET = ipaddress.IPv4Network("198.18.0.0/24")
BENCH_NET = ipaddress.IPv4Network("198.18.0.0/15")


@pytest.mark.parametrize("count", [1, 2, 64, sshnodes.MAX_NODES])
def test_plan_stays_in_its_own_range(count: int) -> None:
    nodes = sshnodes.plan(count)
    assert [n.name for n in nodes] == ["ctl01"] + [f"gpu{i:03d}" for i in range(1, count + 1)]
    addresses = [ipaddress.IPv4Address(n.address) for n in nodes]
    assert len(set(addresses)) == len(addresses)
    for address in addresses:
        assert address in sshnodes.NETWORK
        assert address in BENCH_NET
        assert address not in LAB_NET
        assert str(address) != sshnodes.BRIDGE_ADDRESS
        assert address != sshnodes.NETWORK.broadcast_address
    assert nodes[0].address == "198.19.0.10"
    assert nodes[1].address == "198.19.0.11"
    assert not nodes[0].gpu
    assert all(n.gpu for n in nodes[1:])
    for node in nodes:  # Linux interface names: 15 characters at most
        assert len(node.veth) <= 15
        assert node.netns.startswith(sshnodes.NETNS_PREFIX)
        assert not node.netns.startswith("gpuctl-gpu")  # never a lab node's namespace


@pytest.mark.parametrize("count", [0, -1, sshnodes.MAX_NODES + 1])
def test_plan_refuses_counts_outside_the_range(count: int) -> None:
    with pytest.raises(sshnodes.HarnessError, match="--nodes takes 1 to"):
        sshnodes.plan(count)


@pytest.mark.parametrize("count", [1, 2, 17, 64])
def test_nodesets_fold_the_plan(count: int) -> None:
    gpus = sshnodes.plan(count)[1:]
    assert list(NodeSet(sshnodes.gpu_nodeset(count))) == [n.name for n in gpus]
    assert list(NodeSet(sshnodes.address_nodeset(count))) == [n.address for n in gpus]


@pytest.mark.parametrize("count", [1, 16, 17, 64, 200])
def test_cluster_doc_is_a_valid_cluster_of_the_planned_nodes(count: int, tmp_path: Path) -> None:
    key, known = tmp_path / "id_ed25519", tmp_path / "known_hosts"
    doc = sshnodes.cluster_doc(count, key, known)
    cluster = load_cluster_text(yaml.safe_dump(doc), "bench.yml")
    assert cluster.ssh.private_key == str(key)
    assert cluster.ssh.known_hosts == str(known)
    assert cluster.ssh.user == "root"
    gpu = cluster.node_groups[1]
    assert gpu.gpus is not None
    assert (gpu.gpus.model, gpu.gpus.count, str(gpu.gpus.interconnect)) == (
        "h100-sxm",
        8,
        "nvswitch",
    )
    assert list(NodeSet(gpu.nics[0].devices)) == [f"mlx5_{i}" for i in range(8)]
    planned = {n.name: n.address for n in sshnodes.plan(count)}
    declared: dict[str, str] = {}
    for group in cluster.node_groups:
        assert group.addresses is not None
        declared.update(zip(NodeSet(group.nodes), NodeSet(group.addresses), strict=True))
    assert declared == planned
    # the simulated profile is the hardware the file declares (what the lab's file says too)
    hw = profiles.load(sshnodes.DEFAULT_PROFILE)
    assert hw["model"] == gpu.gpus.model
    assert int(hw["gpus"]["count"]) == gpu.gpus.count
    assert cluster.software.driver.version == hw["driver_version"]


def test_inventory_checks_host_keys_with_the_benchmark_key(tmp_path: Path) -> None:
    key, known = tmp_path / "k", tmp_path / "kh"
    nodes = sshnodes.plan(3)
    inv = sshnodes.ansible_inventory(nodes, key, known)["all"]
    assert inv["hosts"] == {n.name: {"ansible_host": n.address} for n in nodes[1:]}
    args = inv["vars"]["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in args
    assert f"UserKnownHostsFile={known}" in args
    assert "StrictHostKeyChecking=no" not in args
    assert inv["vars"]["ansible_ssh_private_key_file"] == str(key)


def test_sshd_config_key_only_root_and_the_simulators_environment(tmp_path: Path) -> None:
    ctl, gpu = sshnodes.plan(1)
    dirs = [str(tmp_path / "bin"), "/usr/bin", "/bin"]
    text = sshnodes.sshd_config(gpu, tmp_path, dirs)
    lines = set(text.splitlines())
    for want in (
        "ListenAddress 198.19.0.11:22",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "StrictModes yes",
        f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}",
        f"HostKey {tmp_path / 'nodes' / 'gpu001' / 'ssh_host_ed25519_key'}",
    ):
        assert want in lines
    setenv = next(line for line in lines if line.startswith("SetEnv "))
    env = dict(item.split("=", 1) for item in setenv.split()[1:])
    assert env["PATH"].split(":")[0] == str(tmp_path / "bin")
    assert env["GPUCTL_SIM_NODE"] == "gpu001"
    assert env["GPUCTL_SIM_FAULTS"] == str(tmp_path / "nodes" / "gpu001" / "faults.json")
    ctl_text = sshnodes.sshd_config(ctl, tmp_path, dirs[1:])
    assert "GPUCTL_SIM" not in ctl_text
    assert str(tmp_path / "bin") not in ctl_text


def test_known_hosts_line_names_address_and_host() -> None:
    node = sshnodes.plan(1)[1]
    line = sshnodes.known_hosts_line(node, "ssh-ed25519 AAAAC3Nza gpu001\n")
    assert line == "198.19.0.11,gpu001 ssh-ed25519 AAAAC3Nza\n"


# --- the harness's journalctl and systemctl stand-ins, run as the nodes run them


@pytest.fixture
def sim_env(tmp_path: Path) -> dict[str, str]:
    lib = tmp_path / "lib" / sshnodes.SIM_PACKAGE
    shutil.copytree(sshnodes.SIM_SOURCE, lib, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "hw.json").write_text(
        profiles.profile_json(sshnodes.DEFAULT_PROFILE), encoding="utf-8"
    )
    for tool in ("journalctl", "systemctl"):
        path = tmp_path / tool
        path.write_text(sshnodes.harness_standin(tool, tmp_path / "lib"), encoding="utf-8")
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GPUCTL_SIM_PROFILE": str(tmp_path / "hw.json"),
        "GPUCTL_SIM_FAULTS": str(tmp_path / "faults.json"),
        "GPUCTL_SIM_NODE": "gpu007",
        "DIR": str(tmp_path),
    }


def _tool(env: dict[str, str], tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(Path(env["DIR"]) / tool), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


JOURNAL = ("-t", "kernel", "-b", "--no-pager", "-o", "short-iso")  # gpuctl's xid probe


def test_journalctl_standin_is_a_kernel_log_the_xid_parser_reads(sim_env: dict[str, str]) -> None:
    res = _tool(sim_env, "journalctl", *JOURNAL)
    assert res.returncode == 0, res.stderr
    assert " gpu007 kernel: Linux version " in res.stdout
    parsed = parse("xid", res.stdout)
    assert parsed.recognised, parsed.problems
    assert parsed.data["events"] == []

    Path(sim_env["GPUCTL_SIM_FAULTS"]).write_text('{"gpu_lost": [3]}', encoding="utf-8")
    since = ("-t", "kernel", "--no-pager", "-o", "short-iso", "--since", "-2h")
    for args in (JOURNAL, since, ("-k", "-b", "-1", "--no-pager"), ("-k", "--boot=0")):
        res = _tool(sim_env, "journalctl", *args)
        assert res.returncode == 0, res.stderr
        parsed = parse("xid", res.stdout)
        assert parsed.recognised
        assert [e["xid"] for e in parsed.data["events"]] == [79]
        assert parsed.data["events"][0]["timestamp"] is not None


def test_journalctl_standin_other_identifiers_and_unknown_options(sim_env: dict[str, str]) -> None:
    res = _tool(sim_env, "journalctl", "-t", "sshd", "--no-pager")
    assert (res.returncode, res.stdout) == (0, "-- No entries --\n")
    res = _tool(sim_env, "journalctl", "-t", "kernel", "--grep", "Xid")
    assert res.returncode == 1
    assert "unsupported option '--grep'" in res.stderr
    res = _tool(sim_env, "journalctl", "-k", "-o", "json")
    assert res.returncode == 1


def test_systemctl_standin_fabric_manager(sim_env: dict[str, str]) -> None:
    res = _tool(sim_env, "systemctl", "status", "nvidia-fabricmanager", "--no-pager", "-l")
    assert res.returncode == 0, res.stderr
    parsed = parse("fabricmanager", res.stdout)
    assert parsed.recognised, parsed.problems
    Path(sim_env["GPUCTL_SIM_FAULTS"]).write_text('{"fabricmanager_failed": true}', "utf-8")
    res = _tool(sim_env, "systemctl", "status", "nvidia-fabricmanager", "--no-pager", "-l")
    assert res.returncode == 3
    assert "Active: failed" in res.stdout
    res = _tool(sim_env, "systemctl", "is-active", "nvidia-fabricmanager")
    assert (res.returncode, res.stdout) == (3, "failed\n")
    res = _tool(sim_env, "systemctl", "restart", "slurmd")
    assert res.returncode == 1
    assert "answers only" in res.stderr


def test_standins_fail_without_a_profile(sim_env: dict[str, str]) -> None:
    sim_env["GPUCTL_SIM_PROFILE"] = "/nonexistent/hw.json"
    for tool in ("journalctl", "systemctl"):
        res = _tool(sim_env, tool, "-k")
        assert res.returncode == 1
        assert "cannot read the simulated node" in res.stderr


# --- real nodes (root, openssh-server): bring-up, SSH with host keys checked, teardown

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not Path(sshnodes.SSHD).exists(),
    reason="needs root and openssh-server (scripts/bootstrap.sh --test installs it)",
)


def _ssh(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", *args], capture_output=True, text=True, check=False, timeout=30)


@pytest.mark.slow
@needs_root
def test_nodes_answer_over_ssh_with_host_keys_checked_and_leave_nothing() -> None:
    assert sshnodes.residue() == []
    with sshnodes.SshNodes(2) as nodes:
        with pytest.raises(sshnodes.HarnessError, match="another SSH node harness"):
            sshnodes.SshNodes(1).__enter__()
        gpu = nodes.gpu_nodes[1]
        client = [*nodes.ssh_options(), "-o", "BatchMode=yes", f"root@{gpu.address}"]
        res = _ssh([*client, "nvidia-smi -q -x"])
        assert res.returncode == 0, res.stderr
        parsed = parse("smi-xml", res.stdout)
        assert parsed.recognised
        assert len(parsed.data["gpus"]) == 8
        nodes.set_faults(gpu.name, {"gpu_lost": [2]})
        assert len(_ssh([*client, "nvidia-smi -L"]).stdout.splitlines()) == 7
        # a node whose key is not in known_hosts is refused (checking is on)
        res = _ssh(["-o", "UserKnownHostsFile=/dev/null", *client, "true"])  # first one wins
        assert res.returncode == 255
        assert "Host key verification failed" in res.stderr
        # the controller has no simulated tools
        ctl = nodes.nodes[0].address
        res = _ssh(
            [*nodes.ssh_options(), "-o", "BatchMode=yes", f"root@{ctl}", "command -v nvidia-smi"]
        )
        assert res.returncode == 1
    assert sshnodes.residue() == []


@pytest.mark.slow
@needs_root
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_tears_everything_down(sig: signal.Signals) -> None:
    code = (
        "import signal, sys, time\n"
        # a background job inherits SIGINT ignored (CI may run us so); Ctrl-C in a terminal
        # reaches Python's default handler, which this restores
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "import sshnodes\n"
        "with sshnodes.SshNodes(3):\n"
        "    print('up', flush=True)\n"
        "    time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "up\n"
        assert any(ns.startswith(sshnodes.NETNS_PREFIX) for ns in sshnodes._namespaces())
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc != 0
    deadline = time.monotonic() + 5
    left: list[Any] = sshnodes.residue()
    while left and time.monotonic() < deadline:  # namespace removal is asynchronous
        time.sleep(0.1)
        left = sshnodes.residue()
    assert left == []


# --- benchmarks/validate_quick_64.py: what each tool runs, and when a run does not count


def _done(stdout: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], rc, stdout, "")


def test_peers_run_gpuctls_quick_probes_at_their_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = sshnodes.SshNodes(3)
    doc = sshnodes.cluster_doc(3, nodes.key, nodes.known_hosts)
    cluster = tmp_path / "cluster.yml"
    cluster.write_text(yaml.safe_dump(doc), encoding="utf-8")
    commands = bench.quick_commands(cluster, "gpu001")
    assert commands[0] == "nvidia-smi -q -x"
    assert "ibstat" in commands
    assert any(c.startswith("journalctl ") for c in commands)
    assert any(c.startswith("systemctl status nvidia-fabricmanager") for c in commands)

    clush = bench.clush_tool(nodes, commands).steps(tmp_path)
    assert [argv[-1] for argv in clush] == commands
    for argv in clush:
        assert argv[1:3] == ["-w", "198.19.0.[11-13]"]
        assert "-S" in argv  # the largest return code, so a failed node fails the run
        assert "-f" not in argv  # clush's default fanout
        assert "--fanout" not in argv
        assert "StrictHostKeyChecking=yes" in argv[argv.index("-o") + 1]

    ansible = bench.ansible_tool(nodes, tmp_path / "inv.yml", commands)
    steps = ansible.steps(tmp_path)
    assert [argv[-1] for argv in steps] == commands
    for argv in steps:
        assert argv[1:] == ["all", "-i", str(tmp_path / "inv.yml"), "-m", "command", "-a", argv[-1]]
    monkeypatch.setenv("ANSIBLE_FORKS", "50")  # an operator's setting must not reach the peer
    env = ansible.env(tmp_path)
    assert "ANSIBLE_FORKS" not in env
    assert sorted(k for k in env if k.startswith("ANSIBLE_")) == [
        "ANSIBLE_HOME",
        "ANSIBLE_NOCOLOR",
        "ANSIBLE_REMOTE_TMP",
    ]

    gpuctl = bench.gpuctl_tool(nodes, cluster).steps(tmp_path)
    assert gpuctl == [
        [
            str(bench.BIN / "gpuctl"),
            "validate",
            str(cluster),
            "--level",
            "quick",
            "--limit",
            "gpu[001-003]",
            "--out",
            str(tmp_path / "bundle"),
        ]
    ]


def test_a_run_with_a_failed_node_does_not_count(tmp_path: Path) -> None:
    nodes = sshnodes.SshNodes(2)
    commands = ["ibstat"]
    ansible = bench.ansible_tool(nodes, tmp_path / "inv.yml", commands)
    good = "gpu001 | CHANGED | rc=0 >>\nx\ngpu002 | CHANGED | rc=0 >>\ny\n"
    assert ansible.check(tmp_path, [_done(good)]) is None
    half = "gpu001 | CHANGED | rc=0 >>\nx\ngpu002 | FAILED | rc=1 >>\n"
    assert "1/2 hosts" in (ansible.check(tmp_path, [_done(half, 2)]) or "")
    clush = bench.clush_tool(nodes, commands)
    assert clush.check(tmp_path, [_done("---\nout\n")]) is None
    assert clush.check(tmp_path, [_done("clush: 198.19.0.12: exited with exit code 1\n", 1)])

    gpuctl = bench.gpuctl_tool(nodes, tmp_path / "cluster.yml")
    assert "exited 1" in (gpuctl.check(tmp_path, [_done("gpu002 fail", 1)]) or "")
    assert "0 node folders" in (gpuctl.check(tmp_path, [_done("")]) or "")
    for name in ("gpu001", "gpu002"):
        (tmp_path / "bundle" / name).mkdir(parents=True)
        (tmp_path / "bundle" / name / "meta.json").write_text('{"probes": {}}', "utf-8")
    assert gpuctl.check(tmp_path, [_done("")]) is None
    (tmp_path / "bundle" / "gpu002" / "meta.json").write_text(
        '{"unreachable": "connection refused"}', "utf-8"
    )
    assert "gpu002: unreachable" in (gpuctl.check(tmp_path, [_done("")]) or "")


@pytest.mark.slow
@needs_root
def test_the_benchmark_runs_end_to_end_on_two_nodes() -> None:
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "validate_quick_64.py"),
            "--nodes",
            "2",
            "--repeat",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode in (0, 1), res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert set(doc["medians_s"]) == {"gpuctl", "clush", "ansible"}
    assert doc["ratios"]["gpuctl/clush"] > 0
    assert sshnodes.residue() == []
