"""The lab's SIMULATED BMCs (gpuctl/lab/sim/bmc/) on the provisioned lab, through the real
Redfish client: HTTPS checked against the lab CA, HTTP Basic with the credentials decrypted from
the lab's Ansible Vault file, the inventory agreeing with the node's nvidia-smi, and GPU firmware
that stays staged through a warm reset and runs after a power cycle (a real new boot of the
node's container).

gpu001 is drained for the test and resumed at the end; its GPU firmware is put back the same
way it was changed, so the lab is as it was for the tests after this one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from lab_helpers import ProvisionedLab, sh

from gpuctl.config import load_cluster
from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.lab import lab
from gpuctl.lab.sim import bmc
from gpuctl.rollout import redfish

pytestmark = pytest.mark.lab

NODE = "gpu001"
NEW_GPU = "96.00.99.00.42"
REASON = "gpuctl lab test: BMC power actions"


def on(node: str, command: str, timeout: float = 120) -> str:
    res = sh(lab.address_of(node), command, timeout=timeout)
    assert res.returncode == 0, (node, command, res.stdout[-1500:], res.stderr[-1500:])
    return res.stdout


def vbios(node: str = NODE) -> set[str]:
    out = on(node, "nvidia-smi --query-gpu=vbios_version --format=csv,noheader")
    return {line.strip() for line in out.splitlines() if line.strip()}


def boot_id(node: str = NODE) -> str:
    return on(node, "cat /proc/sys/kernel/random/boot_id").strip()


def slurm_state(node: str = NODE) -> str:
    return on("ctl01", f'sinfo -h -N -n {node} -o "%T"').strip().splitlines()[0]


def wait_new_boot(before: str, node: str = NODE, timeout: float = 180) -> str:
    """The node's boot id once it differs from ``before`` and systemd is up again."""
    address = lab.address_of(node)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = sh(address, "cat /proc/sys/kernel/random/boot_id", timeout=20)
        if res.returncode == 0 and res.stdout.strip() not in ("", before):
            return lab.wait_running(node, address, timeout=max(10.0, deadline - time.monotonic()))
        time.sleep(1)
    raise AssertionError(f"{node} did not boot again within {timeout} s")


@pytest.fixture(scope="module")
def client(provisioned_lab: ProvisionedLab) -> Iterator[redfish.RedfishClient]:
    from ansible.parsing.vault import VaultLib, VaultSecret

    config = load_cluster(provisioned_lab.cluster)
    address = next(n.bmc_address for n in cluster_nodes(config) if n.name == NODE)
    assert address == "198.18.1.11"
    assert config.bmc.credentials.vault_file is not None
    assert config.bmc.credentials.vault_password_file is not None
    assert config.bmc.ca_bundle is not None
    secret = Path(config.bmc.credentials.vault_password_file).read_bytes().strip()
    vault = VaultLib([("default", VaultSecret(secret))])
    creds = yaml.safe_load(vault.decrypt(Path(config.bmc.credentials.vault_file).read_bytes()))
    endpoint = redfish.BmcEndpoint(f"https://{address}", ca_bundle=config.bmc.ca_bundle)
    on("ctl01", f'scontrol update nodename={NODE} state=drain reason="{REASON}"')
    yield redfish.RedfishClient(
        endpoint, redfish.Credentials(creds["username"], creds["password"]), timeout_s=15
    )
    lab.clear_faults(NODE)
    deadline = time.monotonic() + 120
    while slurm_state() != "idle":
        on("ctl01", f"scontrol update nodename={NODE} state=resume", timeout=30)
        assert time.monotonic() < deadline, slurm_state()
        time.sleep(2)


def gpu_inventory(client: redfish.RedfishClient) -> set[str | None]:
    items = redfish.firmware_inventory(client)
    gpus = [i for i in items if i.id.startswith("HGX_FW_GPU_SXM_")]
    assert len(gpus) == 8
    return {i.version for i in gpus}


def flash_gpus(client: redfish.RedfishClient, version: str, tmp_path: Path) -> None:
    image = tmp_path / f"gpu-{version}.fwpkg"
    lab.firmware_image(NODE, version, image, "gpu-firmware")
    targets = [
        i.odata_id for i in redfish.firmware_inventory(client) if i.id.startswith("HGX_FW_GPU_")
    ]
    task = redfish.multipart_update(client, image, targets=targets)
    assert task is not None
    result = redfish.wait_for_task(client, task, timeout_s=120, poll_s=1)
    assert (result.state, result.status) == ("Completed", "OK")


def test_the_bmc_answers_over_https_with_the_vault_credentials(
    client: redfish.RedfishClient,
) -> None:
    assert redfish.manager_firmware_version(client) == "lab-bmc-2.6.3"
    assert gpu_inventory(client) == vbios()
    system = client.get("/redfish/v1/Systems/System_0")
    assert system["PowerState"] == "On"
    # no CA: the handshake fails; a wrong password: 401
    bare = redfish.RedfishClient(
        redfish.BmcEndpoint(client.endpoint.url),
        redfish.Credentials("gpuctl-lab", "x"),
        timeout_s=10,
    )
    with pytest.raises(redfish.RedfishTLSError):
        redfish.manager_firmware_version(bare)
    wrong = redfish.RedfishClient(
        client.endpoint, redfish.Credentials("gpuctl-lab", "not-the-password"), timeout_s=10
    )
    with pytest.raises(redfish.RedfishHTTPError) as caught:
        redfish.manager_firmware_version(wrong)
    assert caught.value.status == 401
    # the nodes cannot reach their BMCs (a separate management network)
    assert sh(lab.address_of("gpu002"), "ping -c1 -W1 198.18.1.11", timeout=20).returncode != 0


def test_gpu_firmware_is_staged_until_a_power_cycle(
    client: redfish.RedfishClient, tmp_path: Path
) -> None:
    original = vbios()
    assert len(original) == 1
    assert NEW_GPU not in original
    flash_gpus(client, NEW_GPU, tmp_path)
    assert vbios() == original  # staged
    assert gpu_inventory(client) == original
    # a warm reset: a new boot, the old firmware still runs
    before = boot_id()
    assert redfish.reset_system(client, "System_0", "ForceRestart") is None
    after_warm = wait_new_boot(before)
    assert vbios() == original
    # a power cycle: the GPUs lose power, the new firmware runs
    assert redfish.reset_system(client, "System_0", "PowerCycle") is None
    after_cycle = wait_new_boot(after_warm)
    assert after_cycle not in (before, after_warm)
    assert vbios() == {NEW_GPU}
    assert gpu_inventory(client) == {NEW_GPU}
    assert client.get("/redfish/v1/Systems/System_0")["PowerState"] == "On"
    # back to the original firmware, the same way
    flash_gpus(client, original.pop(), tmp_path)
    redfish.reset_system(client, "System_0", "PowerCycle")
    wait_new_boot(after_cycle)
    assert vbios() == gpu_inventory(client) != {NEW_GPU}


def test_the_bmc_log_never_has_the_password(client: redfish.RedfishClient) -> None:
    log = (lab.lab_dir() / "run" / "bmc.log").read_text()
    assert "GET /redfish/v1/UpdateService" in log
    assert "PowerCycle" in log
    password = bmc.load_credentials()[1]
    assert password not in log
    assert "Authorization" not in log
