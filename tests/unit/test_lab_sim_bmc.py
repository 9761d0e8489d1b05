"""The lab's SIMULATED Redfish BMCs (gpuctl/lab/sim/bmc/), in process on 127.0.0.1 with real TLS
(the lab CA made by ensure_tls), real HTTP Basic credentials from the Ansible Vault file, and
driven by the real Redfish client (gpuctl/rollout/redfish.py). The node is a fake root (its
hardware.json and faults.json) and its power a fake (the lab signals the node's supervisor;
that protocol is tested at the end with a fake systemd-nspawn)."""

from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import os
import signal
import ssl
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuctl.lab import lab as lab_module
from gpuctl.lab.sim import bmc, mft, profiles, standin
from gpuctl.lab.system import LabError
from gpuctl.rollout import redfish

NODE = "gpu001"
PROFILE = "hgx-h100-ndr"
OLD_GPU = "96.00.74.00.01"
NEW_GPU = "96.00.99.00.07"
OLD_BMC = "lab-bmc-2.6.3"
TIMING = bmc.Timing(task_s=0.5, reset_s=1.0, reset_delay_s=0.3, power_off_timeout_s=5)


@dataclass
class FakePower:
    """A node's power as the lab's supervisor would switch it (boots counted)."""

    on: bool = True
    boots: int = 1
    events: list[str] = field(default_factory=list)

    def is_on(self) -> bool:
        return self.on

    def force_off(self) -> None:
        self.events.append("force_off")
        self.on = False

    def graceful_off(self) -> None:
        self.events.append("graceful_off")
        self.on = False

    def restart(self, graceful: bool) -> None:
        self.events.append("graceful_restart" if graceful else "force_restart")
        self.boots += 1

    def power_on(self) -> None:
        self.events.append("power_on")
        if not self.on:
            self.on = True
            self.boots += 1

    def wait_off(self, timeout: float) -> bool:
        return not self.on


@dataclass
class Lab:
    service: bmc.BmcService
    power: FakePower
    root: Path
    secrets_dir: Path
    state_dir: Path
    log: Path
    username: str
    password: str

    @property
    def ca(self) -> str:
        return str(self.secrets_dir / "ca.pem")

    def client(
        self, password: str | None = None, *, ca: str | None = "", url: str | None = None
    ) -> redfish.RedfishClient:
        endpoint = redfish.BmcEndpoint(
            url or self.service.url(NODE), ca_bundle=self.ca if ca == "" else ca
        )
        creds = redfish.Credentials(self.username, self.password if password is None else password)
        return redfish.RedfishClient(endpoint, creds, timeout_s=5)

    def faults(self, faults: dict[str, Any]) -> None:
        path = self.root / "var" / "lib" / "gpuctl-lab-sim" / "faults.json"
        path.write_text(json.dumps(faults))

    def state(self) -> dict[str, Any]:
        self.service.bmcs[NODE].state()  # made on first use
        data: dict[str, Any] = json.loads((self.state_dir / f"{NODE}.json").read_text())
        return data


def make_root(base: Path, profile: str = PROFILE) -> Path:
    root = base / "nodes" / NODE / "root"
    (root / "etc" / "gpuctl-lab").mkdir(parents=True)
    (root / "etc" / "gpuctl-lab" / "hardware.json").write_text(profiles.profile_json(profile))
    (root / "var" / "lib" / "gpuctl-lab-sim").mkdir(parents=True)
    return root


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    secrets_dir = tmp_path / "bmc"
    assert bmc.ensure_credentials(secrets_dir)
    assert bmc.ensure_tls([bmc.TEST_ADDRESS], secrets_dir)
    username, password = bmc.load_credentials(secrets_dir)
    root = make_root(tmp_path)
    power = FakePower()
    log = tmp_path / "bmc.log"
    handler = logging.FileHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger = logging.getLogger("gpuctl.lab.sim.bmc")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    service = bmc.BmcService(
        [bmc.BmcSpec(NODE, bmc.TEST_ADDRESS, root)],
        username=username,
        password=password,
        context=bmc.server_context(secrets_dir),
        state_directory=secrets_dir / "state",
        power=lambda spec: power,
        timing=TIMING,
        port=0,
    )
    service.start()
    try:
        yield Lab(service, power, root, secrets_dir, secrets_dir / "state", log, username, password)
    finally:
        service.stop()
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(logging.NOTSET)


def package(tmp_path: Path, component: str, version: str, model: str | None = "h100-sxm") -> Path:
    path = tmp_path / f"{component}-{version}.pkg"
    bmc.write_package(path, component, version, model if component == bmc.GPU_COMPONENT else None)
    return path


def fast_wait(client: redfish.RedfishClient, task: redfish.TaskRef | None) -> redfish.TaskResult:
    assert task is not None
    return redfish.wait_for_task(
        client, task, timeout_s=20, poll_s=0.1, sleep=lambda s: time.sleep(min(s, 0.1))
    )


def gpu_versions(client: redfish.RedfishClient) -> dict[str, str | None]:
    return {
        i.id: i.version
        for i in redfish.firmware_inventory(client)
        if i.id.startswith(bmc.GPU_INVENTORY_PREFIX)
    }


def eventually(check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def raw(
    lab: Lab,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    auth: bool = True,
) -> tuple[int, dict[str, str], bytes]:
    context = ssl.create_default_context(cafile=lab.ca)
    port = int(lab.service.url(NODE).rsplit(":", 1)[1])
    conn = http.client.HTTPSConnection(bmc.TEST_ADDRESS, port, context=context, timeout=5)
    all_headers = dict(headers or {})
    if auth:
        token = base64.b64encode(f"{lab.username}:{lab.password}".encode()).decode()
        all_headers["Authorization"] = f"Basic {token}"
    try:
        conn.request(method, path, body=body, headers=all_headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------
# Credentials, TLS, packages


def test_credentials_are_an_ansible_vault_made_once(tmp_path: Path) -> None:
    from ansible.parsing.vault import VaultLib, VaultSecret

    d = tmp_path / "bmc"
    assert bmc.ensure_credentials(d)
    user, password = bmc.load_credentials(d)
    assert user == "gpuctl-lab"
    assert len(password) >= 24
    data = (d / "credentials.vault.yml").read_bytes()
    assert data.startswith(b"$ANSIBLE_VAULT;1.1;AES256")
    assert password.encode() not in data
    vault_pw = (d / "vault-password").read_bytes().strip()
    plain = VaultLib([("default", VaultSecret(vault_pw))]).decrypt(data)
    assert f"password: {password}".encode() in plain
    for name in ("credentials.vault.yml", "vault-password"):
        assert stat.S_IMODE((d / name).stat().st_mode) == 0o600
    assert not bmc.ensure_credentials(d)  # reused: the same password
    assert bmc.load_credentials(d) == (user, password)
    (d / "vault-password").write_text("another\n")
    with pytest.raises(LabError, match="cannot be read"):
        bmc.load_credentials(d)
    assert bmc.ensure_credentials(d)  # unreadable: made again
    assert bmc.load_credentials(d)[1] != password


def test_tls_certificate_for_the_bmc_addresses(tmp_path: Path) -> None:
    from cryptography import x509

    d = tmp_path / "bmc"
    addresses = ["198.18.1.11", "198.18.1.12"]
    assert bmc.ensure_tls(addresses, d)
    assert stat.S_IMODE((d / "ca.pem").stat().st_mode) == 0o644
    for key in ("ca.key", "server.key"):
        assert stat.S_IMODE((d / key).stat().st_mode) == 0o600
    ca = (d / "ca.pem").read_bytes()
    cert = x509.load_pem_x509_certificate((d / "server.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(str(ip) for ip in sans.get_values_for_type(x509.IPAddress)) == addresses
    assert not bmc.ensure_tls(list(reversed(addresses)), d)  # same set: kept
    assert bmc.ensure_tls([*addresses, "198.18.1.13"], d)  # a new node: made again
    assert (d / "ca.pem").read_bytes() == ca  # by the same CA
    cert = x509.load_pem_x509_certificate((d / "server.pem").read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))


def test_only_lab_addresses_are_bound() -> None:
    bmc.check_bind_address("198.18.1.11")
    bmc.check_bind_address("198.19.255.1")
    bmc.check_bind_address("127.0.0.1")
    for address in ("10.0.0.1", "0.0.0.0", "198.20.0.1", "::1", "example.com"):  # noqa: S104
        with pytest.raises(LabError):
            bmc.check_bind_address(address)


def test_packages_name_component_version_and_model(tmp_path: Path) -> None:
    gpu = package(tmp_path, bmc.GPU_COMPONENT, NEW_GPU)
    text = gpu.read_bytes()
    assert text.startswith(b"gpuctl-lab-firmware-package 1\n")
    assert b"SIMULATION" in text.splitlines()[1]
    assert bmc.read_package(text) == bmc.LabPackage(bmc.GPU_COMPONENT, NEW_GPU, "h100-sxm")
    assert bmc.read_package(package(tmp_path, bmc.BMC_COMPONENT, "lab-bmc-2.7.1").read_bytes()) == (
        bmc.LabPackage(bmc.BMC_COMPONENT, "lab-bmc-2.7.1", None)
    )
    with pytest.raises(bmc.PackageError, match="SHA-256"):
        bmc.read_package(text[:-10])
    with pytest.raises(bmc.PackageError, match="not a gpuctl lab firmware package"):
        bmc.read_package(b"\x00PLDM firmware package")
    with pytest.raises(bmc.PackageError, match="VBIOS version"):
        bmc.package_bytes(bmc.GPU_COMPONENT, "lab-1", "h100-sxm")
    with pytest.raises(bmc.PackageError, match="GPU model"):
        bmc.package_bytes(bmc.GPU_COMPONENT, NEW_GPU)
    with pytest.raises(bmc.PackageError, match="letters, digits"):
        bmc.package_bytes(bmc.BMC_COMPONENT, "2.7 beta")


def test_lab_firmware_image_components(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCTL_LAB_DIR", str(tmp_path))
    make_root(tmp_path)
    psid = lab_module.firmware_image(NODE, "28.99.1000", tmp_path / "nic.bin")
    assert psid == "MT_0000000838"
    assert mft.read_image(str(tmp_path / "nic.bin")) == mft.LabImage(psid, "28.99.1000")
    model = lab_module.firmware_image(NODE, NEW_GPU, tmp_path / "gpu.pkg", bmc.GPU_COMPONENT)
    assert model == "h100-sxm"
    assert bmc.read_package((tmp_path / "gpu.pkg").read_bytes()).gpu_model == "h100-sxm"
    assert lab_module.firmware_image("none", "lab-bmc-3", tmp_path / "b.pkg", "bmc-firmware") == ""
    with pytest.raises(LabError, match="no simulated GPUs"):
        lab_module.firmware_image("gpu009", NEW_GPU, tmp_path / "x.pkg", bmc.GPU_COMPONENT)
    with pytest.raises(LabError, match="VBIOS"):
        lab_module.firmware_image(NODE, "1.2", tmp_path / "x.pkg", bmc.GPU_COMPONENT)
    with pytest.raises(LabError, match="unknown component"):
        lab_module.firmware_image(NODE, "1.2", tmp_path / "x.pkg", "driver")


def test_multipart_parser() -> None:
    body = (
        b"preamble\r\n--XyZ\r\n"
        b'Content-Disposition: form-data; name="UpdateParameters"\r\n'
        b"Content-Type: application/json\r\n\r\n"
        b'{"Targets": []}\r\n'
        b"--XyZ\r\n"
        b'Content-Disposition: form-data; name="UpdateFile"; filename="fw.pkg"\r\n\r\n'
        b"\r\n--Xy\r\nbinary\x00\xff\r\n"
        b"--XyZ--\r\n"
    )
    parts = bmc.parse_multipart(body, 'multipart/form-data; boundary="XyZ"')
    assert parts["UpdateParameters"].data == b'{"Targets": []}'
    assert parts["UpdateFile"].filename == "fw.pkg"
    assert parts["UpdateFile"].data == b"\r\n--Xy\r\nbinary\x00\xff"
    with pytest.raises(bmc.BadRequest):
        bmc.parse_multipart(body[:-12], "multipart/form-data; boundary=XyZ")
    with pytest.raises(bmc.BadRequest):
        bmc.parse_multipart(body, "application/json")


# ------------------------------------------------------------------------------------------
# The service, through the real client


def test_resources_have_odata_ids_and_the_service_root_needs_no_auth(lab: Lab) -> None:
    status, _, data = raw(lab, "GET", "/redfish/v1/", auth=False)
    assert status == 200
    root = json.loads(data)
    for key in ("Systems", "Managers", "UpdateService", "TaskService"):
        assert root[key]["@odata.id"].startswith("/redfish/v1/")
    client = lab.client()
    seen: set[str] = set()
    todo = ["/redfish/v1"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        resource = client.get(path)
        assert resource["@odata.id"] == path
        links = [v for v in resource.values() if isinstance(v, dict) and "@odata.id" in v]
        links += resource.get("Members") or []
        todo += [link["@odata.id"] for link in links]
    assert "/redfish/v1/Systems/System_0" in seen
    assert "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_SXM_8" in seen
    system = client.get("/redfish/v1/Systems/System_0")
    assert system["PowerState"] == "On"
    assert system["Actions"]["#ComputerSystem.Reset"] == {
        "target": "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset",
        "ResetType@Redfish.AllowableValues": [
            "On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "PowerCycle"
        ],
    }  # fmt: skip
    manager = client.get("/redfish/v1/Managers/BMC_0")
    assert manager["Actions"]["#Manager.Reset"]["ResetType@Redfish.AllowableValues"] == [
        "GracefulRestart",
        "ForceRestart",
    ]
    service = redfish.update_service(client)
    assert service["MultipartHttpPushUri"] == "/redfish/v1/UpdateService/update-multipart"
    lab.power.on = False
    assert client.get("/redfish/v1/Systems/System_0")["PowerState"] == "Off"


def test_inventory_and_manager_versions(lab: Lab) -> None:
    client = lab.client()
    items = redfish.firmware_inventory(client)
    assert [i.id for i in items] == [f"HGX_FW_GPU_SXM_{n}" for n in range(1, 9)] + ["BMC_Firmware"]
    assert all(i.updateable and i.state == "Enabled" for i in items)
    assert gpu_versions(client) == {f"HGX_FW_GPU_SXM_{n}": OLD_GPU for n in range(1, 9)}
    assert redfish.inventory_version(items, "BMC_Firmware") == OLD_BMC
    assert redfish.manager_firmware_version(client) == OLD_BMC
    assert redfish.bmc_versions(client).running == OLD_BMC
    # the firmware fault is what the node's nvidia-smi shows: the BMC shows it too
    lab.faults({"firmware": {"gpu3": "96.00.01.00.01"}})
    # GPU 3 of the H100 profile sits in SXM slot 1 (module id 1)
    assert gpu_versions(client)["HGX_FW_GPU_SXM_1"] == "96.00.01.00.01"


def test_wrong_or_missing_credentials_are_refused(lab: Lab) -> None:
    with pytest.raises(redfish.RedfishHTTPError) as caught:
        redfish.manager_firmware_version(lab.client("not-the-password"))
    assert caught.value.status == 401
    assert "not-the-password" not in str(caught.value)
    status, headers, body = raw(lab, "GET", "/redfish/v1/Managers/BMC_0", auth=False)
    assert status == 401
    assert headers["WWW-Authenticate"] == 'Basic realm="Redfish"'
    assert json.loads(body)["error"]["code"] == "Base.1.18.NoValidSession"
    status, _, _ = raw(
        lab, "GET", "/redfish/v1/Systems", auth=False, headers={"Authorization": "Basic %%%"}
    )
    assert status == 401


def test_tls_is_refused_without_the_lab_ca_or_for_another_name(lab: Lab) -> None:
    with pytest.raises(redfish.RedfishTLSError, match="certificate verify failed"):
        redfish.manager_firmware_version(lab.client(ca=None))  # the system store only
    port = lab.service.url(NODE).rsplit(":", 1)[1]
    with pytest.raises(redfish.RedfishTLSError):  # the certificate names 127.0.0.1 only
        redfish.manager_firmware_version(lab.client(url=f"https://localhost:{port}"))
    assert redfish.manager_firmware_version(lab.client()) == OLD_BMC


def test_gpu_update_is_staged_until_a_power_cycle(lab: Lab, tmp_path: Path) -> None:
    client = lab.client()
    targets = [
        i.odata_id for i in redfish.firmware_inventory(client) if i.id.startswith("HGX_FW_GPU_")
    ]
    task = redfish.multipart_update(
        client, package(tmp_path, bmc.GPU_COMPONENT, NEW_GPU), targets=targets
    )
    assert task is not None
    assert task.monitor_uri is not None
    assert task.monitor_uri.startswith("/redfish/v1/TaskService/TaskMonitors/")
    assert task.task_uri is not None
    assert task.task_uri.startswith("/redfish/v1/TaskService/Tasks/")
    first, _ = redfish.poll_task(client, task)
    assert first is not None
    assert (first.state, first.status) == ("Running", "OK")
    status, headers, body = raw(lab, "GET", task.monitor_uri)
    assert status == 202
    assert headers["Location"] == task.monitor_uri
    assert json.loads(body)["TaskState"] == "Running"
    result = fast_wait(client, task)
    assert (result.state, result.status, result.percent) == ("Completed", "OK", 100)
    assert any("power cycle" in m for m in result.messages)
    status, _, body = raw(lab, "GET", task.monitor_uri)
    assert (status, json.loads(body)["TaskState"]) == (200, "Completed")
    # staged: the GPUs run the old firmware, also after a warm reset
    assert set(gpu_versions(client).values()) == {OLD_GPU}
    assert lab.state()["gpu_firmware_staged"] == {str(i): NEW_GPU for i in range(8)}
    assert redfish.reset_system(client, "System_0", "ForceRestart") is None
    eventually(lambda: lab.power.events == ["force_restart"])
    redfish.reset_system(client, "System_0", "GracefulRestart")
    eventually(lambda: lab.power.events == ["force_restart", "graceful_restart"])
    assert set(gpu_versions(client).values()) == {OLD_GPU}
    assert lab.power.boots == 3
    # a power cycle: the GPUs lose power, the staged firmware runs, the node boots again
    redfish.reset_system(client, "System_0", "PowerCycle")
    eventually(lambda: lab.power.events[2:] == ["force_off", "power_on"])
    assert lab.power.boots == 4
    eventually(lambda: set(gpu_versions(client).values()) == {NEW_GPU})
    assert lab.state()["gpu_firmware_staged"] == {}
    running = json.loads((lab.root / "var/lib/gpuctl-lab-sim/gpu-firmware.json").read_text())
    assert running == {"gpus": {str(i): NEW_GPU for i in range(8)}}
    # what the node's nvidia-smi shows (the stand-in, reading the node's files)
    out = io.StringIO()
    env = {
        "GPUCTL_SIM_PROFILE": str(lab.root / "etc/gpuctl-lab/hardware.json"),
        "GPUCTL_SIM_FAULTS": str(lab.root / "var/lib/gpuctl-lab-sim/faults.json"),
        "GPUCTL_SIM_NODE": NODE,
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("GPUCTL_SIM_STATE_DIR", raising=False)
        rc = standin.main(
            "nvidia-smi", ["--query-gpu=vbios_version", "--format=csv,noheader"], out, io.StringIO()
        )
    assert rc == 0
    assert out.getvalue().split() == [NEW_GPU] * 8


def test_one_gpu_targeted_and_force_off_then_on(lab: Lab, tmp_path: Path) -> None:
    client = lab.client()
    target = "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_SXM_1"
    fast_wait(
        client,
        redfish.multipart_update(
            client, package(tmp_path, bmc.GPU_COMPONENT, NEW_GPU), targets=[target]
        ),
    )
    assert lab.state()["gpu_firmware_staged"] == {"3": NEW_GPU}  # module id 1 is GPU 3
    redfish.reset_system(client, "System_0", "ForceOff")
    eventually(lambda: lab.power.events == ["force_off"])
    eventually(lambda: gpu_versions(client)["HGX_FW_GPU_SXM_1"] == NEW_GPU)
    assert client.get("/redfish/v1/Systems/System_0")["PowerState"] == "Off"
    versions = gpu_versions(client)
    assert [v for k, v in versions.items() if k != "HGX_FW_GPU_SXM_1"] == [OLD_GPU] * 7
    redfish.reset_system(client, "System_0", "On")
    eventually(lambda: lab.power.on)
    assert lab.power.events == ["force_off", "power_on"]


def test_bmc_update_resets_the_bmc_then_runs_the_new_version(lab: Lab, tmp_path: Path) -> None:
    client = lab.client()
    image = package(tmp_path, bmc.BMC_COMPONENT, "lab-bmc-2.7.1")
    task = redfish.multipart_update(client, image, apply_time="Immediate")
    result = fast_wait(client, task)
    assert result.state == "Completed"
    assert redfish.manager_firmware_version(client) == OLD_BMC  # not reset yet
    # the BMC resets itself: its address refuses connections, then answers the new version
    with pytest.raises(redfish.RedfishError) as caught:
        _poll_until_it_fails(client)
    # refused (or reset, for a connection caught in the closing listener's queue)
    assert any(word in str(caught.value).lower() for word in ("refused", "reset by peer"))
    assert not isinstance(caught.value, redfish.RedfishHTTPError)
    eventually(lambda: _answers(client))
    assert redfish.manager_firmware_version(client) == "lab-bmc-2.7.1"
    assert redfish.inventory_version(redfish.firmware_inventory(client), "BMC_Firmware") == (
        "lab-bmc-2.7.1"
    )
    # the task is still there after the reset
    assert task is not None
    assert redfish.poll_task(client, task)[0] == result
    assert lab.power.events == []  # the host kept running


def _poll_until_it_fails(client: redfish.RedfishClient, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        redfish.manager_firmware_version(client)
        time.sleep(0.05)


def _answers(client: redfish.RedfishClient) -> bool:
    try:
        redfish.manager_firmware_version(client)
    except redfish.RedfishError:
        return False
    return True


def test_bmc_update_on_reset_waits_for_a_manager_reset(lab: Lab, tmp_path: Path) -> None:
    client = lab.client()
    image = package(tmp_path, bmc.BMC_COMPONENT, "lab-bmc-2.7.2")
    target = "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware"
    fast_wait(
        client, redfish.multipart_update(client, image, targets=[target], apply_time="OnReset")
    )
    time.sleep(TIMING.reset_delay_s + 0.2)
    assert redfish.manager_firmware_version(client) == OLD_BMC
    assert lab.state()["bmc_firmware"] == {"running": OLD_BMC, "staged": "lab-bmc-2.7.2"}
    assert redfish.reset_manager(client, "BMC_0", "GracefulRestart") is None
    eventually(lambda: not _answers(client), timeout=3)
    eventually(lambda: _answers(client))
    assert redfish.manager_firmware_version(client) == "lab-bmc-2.7.2"


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("not-a-package", "not a gpuctl lab firmware package"),
        ("nic-image", "not a gpuctl lab firmware package"),
        ("other-model", "the package is for a100-sxm4-80gb GPUs, this node has h100-sxm"),
        ("bmc-target", "is not a gpu-firmware component"),
        ("unknown-target", "is not in this BMC's FirmwareInventory"),
        ("fault", "simulated fault fw_update_fails"),
    ],
)
def test_bad_updates_end_in_exception(lab: Lab, tmp_path: Path, kind: str, expected: str) -> None:
    client = lab.client()
    image = package(tmp_path, bmc.GPU_COMPONENT, NEW_GPU)
    targets: list[str] = []
    if kind == "not-a-package":
        image.write_bytes(os.urandom(4096))
    elif kind == "nic-image":
        mft.write_image(str(image), "MT_0000000838", "28.99.1000")
    elif kind == "other-model":
        image = package(tmp_path, bmc.GPU_COMPONENT, NEW_GPU, model="a100-sxm4-80gb")
    elif kind == "bmc-target":
        targets = ["/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware"]
    elif kind == "unknown-target":
        targets = ["/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_SXM_9"]
    elif kind == "fault":
        lab.faults({"fw_update_fails": True})
    task = redfish.multipart_update(client, image, targets=targets)
    with pytest.raises(redfish.RedfishTaskFailed, match="ended Exception") as caught:
        fast_wait(client, task)
    assert caught.value.status == "Critical"
    assert expected in str(caught.value)
    assert lab.state()["gpu_firmware_staged"] == {}
    if kind != "fault":  # a BMC package aimed at a GPU fails the same way
        bmc_image = package(tmp_path, bmc.BMC_COMPONENT, "lab-bmc-9")
        gpu = ["/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_SXM_2"]
        with pytest.raises(redfish.RedfishTaskFailed, match="not a bmc-firmware component"):
            fast_wait(client, redfish.multipart_update(client, bmc_image, targets=gpu))


def test_malformed_requests_are_answered_400(lab: Lab) -> None:
    boundary = "b0undary"

    def form(*parts: tuple[str, bytes]) -> bytes:
        out = b""
        for name, data in parts:
            out += (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
                + data
                + b"\r\n"
            )
        return out + f"--{boundary}--\r\n".encode()

    push = "/redfish/v1/UpdateService/update-multipart"
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    cases = [
        (form(("UpdateParameters", b"{}")), "ActionParameterMissing"),
        (form(("UpdateParameters", b"[1]"), ("UpdateFile", b"x")), "MalformedJSON"),
        (form(("UpdateParameters", b'{"Targets": "x"}'), ("UpdateFile", b"x")), "TypeError"),
        (
            form(
                (
                    "UpdateParameters",
                    b'{"@Redfish.OperationApplyTime": "AtMaintenanceWindowStart"}',
                ),
                ("UpdateFile", b"x"),
            ),
            "PropertyValueNotInList",
        ),
    ]
    for body, message in cases:
        status, _, answer = raw(lab, "POST", push, body, headers)
        assert status == 400, answer
        assert message in json.loads(answer)["error"]["code"]
    reset = "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset"
    status, _, answer = raw(lab, "POST", reset, b'{"ResetType": "Nmi"}')
    assert (status, json.loads(answer)["error"]["code"]) == (
        400,
        "Base.1.18.ActionParameterNotSupported",
    )
    assert raw(lab, "POST", reset, b"{}")[0] == 400
    assert raw(lab, "GET", "/redfish/v1/Chassis")[0] == 404
    assert raw(lab, "PATCH", "/redfish/v1/Managers/BMC_0", b"{}")[0] == 405
    assert lab.power.events == []
    with pytest.raises(redfish.RedfishProtocolError, match="not allowed"):
        redfish.reset_system(lab.client(), "System_0", "AuxPowerCycle")


def test_the_password_never_reaches_the_log(lab: Lab, tmp_path: Path) -> None:
    client = lab.client()
    redfish.firmware_inventory(client)
    with pytest.raises(redfish.RedfishHTTPError):
        redfish.manager_firmware_version(lab.client(lab.password + "x"))
    fast_wait(
        client,
        redfish.multipart_update(client, package(tmp_path, bmc.GPU_COMPONENT, NEW_GPU)),
    )
    redfish.reset_system(client, "System_0", "PowerCycle")
    eventually(lambda: lab.power.events == ["force_off", "power_on"])
    for handler in logging.getLogger("gpuctl.lab.sim.bmc").handlers:
        handler.flush()
    text = lab.log.read_text()
    assert "GET /redfish/v1/UpdateService" in text  # the log has the request lines
    assert "PowerCycle" in text
    token = base64.b64encode(f"{lab.username}:{lab.password}".encode()).decode()
    for secret in (lab.password, token, "Authorization", lab.password + "x"):
        assert secret not in text


# ------------------------------------------------------------------------------------------
# The supervisor's power signals, with a fake systemd-nspawn (no root needed)

FAKE_NSPAWN = textwrap.dedent(
    """
    import signal, subprocess, sys
    init = subprocess.Popen([sys.executable, "-c", '''
    import signal, sys, time
    signal.signal(signal.SIGRTMIN + 4, lambda *a: sys.exit(0))
    signal.signal(signal.SIGRTMIN + 5, lambda *a: sys.exit(133))
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.05)
    '''])
    signal.signal(signal.SIGTERM, lambda *a: init.terminate())
    rc = init.wait()
    sys.exit(rc if rc >= 0 else 1)
    """
)


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    fake = tmp_path / "fake_nspawn.py"
    fake.write_text(FAKE_NSPAWN)
    (tmp_path / "root" / "var/lib/gpuctl-lab-sim").mkdir(parents=True)
    procs: list[subprocess.Popen[bytes]] = []
    code = (
        "import sys; from gpuctl.lab import supervisor as s; "
        f"s.nspawn_argv = lambda n, r, ns: [sys.executable, {str(fake)!r}]; "
        f"sys.exit(s.main(['gpu001', {str(tmp_path / 'root')!r}, 'ns', "
        f"{str(tmp_path / 'gpu001.pid')!r}]))"
    )

    def start() -> subprocess.Popen[bytes]:
        log = (tmp_path / "supervisor.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=log)
        procs.append(proc)
        eventually(lambda: _nspawn(tmp_path) is not None)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _descendants(proc.pid):
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(k) for k in kids] + [d for k in kids for d in _descendants(int(k))]


def _nspawn(tmp_path: Path) -> int | None:
    try:
        return int((tmp_path / "gpu001.nspawn").read_text())
    except (OSError, ValueError):
        return None


def _boots(tmp_path: Path) -> int:
    return (tmp_path / "supervisor.log").read_text().count("gpuctl-lab: boot ")


def _init_of(tmp_path: Path) -> int:
    eventually(lambda: _current_init(tmp_path) is not None)
    init = _current_init(tmp_path)
    assert init is not None
    return init


def _current_init(tmp_path: Path) -> int | None:
    """The container's init now, or None between a boot's log line and its pid file."""
    nspawn = _nspawn(tmp_path)
    kids = _descendants(nspawn) if nspawn is not None else []
    return kids[0] if kids else None


def test_supervisor_power_signals(
    supervisor: Callable[[], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    proc = supervisor()
    assert _boots(tmp_path) == 1
    first = _init_of(tmp_path)
    proc.send_signal(signal.SIGUSR1)  # reset: killed at once, booted again
    eventually(lambda: _boots(tmp_path) == 2 and _current_init(tmp_path) not in (None, first))
    assert "(reset)" in (tmp_path / "supervisor.log").read_text()
    second = _init_of(tmp_path)
    proc.send_signal(signal.SIGHUP)  # clean restart: the container's systemd reboots (133)
    eventually(lambda: _boots(tmp_path) == 3 and _current_init(tmp_path) not in (None, second))
    assert "exited with 133 (reboot)" in (tmp_path / "supervisor.log").read_text()
    proc.send_signal(signal.SIGUSR2)  # power off at once: the supervisor ends
    assert proc.wait(timeout=10) == 0
    assert not (tmp_path / "gpu001.pid").exists()
    assert not (tmp_path / "gpu001.nspawn").exists()
    assert "(off)" in (tmp_path / "supervisor.log").read_text()
    # a clean shutdown (lab down, GracefulShutdown): the container's systemd powers off
    proc = supervisor()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert "exited with 0 (stop)" in (tmp_path / "supervisor.log").read_text()
    assert _boots(tmp_path) == 4


def test_supervisor_no_reboot_fault_keeps_a_reset_node_down(
    supervisor: Callable[[], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    proc = supervisor()
    faults = tmp_path / "root" / "var/lib/gpuctl-lab-sim/faults.json"
    faults.write_text(json.dumps({"no_reboot": True}))
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=10) == 0
    assert "does not come back (fault no_reboot)" in (tmp_path / "supervisor.log").read_text()
    assert _boots(tmp_path) == 1


def test_supervisor_power_of_the_lab_reads_the_pid_file(tmp_path: Path) -> None:
    power = bmc.SupervisorPower(NODE, tmp_path / "root", tmp_path)
    assert not power.is_on()
    (tmp_path / f"{NODE}.pid").write_text(f"{os.getpid()}\n")  # not a supervisor
    assert not power.is_on()
    assert power.wait_off(0.1)
