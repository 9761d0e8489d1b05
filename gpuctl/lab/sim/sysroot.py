"""A simulated sysfs and configfs for a RoCE lab node, and what points the RoCE QoS script at it.

The roce_qos role's script (playbooks/roles/roce_qos/files/gpuctl-roce-qos) reads and writes
the kernel's files of each RDMA device: the netdev under
/sys/class/infiniband/<dev>/device/net, ECN under /sys/class/net/<netdev>/ecn, RDMA-CM's
default ToS and RoCE mode under /sys/kernel/config/rdma_cm. A lab node (a systemd-nspawn
container) sees the host's read-only /sys, with no RDMA device, and has no configfs entries.
:func:`write` builds those files under the node's ``/var/lib/gpuctl-lab-sim/sysroot`` and
points the script at that directory with its test hook ``GPUCTL_ROCE_QOS_ROOT`` (a directory
standing in for /; under it the script never loads a module or mounts configfs), through three
lab-only files that each say they are the lab's SIMULATION:

- /etc/environment: ``GPUCTL_ROCE_QOS_ROOT=...`` (pam_env reads it for Ansible's SSH session),
- /etc/sudoers.d/gpuctl-lab-sim: ``Defaults env_keep += "GPUCTL_ROCE_QOS_ROOT"`` (become runs
  sudo, which resets the environment; mode 0440, as visudo wants),
- /etc/systemd/system/gpuctl-roce-qos.service.d/gpuctl-lab-sim.conf: ``Environment=`` for the
  boot unit the role installs (``__roce_qos_service``, gpuctl-roce-qos).

Nothing of the role changes; a real cluster runs the script on the real sysfs. Only a node whose
profile has Ethernet (RoCE) ports gets any of this.

What each port starts with (a fresh ConnectX port after boot):

- ``ecn/roce_np/enable/<0..7>`` and ``ecn/roce_rp/enable/<0..7>``: 1. NVIDIA's DCQCN parameter
  table gives "Enable" as the default of DcQcnEnablePrio0..7 / MLNX_OFED ``enable`` /
  ROCE_CC_PRIO_MASK on ConnectX-4 and later
  (https://networking-docs.nvidia.com/doca/archive/3-4-0/dcqcn-cc-parameters; the older
  community page DOC-2790 said "Disable").
- ``ecn/roce_np/cnp_dscp`` 48 and ``cnp_802p_prio`` 6: ASSUMED, not found stated as the
  firmware's reset values in a public source. They are the values NVIDIA's lossless RoCE
  configurations write (and the roce_qos role's defaults), so on a fresh lab node the script
  finds these two as wanted.
- RDMA-CM: ``default_roce_mode`` "RoCE v2" and ``default_roce_tos`` 0, what the kernel gives a
  new entry (drivers/infiniband/core/cma.c, cma_add_one(): CMA_PREFERRED_ROCE_GID_TYPE is
  IB_GID_TYPE_ROCE_UDP_ENCAP where the port supports it, "IB/cma: Set default gid type to
  RoCEv2" 63a5f483af0e and its fix 3c7f67d1880d; ``default_roce_tos[...] = 0``; names and values
  in Documentation/ABI/testing/configfs-rdma_cm).

The one departure from a real node: the kernel creates ``rdma_cm/<dev>/ports/<n>/`` and its two
files when ``<dev>`` is mkdir'd, and a directory on disk cannot. So the entry is made here
already, as right after that mkdir: the script then finds it and never runs mkdir, and its
"drift: <dev> has no rdma_cm configfs entry" (a configfs without the entry) does not show in
the lab (tests/unit/test_roce_qos_script.py covers that path).

The files are plain files on the node's disk: a reboot of a lab node keeps what was written (a
real port comes back at its defaults and the role's boot unit applies the settings again).
:func:`write` adds what is missing and never overwrites, so a ``gpuctl lab up`` of a running
node keeps what the role applied. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SYSROOT = "/var/lib/gpuctl-lab-sim/sysroot"  # inside the node
ENV_NAME = "GPUCTL_ROCE_QOS_ROOT"
SERVICE = "gpuctl-roce-qos"  # playbooks/roles/roce_qos/vars/main.yml: __roce_qos_service
NOTICE = (
    "gpuctl lab SIMULATION (gpuctl/lab/sim/sysroot.py, docs/lab-hardware.md): the RoCE QoS "
    f"script reads a simulated sysfs under {SYSROOT}; never on a real node"
)

ECN_ENABLED = 1
CNP_DSCP = 48
CNP_PRIORITY = 6
ROCE_MODE = "RoCE v2"
ROCE_TOS = 0
PORT = 1  # one port per RDMA device (gpuctl/lab/sim/common.py: hcas)


def roce_ports(profile: dict[str, Any]) -> list[tuple[str, str]]:
    """(RDMA device, netdev) of each port on an Ethernet link layer; empty otherwise."""
    nics = profile.get("nics") or {}
    if nics.get("link_layer") != "Ethernet":
        return []
    return [(str(p["name"]), str(p["netdev"])) for p in nics.get("ports") or ()]


def _file(path: Path, text: str, mode: int = 0o644) -> None:
    """Create ``path`` holding ``text`` unless it exists (what was written since stays)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(text, encoding="utf-8")
        path.chmod(mode)


def _line_in(path: Path, line: str) -> None:
    """Append ``line`` to ``path`` (created if missing) unless it holds it already."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if line in text.splitlines():
        return
    if text and not text.endswith("\n"):
        text += "\n"
    path.write_text(text + line + "\n", encoding="utf-8")


def write(root: Path, profile: dict[str, Any]) -> None:
    """Give the node whose root directory is ``root`` a simulated sysfs for the RoCE ports of
    ``profile`` and point the RoCE QoS script at it (see the module docstring). Does nothing
    for a profile without Ethernet ports."""
    ports = roce_ports(profile)
    if not ports:
        return
    sysroot = root / SYSROOT.lstrip("/")
    for dev, netdev in ports:
        ib = sysroot / "sys" / "class" / "infiniband" / dev
        (ib / "device" / "net" / netdev).mkdir(parents=True, exist_ok=True)
        _file(ib / "ports" / str(PORT) / "link_layer", "Ethernet\n")
        ecn = sysroot / "sys" / "class" / "net" / netdev / "ecn"
        for point in ("roce_np", "roce_rp"):
            for prio in range(8):
                _file(ecn / point / "enable" / str(prio), f"{ECN_ENABLED}\n")
        _file(ecn / "roce_np" / "cnp_dscp", f"{CNP_DSCP}\n")
        _file(ecn / "roce_np" / "cnp_802p_prio", f"{CNP_PRIORITY}\n")
        cm = sysroot / "sys" / "kernel" / "config" / "rdma_cm" / dev / "ports" / str(PORT)
        _file(cm / "default_roce_mode", f"{ROCE_MODE}\n")
        _file(cm / "default_roce_tos", f"{ROCE_TOS}\n")
    etc = root / "etc"
    # NAME=VALUE lines; pam_env skips the lines that start with "#" (pam_env.conf(5))
    _line_in(etc / "environment", f"# {NOTICE}")
    _line_in(etc / "environment", f"{ENV_NAME}={SYSROOT}")
    sudoers = etc / "sudoers.d" / "gpuctl-lab-sim"
    sudoers.parent.mkdir(parents=True, exist_ok=True)
    sudoers.write_text(f'# {NOTICE}\nDefaults env_keep += "{ENV_NAME}"\n', encoding="utf-8")
    os.chmod(sudoers, 0o440)
    dropin = etc / "systemd" / "system" / f"{SERVICE}.service.d" / "gpuctl-lab-sim.conf"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(f"# {NOTICE}\n[Service]\nEnvironment={ENV_NAME}={SYSROOT}\n", "utf-8")
