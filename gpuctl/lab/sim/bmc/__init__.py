"""SIMULATION: one Redfish BMC per lab GPU node, served over HTTPS on the lab host.

Nothing here talks to real hardware, and nothing outside gpuctl/lab may import it: it lets the
real Redfish client (gpuctl/rollout/redfish.py) and a real `gpuctl rollout` of
``gpu-firmware`` / ``bmc-firmware`` run against the lab.

Real: HTTPS with a certificate per BMC address (IP SANs) signed by the lab's own CA, HTTP Basic
authentication, the credentials in an Ansible Vault file, the Redfish resource shapes (DSP0266,
the DSP8010 schemas), multipart HTTP push updates, tasks and task monitors, resets.

Simulated: the firmware (lab-only packages, :func:`write_package`; a real BMC takes PLDM
``.fwpkg`` files and refuses these), the flash (a few seconds, ``GPUCTL_LAB_BMC_TASK_S``), a BMC
reset (its address refuses connections for ``GPUCTL_LAB_BMC_RESET_S`` seconds), and power: the
node is a systemd-nspawn container, powered off, on and reset through its supervisor's signals
(gpuctl/lab/supervisor.py).

Runs on the lab host (it needs PyYAML, cryptography, Ansible's vault code and gpuctl), unlike
the rest of gpuctl/lab/sim, which the lab copies into the nodes (this package is left out).
Modules: :mod:`.credentials` (its directory, the vault), :mod:`.tls` (CA and certificate),
:mod:`.packages` (lab firmware packages), :mod:`.protocol` (Redfish URIs, messages, multipart),
:mod:`.power` (a node's power: its supervisor), :mod:`.node` (one node's BMC: resources,
firmware state, update tasks, resets), :mod:`.service` (HTTPS, one server per BMC address),
:mod:`.process` (the lab's BMC process: started by `gpuctl lab up`, ended by `down`).

Files (``<lab dir>/bmc``, kept by `gpuctl lab down` like the base image, so the CA a person
trusted and the credentials stay the same across labs; ``state/`` is removed by `down`):

- ``ca.pem`` (0644), ``ca.key`` (0600): the lab BMCs' CA (ECDSA P-256);
- ``server.pem`` (0644), ``server.key`` (0600): the BMCs' certificate, one IP SAN per BMC
  address, made again when the addresses change;
- ``credentials.vault.yml`` (0600): Ansible Vault (default vault id) encrypted YAML
  ``{username: gpuctl-lab, password: <random>}``; ``vault-password`` (0600): its vault password;
- ``state/<node>.json``: what belongs to the BMC: its running and staged BMC firmware and the
  staged GPU firmware per GPU (written atomically).

The GPU firmware that runs is the node's: ``var/lib/gpuctl-lab-sim/gpu-firmware.json`` in the
node's root, written when the GPUs lose power (``PowerCycle``, ``ForceOff``,
``GracefulShutdown``), and read by the node's nvidia-smi (gpuctl.lab.sim.common.gpu_vbios).

The server: ``python -m gpuctl.lab.sim.bmc serve CONFIG`` (:func:`start`, run by `gpuctl lab up`
after the nodes), one ThreadingHTTPServer per BMC address on port 443, all in one process; pid
file and log ``<lab dir>/run/bmc.{pid,log}``. Only addresses in 198.18.0.0/15 (and 127.0.0.1,
for unit tests) are bound. The log has the request lines http.server writes, never a header.
"""

from gpuctl.lab.sim.bmc.credentials import (
    USERNAME,
    bmc_dir,
    ca_file,
    ensure_credentials,
    load_credentials,
    state_dir,
    vault_file,
    vault_password_file,
)
from gpuctl.lab.sim.bmc.node import BmcSpec, LabBmc, Task, Timing
from gpuctl.lab.sim.bmc.packages import (
    BMC_COMPONENT,
    GPU_COMPONENT,
    LabPackage,
    PackageError,
    check_version,
    package_bytes,
    read_package,
    write_package,
)
from gpuctl.lab.sim.bmc.power import PowerControl, SupervisorPower
from gpuctl.lab.sim.bmc.process import server_pid, start, stop, stop_server
from gpuctl.lab.sim.bmc.protocol import (
    BMC_INVENTORY_ID,
    GPU_INVENTORY_PREFIX,
    BadRequest,
    Part,
    parse_multipart,
)
from gpuctl.lab.sim.bmc.service import (
    ALLOWED_NETWORK,
    PORT,
    TEST_ADDRESS,
    BmcService,
    check_bind_address,
)
from gpuctl.lab.sim.bmc.tls import ensure_tls, server_context

__all__ = [
    "ALLOWED_NETWORK",
    "BMC_COMPONENT",
    "BMC_INVENTORY_ID",
    "GPU_COMPONENT",
    "GPU_INVENTORY_PREFIX",
    "PORT",
    "TEST_ADDRESS",
    "USERNAME",
    "BadRequest",
    "BmcService",
    "BmcSpec",
    "LabBmc",
    "LabPackage",
    "PackageError",
    "Part",
    "PowerControl",
    "SupervisorPower",
    "Task",
    "Timing",
    "bmc_dir",
    "ca_file",
    "check_bind_address",
    "check_version",
    "ensure_credentials",
    "ensure_tls",
    "load_credentials",
    "package_bytes",
    "parse_multipart",
    "read_package",
    "server_context",
    "server_pid",
    "start",
    "state_dir",
    "stop",
    "stop_server",
    "vault_file",
    "vault_password_file",
    "write_package",
]
