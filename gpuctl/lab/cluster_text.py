"""The running lab's cluster.yml: the lab starter with the hardware of its profiles and the
package sources of its node OS (gpuctl/lab/lab.py writes it at `gpuctl lab up`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from ClusterShell.NodeSet import NodeSet

from gpuctl.config.catalog import gpu_spec
from gpuctl.config.rules.settings import NCCL_BUSBW_KEYS
from gpuctl.lab import repo, slurm_repo
from gpuctl.lab.sim import profiles as sim_profiles
from gpuctl.lab.system import LabError, wheelhouse_dir
from gpuctl.lab.system import lab_dir as lab_dir
from gpuctl.starter import starter

# node operating systems the lab builds (debootstrap suites); Debian 12 is the default
OS_RELEASES = {"debian12": "bookworm", "debian13": "trixie"}
DEFAULT_OS = "debian12"

DEFAULT_PROFILE = "hgx-h100-ndr"
_IB_GENERATIONS = {100: "edr", 200: "hdr", 400: "ndr", 800: "xdr"}


def parse_profiles(compute_nodes: int, profiles: list[str]) -> list[tuple[str, int]]:
    """``--profile`` values as (profile, compute nodes): ``NAME`` alone takes every compute
    node (one profile only); ``NAME:COUNT`` gives each profile its own node group."""
    groups: list[tuple[str, int]] = []
    for value in profiles:
        name, sep, count = value.partition(":")
        if name not in sim_profiles.names():
            raise LabError(f"unknown profile {name!r}; profiles: {', '.join(sim_profiles.names())}")
        if sep and not (count.isdigit() and 1 <= int(count) <= 16):
            raise LabError(f"--profile {value!r}: the count after ':' must be 1 to 16")
        groups.append((name, int(count) if sep else 0))
    if len(groups) == 1 and groups[0][1] == 0:
        return [(groups[0][0], compute_nodes)]
    if any(n == 0 for _, n in groups) or len({g for g, _ in groups}) != len(groups):
        raise LabError("several profiles: give each one once, with its node count (NAME:COUNT)")
    if sum(n for _, n in groups) > 16:
        raise LabError("at most 16 compute nodes in the lab")
    return groups


def lab_cluster_text(
    compute_nodes: int,
    profile: str,
    os_name: str,
    groups: list[tuple[str, int]] | None,
    *,
    key: Path,
    known_hosts: Path,
) -> str:
    """The running lab's cluster.yml: the lab starter, its hardware taken from the profile (or
    one node group per profile of ``groups``), its package sources from the node OS."""
    groups = groups or [(profile, compute_nodes)]
    total = sum(n for _, n in groups)
    text = starter("lab", total)
    # the lab's own key, absolute, so the file works from any directory
    text = text.replace("private_key: .gpuctl/lab/id_ed25519", f"private_key: {key}")
    text = text.replace("known_hosts: .gpuctl/lab/known_hosts", f"known_hosts: {known_hosts}")
    text = text.replace(".gpuctl/lab/bmc/", f"{lab_dir() / 'bmc'}/")
    text = text.replace(
        "gpuctl_wheelhouse: /var/lib/gpuctl-lab/wheelhouse",
        f"gpuctl_wheelhouse: {wheelhouse_dir()}",
    )
    if groups == [(DEFAULT_PROFILE, total)] and os_name == DEFAULT_OS:
        return text  # the starter describes exactly this hardware (and keeps its comments)
    doc: dict[str, Any] = yaml.safe_load(text)
    if os_name != DEFAULT_OS:
        _os_package_sources(doc, os_name)
    if len(groups) == 1:
        fabric = _profile_group(doc["node_groups"][1], groups[0][0], doc["fabrics"][0], "")
        doc["fabrics"] = [fabric] if fabric else []
    else:
        _split_groups(doc, groups)
    driver = {str(sim_profiles.load(g).get("driver_version", "570.172.08")) for g, _ in groups}
    if len(driver) != 1:
        raise LabError(f"the profiles want different drivers ({', '.join(sorted(driver))})")
    doc["software"]["driver"]["version"] = driver.pop()
    described = ", ".join(
        f"{g} x{n} ({sim_profiles.load(g).get('description', '')})" for g, n in groups
    )
    header = f"# gpuctl lab cluster.yml on {os_name}: simulated profiles {described}.\n"
    return header + yaml.safe_dump(doc, sort_keys=False)


def _os_package_sources(doc: dict[str, Any], os_name: str) -> None:
    """A node OS other than Debian 12: its archive through the lab's apt-cacher-ng used as a
    mirror (``http://<proxy>/deb.debian.org/debian``: no proxy setting on the nodes at all) and
    Slurm from the lab's separate Slurm repository (slurm_repo.py)."""
    src = doc["package_sources"]
    src.pop("http_proxy", None)
    src.pop("no_proxy", None)
    src["os_mirror"] = f"{repo.PROXY_URL}/deb.debian.org/debian"
    src["os_security_mirror"] = f"{repo.PROXY_URL}/security.debian.org/debian-security"
    doc["software"]["slurm"] = slurm_repo.VERSIONS[OS_RELEASES[os_name]]
    src["slurm"] = {
        "url": slurm_repo.url(),
        "suite": "./",
        "components": [],
        "packages": "schedmd",
        "trusted": True,
    }


def _profile_group(
    group: dict[str, Any], profile: str, leaf_fabric: dict[str, Any], suffix: str
) -> dict[str, Any] | None:
    """Give a node group the hardware of ``profile``; returns its fabric (None: no NICs)."""
    hw = sim_profiles.load(profile)
    gpus = hw["gpus"]
    count = int(gpus["count"])
    interconnect = "nvswitch" if gpus.get("nvswitch") else ("none" if count == 1 else "pcie-switch")
    group["gpus"] = {"model": hw["model"], "count": count, "interconnect": interconnect}
    # a collective the catalog has no NCCL floor for on this model (L40S PCIe, and most models'
    # all_gather ... sendrecv: no source): the threshold an operator sets from a healthy run,
    # 90 % of the busbw this profile's nodes measure
    floors: dict[str, float] = {}
    for key in NCCL_BUSBW_KEYS:
        expected = (hw.get("expected") or {}).get(key)
        if expected and gpu_spec(hw["model"]).thresholds.get(key) is None:
            floors[key] = round(float(expected) * 0.9, 1)
    if floors:
        group.setdefault("validation", {})["thresholds"] = floors
    nics = hw.get("nics") or {}
    ports = [p["name"] for p in nics.get("ports") or []]
    if not ports:
        group.pop("nics", None)
        return None
    rate = int(nics["rate"])
    fabric: dict[str, Any]
    if nics.get("link_layer") == "InfiniBand":
        fabric = {
            "name": f"ib{suffix}",
            "kind": "infiniband",
            "generation": _IB_GENERATIONS[rate],
            "subnet_manager": "switch",
        }
    else:
        # gid_index: the RoCE v2 GID of an mlx5 port with one IPv4 address (show_gids); the
        # stand-in prints the index -x gives it (0 without), so the lab proves it is passed
        fabric = {"name": f"roce{suffix}", "kind": "roce", "rate_gbps": rate, "gid_index": 3}
    # one profile: the starter's leaf (topology.conf); several: no topology, since topology.conf
    # describes one fabric and Slurm places no job across nodes it does not connect
    if leaf_fabric and not suffix:
        fabric["topology"] = leaf_fabric["topology"]
    group["nics"] = [{"devices": ",".join(ports), "fabric": fabric["name"]}]
    gpus = int(hw["gpus"]["count"])
    if gpus % len(ports) == 0 or len(ports) % gpus == 0:
        # every profile's adapters sit where the rails put them (GPU i: adapter i x adapters /
        # GPUs): validation checks it in topo -m (the nic_slots_swapped fault breaks it)
        group["nics"][0]["rails"] = True
    return fabric


def _split_groups(doc: dict[str, Any], groups: list[tuple[str, int]]) -> None:
    """One node group per profile, in order over the starter's compute nodes, each with its own
    fabric (no topology.conf); one partition over all of them."""
    template = doc["node_groups"].pop(1)
    names = list(NodeSet(template["nodes"]))
    addresses = list(NodeSet(template["addresses"]))
    bmcs = list(NodeSet(template["bmc_addresses"]))
    fabrics: list[dict[str, Any]] = []
    at = 0
    for i, (profile, count) in enumerate(groups, start=1):
        group = json.loads(json.dumps(template))
        group["name"] = profile.replace("-", "_")
        group["nodes"] = str(NodeSet.fromlist(names[at : at + count]))
        group["addresses"] = ",".join(addresses[at : at + count])
        group["bmc_addresses"] = ",".join(bmcs[at : at + count])
        at += count
        fabric = _profile_group(group, profile, {}, f"{i:02d}")
        if fabric:
            fabrics.append(fabric)
        doc["node_groups"].append(group)
    doc["fabrics"] = fabrics
    doc["slurm"]["partitions"][0]["node_groups"] = [g["name"] for g in doc["node_groups"][1:]]
