"""The cluster.yml model: pydantic v2, strict about unknown keys, documented field by field.

Structure and types are checked here; rules that relate several fields to each other live in
``gpuctl.config.rules`` and run from the root model's after-validator, so that every path to a
``Cluster`` (the loader, ``Cluster.model_validate``) enforces them.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

from gpuctl.config.nodesets import (
    MAX_CLUSTER_NODES,
    MAX_NODESET,
    estimated_size,
    expand,
    expand_in_order,
    nodeset_value,
)
from gpuctl.config.values import HostName, LoginName, NoProxyEntry, unsafe_values

SCHEMA_VERSION = 1

_NAME_RE = r"^[a-z][a-z0-9_-]{0,62}$"


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=False, allow_inf_nan=False
    )


# --------------------------------------------------------------------------------------------
# Reusable field types


def _no_numbers(value: Any) -> Any:
    """YAML reads ``12.10`` as the number 12.1: versions must be quoted strings."""
    if isinstance(value, bool | int | float):
        raise ValueError(
            f'write versions as quoted strings ("{value}"): YAML reads unquoted versions as '
            "numbers and drops digits (12.10 becomes 12.1)"
        )
    return value


Version = Annotated[
    str,
    BeforeValidator(_no_numbers),
    Field(pattern=r"^[0-9A-Za-z][0-9A-Za-z.+~_-]*$", max_length=64),
]
Name = Annotated[str, Field(pattern=_NAME_RE)]
NodeSetStr = Annotated[
    str,
    BeforeValidator(nodeset_value),
    Field(
        description="Host names as a ClusterShell node set, e.g. `gpu[001-064]` or `a,b,c[1-3]`.",
        examples=["gpu[001-064]"],
    ),
]
# RFC 3986 has no unencoded quote, backslash, brace, angle bracket, pipe, caret or backtick: a
# URL without them cannot end the quoted string of apt.conf or a line of sources.list early
Url = Annotated[str, Field(pattern=r"^(https?|file)://[^\s\"\\<>{}|^`]+$")]
# an absolute directory: plain path components, none starting with a dot (no `.`, `..`)
AbsPath = Annotated[str, Field(pattern=r"^(/[A-Za-z0-9_+-][A-Za-z0-9._+-]*)+$", max_length=255)]
Port = Annotated[int, Field(ge=1, le=65535)]


# --------------------------------------------------------------------------------------------
# Access and sources


class JumpHost(_Strict):
    """An SSH bastion every connection goes through (ProxyJump)."""

    host: HostName = Field(description="IP address or host name of the jump host.")
    user: LoginName | None = Field(
        None, description="SSH user on the jump host (default: `ssh.user`)."
    )
    port: Port = Field(22, description="SSH port of the jump host.")


class Ssh(_Strict):
    """How gpuctl and Ansible reach the nodes."""

    user: LoginName = Field("root", description="SSH login user on every node.")
    private_key: str | None = Field(
        None,
        min_length=1,
        description="Private key file (`~` expanded); null uses the SSH agent / default keys.",
    )
    known_hosts: str = Field(
        "known_hosts",
        min_length=1,
        description="The nodes' SSH host keys (OpenSSH known_hosts format; relative to the "
        "folder of cluster.yml, `~` expanded). Host keys are always checked against it.",
    )
    port: Port = Field(22, description="SSH port on the nodes.")
    jump_host: JumpHost | None = Field(None, description="Optional bastion (ProxyJump).")
    become: bool = Field(
        True,
        description="Escalate with sudo on the nodes; must be true unless `user` is root.",
    )
    connect_timeout_s: int = Field(10, ge=1, le=600, description="SSH connect timeout in seconds.")


# an apt suite: a distribution or a flat path ending in "/" ("./"); a component
_APT_SUITE = r"^(\./|[A-Za-z0-9][A-Za-z0-9._~+/-]*)$"
_APT_COMPONENT = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"


class SlurmSource(_Strict):
    """A package repository with Slurm, added by the Slurm roles on every node that runs Slurm
    (controller, compute and login nodes), its packages preferred over the OS's (apt: a pin at
    priority 1001 on the repository's host; dnf: repository priority 1)."""

    url: Url = Field(description="apt: the repository URL (before the suite); dnf: the baseurl.")
    suite: Annotated[str, Field(pattern=_APT_SUITE, max_length=128)] | None = Field(
        None,
        description="apt only: a distribution (`jammy`) or a flat repository's path ending in "
        "`/` (`./`); null = the node's codename. Must be null for dnf.",
    )
    components: list[Annotated[str, Field(pattern=_APT_COMPONENT, max_length=64)]] | None = Field(
        None,
        max_length=16,
        description="apt only: the components; null = `[main]`, or `[]` for a flat suite "
        "(which must have none). Must be null for dnf.",
    )
    packages: Literal["distribution", "schedmd"] = Field(
        "distribution",
        description="Package names: `distribution` (Debian/Ubuntu `slurmd`, `slurmctld`, "
        "`slurm-client`; EL `slurm`, `slurm-slurmd`, `slurm-slurmctld`) or `schedmd` (SchedMD's "
        "own packaging: Debian/Ubuntu `slurm-smd-*`; EL the same names as `distribution`).",
    )
    gpg_key: Url | None = Field(
        None,
        description="URL of the repository's signing key (apt: armored, kept as "
        "`/etc/apt/keyrings/gpuctl-slurm.asc` for `signed-by`; dnf: `gpgkey`); required unless "
        "`trusted`.",
    )
    trusted: bool = Field(
        False,
        description="An unsigned repository (a site or lab repository): apt `[trusted=yes]`, dnf "
        "`gpgcheck=0`. An explicit opt-in; give `gpg_key` or `trusted: true`, not both.",
    )

    @model_validator(mode="after")
    def _signed_and_shaped(self) -> SlurmSource:
        if self.gpg_key is None and not self.trusted:
            raise ValueError(
                "give gpg_key (the URL of the repository's signing key) or trusted: true (an "
                "unsigned site repository)"
            )
        if self.gpg_key is not None and self.trusted:
            raise ValueError("give gpg_key or trusted: true, not both")
        flat = self.suite is not None and self.suite.endswith("/")
        if flat and self.components:
            raise ValueError(f'suite "{self.suite}" is a flat repository: components must be []')
        if not flat and self.components == []:
            raise ValueError(
                "components is [] but suite is a distribution (null = the node's codename): "
                "name the components, or end suite with / for a flat repository"
            )
        return self


class PackageSources(_Strict):
    """Where packages come from. Point every URL at your own mirror for an air-gapped cluster."""

    os_mirror: Url | None = Field(
        None,
        description="Mirror of the OS distribution archive (Debian, Ubuntu: apt); it replaces "
        "the nodes' OS sources (`<codename>`, `<codename>-updates`; Ubuntu also "
        "`<codename>-security`). null keeps the nodes' sources. EL: not supported yet.",
    )
    os_security_mirror: Url | None = Field(
        None,
        description="Debian only, with `os_mirror`: mirror of Debian's security archive "
        "(`<codename>-security`); null: no security source while `os_mirror` is set.",
    )
    cuda: Url | None = Field(
        "https://developer.download.nvidia.com/compute/cuda/repos",
        description="NVIDIA CUDA repository root (driver, Fabric Manager, NCCL, DCGM); "
        "`<distro>/<arch>/` is appended. null = the nodes' own package sources already carry "
        "NVIDIA's packages (a site mirror) and gpuctl adds no repository.",
    )
    doca: Url = Field(
        "https://linux.mellanox.com/public/repo/doca",
        description="NVIDIA DOCA repository root; used only with `rdma.stack: doca-ofed`.",
    )
    nccl_tests: Url = Field(
        "https://github.com/NVIDIA/nccl-tests.git",
        description="Git URL of nccl-tests (or a mirror of it).",
    )
    slurm: SlurmSource | None = Field(
        None,
        description="A package repository the Slurm roles add for Slurm (a site repository or "
        "SchedMD-built packages), preferred over the OS's own Slurm packages; needs "
        "`software.slurm`. null = the OS's repositories (EL: EPEL, which gpuctl enables).",
    )
    pypi_index: Url | None = Field(
        None,
        description="Python package index for tools installed on nodes (a site mirror); null = "
        "default. gpuctl's node check installs gpuctl from it when `gpuctl_wheelhouse` is null.",
    )
    gpuctl_wheelhouse: Annotated[str, Field(pattern=r"^/")] | None = Field(
        None,
        description="Absolute path, on the machine that runs `gpuctl provision`, of a directory "
        "with gpuctl's wheel and the wheels of its node requirements (docs/provisioning.md); "
        "copied to the nodes for `slurm.health_check`, which then need no package index.",
    )
    http_proxy: Url | None = Field(
        None,
        description="HTTP(S) proxy the nodes use for every download: apt/dnf (a 0600 config "
        "file), git, pip and file downloads (the plays' environment).",
    )
    no_proxy: list[NoProxyEntry] = Field(
        default_factory=list,
        description="Host names, domains (`.example.org`) or IP addresses the nodes reach "
        "without `http_proxy` (a site mirror); localhost is always direct.",
    )

    @model_validator(mode="after")
    def _security_mirror_needs_mirror(self) -> PackageSources:
        if self.os_security_mirror is not None and self.os_mirror is None:
            raise ValueError("os_security_mirror is used only with os_mirror; set both or neither")
        return self


# --------------------------------------------------------------------------------------------
# Software


class KernelModules(StrEnum):
    OPEN = "open"
    PROPRIETARY = "proprietary"


class Driver(_Strict):
    """The NVIDIA data center driver."""

    branch: Version = Field(description='Driver branch, e.g. "570" (packages are pinned to it).')
    version: Version = Field(
        description='Exact driver version, e.g. "570.133.20"; must belong to `branch`.'
    )
    kernel_modules: KernelModules = Field(
        KernelModules.OPEN,
        description="`open` (default since R560, required on Blackwell) or `proprietary`.",
    )
    secure_boot_signed: bool = Field(
        False,
        description="The nodes sign the driver's DKMS modules with a key their firmware trusts "
        "(a MOK enrolled, DKMS set to sign). false: a node with Secure Boot on stops before "
        "the driver is installed, since the kernel would refuse the unsigned modules.",
    )


class FabricManager(_Strict):
    """NVIDIA Fabric Manager: implied on NVSwitch systems, at exactly the driver's version."""

    enabled: bool | None = Field(
        None,
        description="null = installed exactly where GPUs sit on NVSwitch (the normal case). "
        "true/false may only confirm that: false is refused on NVSwitch systems, true without "
        "them.",
    )
    version: Version | None = Field(
        None, description="Must equal `software.driver.version`; null = the driver's version."
    )


class RdmaStack(StrEnum):
    INBOX = "inbox"
    DOCA_OFED = "doca-ofed"


class Rdma(_Strict):
    """The RDMA user space and drivers."""

    stack: RdmaStack = Field(
        RdmaStack.INBOX, description="`inbox` (distribution rdma-core) or `doca-ofed`."
    )
    doca_version: Version | None = Field(
        None, description='DOCA version, required with `doca-ofed` (e.g. "2.9.1").'
    )
    peermem: bool = Field(
        True,
        description="GPUDirect RDMA through nvidia-peermem: loaded where the kernel has the "
        "peer memory API (DOCA-OFED / MLNX_OFED); with inbox rdma-core GPUDirect RDMA goes "
        "through DMA-BUF instead and provisioning reports that.",
    )


class MpiFlavor(StrEnum):
    OPENMPI = "openmpi"
    HPCX = "hpcx"


class Mpi(_Strict):
    """MPI used to build and launch nccl-tests."""

    flavor: MpiFlavor = Field(MpiFlavor.OPENMPI, description="`openmpi` (distribution) or `hpcx`.")
    version: Version | None = Field(None, description="Version (required for `hpcx`).")
    url: Url | None = Field(None, description="Download URL of the HPC-X tarball (for `hpcx`).")


class Software(_Strict):
    """Pinned versions of everything gpuctl installs. Drift between them breaks clusters."""

    driver: Driver = Field(description="NVIDIA driver branch, version and kernel modules.")
    fabric_manager: FabricManager = Field(
        default_factory=lambda: FabricManager(), description="Fabric Manager."
    )
    cuda: Version = Field(description='CUDA toolkit version, major.minor, e.g. "12.8".')
    nccl: Version = Field(
        description='NCCL package version as the CUDA repository names it: "2.26.2-1+cuda12.8".'
    )
    nccl_tests: Version = Field(description='nccl-tests release tag without the v, e.g. "2.14.1".')
    dcgm: Version = Field(description='DCGM version, e.g. "4.2.3".')
    rdma: Rdma = Field(default_factory=lambda: Rdma(), description="RDMA stack.")
    mpi: Mpi = Field(default_factory=lambda: Mpi(), description="MPI for nccl-tests.")
    slurm: Version | None = Field(
        None, description="Slurm version to install; null = the distribution's package."
    )
    mft: Version | None = Field(
        None,
        description="NVIDIA Firmware Tools (package `mft`, from the site's DOCA/MLNX mirror), "
        "for `gpuctl rollout --component nic-firmware`; null = not installed by gpuctl.",
    )
    unverified_versions: list[Literal["cuda", "nccl", "dcgm", "gpu_models", "slurm"]] = Field(
        default_factory=list,
        description="Versions the preflight version gate may let through although it has no "
        "rule for them (a CUDA minor, DCGM major or GPU model its tables do not list, an NCCL "
        "version without `+cudaX.Y`, a Slurm release series without a cgroup rule): reported "
        "as warnings instead of refused. Empty = every version without a rule is refused "
        "(docs/compatibility.md).",
    )

    @model_validator(mode="after")
    def _cuda_major_minor(self) -> Software:
        if not re.fullmatch(r"\d+\.\d+", self.cuda):
            raise ValueError(f'cuda must be major.minor like "12.8", not "{self.cuda}"')
        return self


# --------------------------------------------------------------------------------------------
# Hardware


class GpuModel(StrEnum):
    """GPU models gpuctl knows (facts and default thresholds in ``gpuctl/data/gpu_models.yml``)."""

    A100_SXM4_40GB = "a100-sxm4-40gb"
    A100_SXM4_80GB = "a100-sxm4-80gb"
    H100_SXM = "h100-sxm"
    H200_SXM = "h200-sxm"
    B200 = "b200"
    H100_NVL = "h100-nvl"
    L40S = "l40s"
    RTX_6000_ADA = "rtx-6000-ada"


class Interconnect(StrEnum):
    NVSWITCH = "nvswitch"
    NVLINK = "nvlink"
    NVLINK_BRIDGE = "nvlink-bridge"
    PCIE_SWITCH = "pcie-switch"
    PCIE = "pcie"
    NONE = "none"


class Gpus(_Strict):
    """The GPUs in each node of the group."""

    model: GpuModel = Field(description="GPU model (see the table of models).")
    count: int = Field(ge=1, le=16, description="GPUs per node.")
    interconnect: Interconnect | None = Field(
        None,
        description="How GPUs connect to each other: `nvswitch` (HGX/DGX baseboard), `nvlink` "
        "(direct NVLink, 4-GPU boards), `nvlink-bridge` (PCIe cards in bridged pairs), "
        "`pcie-switch`, `pcie` (CPU root ports), `none` (one GPU). null = derived from the count: "
        "`none` for one GPU, `nvswitch` for a full NVSwitch baseboard, else `nvlink` where the "
        "model has it, else `pcie-switch`.",
    )
    cpu_affinity: list[Annotated[int, Field(ge=0, le=15)]] | None = Field(
        None,
        description="CPU socket each GPU hangs off, one entry per GPU in `/dev/nvidiaN` order, "
        "e.g. `[0, 0, 0, 0, 1, 1, 1, 1]` (`nvidia-smi topo -m`: NUMA Affinity, on nodes with "
        "one NUMA node per socket). Written to gres.conf as `Cores=`: all cores of that socket, "
        "since Slurm binds GPUs to whole sockets (gres.conf(5)). Required for a compute group "
        "of several sockets unless `slurm.gres_autodetect` is `nvml` (NVML detects it); "
        "null on one socket = no `Cores=`.",
    )


class Cpu(_Strict):
    """CPU layout of each node, for Slurm's NodeName line."""

    sockets: int = Field(ge=1, le=16, description="CPU sockets.")
    cores_per_socket: int = Field(ge=1, le=1024, description="Physical cores per socket.")
    threads_per_core: int = Field(1, ge=1, le=8, description="Hardware threads per core.")


class Nic(_Strict):
    """Network adapters of one kind in each node of the group."""

    devices: NodeSetStr = Field(
        description="RDMA device names as a node set, e.g. `mlx5_[0-7]` (as `ibstat` lists them)."
    )
    fabric: Name = Field(description="Name of the fabric (in `fabrics`) these ports connect to.")
    rate_gbps: int | None = Field(
        None,
        description="Link rate in Gb/s; null = the fabric's rate. Must be a rate the fabric "
        "runs at (NDR: 400 or 200).",
    )
    rails: bool = Field(
        False,
        description="Not supported yet: `true` is refused (nothing reads a rail numbering; "
        "ib_write_bw pairs HCAs by index either way).",
    )


class Role(StrEnum):
    CONTROLLER = "controller"
    LOGIN = "login"
    COMPUTE = "compute"


def _above_zero_percent(value: str) -> str:
    if float(value.rstrip("%")) <= 0:
        raise ValueError(f"{value} judges nothing: give a share above 0%")
    return value


Percent = Annotated[
    str,
    Field(
        pattern=r"^(100|[1-9]?[0-9])(\.[0-9]+)?%$",
        description="A share of the physical limit, above 0%.",
    ),
    AfterValidator(_above_zero_percent),
]


class Thresholds(_Strict):
    """Validation thresholds; unset values are inherited.

    Resolution, last wins: gpuctl defaults (data/health.yml), the group's GPU model
    (data/gpu_models.yml), the group's fabric rate (data/fabrics.yml), `validation.thresholds`,
    `node_groups[].validation.thresholds`. ECC and row-remap limits count per GPU.
    """

    nccl_all_reduce_busbw_gbs: float | None = Field(
        None, gt=0, description="Minimum single-node all_reduce bus bandwidth, GB/s."
    )
    nccl_multinode_busbw_gbs: float | None = Field(
        None, gt=0, description="Minimum multi-node all_reduce bus bandwidth, GB/s."
    )
    ib_write_bw_gbps: Annotated[float, Field(gt=0)] | Percent | None = Field(
        None,
        description="Minimum ib_write_bw per adapter: Gb/s, or a share of the port's line rate "
        '("90%").',
    )
    ib_write_lat_p99_us: float | None = Field(
        None, gt=0, description="Maximum ib_write_lat 99th percentile, microseconds."
    )
    pcie_h2d_gbs: float | None = Field(
        None, gt=0, description="Minimum host-to-device copy bandwidth per GPU, GB/s."
    )
    pcie_d2h_gbs: float | None = Field(
        None, gt=0, description="Minimum device-to-host copy bandwidth per GPU, GB/s."
    )
    fleet_relative_min: float | None = Field(
        None, gt=0, le=1, description="Fail a node below this fraction of the fleet median."
    )
    remapped_rows_pending_max: int | None = Field(
        None, ge=0, description="Most GPU rows pending remap."
    )
    remapped_rows_failure_max: int | None = Field(None, ge=0, description="Most failed row remaps.")
    sram_uncorrectable_max: int | None = Field(
        None, ge=0, description="Most SRAM uncorrectable ECC errors."
    )
    sram_correctable_max: int | None = Field(
        None, ge=0, description="Most SRAM correctable ECC errors."
    )
    dram_correctable_max: int | None = Field(
        None, ge=0, description="Most DRAM correctable ECC errors."
    )
    xid_fatal: list[int] | None = Field(
        None, description="XID codes that fail a node (replaces the default list)."
    )
    ib_link_flaps_max: int | None = Field(
        None, ge=0, description="Most link-down events per adapter in 24 h."
    )


class Level(StrEnum):
    QUICK = "quick"
    STANDARD = "standard"
    LONG = "long"


class GroupValidation(_Strict):
    """Validation settings for one node group."""

    level: Level | None = Field(None, description="Default check level; null = the cluster's.")
    thresholds: Thresholds = Field(
        default_factory=lambda: Thresholds(), description="Overrides for this group."
    )


class GroupSlurm(_Strict):
    """Slurm settings for the group's NodeName line."""

    features: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]] = Field(
        default_factory=list, description="Node features (constraints), e.g. `[h100, ib]`."
    )
    weight: int | None = Field(None, ge=0, description="Scheduling weight (lower is used first).")


class NodeGroup(_Strict):
    """Nodes of one shape and purpose."""

    name: Name = Field(description="Group name (becomes the Ansible group `ng_<name>`).")
    nodes: NodeSetStr = Field(description="Host names, e.g. `gpu[001-064]`.")
    addresses: NodeSetStr | None = Field(
        None,
        description="Management addresses as a node set (`10.0.0.[11-74]`), one per node: the "
        "i-th address (in the order written) belongs to the i-th node of `nodes` (in sorted "
        "order). null = reach nodes by name.",
    )
    roles: list[Role] = Field(
        min_length=1, description="`controller`, `login`, `compute` (one or more)."
    )
    gpus: Gpus | None = Field(None, description="GPUs per node; null for CPU-only nodes.")
    cpu: Cpu | None = Field(
        None,
        description="CPU layout (Slurm NodeName); required for compute groups (Slurm reads a "
        "missing one as 1 CPU). null = undeclared.",
    )
    memory_mb: int | None = Field(
        None,
        ge=1,
        description="Memory Slurm may allocate (RealMemory), MiB, at most what `slurmd -C` "
        "reports; required for compute groups (Slurm's default is 1 MiB).",
    )
    nics: list[Nic] = Field(default_factory=list, description="High-speed network adapters.")
    validation: GroupValidation = Field(
        default_factory=lambda: GroupValidation(), description="Validation settings."
    )
    slurm: GroupSlurm = Field(
        default_factory=lambda: GroupSlurm(), description="Slurm node settings."
    )
    bmc_addresses: NodeSetStr | None = Field(
        None,
        description="BMC (Redfish) addresses as a node set, one per node, paired with `nodes` "
        "like `addresses`; needed by `gpuctl rollout` for gpu-firmware and bmc-firmware "
        "(settings in the top-level `bmc`). null = no BMC access.",
    )

    def node_names(self) -> list[str]:
        return expand(self.nodes)

    def address_list(self) -> list[str] | None:
        """Addresses in the order written; the i-th belongs to the i-th name of ``nodes``."""
        return expand_in_order(self.addresses) if self.addresses is not None else None

    def bmc_address_list(self) -> list[str] | None:
        """BMC addresses in the order written; the i-th belongs to the i-th name of ``nodes``."""
        return expand_in_order(self.bmc_addresses) if self.bmc_addresses is not None else None


# --------------------------------------------------------------------------------------------
# Fabrics


class FabricKind(StrEnum):
    INFINIBAND = "infiniband"
    ROCE = "roce"


class IbGeneration(StrEnum):
    EDR = "edr"
    HDR = "hdr"
    NDR = "ndr"
    XDR = "xdr"


class SubnetManager(StrEnum):
    SWITCH = "switch"
    OPENSM = "opensm"


class RoceQos(_Strict):
    """Lossless RoCE settings (NVIDIA's recommended defaults)."""

    trust: Literal["dscp", "pcp"] = Field("dscp", description="QoS trust mode.")
    pfc_priority: int = Field(3, ge=0, le=7, description="Priority with PFC enabled.")
    dscp: int = Field(26, ge=0, le=63, description="DSCP value for RoCE traffic.")
    ecn: bool = Field(True, description="ECN / DCQCN congestion control.")


class Ipoib(_Strict):
    """IP over InfiniBand addressing."""

    network: str = Field(description="IPv4 network for IPoIB interfaces, e.g. `10.10.0.0/16`.")

    @model_validator(mode="after")
    def _network(self) -> Ipoib:
        try:
            ipaddress.IPv4Network(self.network, strict=True)
        except ValueError as exc:
            raise ValueError(f"not an IPv4 network: {exc}") from None
        return self


class Leaf(_Strict):
    """A leaf (edge) switch and the nodes cabled to it."""

    name: Name = Field(description="Switch name (as in topology.conf).")
    nodes: NodeSetStr = Field(description="Nodes that hang off this leaf.")


class Spine(_Strict):
    """A spine switch and the switches below it."""

    name: Name = Field(description="Switch name (as in topology.conf).")
    switches: NodeSetStr = Field(
        description="Leaves (or lower spines) below it, e.g. `leaf[01-04]`."
    )


class Topology(_Strict):
    """The fabric's switch tree, for Slurm's topology.conf."""

    kind: Literal["fat-tree"] = Field("fat-tree", description="Only `fat-tree` for now.")
    leaves: list[Leaf] = Field(min_length=1, description="Leaf switches.")
    spines: list[Spine] = Field(default_factory=list, description="Spine (and core) switches.")


class Fabric(_Strict):
    """One high-speed network (InfiniBand subnet or RoCE fabric)."""

    name: Name = Field(description="Fabric name, referenced by `nics[].fabric`.")
    kind: FabricKind = Field(description="`infiniband` or `roce`.")
    generation: IbGeneration | None = Field(
        None, description="InfiniBand generation (`edr`, `hdr`, `ndr`, `xdr`); InfiniBand only."
    )
    rate_gbps: int | None = Field(
        None,
        description="Port rate in Gb/s. InfiniBand: null = the generation's full rate. "
        "RoCE: required (100, 200 or 400).",
    )
    subnet_manager: SubnetManager | None = Field(
        None,
        description="InfiniBand only: `switch` (managed switch) or `opensm` on a node; null = "
        "an SM already runs elsewhere and gpuctl installs none.",
    )
    ipoib: Ipoib | None = Field(None, description="InfiniBand only: IPoIB addressing.")
    qos: RoceQos | None = Field(None, description="RoCE only: lossless settings (PFC/ECN/DSCP).")
    topology: Topology | None = Field(
        None, description="Switch tree; null for a single node or when not modelled."
    )


# --------------------------------------------------------------------------------------------
# Slurm


class Partition(_Strict):
    """A Slurm partition."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")] = Field(description="Partition name.")
    node_groups: list[Name] = Field(
        default_factory=list, description="Node groups whose nodes belong to it."
    )
    nodes: NodeSetStr | None = Field(
        None,
        description="More member nodes, as a node set; each must be in a node group with the "
        "`compute` role.",
    )
    default: bool = Field(False, description="The default partition (at most one).")
    max_time: str = Field(
        "INFINITE",
        pattern=r"^(INFINITE|UNLIMITED|\d+|\d+:\d{2}(:\d{2})?|\d+-\d+(:\d{2}(:\d{2})?)?)$",
        description="MaxTime: `INFINITE`, minutes, `HH:MM:SS` or `D-HH:MM:SS`.",
    )
    state: Literal["UP", "DOWN", "DRAIN", "INACTIVE"] = Field("UP", description="Partition state.")


class Cgroup(_Strict):
    """cgroup.conf."""

    constrain_cores: bool = Field(True, description="ConstrainCores.")
    constrain_devices: bool = Field(True, description="ConstrainDevices (GPU isolation).")
    constrain_ram_space: bool = Field(True, description="ConstrainRAMSpace.")


TaskPlugin = Literal["task/cgroup", "task/affinity", "task/none"]


def _default_task_plugins() -> list[TaskPlugin]:
    return ["task/cgroup", "task/affinity"]


HealthCheckState = Literal["ANY", "ALLOC", "IDLE", "MIXED", "NONDRAINED_IDLE", "CYCLE"]


def _any_state() -> list[HealthCheckState]:
    return ["ANY"]


class HealthCheck(_Strict):
    """Slurm's node health check: slurmd runs `gpuctl node-check` (HealthCheckProgram) on every
    compute node; a failing node drains itself, and resumes once it passes again."""

    enabled: bool = Field(
        False,
        description="Install gpuctl's node check on the compute nodes (role gpuctl_node_check, "
        "from `package_sources.gpuctl_wheelhouse` or `pypi_index`) and name it in slurm.conf.",
    )
    interval_s: int = Field(
        300, ge=10, le=86400, description="HealthCheckInterval: seconds between two runs."
    )
    node_state: list[HealthCheckState] = Field(
        default_factory=_any_state,
        min_length=1,
        description="HealthCheckNodeState. `ANY` (default) includes drained nodes, so a node "
        "the check drained is resumed when it passes; `NONDRAINED_IDLE` never resumes one.",
    )
    level: Literal["quick"] = Field(
        "quick",
        description="Check level: `quick` (seconds). slurmd ends a health check after 60 s, and "
        "`standard` loads the GPUs for minutes: run it from a prolog or by hand instead.",
    )


class Slurm(_Strict):
    """Slurm: controller, partitions and what slurm.conf, gres.conf and topology.conf need."""

    controller: str = Field(
        min_length=1,
        description="Node that runs slurmctld; in a node group with the `controller` role.",
    )
    backup_controller: str | None = Field(
        None,
        description="Node that runs a backup slurmctld; in a node group with the `controller` "
        "role.",
    )
    cluster_name: Annotated[str, Field(pattern=r"^[a-z0-9_-]{1,40}$")] | None = Field(
        None, description="ClusterName; null = the cluster's `name`."
    )
    state_save_location: AbsPath = Field(
        "/var/lib/slurm/slurmctld",
        description="StateSaveLocation: the directory where slurmctld keeps its state (the "
        "controller role creates it, owned by SlurmUser). With `backup_controller` it must be "
        "given explicitly, on storage both controllers mount (slurm.conf(5)); gpuctl mounts "
        "nothing.",
    )
    partitions: list[Partition] = Field(min_length=1, description="Partitions.")
    gres_autodetect: Literal["off", "nvml"] = Field(
        "off",
        description="`nvml` needs slurmd built with NVML; `off` lists `/dev/nvidiaN` files.",
    )
    select_type_parameters: Literal["CR_Core", "CR_Core_Memory", "CR_CPU", "CR_CPU_Memory"] = Field(
        "CR_Core_Memory", description="SelectTypeParameters for select/cons_tres."
    )
    proctrack: Literal["cgroup", "linuxproc"] = Field(
        "cgroup", description="ProctrackType plugin (`linuxproc` where cgroups are unavailable)."
    )
    task_plugins: list[TaskPlugin] = Field(
        default_factory=_default_task_plugins,
        description="TaskPlugin list.",
    )
    return_to_service: Literal[0, 1, 2] = Field(
        1, description="ReturnToService (0 never, 1 if down for non-response, 2 any valid)."
    )
    topology_fabric: Name | None = Field(
        None,
        description="Fabric whose topology becomes topology.conf; needed when several have one.",
    )
    cgroup: Cgroup = Field(default_factory=lambda: Cgroup(), description="cgroup.conf settings.")
    health_check: HealthCheck = Field(
        default_factory=lambda: HealthCheck(),
        description="HealthCheckProgram: gpuctl's node check, run by slurmd on every node.",
    )
    extra: dict[Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9]*$")], str | int | bool] = Field(
        default_factory=dict,
        description="More slurm.conf parameters (`Key: value`); keys gpuctl manages are refused.",
    )


# --------------------------------------------------------------------------------------------
# Validation and rollout


class Multinode(_Strict):
    """Multi-node nccl-tests at the `long` level: how `srun` starts them (docs/validate.md)."""

    mpi: Literal["pmix", "pmi2", "none"] = Field(
        "pmix",
        description="`srun --mpi=` plugin; nccl-tests built with Open MPI needs `pmix` (the "
        "compute nodes then need the PMIx library; the slurm_node role installs it).",
    )
    partition: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")] | None = Field(
        None, description="`srun --partition=`; null = Slurm's default partition."
    )
    reservation: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")] | None = Field(
        None, description="`srun --reservation=`, e.g. a maintenance reservation of the nodes."
    )
    rank_per: Literal["gpu", "node"] = Field(
        "gpu",
        description="`gpu`: one rank per GPU (`--ntasks-per-node=<GPUs>`, `-g 1`); `node`: one "
        "rank per node driving all its GPUs (`--ntasks-per-node=1`, `-g <GPUs>`), for nodes "
        "Slurm gives fewer CPUs than GPUs.",
    )
    launch_node: str | None = Field(
        None,
        min_length=1,
        description="Node gpuctl runs `srun` on (over SSH): a login node or any node with the "
        "Slurm client, munge and, for `pmix`, the PMIx library; null = `slurm.controller`.",
    )
    max_runs: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Most runs per node group, the first included; null = 3 x log2(nodes) + 4 "
        "(enough to locate and confirm two slow nodes).",
    )


class Validation(_Strict):
    """Cluster-wide validation settings."""

    level: Level = Field(Level.STANDARD, description="Default check level.")
    unknown_is_failure: bool = Field(
        True,
        description="A check that could not run or be read (UNKNOWN) fails its node; set false "
        "only to report UNKNOWN without failing (never counted as a pass).",
    )
    thresholds: Thresholds = Field(
        default_factory=lambda: Thresholds(),
        description="Overrides for every group (group overrides win).",
    )
    multinode: Multinode = Field(
        default_factory=lambda: Multinode(),
        description="Multi-node nccl-tests through Slurm (`long` level).",
    )


class Rollout(_Strict):
    """Defaults for `gpuctl rollout`."""

    canary: int = Field(1, ge=0, description="Nodes updated alone first; 0 skips the canary.")
    batch_size: int | None = Field(
        None, ge=1, description="Nodes per batch after the canary (exclusive with max_unavailable)."
    )
    max_unavailable: Annotated[str, Field(pattern=r"^(100|[1-9][0-9]?)%$")] | int | None = Field(
        None,
        description='Most compute nodes out of service at once: a count or a percentage ("10%").',
    )
    failure_threshold: int = Field(
        1, ge=1, description="Halt the rollout once this many nodes have failed."
    )
    drain_timeout_s: int = Field(3600, ge=1, description="Longest wait for running jobs to end.")
    reboot_timeout_s: int = Field(1800, ge=1, description="Longest wait for a node to come back.")
    validate_level: Level = Field(
        Level.QUICK,
        description="Validation of each updated node before it is resumed (the single-node "
        "checks of that level).",
    )
    poll_interval_s: float = Field(
        5.0, gt=0, le=300, description="Seconds between looks at Slurm while waiting for jobs."
    )


class BmcCredentials(_Strict):
    """Where the BMC user and password come from: never cluster.yml itself.

    With `vault_file` set, that file (an Ansible Vault encrypted YAML mapping with `username`
    and `password`) is decrypted with the vault password file; otherwise the two environment
    variables are read.
    """

    username_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = Field(
        "GPUCTL_BMC_USERNAME", description="Environment variable holding the BMC user name."
    )
    password_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = Field(
        "GPUCTL_BMC_PASSWORD", description="Environment variable holding the BMC password."
    )
    vault_file: str | None = Field(
        None,
        min_length=1,
        description="Ansible Vault encrypted YAML with `username` and `password` (relative to "
        "the folder of cluster.yml, `~` expanded); null = use the environment.",
    )
    vault_password_file: str | None = Field(
        None,
        min_length=1,
        description="File holding the vault password (mode 0600 or stricter); null = "
        "`ANSIBLE_VAULT_PASSWORD_FILE` from the environment.",
    )


class Bmc(_Strict):
    """How gpuctl talks to the nodes' BMCs over Redfish (HTTPS, certificates checked).

    Used by `gpuctl rollout` for `gpu-firmware` (HGX GPU firmware through the BMC's
    UpdateService, activated by a power cycle) and `bmc-firmware`. Addresses are per node group
    (`node_groups[].bmc_addresses`).
    """

    credentials: BmcCredentials = Field(
        default_factory=lambda: BmcCredentials(), description="Where the credentials come from."
    )
    port: Port = Field(443, description="HTTPS port of the Redfish service.")
    ca_bundle: str | None = Field(
        None,
        min_length=1,
        description="PEM file of the CAs that signed the BMCs' certificates (relative to the "
        "folder of cluster.yml); null = the system's trust store.",
    )
    verify_tls: bool = Field(
        True,
        description="Check BMC certificates. false accepts any certificate (a man in the middle "
        "would get the BMC password): only for a lab you own.",
    )
    request_timeout_s: int = Field(30, ge=1, le=600, description="Timeout of one request.")
    update_timeout_s: int = Field(
        3600, ge=60, description="Longest wait for a firmware update task to finish."
    )
    system_id: str | None = Field(
        None,
        min_length=1,
        description="Redfish ComputerSystem Id to power cycle; null = the service's only one.",
    )
    manager_id: str | None = Field(
        None, min_length=1, description="Redfish Manager Id of the BMC; null = the only one."
    )
    gpu_inventory_prefix: str = Field(
        "HGX_FW_GPU_",
        min_length=1,
        description="FirmwareInventory Ids of the GPUs start with this (HGX: "
        "`HGX_FW_GPU_SXM_1` ...); their versions are the node's GPU firmware.",
    )
    bmc_inventory_id: str | None = Field(
        None,
        min_length=1,
        description="FirmwareInventory Id of the BMC image, the update's target; null = "
        "no Targets (the BMC picks the components the package holds).",
    )
    power_cycle: Literal["PowerCycle", "ForceRestart", "AuxPowerCycle"] = Field(
        "PowerCycle",
        description="ComputerSystem.Reset type that activates new GPU firmware "
        "(the GPUs must lose power; a warm reboot keeps the old firmware).",
    )


# --------------------------------------------------------------------------------------------
# Root


class Cluster(_Strict):
    """A GPU cluster: the one file every gpuctl command reads."""

    schema_version: Literal[1] = Field(1, description="Version of this file's schema (1).")
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,39}$")] = Field(
        description="Cluster name (lower case, digits, dashes)."
    )
    ssh: Ssh = Field(default_factory=lambda: Ssh(), description="SSH access.")
    package_sources: PackageSources = Field(
        default_factory=lambda: PackageSources(), description="Package repositories."
    )
    software: Software = Field(description="Pinned software versions.")
    fabrics: list[Fabric] = Field(
        default_factory=list, description="High-speed fabrics (empty for a single node)."
    )
    node_groups: list[NodeGroup] = Field(min_length=1, description="Groups of nodes.")
    slurm: Slurm = Field(description="Slurm settings.")
    validation: Validation = Field(
        default_factory=lambda: Validation(), description="Validation defaults."
    )
    rollout: Rollout = Field(default_factory=lambda: Rollout(), description="Rollout defaults.")
    bmc: Bmc = Field(
        default_factory=lambda: Bmc(),
        description="Redfish access to the BMCs named by `node_groups[].bmc_addresses`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _data_not_code(cls, data: Any) -> Any:
        """Before any field is read: refuse unsafe strings, and clusters too big to expand."""
        from gpuctl.config.rules import RuleViolations

        if not isinstance(data, dict):
            return data
        findings = unsafe_values(data)
        groups = data.get("node_groups")
        if isinstance(groups, list):
            sizes = [
                estimated_size(g["nodes"].strip())
                for g in groups
                if isinstance(g, dict) and isinstance(g.get("nodes"), str)
            ]
            total = sum(sizes)
            # one set over MAX_NODESET is named by its own field's check, more precisely
            if total > MAX_CLUSTER_NODES and max(sizes) <= MAX_NODESET:
                findings.append(
                    (
                        ("node_groups",),
                        f"the node groups name about {total} nodes in all; gpuctl handles at "
                        f"most {MAX_CLUSTER_NODES} nodes in one cluster.yml",
                    )
                )
        if findings:
            raise RuleViolations(findings)
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Cluster:
        from gpuctl.config.rules import check_rules

        check_rules(self)
        return self
