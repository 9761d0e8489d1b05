"""Render a Cluster into the Ansible inventory, ansible.cfg and Slurm's configuration files.

``render_files`` is pure (cluster -> {relative path: text}); ``write_rendered`` puts the files on
disk atomically and removes files an earlier render wrote that are no longer produced.
The same input always gives byte-identical output: no timestamps, stable ordering.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml
from ClusterShell.NodeSet import NodeSet

from gpuctl import __version__
from gpuctl.config.catalog import gpu_spec
from gpuctl.config.derived import effective_thresholds, nodes
from gpuctl.config.facts import (
    ansible_group_name,
    effective_interconnect,
    fabric_rate,
    has_nvswitch,
    topology_fabric,
)
from gpuctl.config.model import Cluster, NodeGroup, RoceQos, Slurm
from gpuctl.errors import RenderError
from gpuctl.fileio import SECRET_DIR_MODE, SECRET_FILE_MODE, write_atomic
from gpuctl.resources import templates_dir

try:
    from yaml import CSafeDumper as _Dumper
except ImportError:  # pragma: no cover
    from yaml import SafeDumper as _Dumper  # type: ignore[assignment]

MANIFEST = ".gpuctl-rendered"
HEADER = "# Managed by gpuctl from cluster.yml ({name}). Do not edit: re-run `gpuctl render`.\n"
# slurm.health_check: the wrapper the gpuctl_node_check role installs (HealthCheckProgram), and
# the copy of cluster.yml it copies to the nodes (/etc/gpuctl/cluster.yml)
HEALTH_CHECK_PROGRAM = "/usr/local/sbin/gpuctl-node-check"
NODE_CLUSTER_YML = "gpuctl/cluster.yml"
# left out of the nodes' copy: node-check does not read them, URLs can carry credentials, and
# health_check (enabled) would require the package sources that are left out
_NODE_COPY_EXCLUDES: dict[str, Any] = {
    "ssh": True,
    "package_sources": True,
    "slurm": {"health_check": True},
}


@dataclass(frozen=True, slots=True)
class RenderResult:
    directory: Path
    written: tuple[str, ...]
    removed: tuple[str, ...]


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - config files, not HTML
    )


def fold(names: list[str]) -> str:
    return str(NodeSet.fromlist(names)) if names else ""


def fold_sets(nodesets: list[str]) -> str:
    """Union of node set strings, folded (cheap: works on ranges, not on expanded names)."""
    union = NodeSet()
    for text in nodesets:
        union.update(text)
    return str(union)


# Beyond this many comma-separated pieces, addresses are written one NodeName line per node
# rather than folded: folding thousands of single addresses costs more than it saves.
_FOLD_PIECES = 64


def _dump(data: Any) -> str:
    return yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        width=10_000,
        allow_unicode=True,
    )


def render_files(cluster: Cluster) -> dict[str, str]:
    """Every rendered file, keyed by its path relative to the output directory."""
    header = HEADER.format(name=cluster.name)
    files: dict[str, str] = {}
    files["inventory.yml"] = header + _inventory_text(cluster)
    files["group_vars/all.yml"] = header + _dump(_all_vars(cluster))
    for gi, group in enumerate(cluster.node_groups):
        name = ansible_group_name("ng", group.name)
        files[f"group_vars/{name}.yml"] = header + _dump(_group_vars(cluster, group, gi))

    env = _env()
    ctx = _template_context(cluster)
    for target, template in (
        ("ansible.cfg", "ansible/ansible.cfg.j2"),
        ("slurm/slurm.conf", "slurm/slurm.conf.j2"),
        ("slurm/gres.conf", "slurm/gres.conf.j2"),
        ("slurm/cgroup.conf", "slurm/cgroup.conf.j2"),
    ):
        files[target] = env.get_template(template).render(ctx)
    if ctx["topology"] is not None:
        files["slurm/topology.conf"] = env.get_template("slurm/topology.conf.j2").render(ctx)
    if cluster.slurm.health_check.enabled:
        files[NODE_CLUSTER_YML] = node_cluster_yml(cluster)
    return dict(sorted(files.items()))


def node_cluster_yml(cluster: Cluster) -> str:
    """cluster.yml as `gpuctl node-check` reads it on the nodes: what the operator wrote (keys
    left unset stay unset), without ``ssh``, ``package_sources`` (URLs may carry credentials,
    and the file is world-readable there: 0644) and ``slurm.health_check``, none of which
    node-check reads."""
    doc = cluster.model_dump(mode="json", exclude_unset=True, exclude=_NODE_COPY_EXCLUDES)
    note = (
        "# gpuctl node-check's copy (without ssh, package_sources, slurm.health_check); installed\n"
        "# on compute nodes as /etc/gpuctl/cluster.yml by the gpuctl_node_check role.\n"
    )
    return HEADER.format(name=cluster.name) + note + _dump(doc)


def write_rendered(files: dict[str, str], directory: Path) -> RenderResult:
    """Write ``files`` under ``directory``; drop files of an earlier render that are gone now.

    The files hold what the operator may keep private (proxy credentials in URLs, key paths,
    the cluster's layout): they are written 0600 in folders made 0700. Only regular files
    inside ``directory``, reached without a symlink, are ever removed, whatever the manifest
    says.
    """
    try:
        fresh = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True, mode=SECRET_DIR_MODE)
        manifest = directory / MANIFEST
        previous: set[str] = set()
        if fresh or manifest.is_file():
            # a folder gpuctl made or renders into: private to the operator
            os.chmod(directory, SECRET_DIR_MODE)
        if manifest.is_file() and not manifest.is_symlink():
            previous = {ln for ln in manifest.read_text(encoding="utf-8").splitlines() if ln}
        for rel, text in files.items():
            _atomic_write(directory / rel, text)
        removed = sorted(rel for rel in previous - set(files) if _remove_inside(directory, rel))
        _atomic_write(manifest, "".join(f"{rel}\n" for rel in files))
    except OSError as exc:
        raise RenderError(f"cannot write {exc.filename or directory}: {exc.strerror}") from None
    return RenderResult(directory, tuple(files), tuple(removed))


def _remove_inside(directory: Path, rel: str) -> bool:
    """Remove ``directory/rel`` if it is a regular file below ``directory`` reached through
    real folders only (no ``..``, no absolute path, no symlink on the way)."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        return False
    current = directory
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink() or not current.is_dir():
            return False
    target = current / parts[-1]
    if target.is_symlink() or not target.is_file():
        return False
    target.unlink()
    return True


def render_cluster(cluster: Cluster, directory: Path) -> RenderResult:
    try:
        files = render_files(cluster)
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc}") from None
    return write_rendered(files, directory)


def _atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` atomically at mode 0600; leave it untouched when it is already right."""
    data = text.encode("utf-8")
    try:
        st = path.lstat()
        if (
            stat.S_ISREG(st.st_mode)
            and stat.S_IMODE(st.st_mode) == SECRET_FILE_MODE
            and path.read_bytes() == data
        ):
            return
    except FileNotFoundError:
        pass
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    write_atomic(path, data, mode=SECRET_FILE_MODE, dir_mode=SECRET_DIR_MODE)


# ---------------------------------------------------------------------------------------------


def _ssh_common_args(cluster: Cluster) -> str:
    """ssh options for Ansible (``ansible_ssh_common_args``).

    Two readers parse this string: Ansible splits it into words with shlex, and ssh hands the
    ProxyCommand to ``/bin/sh -c`` after expanding its ``%`` tokens. So the ProxyCommand is
    shell-quoted word by word (``%`` doubled in the key path), and the whole ``ProxyCommand=``
    option is quoted once more for Ansible's split. The jump host and user are validated as a
    host name or IP and a login name at load time; this quoting is the second line of defence.
    """
    ssh = cluster.ssh
    known = "{{ inventory_dir }}/known_hosts"
    args = [
        f"-o UserKnownHostsFile={known}",
        "-o StrictHostKeyChecking=yes",
        f"-o ConnectTimeout={ssh.connect_timeout_s}",
    ]
    jump = ssh.jump_host
    if jump is not None:
        user = jump.user or ssh.user
        key = ["-i", ssh.private_key.replace("%", "%%")] if ssh.private_key else []
        # ProxyCommand (not ProxyJump) so the hop is checked against the same known_hosts file
        proxy = shlex.join(
            [
                "ssh",
                "-W",
                "%h:%p",
                "-q",
                "-p",
                str(jump.port),
                *key,
                "-o",
                "BatchMode=yes",
                "-o",
                f"UserKnownHostsFile={known}",
                "-o",
                "StrictHostKeyChecking=yes",
                "--",
                f"{user}@{jump.host}",
            ]
        )
        # double quotes for Ansible's (POSIX) shlex split: only \ and " are special there
        quoted = proxy.replace("\\", "\\\\").replace('"', '\\"')
        args.append(f'-o ProxyCommand="{quoted}"')
    return " ".join(args)


def _inventory_text(cluster: Cluster) -> str:
    """inventory.yml, written directly: host lists of thousands of nodes are the bulk of it.

    Names are validated host names and addresses IP addresses, so they need no quoting; the
    few free-form values go through the YAML dumper.
    """
    ssh = cluster.ssh
    all_vars: dict[str, Any] = {
        "ansible_user": ssh.user,
        "ansible_port": ssh.port,
        "ansible_become": ssh.become and ssh.user != "root",
        "ansible_ssh_common_args": _ssh_common_args(cluster),
    }
    if ssh.private_key:
        all_vars["ansible_ssh_private_key_file"] = ssh.private_key
    lines = ["all:", "  vars:"]
    lines.extend("    " + ln for ln in _dump(all_vars).splitlines())
    lines.append("  children:")
    # Host variables live here, under each host of its node group (one file, not one per host:
    # creating thousands of host_vars files dominated render time). host_vars/ stays free for
    # the operator's own overrides, which a re-render never touches.
    leaves = _leaf_index(cluster)
    rdma_hosts = _rdma_host_vars(cluster)
    for group in cluster.node_groups:
        names = group.node_names()
        addrs = group.address_list()
        lines.append(f"    {ansible_group_name('ng', group.name)}:")
        lines.append("      hosts:")
        for i, name in enumerate(names):
            host: list[str] = []
            if addrs:
                host.append(f"          ansible_host: {addrs[i]}")
            if name in leaves:
                pairs = ", ".join(f"{fab}: {leaf}" for fab, leaf in leaves[name].items())
                host.append(f"          gpuctl_leaves: {{{pairs}}}")
            for key, value in rdma_hosts.get(name, {}).items():
                host.append(f"          {key}: {_flow(value)}")
            lines.append(f"        {name}:" if host else f"        {name}: null")
            lines.extend(host)
    for group_name, members in _membership_groups(cluster):
        lines.append(f"    {group_name}:")
        lines.append("      hosts:")
        lines.extend(f"        {name}: null" for name in members)
    return "\n".join(lines) + "\n"


def _flow(value: Any) -> str:
    return yaml.dump(
        value, Dumper=_Dumper, default_flow_style=True, width=10_000, sort_keys=False
    ).strip()


def _rdma_host_vars(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Per host: where opensm runs (the first member of each InfiniBand fabric that wants it on
    a node) and the IPoIB address of the fabric's first port (network address + position + 1)."""
    out: dict[str, dict[str, Any]] = {}
    for fab in cluster.fabrics:
        if fab.kind.value != "infiniband":
            continue
        members: list[tuple[str, str]] = []  # (host, first device on this fabric)
        for group in cluster.node_groups:
            devices = [
                d for nic in group.nics if nic.fabric == fab.name for d in NodeSet(nic.devices)
            ]
            if devices:
                members.extend((n, devices[0]) for n in group.node_names())
        if not members:
            continue
        if fab.subnet_manager is not None and fab.subnet_manager.value == "opensm":
            out.setdefault(members[0][0], {})["rdma_opensm_enabled"] = True
        if fab.ipoib is not None:
            net = ipaddress.IPv4Network(fab.ipoib.network)
            if len(members) > net.num_addresses - 2:
                raise RenderError(
                    f"fabric {fab.name}: IPoIB network {net} has no room for {len(members)} hosts"
                )
            for i, (host, device) in enumerate(members):
                address = f"{net.network_address + i + 1}/{net.prefixlen}"
                out.setdefault(host, {}).setdefault("rdma_ipoib", []).append(
                    {"device": device, "address": address}
                )
    return out


def _membership_groups(cluster: Cluster) -> list[tuple[str, list[str]]]:
    """Groups by role, GPU presence, NVSwitch, fabric and leaf, with their member hosts."""
    out: list[tuple[str, list[str]]] = []
    by_role: dict[str, list[str]] = {"controller": [], "login": [], "compute": []}
    gpu_hosts: list[str] = []
    nvswitch_hosts: list[str] = []
    for group in cluster.node_groups:
        names = group.node_names()
        for role in group.roles:
            by_role[role.value].extend(names)
        if group.gpus is not None:
            gpu_hosts.extend(names)
            if _interconnect(group) == "nvswitch":
                nvswitch_hosts.extend(names)
    out.extend((f"role_{name}", members) for name, members in by_role.items() if members)
    if gpu_hosts:
        out.append(("gpu", gpu_hosts))
    if nvswitch_hosts:
        out.append(("nvswitch", nvswitch_hosts))
    rdma_hosts: list[str] = []
    for fab in cluster.fabrics:
        members = [
            n
            for g in cluster.node_groups
            if any(x.fabric == fab.name for x in g.nics)
            for n in g.node_names()
        ]
        if members:
            out.append((ansible_group_name("fabric", fab.name), members))
    for group in cluster.node_groups:
        if group.nics:
            rdma_hosts.extend(group.node_names())
    if rdma_hosts:
        out.append(("rdma", rdma_hosts))
    topo = topology_fabric(cluster)
    if topo is not None and topo.topology is not None:
        for leaf in topo.topology.leaves:
            out.append((ansible_group_name("leaf", leaf.name), list(NodeSet(leaf.nodes))))
    return out


def _interconnect(group: NodeGroup) -> str | None:
    if group.gpus is None:
        return None
    return effective_interconnect(group.gpus.model.value, group.gpus.count, group.gpus.interconnect)


def _no_proxy(hosts: list[str]) -> list[str]:
    """What the nodes reach without the proxy: always themselves, then cluster.yml's list."""
    return list(dict.fromkeys(["localhost", "127.0.0.1", "::1", *hosts]))


def _proxy_environment(proxy: str | None, hosts: list[str]) -> dict[str, str]:
    """The plays' environment for ``http_proxy``: both spellings, which programs differ on
    (curl reads only lower-case http_proxy; Python and git read either)."""
    if proxy is None:
        return {}
    direct = ",".join(_no_proxy(hosts))
    env: dict[str, str] = {}
    for name, value in (("http_proxy", proxy), ("https_proxy", proxy), ("no_proxy", direct)):
        env[name] = value
        env[name.upper()] = value
    return env


def _slurm_repository(cluster: Cluster) -> dict[str, Any] | None:
    """package_sources.slurm for one role (a copy each: group_vars carries no YAML aliases)."""
    source = cluster.package_sources.slurm
    return source.model_dump(mode="json") if source is not None else None


def _cgroup_plugins(slurm: Slurm) -> list[str]:
    """The plugins of slurm.conf that slurmd runs through Slurm's cgroup plugin."""
    plugins = ["proctrack/cgroup"] if slurm.proctrack == "cgroup" else []
    return plugins + [p for p in slurm.task_plugins if p == "task/cgroup"]


def _all_vars(cluster: Cluster) -> dict[str, Any]:
    """group_vars/all.yml: gpuctl's own facts, then each role's inputs under its own prefix."""
    sw = cluster.software
    src = cluster.package_sources
    slurm = cluster.slurm
    health = slurm.health_check
    fm_version = sw.fabric_manager.version or sw.driver.version
    any_nvswitch = any(_interconnect(g) == "nvswitch" for g in cluster.node_groups)
    gpu_models = sorted({g.gpus.model.value for g in cluster.node_groups if g.gpus is not None})
    return {
        "gpuctl_cluster_name": cluster.name,
        "gpuctl_schema_version": cluster.schema_version,
        "gpuctl_package_sources": src.model_dump(mode="json"),
        "gpuctl_validation_level": cluster.validation.level.value,
        "gpuctl_rollout": cluster.rollout.model_dump(mode="json"),
        "gpuctl_fabrics": [
            {
                "name": f.name,
                "kind": f.kind.value,
                "generation": f.generation.value if f.generation else None,
                "rate_gbps": fabric_rate(f),
                "subnet_manager": f.subnet_manager.value if f.subnet_manager else None,
                "ipoib_network": f.ipoib.network if f.ipoib else None,
                "qos": f.qos.model_dump(mode="json") if f.qos else None,
            }
            for f in cluster.fabrics
        ],
        # the version gate of the preflight role checks this set before anything is installed
        "preflight_versions": {
            "driver": sw.driver.version,
            "driver_branch": sw.driver.branch,
            "kernel_modules": sw.driver.kernel_modules.value,
            "fabric_manager": fm_version if any_nvswitch else None,
            "cuda": sw.cuda,
            "nccl": sw.nccl,
            "dcgm": sw.dcgm,
            "rdma_stack": sw.rdma.stack.value,
            "doca": sw.rdma.doca_version,
            "gpu_models": gpu_models,
        },
        # versions the gate lets through without a rule (software.unverified_versions)
        "preflight_unverified_versions": sorted(set(sw.unverified_versions)),
        # where the nodes get packages: the OS mirror and the proxy (preflight/tasks/sources.yml)
        "preflight_os_mirror": src.os_mirror,
        "preflight_os_security_mirror": src.os_security_mirror,
        "preflight_http_proxy": src.http_proxy,
        "preflight_no_proxy": _no_proxy(src.no_proxy),
        # every play's environment: git, pip, get_url and apt itself go through the proxy
        "gpuctl_environment": _proxy_environment(src.http_proxy, src.no_proxy),
        "nvidia_driver_branch": sw.driver.branch,
        "nvidia_driver_version": sw.driver.version,
        "nvidia_driver_kernel_modules": sw.driver.kernel_modules.value,
        "nvidia_driver_secure_boot_signed": sw.driver.secure_boot_signed,
        "nvidia_driver_repo_url": src.cuda,
        "fabric_manager_version": fm_version,
        "nccl_version": sw.nccl,
        "nccl_tests_version": sw.nccl_tests,
        "nccl_tests_repo_url": src.nccl_tests,
        "nccl_tests_mpi_flavor": sw.mpi.flavor.value,
        "nccl_tests_mpi_version": sw.mpi.version,
        "nccl_tests_mpi_url": sw.mpi.url,
        "dcgm_version": sw.dcgm,
        "dcgm_cuda_major": sw.cuda.split(".", 1)[0],
        "rdma_stack": sw.rdma.stack.value,
        "rdma_doca_version": sw.rdma.doca_version,
        "rdma_doca_repo_url": src.doca,
        "rdma_peermem": sw.rdma.peermem,
        # NVIDIA Firmware Tools for `gpuctl rollout --component nic-firmware`; null: none
        "mft_version": sw.mft,
        # the key is adopted from the first host and never leaves the nodes' own files
        "munge_key_generate": True,
        "munge_key_source_host": slurm.controller,
        "slurm_controller_host": slurm.controller,
        "slurm_controller_state_dir": slurm.state_save_location,
        "slurm_controller_config_src": "{{ inventory_dir }}/slurm",
        "slurm_controller_package_version": sw.slurm,
        "slurm_controller_repository": _slurm_repository(cluster),
        "slurm_node_config_src": "{{ inventory_dir }}/slurm",
        "slurm_node_package_version": sw.slurm,
        "slurm_node_repository": _slurm_repository(cluster),
        # the Slurm gate of the preflight role (tasks/slurm.yml): the version against the
        # nodes' cgroup version, for the cgroup plugins slurm.conf names
        "preflight_slurm_version": sw.slurm,
        "preflight_slurm_repository": src.slurm is not None,
        "preflight_slurm_cgroup_plugins": _cgroup_plugins(slurm),
        "slurm_node_health_check_program": HEALTH_CHECK_PROGRAM if health.enabled else "",
        # gpuctl's node check on the compute nodes (slurm.health_check)
        "gpuctl_node_check_enabled": health.enabled,
        "gpuctl_node_check_version": __version__,
        "gpuctl_node_check_wheelhouse": src.gpuctl_wheelhouse or "",
        "gpuctl_node_check_index_url": src.pypi_index or "",
        "gpuctl_node_check_http_proxy": src.http_proxy or "",
        "gpuctl_node_check_cluster_src": "{{ inventory_dir }}/" + NODE_CLUSTER_YML,
        "gpuctl_node_check_level": health.level,
        "gpuctl_node_check_program": HEALTH_CHECK_PROGRAM,
    }


def _group_vars(cluster: Cluster, group: NodeGroup, gi: int) -> dict[str, Any]:
    fabrics = {f.name: f for f in cluster.fabrics}
    gpu: dict[str, Any] | None = None
    if group.gpus is not None:
        spec = gpu_spec(group.gpus.model.value)
        gpu = {
            "model": spec.key,
            "product_name": spec.product_name,
            "count": group.gpus.count,
            "interconnect": _interconnect(group),
            "nvlink_per_pair": spec.nvlink_per_pair if _interconnect(group) == "nvswitch" else None,
            "gres_type": spec.gres_type,
            "pcie_gen": spec.pcie_gen,
        }
    nics: list[dict[str, Any]] = []
    next_rail: dict[str, int] = {}  # rails count on across nics[] entries of the same fabric
    for nic in group.nics:
        fab = fabrics[nic.fabric]
        for dev, port in ((d, p) for d in NodeSet(nic.devices) for p in nic.ports):
            rail = next_rail.get(fab.name, 0)
            if nic.rails:
                next_rail[fab.name] = rail + 1
            nics.append(
                {
                    "device": dev,
                    "port": port,
                    "fabric": fab.name,
                    "kind": fab.kind.value,
                    "rate_gbps": nic.rate_gbps or fabric_rate(fab),
                    "rail": rail if nic.rails else None,
                }
            )
    rdma_devices = list(dict.fromkeys(n["device"] for n in nics))  # a device once, its ports all
    roce = [n for n in nics if n["kind"] == "roce"]
    qos_vars: dict[str, Any] = {}
    # /etc/nccl.conf (the nccl role): only the lines that apply. NCCL does not use RDMA-CM and
    # sends with traffic class 0 unless NCCL_IB_TC is set; on RoCE v2 the traffic class is the
    # IP ToS byte, DSCP << 2, so NCCL rides the lossless class the roce_qos role sets up
    nccl_conf: dict[str, Any] = {}
    if roce:
        fabric = fabrics[str(roce[0]["fabric"])]
        qos = fabric.qos or RoceQos()
        nccl_conf["NCCL_IB_TC"] = qos.dscp << 2
        # the GID NCCL addresses by (a routed RoCE v2 fabric needs the RoCE v2 IPv4 one);
        # without it NCCL picks its own
        if fabric.gid_index is not None:
            nccl_conf["NCCL_IB_GID_INDEX"] = fabric.gid_index
        qos_vars = {
            "roce_qos_devices": [n["device"] for n in roce],
            "roce_qos_trust": qos.trust,
            "roce_qos_pfc_priority": qos.pfc_priority,
            "roce_qos_dscp": qos.dscp,
            "roce_qos_ecn": qos.ecn,
        }
    return {
        "gpuctl_node_group": group.name,
        "gpuctl_group_roles": [r.value for r in group.roles],
        "gpuctl_gpu": gpu,
        "gpuctl_nics": nics,
        "fabric_manager_enabled": _interconnect(group) == "nvswitch",
        "rdma_devices": rdma_devices,
        **qos_vars,
        **_perftest_cuda_vars(cluster, group),
        "nccl_conf": nccl_conf,
        "gpuctl_validation_level": (group.validation.level or cluster.validation.level).value,
        "gpuctl_thresholds": {
            k: v.value for k, v in effective_thresholds(cluster, group, gi).items()
        },
    }


def _perftest_cuda_vars(cluster: Cluster, group: NodeGroup) -> dict[str, Any]:
    """perftest built with CUDA (the validation_tools role), for the GPUDirect RDMA check: only
    on GPU nodes with RDMA NICs, the hosts where the rdma role loads nvidia-peermem (GPU hosts
    of its play on the rdma group). The CUDA home is the nccl role's: /usr/local/cuda-<X.Y>,
    where software.cuda is the +cudaX.Y of the NCCL package (a rule of gpuctl check)."""
    if group.gpus is None or not group.nics:
        return {}
    sw = cluster.software
    return {
        "validation_tools_perftest_version": sw.perftest or "",
        "validation_tools_perftest_repo_url": cluster.package_sources.perftest,
        "validation_tools_perftest_cuda_version": sw.cuda,
        "validation_tools_perftest_cuda_home": f"/usr/local/cuda-{sw.cuda}",
    }


def _leaf_index(cluster: Cluster) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for fab in cluster.fabrics:
        if fab.topology is None:
            continue
        for leaf in fab.topology.leaves:
            for node in NodeSet(leaf.nodes):
                out.setdefault(node, {})[fab.name] = leaf.name
    return out


def _node_lines(cluster: Cluster, group: NodeGroup) -> list[str]:
    """NodeName lines of one group: one folded line when names and addresses fold in step."""
    names = group.node_names()
    addrs = group.address_list()
    attrs: list[str] = []
    if group.cpu is not None:
        cpu = group.cpu
        attrs.append(
            f"CPUs={cpu.sockets * cpu.cores_per_socket * cpu.threads_per_core} "
            f"Sockets={cpu.sockets} CoresPerSocket={cpu.cores_per_socket} "
            f"ThreadsPerCore={cpu.threads_per_core}"
        )
    if group.memory_mb is not None:
        attrs.append(f"RealMemory={group.memory_mb}")
    if group.gpus is not None:
        attrs.append(f"Gres=gpu:{gpu_spec(group.gpus.model.value).gres_type}:{group.gpus.count}")
    if group.slurm.features:
        attrs.append(f"Feature={','.join(group.slurm.features)}")
    if group.slurm.weight is not None:
        attrs.append(f"Weight={group.slurm.weight}")
    attrs.append("State=UNKNOWN")
    tail = " ".join(attrs)
    folded_names = fold_sets([group.nodes])
    if addrs is None or group.addresses is None:
        return [f"NodeName={folded_names} {tail}"]
    # Slurm expands NodeName and NodeAddr ranges and pairs them position by position, both in
    # sorted order; fold only when that pairing is the one cluster.yml gives.
    if group.addresses.count(",") < _FOLD_PIECES:
        folded = NodeSet(group.addresses)
        if list(folded) == addrs:
            return [f"NodeName={folded_names} NodeAddr={folded} {tail}"]
    return [f"NodeName={n} NodeAddr={a} {tail}" for n, a in zip(names, addrs, strict=True)]


def _core_range(socket: int, per_socket: int) -> str:
    first = socket * per_socket
    return str(first) if per_socket == 1 else f"{first}-{first + per_socket - 1}"


def _gres_lines(group: NodeGroup) -> list[dict[str, Any]]:
    """gres.conf lines of one group: one for all its GPUs, or, with ``gpus.cpu_affinity``, one
    per run of consecutive GPUs on the same socket with ``Cores=`` that socket's cores.

    gres.conf(5): Cores= takes Slurm's logical core indices (core 0 is the first core of the
    first socket, as lstopo's ``Core L#``; not OS CPU ids, not threads), and all cores of a
    socket together, since Slurm co-allocates GPUs and CPUs by socket."""
    gpus = group.gpus
    if gpus is None:
        return []
    nodes = fold_sets([group.nodes])
    gres_type = gpu_spec(gpus.model.value).gres_type
    affinity = gpus.cpu_affinity
    runs: list[tuple[int, int, int | None]] = []  # first GPU, last GPU, socket
    for index in range(gpus.count):
        socket = affinity[index] if affinity is not None else None
        if runs and runs[-1][2] == socket:
            runs[-1] = (runs[-1][0], index, socket)
        else:
            runs.append((index, index, socket))
    per_socket = group.cpu.cores_per_socket if group.cpu is not None else 0
    return [
        {
            "nodes": nodes,
            "type": gres_type,
            "files": f"/dev/nvidia{first}" if first == last else f"/dev/nvidia[{first}-{last}]",
            "cores": None if socket is None else _core_range(socket, per_socket),
        }
        for first, last, socket in runs
    ]


def _template_context(cluster: Cluster) -> dict[str, Any]:
    slurm = cluster.slurm
    address = {n.name: n.address for n in nodes(cluster)}
    controllers = [
        {"name": h, "address": address.get(h)}
        for h in (slurm.controller, slurm.backup_controller)
        if h is not None
    ]
    compute_groups = [g for g in cluster.node_groups if any(r.value == "compute" for r in g.roles)]
    node_lines = [line for g in compute_groups for line in _node_lines(cluster, g)]
    groups = {g.name: g for g in cluster.node_groups}
    partitions = []
    for part in slurm.partitions:
        sets = [groups[gname].nodes for gname in part.node_groups]
        if part.nodes is not None:
            sets.append(part.nodes)
        partitions.append(
            {
                "name": part.name,
                "nodes": fold_sets(sets),
                "default": part.default,
                "max_time": part.max_time,
                "state": part.state,
            }
        )
    gres = [line for g in compute_groups for line in _gres_lines(g)]
    topo_fab = topology_fabric(cluster)
    topology = None
    if topo_fab is not None and topo_fab.topology is not None:
        topology = {
            "fabric": topo_fab.name,
            "leaves": [
                {"name": leaf.name, "nodes": fold_sets([leaf.nodes])}
                for leaf in topo_fab.topology.leaves
            ],
            "spines": [
                {"name": sp.name, "switches": fold_sets([sp.switches])}
                for sp in topo_fab.topology.spines
            ],
        }
    node_count = len(nodes(cluster))
    extra = {k: _slurm_value(v) for k, v in sorted(slurm.extra.items())}
    return {
        "cluster": cluster,
        "cluster_name": slurm.cluster_name or cluster.name,
        "controllers": controllers,
        "slurm": slurm,
        "node_lines": node_lines,
        "partitions": partitions,
        "gres": gres,
        "gres_autodetect": slurm.gres_autodetect,
        "has_gpus": any(g.gpus is not None for g in compute_groups),
        "health_check": (
            {
                "program": HEALTH_CHECK_PROGRAM,
                "interval_s": slurm.health_check.interval_s,
                "node_state": ",".join(slurm.health_check.node_state),
            }
            if slurm.health_check.enabled
            else None
        ),
        "topology": topology,
        "extra": extra,
        "forks": max(5, min(node_count, 100)),
        "ssh": cluster.ssh,
        "nvswitch": has_nvswitch(cluster),
        "header": HEADER.format(name=cluster.name).rstrip("\n"),
    }


def _slurm_value(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "YES" if value else "NO"
    return str(value)
