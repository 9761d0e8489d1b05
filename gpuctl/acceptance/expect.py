"""What a provisioned node should hold, from the variables `gpuctl render` wrote.

Pure functions of a host's inventory variables (``group_vars`` merged, as ``ansible-inventory
--list`` gives them) and its OS family. Package names and version formats follow the roles in
``playbooks/roles/*/vars`` (a unit test keeps the two in step); a role input that gpuctl does not
render comes from the role's ``defaults/main.yml``. Nothing here knows the lab: every expected
version is read from the variables.

A variable that is missing or empty raises :class:`ConfigError`: the test that needed it fails
(it never passes or skips because the expectation could not be formed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import yaml

from gpuctl.errors import ConfigError, Problem
from gpuctl.resources import playbooks_dir

OsFamily = Literal["Debian", "Ubuntu", "RedHat"]

# /etc/os-release ID (and ID_LIKE) values the roles support
_FAMILIES: dict[str, OsFamily] = {
    "debian": "Debian",
    "ubuntu": "Ubuntu",
    "rhel": "RedHat",
    "rocky": "RedHat",
    "almalinux": "RedHat",
    "centos": "RedHat",
}


@dataclass(frozen=True, slots=True)
class PackageSpec:
    """One package as a role leaves it.

    ``version`` None: any version. ``upstream_only``: ``version`` is the upstream part and any
    distribution revision of it matches (Slurm pinned as ``22.05.8`` matches ``22.05.8-4+deb12u3``).
    """

    name: str
    version: str | None = None
    upstream_only: bool = False
    held: bool = False

    def describe(self) -> str:
        if self.version is None:
            return self.name
        return f"{self.name} {self.version}{' (any revision)' if self.upstream_only else ''}"


def _problem(message: str, path: str = "") -> ConfigError:
    return ConfigError([Problem(message, path=path, file="inventory")])


def os_family(os_release: str) -> OsFamily:
    """The roles' OS family from the text of /etc/os-release (ID, then ID_LIKE)."""
    fields: dict[str, str] = {}
    for line in os_release.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip().strip("\"'")
    candidates = [fields.get("ID", ""), *fields.get("ID_LIKE", "").split()]
    for candidate in candidates:
        family = _FAMILIES.get(candidate.lower())
        if family is not None:
            return family
    shown = fields.get("PRETTY_NAME") or fields.get("ID") or "no ID in /etc/os-release"
    raise _problem(f"operating system {shown!r} is not one the roles support")


@cache
def _role_defaults(role: str) -> Mapping[str, Any]:
    path = playbooks_dir() / "roles" / role / "defaults" / "main.yml"
    with path.open(encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict):
        raise _problem(f"{path}: not a mapping of role defaults")
    return data


def setting(hostvars: Mapping[str, Any], role: str, name: str) -> Any:
    """A role input: the inventory's value, else the role's default."""
    if name in hostvars:
        return hostvars[name]
    defaults = _role_defaults(role)
    if name in defaults:
        return defaults[name]
    raise _problem(f"{name} is neither in the inventory nor a default of role {role}", name)


def required(hostvars: Mapping[str, Any], name: str) -> Any:
    """A variable gpuctl renders; missing, null or empty is an error."""
    value = hostvars.get(name)
    if value is None or value == "" or value == []:
        raise _problem(f"{name} is missing from the rendered inventory", name)
    return value


def _flag(hostvars: Mapping[str, Any], role: str, name: str) -> bool:
    value = setting(hostvars, role, name)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off", ""):
        return False
    raise _problem(f"{name}: {value!r} is not a boolean", name)


def groups(hostvars: Mapping[str, Any]) -> frozenset[str]:
    names = hostvars.get("group_names")
    if not isinstance(names, list):
        raise _problem("group_names is missing: not an Ansible inventory's host variables")
    return frozenset(str(n) for n in names)


# ------------------------------------------------------------------------------------------
# NVIDIA driver


def driver_branch(hostvars: Mapping[str, Any]) -> str:
    branch = str(hostvars.get("nvidia_driver_branch") or "")
    return branch or str(required(hostvars, "nvidia_driver_version")).split(".")[0]


def driver_version(hostvars: Mapping[str, Any]) -> str:
    return str(required(hostvars, "nvidia_driver_version"))


def driver_packages(hostvars: Mapping[str, Any], family: OsFamily) -> list[PackageSpec]:
    """playbooks/roles/nvidia_driver/vars/<family>.yml: the pinned package set."""
    version = driver_version(hostvars)
    branch = driver_branch(hostvars)
    modules = str(setting(hostvars, "nvidia_driver", "nvidia_driver_kernel_modules"))
    if modules not in ("open", "proprietary"):
        raise _problem(f"nvidia_driver_kernel_modules: {modules!r}", "nvidia_driver_kernel_modules")
    held = _flag(hostvars, "nvidia_driver", "nvidia_driver_hold")
    names: list[str]
    if family == "Debian":
        names = (
            ["nvidia-open", "nvidia-driver", "nvidia-kernel-open-dkms"]
            if modules == "open"
            else [f"cuda-drivers-{branch}", "nvidia-driver", "nvidia-kernel-dkms"]
        ) + ["nvidia-smi", "libnvidia-ml1", "nvidia-persistenced"]
        return [PackageSpec(n, f"{version}-1", held=held) for n in names]
    if family == "Ubuntu":
        # the headless (compute-only) set: no nvidia-driver-<branch>, no cuda-drivers-<branch>
        flavour = "-open" if modules == "open" else ""
        names = [
            f"nvidia-headless-{branch}{flavour}",
            f"nvidia-headless-no-dkms-{branch}{flavour}",
            f"nvidia-dkms-{branch}{flavour}",
            f"nvidia-kernel-source-{branch}{flavour}",
            f"nvidia-kernel-common-{branch}",
            f"nvidia-utils-{branch}",
            f"nvidia-compute-utils-{branch}",
            f"libnvidia-compute-{branch}",
        ]
        return [PackageSpec(n, f"{version}-0ubuntu1", held=held) for n in names]
    # the compute-only set: no nvidia-driver / nvidia-driver-libs (X driver, GL libraries)
    names = [
        "nvidia-driver-cuda",
        "nvidia-driver-cuda-libs",
        "kmod-nvidia-open-dkms" if modules == "open" else "kmod-nvidia-latest-dkms",
        "nvidia-persistenced",
    ]
    return [PackageSpec(n, version, upstream_only=True, held=held) for n in names]


def persistenced_enabled(hostvars: Mapping[str, Any]) -> bool:
    return _flag(hostvars, "nvidia_driver", "nvidia_driver_persistenced")


def gpu_spec(hostvars: Mapping[str, Any]) -> Mapping[str, Any]:
    """gpuctl_gpu of the host's node group: model, product_name, count, gres_type ..."""
    gpu = required(hostvars, "gpuctl_gpu")
    if not isinstance(gpu, dict) or not isinstance(gpu.get("count"), int) or gpu["count"] < 1:
        raise _problem(f"gpuctl_gpu has no GPU count: {gpu!r}", "gpuctl_gpu")
    return gpu


# ------------------------------------------------------------------------------------------
# Fabric Manager

NVL5_MODELS = frozenset({"b100", "b200", "b300", "gb200", "gb300"})


def fabric_manager_enabled(hostvars: Mapping[str, Any]) -> bool:
    return _flag(hostvars, "fabric_manager", "fabric_manager_enabled")


def fabric_manager_version(hostvars: Mapping[str, Any]) -> str:
    return str(required(hostvars, "fabric_manager_version"))


def fabric_manager_packages(hostvars: Mapping[str, Any], family: OsFamily) -> list[PackageSpec]:
    """playbooks/roles/fabric_manager/vars: Fabric Manager and NSCQ at the driver's version."""
    version = fabric_manager_version(hostvars)
    branch = version.split(".")[0]
    held = _flag(hostvars, "fabric_manager", "fabric_manager_hold")
    nvlsm_setting = str(setting(hostvars, "fabric_manager", "fabric_manager_nvlsm")).lower()
    model = str((hostvars.get("gpuctl_gpu") or {}).get("model") or "").lower()
    nvlsm = nvlsm_setting == "true" or (nvlsm_setting == "auto" and model in NVL5_MODELS)
    if family == "RedHat":
        specs = [
            PackageSpec(n, f"{version}-1", held=held)
            for n in ("nvidia-fabricmanager", "libnvidia-nscq")
        ]
        if nvlsm:
            specs += [PackageSpec(n) for n in ("nvlsm", "libnvsdm", "infiniband-diags")]
        return specs
    old = branch.isdigit() and int(branch) < 580
    names = (
        [f"nvidia-fabricmanager-{branch}", f"libnvidia-nscq-{branch}"]
        if old
        else ["nvidia-fabricmanager", "libnvidia-nscq"]
    )
    specs = [PackageSpec(n, f"{version}-1", held=held) for n in names]
    if nvlsm:
        specs.append(PackageSpec("nvlsm", held=held))
        specs += [
            PackageSpec(n)
            for n in (f"libnvsdm-{branch}" if old else "libnvsdm", "infiniband-diags", "libibumad3")
        ]
    return specs


_FM_VERSION = re.compile(r"version\s+is\s*:\s*(\S+)", re.IGNORECASE)


def fabric_manager_reported_version(text: str) -> str | None:
    """``nv-fabricmanager --version``: ``Fabric Manager version is : 570.172.08``."""
    match = _FM_VERSION.search(text)
    return match.group(1) if match else None


# ------------------------------------------------------------------------------------------
# NCCL, nccl-tests, DCGM


def nccl_packages(hostvars: Mapping[str, Any], family: OsFamily) -> list[PackageSpec]:
    version = str(required(hostvars, "nccl_version"))
    held = _flag(hostvars, "nccl", "nccl_hold")
    names = ["libnccl", "libnccl-devel"] if family == "RedHat" else ["libnccl2", "libnccl-dev"]
    return [PackageSpec(n, version, held=held) for n in names]


@dataclass(frozen=True, slots=True)
class NcclTests:
    enabled: bool
    prefix: str
    current: str = "/opt/nccl-tests/current"
    bin_dir: str = "/usr/local/bin"
    binary: str = "all_reduce_perf"


def nccl_tests(hostvars: Mapping[str, Any]) -> NcclTests:
    """Where the nccl role builds nccl-tests (roles/nccl/vars/main.yml)."""
    enabled = _flag(hostvars, "nccl", "nccl_tests_enabled")
    prefix = str(setting(hostvars, "nccl", "nccl_tests_prefix") or "")
    if not prefix:
        prefix = f"/opt/nccl-tests/{required(hostvars, 'nccl_tests_version')}"
    return NcclTests(enabled=enabled, prefix=prefix.rstrip("/"))


def dcgm_packages(hostvars: Mapping[str, Any], family: OsFamily) -> list[PackageSpec]:
    """roles/dcgm/vars: datacenter-gpu-manager-4-core and -cuda<major> at 1:<version>-1."""
    version = str(required(hostvars, "dcgm_version"))
    major = str(setting(hostvars, "dcgm", "dcgm_cuda_major"))
    held = _flag(hostvars, "dcgm", "dcgm_hold")
    names = ["datacenter-gpu-manager-4-core", f"datacenter-gpu-manager-4-cuda{major}"]
    return [PackageSpec(n, f"1:{version}-1", held=held) for n in names]


# ------------------------------------------------------------------------------------------
# RDMA and the validation tools


def rdma_stack(hostvars: Mapping[str, Any]) -> str:
    stack = str(setting(hostvars, "rdma", "rdma_stack"))
    if stack not in ("inbox", "doca-ofed"):
        raise _problem(f"rdma_stack: {stack!r} is neither inbox nor doca-ofed", "rdma_stack")
    return stack


def rdma_packages(hostvars: Mapping[str, Any], family: OsFamily) -> list[PackageSpec]:
    if rdma_stack(hostvars) == "doca-ofed":
        return [PackageSpec("doca-ofed", held=True)]
    if family == "RedHat":
        names = ["rdma-core", "libibverbs-utils", "infiniband-diags", "librdmacm-utils"]
    else:
        names = ["rdma-core", "ibverbs-utils", "infiniband-diags", "rdmacm-utils"]
    return [PackageSpec(n) for n in names]


PEER_MEMORY_SYMBOL = "ib_register_peer_memory_client"
PEERMEM_MODULES_LOAD = "/etc/modules-load.d/nvidia-peermem.conf"
PEERMEM_SYSFS = "/sys/module/nvidia_peermem"


def peermem_wanted(hostvars: Mapping[str, Any]) -> bool:
    """rdma_peermem on a GPU host (the rdma role's rdma_peermem and rdma_gpu_host)."""
    wanted = _flag(hostvars, "rdma", "rdma_peermem")
    return wanted and "gpu" in groups(hostvars)


def peermem_loads(hostvars: Mapping[str, Any], kernel_has_peer_api: bool) -> bool:
    """Whether the rdma role loads nvidia-peermem here (roles/rdma/tasks/peermem.yml)."""
    return peermem_wanted(hostvars) and (rdma_stack(hostvars) == "doca-ofed" or kernel_has_peer_api)


def opensm_enabled(hostvars: Mapping[str, Any]) -> bool:
    return _flag(hostvars, "rdma", "rdma_opensm_enabled")


def validation_tool_packages(hostvars: Mapping[str, Any], family: OsFamily) -> list[PackageSpec]:
    verbs = "libibverbs-utils" if family == "RedHat" else "ibverbs-utils"
    names = ["perftest", "infiniband-diags", verbs, "pciutils", "dmidecode"]
    extra = setting(hostvars, "validation_tools", "validation_tools_extra_packages") or []
    return [PackageSpec(n) for n in [*names, *(str(e) for e in extra)]]


# the commands the validation suite runs on GPU and fabric nodes
VALIDATION_COMMANDS = ("ib_write_bw", "ib_read_bw", "ibstat", "ibv_devinfo", "lspci")

# perftest built with CUDA (validation_tools: software.perftest), which the GPUDirect RDMA check
# runs as /opt/perftest-cuda/current/bin/ib_write_bw (gpuctl/validation/gpudirect.py)
PERFTEST_CUDA_DIR = "/opt/perftest-cuda"


def perftest_cuda_version(hostvars: Mapping[str, Any]) -> str | None:
    """The perftest tag the validation_tools role builds with CUDA on this host, or None."""
    version = str(setting(hostvars, "validation_tools", "validation_tools_perftest_version") or "")
    wanted = {"gpu", "rdma"} <= groups(hostvars)
    return version if version and wanted else None


# ------------------------------------------------------------------------------------------
# munge and Slurm

MUNGE_KEY = "/etc/munge/munge.key"
MUNGE_USER = "munge"
SLURM_CONF_DIR = "/etc/slurm"
SLURM_CONFIG_FILES = ("slurm.conf", "gres.conf", "cgroup.conf", "topology.conf")


def slurm_packages(
    hostvars: Mapping[str, Any],
    family: OsFamily,
    role: Literal["controller", "compute", "login"],
) -> list[PackageSpec]:
    """roles/slurm_controller and roles/slurm_node (a login node: slurm_node as a client) under
    the names of the repository's flavor (``packages`` of ``*_repository``: SchedMD's Debian
    packages are ``slurm-smd-*``, with ``slurm-smd`` pinned beside them); a pinned version is
    held."""
    prefix = "slurm_controller" if role == "controller" else "slurm_node"
    pinned = setting(hostvars, prefix, f"{prefix}_package_version")
    repository = setting(hostvars, prefix, f"{prefix}_repository") or {}
    schedmd = isinstance(repository, Mapping) and repository.get("packages") == "schedmd"
    if family == "RedHat":
        daemon = {"controller": ["slurm-slurmctld"], "compute": ["slurm-slurmd"], "login": []}
        names = ["slurm", *daemon[role]]
    elif schedmd:
        daemon = {"controller": ["slurm-smd-slurmctld"], "compute": ["slurm-smd-slurmd"]}
        names = [*daemon.get(role, []), "slurm-smd-client", "slurm-smd"]
    else:
        daemon = {"controller": ["slurmctld"], "compute": ["slurmd"]}
        names = [*daemon.get(role, []), "slurm-client"]
    if pinned is None or str(pinned) == "":
        return [PackageSpec(n) for n in names]
    version = str(pinned)
    upstream = "-" not in version
    return [PackageSpec(n, version, upstream_only=upstream, held=True) for n in names]


# ------------------------------------------------------------------------------------------
# Versions and holds, as the package managers print them


def _strip_epoch(version: str) -> str:
    head, sep, tail = version.partition(":")
    return tail if sep and head.isdigit() else version


def version_matches(installed: str, spec: PackageSpec, family: OsFamily) -> bool:
    """``installed`` as ``dpkg-query ${Version}`` or ``rpm %{EPOCH}:%{VERSION}-%{RELEASE}``."""
    if spec.version is None:
        return True
    want = spec.version
    if family == "RedHat":
        have = installed if ":" in want else _strip_epoch(installed)
        if "-" in want or ":" in want:
            return have == want or (spec.upstream_only and have.startswith(want + "-"))
        return have.rsplit("-", 1)[0] == want
    if spec.upstream_only:
        have = installed if ":" in want else _strip_epoch(installed)
        return have == want or have.startswith(want + "-")
    return installed == want


def held(listing: str, name: str, family: OsFamily) -> bool:
    """``name`` in ``apt-mark showhold`` (one name a line) or ``dnf versionlock list``."""
    for line in listing.splitlines():
        entry = line.strip()
        if family == "RedHat":
            if re.match(rf"^{re.escape(name)}-(\d+:)?\d", entry):
                return True
        elif entry.split(":", 1)[0] == name:  # apt-mark may print name:arch
            return True
    return False
