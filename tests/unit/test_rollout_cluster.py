"""The rollout's real backend (gpuctl.rollout.cluster) over a scripted SSH transport: the exact
command lines it sends, how it reads real tool outputs, and where it fails closed."""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.errors import UsageError
from gpuctl.remote import ExecResult, Target, Unreachable
from gpuctl.rollout.backend import BackendError
from gpuctl.rollout.cluster import REMOTE_DIR, ClusterBackend, check_supported
from gpuctl.rollout.model import Component, Restart

FIXTURES = ROOT / "tests" / "fixtures"


def body(path: Path) -> str:
    """A fixture's output: everything after its provenance header's ``# ---`` line."""
    text = path.read_text(encoding="utf-8")
    return text.split("# ---\n", 1)[1]


Reply = ExecResult | Callable[[str, list[str]], ExecResult]


def ok(out: str = "") -> ExecResult:
    return ExecResult(stdout=out.encode(), rc=0)


@dataclass
class _Running:
    result: ExecResult

    def wait_for(self, text: str, timeout: float) -> bool:
        return False

    def finish(self, timeout: float) -> ExecResult:
        return self.result


@dataclass
class Script:
    """Answers commands by their argv prefix; records every command per host."""

    answers: dict[tuple[str, ...], Reply] = field(default_factory=dict)
    log: list[tuple[str, list[str]]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)

    def answer(self, host: str, argv: list[str]) -> ExecResult:
        self.log.append((host, argv))
        for n in range(len(argv), 0, -1):
            reply = self.answers.get(tuple(argv[:n]))
            if reply is not None:
                return reply(host, argv) if callable(reply) else reply
        return ExecResult(stderr=b"not scripted", rc=127)

    def commands(self, host: str) -> list[list[str]]:
        return [argv for h, argv in self.log if h == host]


@dataclass
class _Session:
    host: str
    script: Script

    def start(self, command: str) -> _Running:
        words = shlex.split(command)
        if words[:1] == ["timeout"]:
            words = words[4:]
        return _Running(self.script.answer(self.host, words))

    def put(self, data: bytes, remote: str) -> str:
        path = remote if remote.startswith("/") else f"/home/op/{remote}"
        self.script.files[path] = data
        return path

    def close(self) -> None:
        pass


@dataclass
class Connector:
    script: Script

    def connect(self, target: Target) -> _Session:
        if target.node in self.script.down:
            raise Unreachable("connection refused")
        return _Session(target.node, self.script)

    def close(self) -> None:
        pass


# GPU nodes in the lab cluster's cluster_yml fixture (tests/conftest.py)
LAB_NODES = 2


def backend(cluster_yml: Path, script: Script, **kw: object) -> ClusterBackend:
    clock = {"t": 0.0}

    def sleep(s: float) -> None:
        clock["t"] += s

    return ClusterBackend(
        cluster_yml,
        load_cluster(cluster_yml),
        connector=Connector(script),
        clock=lambda: clock["t"],
        sleeper=sleep,
        **kw,  # type: ignore[arg-type]
    )


# -- refusals before anything runs ----------------------------------------------------------


def test_firmware_components_need_an_image_file(cluster_yml: Path, tmp_path: Path) -> None:
    cluster = load_cluster(cluster_yml)
    nodes = ["gpu001"]
    for component in (Component.NIC_FIRMWARE, Component.GPU_FIRMWARE, Component.BMC_FIRMWARE):
        with pytest.raises(UsageError, match=f"{component}: give the firmware image"):
            check_supported(cluster_yml, cluster, component, "28.41.1000", None, nodes)
        with pytest.raises(UsageError, match="is not a file"):
            check_supported(
                cluster_yml, cluster, component, "28.41.1000", tmp_path / "nope.bin", nodes
            )
    version = cluster.software.driver.version
    with pytest.raises(UsageError, match="--image applies to firmware components, not driver"):
        check_supported(cluster_yml, cluster, Component.DRIVER, version, cluster_yml, nodes)


def test_a_driver_rollout_must_target_the_version_cluster_yml_pins(cluster_yml: Path) -> None:
    cluster = load_cluster(cluster_yml)
    pinned = cluster.software.driver.version
    check_supported(cluster_yml, cluster, Component.DRIVER, pinned, None, ["gpu001"])
    with pytest.raises(UsageError, match=f"pins software.driver.version {pinned}"):
        check_supported(cluster_yml, cluster, Component.DRIVER, "999.1.1", None, ["gpu001"])


# -- Slurm ------------------------------------------------------------------------------------


def test_slurm_state_and_reason_from_a_real_scontrol_record(cluster_yml: Path) -> None:
    text = body(FIXTURES / "slurm" / "scontrol-show-node-idle-drain-gres-count-lower-rtx3090.txt")
    text = text.replace("yigou-dev-102-68", "gpu001")
    script = Script({("scontrol", "show", "node", "gpu001"): ok(text)})
    node = backend(cluster_yml, script).slurm_node("gpu001")
    assert node.flags == frozenset({"IDLE", "DRAIN"})
    assert node.is_drained
    assert node.responding
    assert node.reason is not None
    assert node.reason.startswith("gres/gpu count reported lower")
    assert script.log[0][0] == "ctl01"  # asked on the controller


@pytest.mark.parametrize(
    "state",
    # scontrol's long form (Slurm >= 20.02) and the short one with the "*" suffix
    ["IDLE+DRAIN+NOT_RESPONDING", "IDLE*+DRAIN"],
)
def test_slurmd_not_responding_is_seen_in_either_state_form(cluster_yml: Path, state: str) -> None:
    text = body(FIXTURES / "slurm" / "scontrol-show-node-idle-drain-gres-count-lower-rtx3090.txt")
    text = text.replace("yigou-dev-102-68", "gpu001").replace("State=IDLE+DRAIN", f"State={state}")
    script = Script({("scontrol", "show", "node", "gpu001"): ok(text)})
    node = backend(cluster_yml, script).slurm_node("gpu001")
    assert node.is_drained
    assert not node.responding
    assert node.is_down  # someone else's such node is left alone


def test_slurm_failures_are_errors_not_states(cluster_yml: Path) -> None:
    script = Script({("scontrol",): ExecResult(stderr=b"slurm_load_node error", rc=1)})
    with pytest.raises(BackendError, match="exit 1: slurm_load_node error"):
        backend(cluster_yml, script).slurm_node("gpu001")
    script = Script({("scontrol",): ok("nothing like a node record\n")})
    with pytest.raises(BackendError, match=r"not understood|does not know"):
        backend(cluster_yml, script).slurm_node("gpu001")


def test_drain_resume_and_jobs_command_lines(cluster_yml: Path) -> None:
    script = Script({("scontrol", "update"): ok(), ("squeue",): ok("1041\n1042\n")})
    b = backend(cluster_yml, script)
    b.drain("gpu002", "gpuctl rollout: nic-firmware 28.41.1000")
    b.resume("gpu002")
    assert b.jobs_on("gpu002") == 2
    assert script.commands("ctl01") == [
        [
            "scontrol",
            "update",
            "nodename=gpu002",
            "state=drain",
            "reason=gpuctl rollout: nic-firmware 28.41.1000",
        ],
        ["scontrol", "update", "nodename=gpu002", "state=resume"],
        ["squeue", "--noheader", "--nodelist=gpu002", "--states=R,CG,S", "--format=%A"],
    ]


def test_unreadable_squeue_output_is_an_error(cluster_yml: Path) -> None:
    script = Script({("squeue",): ok("squeue: error: Invalid node name specified\n")})
    with pytest.raises(BackendError, match="unexpected output"):
        backend(cluster_yml, script).jobs_on("gpu002")


# -- nic-firmware ----------------------------------------------------------------------------


def test_nic_versions_from_a_real_query_with_a_pending_image(cluster_yml: Path) -> None:
    text = body(FIXTURES / "rollout" / "mlxfwmanager-query-cx3pro-fw-running-pending-windows.txt")
    script = Script({("mlxfwmanager", "--query"): ok(text)})
    v = backend(cluster_yml, script).versions("gpu001", Component.NIC_FIRMWARE)
    assert v.running is not None
    assert v.pending is not None
    assert v.pending != v.running


def test_a_failed_query_is_an_error_not_a_version(cluster_yml: Path) -> None:
    script = Script({("mlxfwmanager",): ExecResult(stderr=b"-E- No devices found", rc=255)})
    with pytest.raises(BackendError, match="No devices found"):
        backend(cluster_yml, script).versions("gpu001", Component.NIC_FIRMWARE)


def _image(tmp_path: Path) -> tuple[Path, str]:
    image = tmp_path / "fw-28.43.1014.bin"
    image.write_bytes(b"lab image\n" * 100)
    return image, hashlib.sha256(image.read_bytes()).hexdigest()


def test_the_image_is_copied_checked_and_burned(cluster_yml: Path, tmp_path: Path) -> None:
    image, sha = _image(tmp_path)
    remote = f"{REMOTE_DIR}/{sha[:16]}-{image.name}"
    burn = body(FIXTURES / "rollout" / "mlxup-update-cx7-2dev-burn-restart-needed.out")
    copied: list[bool] = []

    def sha256sum(host: str, argv: list[str]) -> ExecResult:
        if not copied:
            return ExecResult(stderr=b"No such file or directory", rc=1)
        return ok(f"{sha}  {remote}\n")

    def mv(host: str, argv: list[str]) -> ExecResult:
        copied.append(True)
        return ok()

    script = Script(
        {
            ("sha256sum",): sha256sum,
            ("install",): ok(),
            ("mv",): mv,
            ("chown",): ok(),
            ("mlxfwmanager", "-u"): ok(burn),
        }
    )
    backend(cluster_yml, script, image=image).apply("gpu001", Component.NIC_FIRMWARE, "28.43.1014")
    assert script.files[f"{remote}.part"] == image.read_bytes()
    cmds = script.commands("gpu001")
    assert ["mv", "-f", "--", f"{remote}.part", remote] in cmds
    assert cmds[-1] == ["mlxfwmanager", "-u", "-i", remote, "-y"]


def test_an_image_that_arrives_damaged_is_never_burned(cluster_yml: Path, tmp_path: Path) -> None:
    image, _ = _image(tmp_path)
    script = Script(
        {
            ("sha256sum",): ok("0000  x\n"),
            ("install",): ok(),
            ("mv",): ok(),
            ("chown",): ok(),
            ("mlxfwmanager",): ok(""),
        }
    )
    with pytest.raises(BackendError, match="SHA-256 does not match"):
        backend(cluster_yml, script, image=image).apply(
            "gpu001", Component.NIC_FIRMWARE, "28.43.1014"
        )
    assert not any(argv[0] == "mlxfwmanager" for argv in script.commands("gpu001"))


def test_a_failed_burn_is_an_error(cluster_yml: Path, tmp_path: Path) -> None:
    image, sha = _image(tmp_path)
    remote = f"{REMOTE_DIR}/{sha[:16]}-{image.name}"
    script = Script(
        {
            ("sha256sum",): ok(f"{sha}  {remote}\n"),
            ("mlxfwmanager",): ExecResult(stdout=b"-E- Failed to open image file\n", rc=255),
        }
    )
    with pytest.raises(BackendError):
        backend(cluster_yml, script, image=image).apply(
            "gpu001", Component.NIC_FIRMWARE, "28.43.1014"
        )
    # already there with the right checksum: not copied again
    assert script.files == {}


# -- restart --------------------------------------------------------------------------------


def test_a_reboot_is_back_only_with_a_new_boot_id(cluster_yml: Path) -> None:
    boots = iter(["aaaa\n", "aaaa\n", "aaaa\n", "bbbb\n"])
    script = Script(
        {
            ("cat",): lambda h, a: ok(next(boots)),
            ("systemctl", "reboot"): ExecResult(error="ssh: connection lost"),
            ("systemctl", "is-system-running"): ok("running\n"),
        }
    )
    b = backend(cluster_yml, script)
    b.restart("gpu001", Restart.REBOOT)
    assert b.wait_up("gpu001", 600)
    assert ["systemctl", "reboot"] in script.commands("gpu001")
    assert b.now() >= 10  # two polls saw the old boot id


def test_a_node_that_stays_away_is_not_up(cluster_yml: Path) -> None:
    script = Script({("cat",): ok("aaaa\n"), ("systemctl",): ok()})
    b = backend(cluster_yml, script)
    b.restart("gpu001", Restart.REBOOT)
    script.down.add("gpu001")
    assert not b.wait_up("gpu001", 120)
    assert 120 <= b.now() < 130


@dataclass
class StubBmc:
    """Records what the backend asks of the BMC (gpuctl.rollout.bmc.BmcAccess's methods)."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    fail: bool = False

    def power_cycle(self, node: str) -> None:
        self.calls.append(("power_cycle", node))
        if self.fail:
            raise BackendError(f"{node}: ComputerSystem.Reset refused")


def test_a_power_cycle_goes_through_the_bmc_and_waits_for_a_new_boot(cluster_yml: Path) -> None:
    boots = iter(["aaaa\n", "aaaa\n", "bbbb\n"])
    script = Script(
        {
            ("cat",): lambda _h, _a: ok(next(boots)),
            ("systemctl", "is-system-running"): ok("running\n"),
        }
    )
    stub = StubBmc()
    b = backend(cluster_yml, script, bmc=stub)
    b.restart("gpu001", Restart.POWER_CYCLE)
    assert stub.calls == [("power_cycle", "gpu001")]
    assert ["systemctl", "reboot"] not in script.commands("gpu001")  # not a warm reboot
    assert b.wait_up("gpu001", 600)
    assert b.now() >= 5  # one poll saw the old boot id


def test_a_node_whose_os_hangs_is_power_cycled_all_the_same(cluster_yml: Path) -> None:
    script = Script({("systemctl", "is-system-running"): ok("running\n")})
    script.down.add("gpu001")
    stub = StubBmc()
    b = backend(cluster_yml, script, bmc=stub)
    b.restart("gpu001", Restart.POWER_CYCLE)
    assert stub.calls == [("power_cycle", "gpu001")]
    assert not b.wait_up("gpu001", 30)  # still unreachable: not up
    script.down.clear()
    script.answers[("cat",)] = ok("cccc\n")
    assert b.wait_up("gpu001", 30)  # no boot id recorded: reachable again is back


def test_a_refused_power_cycle_is_a_backend_error(cluster_yml: Path) -> None:
    script = Script({("cat",): ok("aaaa\n")})
    with pytest.raises(BackendError, match="Reset refused"):
        backend(cluster_yml, script, bmc=StubBmc(fail=True)).restart("gpu001", Restart.POWER_CYCLE)


# -- driver -------------------------------------------------------------------------------


def test_driver_versions_running_and_installed(cluster_yml: Path) -> None:
    smi = body(FIXTURES / "rollout" / "nvsmi-query-gpu-driver-version-csv-noheader-2gpu.out")
    running = smi.split()[0].strip()
    dpkg = "nvidia-driver\tii \t999.1.2-1\nnvidia-smi\tii \t999.1.2-1\n"
    script = Script({("nvidia-smi",): ok(smi), ("dpkg-query",): ok(dpkg)})
    v = backend(cluster_yml, script).versions("gpu001", Component.DRIVER)
    assert v.running == running
    assert v.pending == "999.1.2"


def test_driver_unreachable_node_is_an_error(cluster_yml: Path) -> None:
    script = Script(down={"gpu001"})
    with pytest.raises(BackendError, match="cannot reach gpu001: connection refused"):
        backend(cluster_yml, script).versions("gpu001", Component.DRIVER)


def test_driver_apply_runs_the_provisioning_once_per_node(cluster_yml: Path) -> None:
    calls: list[str] = []

    def provision(node: str) -> str | None:
        calls.append(node)
        return None if node == "gpu001" else "run 20261201T000000Z failed"

    b = backend(cluster_yml, Script(), provision_fn=provision)
    b.apply("gpu001", Component.DRIVER, "x")
    with pytest.raises(BackendError, match=r"gpuctl provision of gpu002: run .* failed"):
        b.apply("gpu002", Component.DRIVER, "x")
    assert calls == ["gpu001", "gpu002"]


def test_a_driver_rollout_runs_the_version_gate_before_the_driver_roles(
    cluster_yml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpuctl rollout --component driver` provisions with the preflight role's version gate
    (tag preflight_versions), as a full `gpuctl provision` does: its --tags used to skip it."""
    import gpuctl.provision
    from gpuctl.provision import ProvisionResult, RunRecord
    from gpuctl.rollout.cluster import DRIVER_TAGS, provision_with_gpuctl

    seen: list[dict[str, object]] = []

    def fake_provision(cluster: object, **kw: object) -> ProvisionResult:
        seen.append(kw)
        record = RunRecord("r1", "c", "now", status="successful")
        return ProvisionResult("r1", tmp_path, record, 0.0)

    monkeypatch.setattr(gpuctl.provision, "provision", fake_provision)
    run = provision_with_gpuctl(load_cluster(cluster_yml), cluster_yml, tmp_path)
    assert run("gpu001") is None
    assert seen[0]["limit"] == "gpu001"
    assert seen[0]["tags"] == DRIVER_TAGS
    assert DRIVER_TAGS.split(",") == ["preflight_versions", "nvidia_driver", "fabric_manager"]


def test_the_driver_tags_name_the_version_gate_and_the_driver_roles() -> None:
    """Each tag of DRIVER_TAGS selects what it is meant to: preflight_versions the version gate
    (and nothing else of the preflight role), the others their roles in site.yml."""
    import yaml

    from gpuctl.rollout.cluster import DRIVER_TAGS

    preflight = yaml.safe_load(
        (ROOT / "playbooks/roles/preflight/tasks/main.yml").read_text(encoding="utf-8")
    )
    gated = [t for t in preflight if "preflight_versions" in t.get("tags", [])]
    assert [t["ansible.builtin.include_tasks"]["file"] for t in gated] == ["versions.yml"]
    assert "preflight_versions" in gated[0]["ansible.builtin.include_tasks"]["apply"]["tags"]
    site = (ROOT / "playbooks/site.yml").read_text(encoding="utf-8")
    assert "import_playbook: preflight.yml" in site
    for role in DRIVER_TAGS.split(",")[1:]:
        assert (ROOT / "playbooks/roles" / role / "tasks/main.yml").is_file()
