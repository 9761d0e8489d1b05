"""No dead settings (issue 15): every field of cluster.yml changes something, and every role
input is read.

For each leaf field of the model (found by walking it, so a field added later is checked too)
the test takes the example inventories and the `gpuctl init` starters, puts another valid value
at each place the field sits, renders both documents and looks for a difference something
consumes (tests/unit/settings_walk.py says what counts). Fields that gpuctl itself consumes
(validation, rollout, BMC access, gpuctl's own SSH) are proven in ``PROOFS`` instead: each
proof changes the field and shows that a library result differs (a verdict, a rollout policy,
the SSH settings). A field that does neither fails with "FIELD: changing it changes nothing".
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT

from gpuctl import render
from gpuctl.config.loader import load_cluster_text, validate_data
from gpuctl.config.model import Cluster
from gpuctl.config.rules.settings import UNENFORCED_THRESHOLDS
from gpuctl.errors import ConfigError, UsageError
from gpuctl.render import render_files
from gpuctl.starter import PROFILES, starter
from gpuctl.validation.bundle import NodeBundle
from gpuctl.validation.capture import capture_output
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.suite import judge_cluster

from settings_walk import (  # isort: skip
    Leaf,
    Loc,
    argument_spec_options,
    consumed_difference,
    generic_candidates,
    leaves,
    locations,
    put,
    rendered_variables,
    role_words,
    unread_variables,
)

FIX = ROOT / "tests" / "fixtures"

# Fields another change of issue 15 is making live right now (package sources: the lead and H1;
# RoCE QoS: H4). They are not refused; the lead empties this set when those changes are in.
# Fields other changes were making live while this test was written; empty now: every field
# is proven live, checked at load, or refused.
_BEING_MADE_LIVE: frozenset[str] = frozenset()


def _being_made_live(name: str) -> bool:
    """The field, or a field of the model it has become, is in ``_BEING_MADE_LIVE``."""
    return any(name == p or name.startswith(p + ".") for p in _BEING_MADE_LIVE)


# Variables render writes that are gpuctl's facts about the cluster, not role inputs: README's
# "What `gpuctl render` writes" lists them for the operator's own plays. No role reads them, so
# a change that shows only here is no evidence. Being made live: gpuctl_package_sources (proxy).
_GPUCTL_FACTS = frozenset(
    {
        "gpuctl_cluster_name",
        "gpuctl_schema_version",
        "gpuctl_package_sources",
        "gpuctl_validation_level",
        "gpuctl_rollout",
        "gpuctl_fabrics",
        "gpuctl_node_group",
        "gpuctl_group_roles",
        "gpuctl_nics",
        "gpuctl_thresholds",
        "gpuctl_leaves",
        "gpuctl_gpu",  # read by playbooks/fabric_manager.yml and the acceptance suite
        "rdma_devices",  # read by the acceptance suite (gpuctl/acceptance/test_rdma.py)
        # every play's environment (playbooks/*.yml); package_sources.http_proxy also reaches
        # the preflight role's preflight_http_proxy, which is the evidence for that field
        "gpuctl_environment",
    }
)


# ---------------------------------------------------------------------------------------------
# The documents: every example inventory, every starter, and one that sets what none sets


def _load(doc: dict[str, Any]) -> Cluster | None:
    try:
        return validate_data(copy.deepcopy(doc), None, "cluster.yml")
    except ConfigError:
        return None


def _full() -> dict[str, Any]:
    """The HGX example with what no example sets: a second fabric with its own topology, the
    health check, BMC access, HPC-X and the optional versions."""
    doc: dict[str, Any] = yaml.safe_load(
        (ROOT / "inventories" / "hgx-h100-ndr.yml").read_text(encoding="utf-8")
    )
    doc["package_sources"]["pypi_index"] = "http://mirror.example.com/pypi/simple"
    doc["package_sources"]["gpuctl_wheelhouse"] = "/srv/gpuctl-wheels"
    doc["software"]["mpi"] = {
        "flavor": "hpcx",
        "version": "2.21",
        "url": "http://mirror.example.com/hpcx/hpcx-v2.21.tbz",
    }
    doc["software"]["mft"] = "4.30.1"
    doc["fabrics"].append(
        {
            "name": "storage",
            "kind": "infiniband",
            "generation": "hdr",
            "subnet_manager": "opensm",
            "topology": {"leaves": [{"name": "sleaf01", "nodes": "gpu[001-004]"}]},
        }
    )
    doc["slurm"]["topology_fabric"] = "ndr"
    doc["fabrics"][0]["topology"]["spines"] = [
        {"name": "spine1", "switches": "leaf01"},
        {"name": "spine2", "switches": "leaf02"},
        {"name": "core", "switches": "spine[1-2]"},
    ]
    group = doc["node_groups"][2]
    group["nics"].append({"devices": "mlx5_[8-9]", "fabric": "storage", "rate_gbps": 200})
    group["bmc_addresses"] = "10.0.2.[1-4]"
    doc["slurm"]["health_check"] = {"enabled": True}
    # where packages come from: an OS mirror with Debian's security archive, a proxy
    doc["package_sources"]["os_mirror"] = "http://mirror.example.com/debian"
    doc["package_sources"]["os_security_mirror"] = "http://mirror.example.com/debian-security"
    doc["package_sources"]["http_proxy"] = "http://proxy.example.com:3128"
    doc["package_sources"]["no_proxy"] = ["mirror.example.com"]
    doc["package_sources"]["slurm"]["suite"] = "jammy"
    doc["package_sources"]["slurm"]["components"] = ["main"]
    doc["fabrics"].append(
        {
            "name": "roce",
            "kind": "roce",
            "rate_gbps": 200,
            "qos": {"trust": "dscp", "pfc_priority": 3, "dscp": 26, "ecn": True},
            "topology": {"leaves": [{"name": "rleaf01", "nodes": "gpu[001-004]"}]},
        }
    )
    group["nics"].append({"devices": "mlx5_[10-11]", "fabric": "roce"})
    doc["slurm"]["state_save_location"] = "/shared/slurm/state"
    return doc


@cache
def bases() -> tuple[tuple[str, dict[str, Any], Cluster], ...]:
    out: list[tuple[str, dict[str, Any], Cluster]] = []
    docs: list[tuple[str, dict[str, Any]]] = [("full", _full())]
    for path in sorted((ROOT / "inventories").glob("*.yml")):
        docs.append((path.name, yaml.safe_load(path.read_text(encoding="utf-8"))))
    docs.extend((f"init {p}", yaml.safe_load(starter(p))) for p in PROFILES)
    for name, doc in docs:
        cluster = _load(doc)
        assert cluster is not None, f"{name} does not load"
        out.append((name, doc, cluster))
    return tuple(out)


@cache
def _base_render(name: str) -> dict[str, str]:
    return render_files(next(c for n, _, c in bases() if n == name))


# ---------------------------------------------------------------------------------------------
# Other values: the generic ones (enums, booleans, numbers in bounds, null) and these

Tweak = Callable[[dict[str, Any], Loc], dict[str, Any]]


def _rename_fabric(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    old = doc["fabrics"][loc[1]]["name"]
    out = put(doc, loc, "renamed")
    for group in out["node_groups"]:
        for nic in group.get("nics") or []:
            if nic["fabric"] == old:
                nic["fabric"] = "renamed"
    if out.get("slurm", {}).get("topology_fabric") == old:
        out["slurm"]["topology_fabric"] = "renamed"
    return out


def _two_ports(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    """Ports [1, 2] where gpuctl serves them: InfiniBand, inbox RDMA stack, no rails."""
    out = put(doc, loc, [1, 2])
    nic = out["node_groups"][loc[1]]["nics"][loc[3]]
    nic.pop("rails", None)
    out.setdefault("software", {}).pop("rdma", None)
    for fabric in out.get("fabrics") or []:
        fabric.pop("ipoib", None)
    return out


def _rename_group(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    old = doc["node_groups"][loc[1]]["name"]
    out = put(doc, loc, "renamed")
    for part in out["slurm"]["partitions"]:
        part["node_groups"] = ["renamed" if g == old else g for g in part.get("node_groups", [])]
    return out


def _other_addresses(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    cur: Any = doc
    for part in loc:
        cur = cur[part] if isinstance(part, int) else (cur or {}).get(part)
    return put(doc, loc, cur.replace("10.0.", "10.9.", 1)) if isinstance(cur, str) else doc


def _swap_controller(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    slurm = doc["slurm"]
    if slurm.get("backup_controller") is None:
        return doc
    out = copy.deepcopy(doc)
    out["slurm"]["controller"], out["slurm"]["backup_controller"] = (
        slurm["backup_controller"],
        slurm["controller"],
    )
    return out


def _driver(version: str, branch: str | None = None) -> Tweak:
    def tweak(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
        out = copy.deepcopy(doc)
        out["software"]["driver"]["version"] = version
        if branch is not None:
            out["software"]["driver"]["branch"] = branch
        fm = out["software"].get("fabric_manager") or {}
        if fm.get("version"):
            fm["version"] = version
        return out

    return tweak


def _cuda(cuda: str) -> Tweak:
    def tweak(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
        out = copy.deepcopy(doc)
        out["software"]["cuda"] = cuda
        out["software"]["nccl"] = re.sub(r"cuda[\d.]+$", f"cuda{cuda}", out["software"]["nccl"])
        return out

    return tweak


def _rdma_stack(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    rdma = out["software"].setdefault("rdma", {})
    if rdma.get("stack") == "doca-ofed":
        rdma.update(stack="inbox", doca_version=None)
    else:
        rdma.update(stack="doca-ofed", doca_version="2.9.1")
    return out


def _to_roce(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    fab = out["fabrics"][loc[1]]
    if fab["kind"] != "infiniband":
        return doc
    for key in ("generation", "subnet_manager", "ipoib"):
        fab.pop(key, None)
    fab.update(kind="roce", rate_gbps=400)
    for group in out["node_groups"]:
        for nic in group.get("nics") or []:
            if nic["fabric"] == fab["name"]:
                nic.pop("rate_gbps", None)
    return out


def _swap_leaves(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    leaves = out["fabrics"][loc[1]]["topology"]["leaves"]
    if len(leaves) < 2:
        return doc
    leaves[0]["nodes"], leaves[1]["nodes"] = leaves[1]["nodes"], leaves[0]["nodes"]
    return out


def _swap_spines(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    spines = out["fabrics"][loc[1]]["topology"].get("spines") or []
    if len(spines) < 3:
        return doc
    spines[0]["switches"], spines[1]["switches"] = spines[1]["switches"], spines[0]["switches"]
    return out


def _swap_fabrics(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    nics = out["node_groups"][loc[1]].get("nics") or []
    if len(nics) < 2:
        return doc
    nics[0]["fabric"], nics[1]["fabric"] = nics[1]["fabric"], nics[0]["fabric"]
    return out


URL = "http://mirror.example.com/other"


def _pfc_priority(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    """Another lossless priority, with the DSCP of its class (dscp >> 3 == pfc_priority)."""
    out = put(doc, loc, 4)
    return put(out, (*loc[:-1], "dscp"), 34)


def _nvlink_mesh(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    """An 8-GPU NVSwitch group as 8 GPUs in a DGX-1-style hybrid cube mesh (two fully joined
    quads, each GPU joined to its twin in the other)."""
    group = doc["node_groups"][loc[1]]
    if (group.get("gpus") or {}).get("count") != 8 or group["gpus"]["model"] == "b200":
        return doc
    pairs = [[a, b] for q in (0, 4) for a in range(q, q + 4) for b in range(a + 1, q + 4)]
    pairs += [[g, g + 4] for g in range(4)]
    out = put(doc, loc, [{"gpus": p, "links": 2} for p in pairs])
    return put(out, (*loc[:-1], "interconnect"), "nvlink")


def _trusted(doc: dict[str, Any], loc: Loc) -> dict[str, Any]:
    """An unsigned repository: trusted, and no key."""
    out = put(doc, loc, True)
    return put(out, (*loc[:-1], "gpg_key"), None)


CANDIDATES: dict[str, list[Any]] = {
    "package_sources.os_mirror": [URL],
    "package_sources.os_security_mirror": [URL],
    "package_sources.http_proxy": [URL],
    "package_sources.no_proxy": [["other.example.com"]],
    "package_sources.slurm.url": [URL],
    "package_sources.slurm.suite": ["noble"],
    "package_sources.slurm.components": [["main", "contrib"]],
    "package_sources.slurm.gpg_key": [URL + "/key.asc"],
    "package_sources.slurm.trusted": [_trusted],
    "fabrics[].qos.pfc_priority": [_pfc_priority],
    "node_groups[].gpus.cpu_affinity": [[1, 1, 1, 1, 0, 0, 0, 0]],
    "node_groups[].gpus.nvlink_mesh": [_nvlink_mesh],
    "slurm.state_save_location": ["/shared/other/state"],
    "name": ["other-name"],
    "ssh.user": ["admin"],
    "ssh.private_key": ["~/.ssh/other_key"],
    "ssh.jump_host.host": ["bastion2.example.com"],
    "ssh.jump_host.user": ["jumper"],
    "package_sources.cuda": [URL],
    "package_sources.doca": [URL],
    "package_sources.nccl_tests": [URL + ".git"],
    "package_sources.perftest": [URL + ".git"],
    "package_sources.pypi_index": [URL],
    "package_sources.gpuctl_wheelhouse": ["/srv/other-wheels"],
    "software.driver.branch": [_driver("550.163.01", "550")],
    "software.driver.version": [_driver("570.124.06"), _driver("570.86.15")],
    "software.cuda": [_cuda("12.6"), _cuda("12.9")],
    "software.rdma.stack": [_rdma_stack],
    "fabrics[].kind": [_to_roce],
    "fabrics[].topology.leaves[].nodes": [_swap_leaves],
    "software.nccl": ["2.25.1-1+cuda12.8", "2.21.5-1+cuda12.4"],
    "software.nccl_tests": ["2.13.11"],
    "software.perftest": ["25.07.0-0.104"],
    "software.dcgm": ["4.1.1"],
    "software.rdma.doca_version": ["2.10.0"],
    "software.mpi.version": ["2.20"],
    "software.mpi.url": [URL + "/hpcx.tbz"],
    "software.slurm": ["23.11.10"],
    "software.mft": ["4.29.0"],
    "fabrics[].name": [_rename_fabric],
    "fabrics[].ipoib.network": ["10.20.0.0/16"],
    "fabrics[].rate_gbps": [200, 100, 400],
    "fabrics[].topology.leaves[].name": ["leaf99"],
    "fabrics[].topology.spines[].name": ["spine99"],
    "fabrics[].topology.spines[].switches": [_swap_spines],
    "node_groups[].name": [_rename_group],
    "node_groups[].nodes": ["login02", "mgmt02", "head[01-03]"],
    "node_groups[].addresses": [_other_addresses],
    "node_groups[].bmc_addresses": [_other_addresses],
    "node_groups[].nics[].devices": ["mlx5_[0-3]", "mlx5_[8]"],
    "node_groups[].nics[].fabric": [_swap_fabrics],
    "node_groups[].nics[].rate_gbps": [200, 100],
    "node_groups[].slurm.features": [["other"]],
    "slurm.controller": [_swap_controller],
    "slurm.cluster_name": ["other"],
    "slurm.partitions[].name": ["other"],
    "slurm.partitions[].node_groups": [[], ["a100"], ["hgx"], ["l40s"]],
    "slurm.partitions[].nodes": ["gpu002"],
    "slurm.partitions[].max_time": ["60"],
    "slurm.topology_fabric": ["storage"],
    "slurm.extra": [{"SchedulerParameters": "bf_continue"}, {}],
}


def candidates(leaf: Leaf, current: Any) -> list[Any]:
    return [*CANDIDATES.get(leaf.name, []), *generic_candidates(leaf, current)]


def _variant(doc: dict[str, Any], loc: Loc, value: Any) -> dict[str, Any]:
    return value(doc, loc) if callable(value) else put(doc, loc, value)


def variants(leaf: Leaf) -> Iterator[tuple[str, Loc, Cluster, Cluster]]:
    """(base name, location, the base loaded, the base with another valid value there)."""
    for name, doc, cluster in bases():
        for loc, current in locations(cluster, leaf.path):
            for value in candidates(leaf, current):
                other = _load(_variant(doc, loc, value))
                if other is not None and other != cluster:
                    yield name, loc, cluster, other


# ---------------------------------------------------------------------------------------------
# Proofs for what gpuctl consumes itself


@contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _ssh(cluster: Cluster, tmp: Path) -> Any:
    """The SSH settings gpuctl's own connections use (validate, rollout)."""
    from gpuctl.remote.ssh import ssh_settings

    known = Path(os.path.expanduser(cluster.ssh.known_hosts))
    if not known.is_absolute():
        (tmp / known).parent.mkdir(parents=True, exist_ok=True)
        (tmp / known).write_text("gpu001 ssh-ed25519 AAAA\n", encoding="utf-8")
    try:
        return ssh_settings(cluster)
    except Exception as exc:
        return str(exc)


def _policy(cluster: Cluster, tmp: Path) -> Any:
    from gpuctl.rollout.run import PolicyOverrides, policy_for

    try:
        return policy_for(cluster, PolicyOverrides())
    except UsageError as exc:
        return str(exc)


def _multinode(cluster: Cluster, tmp: Path) -> Any:
    from gpuctl.validation.collector import multinode_plan

    return multinode_plan(cluster)


def _bmc_client(cluster: Cluster, tmp: Path) -> Any:
    from gpuctl.rollout.bmc import BmcAccess
    from gpuctl.rollout.redfish import Credentials

    if not _bmc_nodes(cluster):
        return None
    node = _bmc_nodes(cluster)[0][0]
    access = BmcAccess(
        tmp / "cluster.yml",
        cluster,
        credentials=lambda: Credentials("u", "p"),
        allow_plain_http=True,  # no TLS context: the CA file need not exist
    )
    client = access.client(node)
    ep = client.endpoint
    return (ep.url, ep.verify_tls, ep.ca_bundle, client.timeout_s)


def _bmc_nodes(cluster: Cluster) -> list[tuple[str, str]]:
    from gpuctl.config.derived import nodes

    return [(n.name, n.bmc_address) for n in nodes(cluster) if n.bmc_address]


def _credentials(cluster: Cluster, tmp: Path) -> Any:
    from gpuctl.rollout.bmc import load_credentials

    values = {"GPUCTL_BMC_USERNAME": "a", "GPUCTL_BMC_PASSWORD": "b", "OTHER_USER": "c"}
    with _env(**values, OTHER_PASS="d"):  # noqa: S106 - test values
        try:
            creds = load_credentials(tmp / "cluster.yml", cluster)
        except UsageError as exc:
            return str(exc)
    return (creds.username, creds.secret())


class _FakeBmc:
    """Just enough of a Redfish service for BmcAccess: two GPUs and a BMC in the firmware
    inventory, two systems and two managers (so a missing id is an error), POSTs recorded."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, Any]] = []
        self.gets = 0
        inv = "/redfish/v1/UpdateService/FirmwareInventory"
        self.data: dict[str, Any] = {
            "/redfish/v1/UpdateService": {
                "FirmwareInventory": {"@odata.id": inv},
                "MultipartHttpPushUri": "/redfish/v1/UpdateService/upload",
            },
            inv: {
                "Members": [
                    {"@odata.id": f"{inv}/{i}"} for i in ("HGX_FW_GPU_SXM_1", "GPU0", "BMC_0")
                ]
            },
            f"{inv}/HGX_FW_GPU_SXM_1": {"Id": "HGX_FW_GPU_SXM_1", "Version": "96.00.1"},
            f"{inv}/GPU0": {"Id": "GPU0", "Version": "96.00.2"},
            f"{inv}/BMC_0": {"Id": "BMC_0", "Version": "1.0"},
            "/redfish/v1/Systems": {"Members": [{"@odata.id": "/redfish/v1/Systems/A"}]},
            "/redfish/v1/Managers": {
                "Members": [
                    {"@odata.id": "/redfish/v1/Managers/bmc"},
                    {"@odata.id": "/redfish/v1/Managers/hgx"},
                ]
            },
            "/redfish/v1/Managers/bmc": {"FirmwareVersion": "1.0"},
            "/redfish/v1/Managers/hgx": {"FirmwareVersion": "2.0"},
        }
        for system in ("A", "B"):
            self.data[f"/redfish/v1/Systems/{system}"] = {
                "Actions": {
                    "#ComputerSystem.Reset": {
                        "target": f"/redfish/v1/Systems/{system}/Actions/ComputerSystem.Reset"
                    }
                }
            }


def _bmc_calls(cluster: Cluster, tmp: Path) -> Any:
    """What BmcAccess asks of a BMC: versions, a power cycle, an update (each outcome)."""
    from gpuctl.rollout import redfish
    from gpuctl.rollout.bmc import BmcAccess

    if not _bmc_nodes(cluster):
        return None
    fake = _FakeBmc()
    ticks = iter(range(0, 10**6, 30))
    access = BmcAccess(
        tmp / "cluster.yml",
        cluster,
        credentials=lambda: redfish.Credentials("u", "p"),
        allow_plain_http=True,
        clock=lambda: float(next(ticks)),
        sleep=lambda s: None,
    )
    node = _bmc_nodes(cluster)[0][0]
    client = access.client(node)

    def get(path: str) -> dict[str, Any]:
        fake.gets += 1
        if path not in fake.data:
            raise redfish.RedfishHTTPError(f"{path}: 404", 404)
        return copy.deepcopy(fake.data[path])

    def request(method: str, path: str, **kw: Any) -> redfish.Response:
        data = kw.get("data")
        if data is not None and not isinstance(data, bytes | str):
            head = next(iter(data)).decode()
            data = re.findall(r"\{.*\}", head)  # the UpdateParameters part
        fake.posts.append((method, path, data if data is not None else kw.get("json")))
        return redfish.Response(202, "/redfish/v1/TaskService/Tasks/1", None)

    def post(path: str, body: Any) -> redfish.Response:
        return request("POST", path, json=body)

    fake.data["/redfish/v1/TaskService/Tasks/1"] = {"TaskState": "Running"}
    client.get = get  # type: ignore[method-assign]
    client.post = post  # type: ignore[method-assign]
    client.request = request  # type: ignore[method-assign,assignment]
    image = tmp / "image.bin"
    image.write_bytes(b"fw")
    results: list[Any] = []
    for step in (
        lambda: access.gpu_versions(node),
        lambda: access.bmc_versions(node),
        lambda: access.power_cycle(node),
        lambda: access.update_bmc(node, image),
    ):
        try:
            results.append(step())
        except Exception as exc:
            results.append(repr(exc))
    return results, fake.posts, fake.gets


def _bundle(rel: str, kind: str, edit: Callable[[str], str] = lambda t: t) -> ProbeOutput:
    return ProbeOutput(kind, edit(capture_output(FIX / rel)))


def _verdicts(cluster: Cluster, bundles: dict[str, NodeBundle]) -> Any:
    report = judge_cluster(cluster, bundles, charts=False)
    return (
        report.level,
        sorted(
            (
                n.node,
                n.failed,
                tuple(
                    sorted(
                        (r.check, r.subject or "", r.verdict.value, str(r.expected))
                        for r in n.checks
                    )
                ),
            )
            for n in report.nodes
        ),
    )


def _counters(text: str) -> str:
    text = re.sub(r"<(sram|dram)_(un)?correctable>0<", r"<\1_\2correctable>5<", text)
    return text.replace("<remapped_row_pending>No<", "<remapped_row_pending>Yes<")


def _gpu_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """The judges on a one-GPU node whose counters are 5 and a row remap pending."""
    gpu = "nvidia-smi/nvsmi-q-x-a10g-1gpu-515.txt"
    group = next((g for g in cluster.node_groups if g.gpus and g.gpus.count == 1), None)
    if group is None:
        return None
    node = group.node_names()[0]
    outputs = {"smi-xml": _bundle(gpu, "smi-xml", _counters)}
    return _verdicts(cluster, {node: NodeBundle(node, outputs)})


def _nccl_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """nccl-tests on the 8-GPU nodes: two runs of one fixture, and a slower one."""
    slow = "nccl-tests/all-reduce-perf-a100-sxm4-80gb-8gpu-mpi-nccl2.16-hostname-placeholder.txt"
    fast = "nccl-tests/all-reduce-perf-a100-sxm4-40gb-8gpu-with-nccl-info-line.txt"  # 235 GB/s
    group = next((g for g in cluster.node_groups if g.gpus and g.gpus.count == 8), None)
    if group is None:
        return None
    names = group.node_names()
    bundles = {
        n: NodeBundle(n, {"nccl": _bundle(slow if i == 0 else fast, "nccl")})
        for i, n in enumerate(names)
    }
    return _verdicts(cluster, bundles)


_COLLECTIVE_CAPTURES = {
    "all_gather": "nccl-tests/all-gather-perf-a100-sxm4-40gb-8gpu-validation0.txt",
    "reduce_scatter": "nccl-tests/reduce-scatter-perf-a100-sxm4-40gb-8gpu-validation0.txt",
    "alltoall": "nccl-tests/alltoall-perf-a100-sxm4-40gb-8gpu-validation0.txt",
}


def _collective_verdicts(name: str) -> Any:
    """One collective's nccl-tests output on the 8-GPU nodes: a real 8x A100 capture, or for
    sendrecv (no whole real run was found) the lab stand-in's, as test_every_threshold.py."""

    def verdicts(cluster: Cluster, tmp: Path) -> Any:
        group = next((g for g in cluster.node_groups if g.gpus and g.gpus.count == 8), None)
        if group is None:
            return None
        kind = f"nccl.{name}"
        if name in _COLLECTIVE_CAPTURES:
            output = _bundle(_COLLECTIVE_CAPTURES[name], kind)
        else:
            from test_every_threshold import SENDRECV

            output = ProbeOutput(kind, SENDRECV)
        return _verdicts(cluster, {n: NodeBundle(n, {kind: output}) for n in group.node_names()})

    return verdicts


def _pcie_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """nvbandwidth's host <-> GPU copies on the 8-GPU nodes: a real 8-GPU capture (PCIe Gen4,
    23.90 to 27.11 GB/s)."""
    group = next((g for g in cluster.node_groups if g.gpus and g.gpus.count == 8), None)
    if group is None:
        return None
    rel = "nvbandwidth/nvbandwidth-rtx4090-8gpu-v0.2-full-run-h2d-d2h-partial.txt"
    output = _bundle(rel, "nvbandwidth")
    return _verdicts(
        cluster, {n: NodeBundle(n, {"nvbandwidth": output}) for n in group.node_names()}
    )


def _p2p_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """nvbandwidth's GPU <-> GPU copies on the 8-GPU nodes: a real 8x H800 run (read 171.88 to
    172.57 GB/s, write 175.99 to 176.20)."""
    group = next((g for g in cluster.node_groups if g.gpus and g.gpus.count == 8), None)
    if group is None:
        return None
    output = _bundle("nvbandwidth/nvbandwidth-h800-8gpu-v0.2-full-run.txt", "nvbandwidth.d2d")
    return _verdicts(
        cluster, {n: NodeBundle(n, {"nvbandwidth.d2d": output}) for n in group.node_names()}
    )


def _ib_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """ib_write_bw on every adapter of the first node with NICs, at the standard level."""
    bw = "perftest/ib-write-bw-roce-100g-rdma-cm-cpu-freq-warning-client.txt"
    group = next((g for g in cluster.node_groups if g.nics), None)
    if group is None:
        return None
    from gpuctl.validation.expect import expectations

    node = group.node_names()[0]
    exp = expectations(cluster)[node]
    per_hca = {nic.name: _bundle(bw, "ib_write_bw") for nic in exp.nics}
    return _verdicts(cluster, {node: NodeBundle(node, {}, per_hca)})


def _lat_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """ib_write_lat on every adapter of the first node with NICs: a real 2-byte run, 99th
    percentile 1.57 us."""
    lat = "perftest/ib-write-lat-dgx-spark-rocep1s0f1-rdma-cm-client-2B.txt"
    group = next((g for g in cluster.node_groups if g.nics), None)
    if group is None:
        return None
    from gpuctl.validation.expect import expectations

    node = group.node_names()[0]
    outputs = {
        f"perftest.lat.{n.name}": _bundle(lat, "perftest") for n in expectations(cluster)[node].nics
    }
    return _verdicts(cluster, {node: NodeBundle(node, outputs)})


def _topo_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """The topology judge on the first 8-GPU node: a real 8x H100 topo -m (NV18 between every
    pair; mlx5_0..5 in the NIC Legend, mlx5_0 PIX to GPU0 and GPU4's PIX is mlx5_3)."""
    topo = "topo/nvsmi-topo-m-h100-8gpu-6nic-blank-cpuaffinity.txt"
    group = next((g for g in cluster.node_groups if g.gpus and g.gpus.count == 8), None)
    if group is None:
        return None
    node = group.node_names()[0]
    return _verdicts(cluster, {node: NodeBundle(node, {"topo": _bundle(topo, "topo")})})


def _nothing_collected(cluster: Cluster, tmp: Path) -> Any:
    """Every node reached, no output: each check UNKNOWN."""
    from gpuctl.config.derived import nodes

    return _verdicts(cluster, {n.name: NodeBundle(n.name) for n in nodes(cluster)})


def _remap_failure_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """The judges on a one-GPU node whose row remapping failed (no public capture shows it:
    the real capture's No turned to Yes, in memory)."""
    gpu = "nvidia-smi/nvsmi-q-x-a10g-1gpu-515.txt"
    group = next((g for g in cluster.node_groups if g.gpus and g.gpus.count == 1), None)
    if group is None:
        return None
    node = group.node_names()[0]

    def failed(text: str) -> str:
        return text.replace("<remapped_row_failure>No<", "<remapped_row_failure>Yes<")

    outputs = {"smi-xml": _bundle(gpu, "smi-xml", failed)}
    return _verdicts(cluster, {node: NodeBundle(node, outputs)})


def _xid_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """The Xid judge on the first GPU node's kernel log with Xid 13 and 43 (monitor by
    default, fatal when xid_fatal lists them)."""
    group = next((g for g in cluster.node_groups if g.gpus), None)
    if group is None:
        return None
    node = group.node_names()[0]
    log = _bundle("kernel-xid/dmesg-decode-iso-xid-13-43-sm-exceptions.txt", "xid")
    return _verdicts(cluster, {node: NodeBundle(node, {"xid": log})})


def _flap_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """The InfiniBand port judge on the first node with InfiniBand HCAs: every HCA read twice
    with the real all-zero perfquery -x capture, the second read of the first HCA with one
    link-down (a fault within or above ib_link_flaps_max)."""
    from gpuctl.validation.expect import expectations

    exp = next(
        (e for e in expectations(cluster).values() if any(n.kind == "infiniband" for n in e.nics)),
        None,
    )
    if exp is None:
        return None
    hcas = [n.device for n in exp.nics if n.kind == "infiniband"]
    zero = _bundle("ib/counters/perfquery-x-rhel75-lid10-port1-all-zero.txt", "perfquery")
    flapped = ProbeOutput(
        "perfquery", re.sub(r"^(LinkDownedCounter:\.+)0$", r"\g<1>1", zero.text or "", flags=re.M)
    )
    outputs = {f"perfquery.start.{h}": zero for h in hcas}
    outputs |= {f"perfquery.end.{h}": flapped if h == hcas[0] else zero for h in hcas}
    return _verdicts(cluster, {exp.node: NodeBundle(exp.node, outputs)})


def _mount_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """The mount judge on the first node that must have file systems: df as a lab node printed
    it (tests/fixtures/node/), plus rows in its layout for the mounts the examples name (a
    tmpfs-sized file system of the type the example gives, 2.4 GiB free)."""
    from gpuctl.validation.expect import expectations

    exp = next((e for e in expectations(cluster).values() if e.mounts), None)
    if exp is None:
        return None
    lab = capture_output(FIX / "node/df-output-file-debian13-lab-node-overlay-tmpfs.txt")
    header, *rows = lab.splitlines()
    size, free = next(r.split()[3:5] for r in rows if r.split()[0] == "/tmp")  # noqa: S108 - a df row
    rows = [r for r in rows if r.split()[0] != "/home"]
    rows += [f"{p} {p} {t} {size} {free}" for p, t in (("/home", "nfs4"), ("/raid", "ext4"))]
    df = ProbeOutput("df", "\n".join([header, *rows]) + "\n")
    return _verdicts(cluster, {exp.node: NodeBundle(exp.node, {"df": df})})


def _clock_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """The clock judge on the first GPU node: GNU date on a lab node (tests/fixtures/node/)
    2.5 s (+/- 0.05) ahead of the window gpuctl recorded."""
    group = next((g for g in cluster.node_groups if g.gpus), None)
    if group is None:
        return None
    node = group.node_names()[0]
    date = _bundle("node/date-epoch-ns-debian13-lab-node.txt", "clock")
    epoch = float(date.text or "0")
    clock = ProbeOutput("clock", date.text, ran=(epoch - 2.55, epoch - 2.45))
    return _verdicts(cluster, {node: NodeBundle(node, {"clock": clock})})


def _hugepage_verdicts(cluster: Cluster, tmp: Path) -> Any:
    """The hugepage judge on the first node that asks for a pool: /proc/meminfo of a real VM
    (tests/fixtures/node/) with 4096 hugepages of 2048 kB reserved."""
    from gpuctl.validation.expect import expectations

    exp = next((e for e in expectations(cluster).values() if e.hugepages), None)
    if exp is None:
        return None
    meminfo = _bundle(
        "node/proc-meminfo-debian12-no-hugepages.txt",
        "meminfo",
        lambda t: re.sub(r"^HugePages_Total:\s+0$", "HugePages_Total:    4096", t, flags=re.M),
    )
    return _verdicts(cluster, {exp.node: NodeBundle(exp.node, {"meminfo": meminfo})})


def _multinode_threshold(cluster: Cluster, tmp: Path) -> Any:
    from gpuctl.validation.expect import expectations
    from gpuctl.validation.multinode import threshold_for

    return sorted((n, threshold_for(e)) for n, e in expectations(cluster).items())


Proof = Callable[[Cluster, Path], Any]
_TH = ("validation.thresholds.", "node_groups[].validation.thresholds.")
PROOFS: dict[str, Proof] = {
    **{
        f"ssh.{k}": _ssh
        for k in ("user", "private_key", "known_hosts", "port", "connect_timeout_s")
    },
    **{f"ssh.jump_host.{k}": _ssh for k in ("host", "user", "port")},
    **{
        f"rollout.{k}": _policy
        for k in (
            "canary",
            "batch_size",
            "max_unavailable",
            "failure_threshold",
            "drain_timeout_s",
            "reboot_timeout_s",
            "validate_level",
            "poll_interval_s",
        )
    },
    **{
        f"validation.multinode.{k}": _multinode
        for k in ("mpi", "partition", "reservation", "rank_per", "launch_node", "max_runs")
    },
    **{f"bmc.{k}": _bmc_client for k in ("port", "ca_bundle", "verify_tls", "request_timeout_s")},
    **{f"bmc.credentials.{k}": _credentials for k in ("username_env", "password_env")},
    **{f"bmc.credentials.{k}": _credentials for k in ("vault_file", "vault_password_file")},
    **{
        f"bmc.{k}": _bmc_calls
        for k in (
            "system_id",
            "manager_id",
            "gpu_inventory_prefix",
            "bmc_inventory_id",
            "power_cycle",
            "update_timeout_s",
        )
    },
    "validation.level": _nothing_collected,
    "validation.unknown_is_failure": _nothing_collected,
    "node_groups[].validation.level": _ib_verdicts,
    # what the judges expect of a node's adapters: their number, link layer and rate
    **dict.fromkeys(
        (
            "fabrics[].kind",
            "fabrics[].generation",
            "fabrics[].rate_gbps",
            "node_groups[].nics[].devices",
            "node_groups[].nics[].fabric",
            "node_groups[].nics[].rate_gbps",
            "node_groups[].nics[].ports",
        ),
        _ib_verdicts,
    ),
    "node_groups[].bmc_addresses": _bmc_client,
    # what the topology judge expects: the NVLink pairs, each GPU's rail adapter
    "node_groups[].gpus.nvlink_mesh": _topo_verdicts,
    "node_groups[].nics[].rails": _topo_verdicts,
    **{
        p + k: _gpu_verdicts
        for p in _TH
        for k in (
            "remapped_rows_pending_max",
            "sram_uncorrectable_max",
            "sram_correctable_max",
            "dram_correctable_max",
        )
    },
    **{p + "nccl_all_reduce_busbw_gbs": _nccl_verdicts for p in _TH},
    **{
        f"{p}nccl_{name}_busbw_gbs": _collective_verdicts(name)
        for p in _TH
        for name in ("all_gather", "reduce_scatter", "alltoall", "sendrecv")
    },
    **{p + "fleet_relative_min": _nccl_verdicts for p in _TH},
    **{p + "remapped_rows_failure_max": _remap_failure_verdicts for p in _TH},
    **{p + "xid_fatal": _xid_verdicts for p in _TH},
    **{p + "ib_link_flaps_max": _flap_verdicts for p in _TH},
    **{p + "ib_write_bw_gbps": _ib_verdicts for p in _TH},
    **{p + "ib_write_lat_p99_us": _lat_verdicts for p in _TH},
    **{p + "nccl_multinode_busbw_gbs": _multinode_threshold for p in _TH},
    **{p + "clock_offset_max_s": _clock_verdicts for p in _TH},
    **{p + k: _pcie_verdicts for p in _TH for k in ("pcie_h2d_gbs", "pcie_d2h_gbs")},
    **{p + k: _p2p_verdicts for p in _TH for k in ("p2p_read_gbs", "p2p_write_gbs")},
    **{
        f"node_groups[].validation.hugepages.{k}": _hugepage_verdicts
        for k in ("size_kib", "min_total")
    },
    **{
        f"{p}mounts[].{k}": _mount_verdicts
        for p in ("validation.", "node_groups[].validation.")
        for k in ("path", "fstype", "min_free_gib")
    },
}
# Values a proof needs that no generic rule finds (a crossing point for a verdict, an id).
CANDIDATES.update(
    {
        **{p + "nccl_all_reduce_busbw_gbs": [1.0, 5000.0] for p in _TH},
        **{
            f"{p}nccl_{name}_busbw_gbs": [1.0, 5000.0]
            for p in _TH
            for name in ("all_gather", "reduce_scatter", "alltoall", "sendrecv")
        },
        **{p + "ib_write_bw_gbps": [1.0, "100%"] for p in _TH},
        **{p + "ib_write_lat_p99_us": [1.0, 2.0] for p in _TH},
        **{p + k: [0, 10] for p in _TH for k in ("sram_correctable_max", "dram_correctable_max")},
        **{p + "fleet_relative_min": [0.999, 0.01] for p in _TH},
        **{p + "xid_fatal": [[13], [43]] for p in _TH},
        **{p + "ib_link_flaps_max": [1, 0] for p in _TH},
        "node_groups[].nics[].ports": [_two_ports],
        **{p + "clock_offset_max_s": [3.0, 2.0] for p in _TH},
        **{p + k: [1.0, 26.5] for p in _TH for k in ("pcie_h2d_gbs", "pcie_d2h_gbs")},
        **{p + k: [1.0, 174.0] for p in _TH for k in ("p2p_read_gbs", "p2p_write_gbs")},
        "node_groups[].validation.hugepages.min_total": [4097, 1],
        **{f"{p}mounts[].path": ["/scratch"] for p in ("validation.", "node_groups[].validation.")},
        **{f"{p}mounts[].fstype": ["xfs"] for p in ("validation.", "node_groups[].validation.")},
        "bmc.credentials.username_env": ["OTHER_USER"],
        "bmc.credentials.password_env": ["OTHER_PASS"],
        "bmc.credentials.vault_file": ["bmc.vault.yml"],
        "bmc.credentials.vault_password_file": ["vault-pass"],
        "bmc.ca_bundle": ["other-ca.pem"],
        "bmc.system_id": ["B"],
        "bmc.manager_id": ["hgx"],
        "bmc.gpu_inventory_prefix": ["GPU"],
        "bmc.bmc_inventory_id": ["BMC_0", "NONE"],
        "ssh.known_hosts": ["other_hosts"],
        "validation.multinode.partition": ["gpu"],
        "validation.multinode.reservation": ["maint"],
        "validation.multinode.launch_node": ["login01"],
    }
)

# Fields whose only allowed value is the one every document has, or that only confirm what
# the rest of cluster.yml implies: a contradicting value is refused at load, naming the field.
CHECKED_AT_LOAD: dict[str, tuple[Any, ...]] = {
    # Ansible escalates exactly when the login user is not root, and false is refused then
    "ssh.become": (False,),
    "schema_version": (2,),
    "slurm.health_check.level": ("standard",),
    "fabrics[].topology.kind": ("dragonfly",),
    "software.fabric_manager.enabled": (False,),
    "software.fabric_manager.version": ("570.124.06",),
}


def _evidence(leaf: Leaf, tmp: Path) -> str | None:
    """Where another value of ``leaf`` changes what something consumes: a rendered file or
    variable, or (for fields in ``PROOFS``) the library result the proof computes."""
    proof = PROOFS.get(leaf.name)
    for name, loc, cluster, other in variants(leaf):
        found = consumed_difference(_base_render(name), render_files(other))
        if found is not None:
            return f"{name} at {loc}: {found}"
        if proof is not None and proof(cluster, tmp) != proof(other, tmp):
            return f"{name} at {loc}: {proof.__name__}"
    return None


def _refused(leaf: Leaf, values: tuple[Any, ...], says: str = "") -> str | None:
    for name, doc, cluster in bases():
        for loc, _ in locations(cluster, leaf.path):
            for value in values:
                try:
                    load_cluster_text(yaml.safe_dump(put(doc, loc, value)), "cluster.yml")
                except ConfigError as exc:
                    where = ".".join(str(p) for p in loc).replace(".[", "[")
                    shown = re.sub(r"\.(\d+)", r"[\1]", ".".join(str(p) for p in loc))
                    if any(p.path in (where, shown) and says in p.message for p in exc.problems):
                        return f"{name} at {loc}"
    return None


# Fields no consumer reads yet, refused when set (gpuctl/config/rules.py): any value is refused
# naming the field, with "not enforced yet".
REFUSED: dict[str, Any] = {
    **{p + k: 1 for p in _TH for k in UNENFORCED_THRESHOLDS},
}
# what the refusal says, where it is not "not enforced yet"
REFUSED_SAYS: dict[str, str] = {}
# Dead and not decided yet: none.
_DEAD_AWAITING_DECISION: frozenset[str] = frozenset()


# ---------------------------------------------------------------------------------------------
# The tests


LEAVES = leaves()


def test_the_walk_finds_every_kind_of_field() -> None:
    names = {leaf.name for leaf in LEAVES}
    for expected in (
        "ssh.jump_host.port",  # an optional model
        "node_groups[].nics[].rails",  # a list of models in a list of models
        "fabrics[].topology.leaves[].nodes",
        "slurm.extra",  # a mapping
        "node_groups[].validation.thresholds.xid_fatal",  # a list of numbers
    ):
        assert expected in names
    assert len(LEAVES) > 140, len(LEAVES)


def test_every_field_changes_something(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # one Jinja environment for the thousand renders (render builds one per call)
    monkeypatch.setattr(render, "_env", cache(render._env))
    dead: list[str] = []
    for leaf in LEAVES:
        if _being_made_live(leaf.name):
            continue
        if leaf.name in _DEAD_AWAITING_DECISION:
            continue
        if leaf.name in REFUSED:
            says = REFUSED_SAYS.get(leaf.name, "not enforced yet")
            if _refused(leaf, (REFUSED[leaf.name],), says) is None:
                dead.append(
                    f"{leaf.name}: changing it changes nothing (refuse it: not enforced yet)"
                )
            continue
        if leaf.name in CHECKED_AT_LOAD:
            if _refused(leaf, CHECKED_AT_LOAD[leaf.name]) is None:
                dead.append(f"{leaf.name}: no contradicting value is refused")
            continue
        if _evidence(leaf, tmp_path) is None:
            dead.append(f"{leaf.name}: changing it changes nothing")
    assert not dead, "\n".join(dead)


def test_the_registries_name_real_fields() -> None:
    names = {leaf.name for leaf in LEAVES}
    for registry in (PROOFS, CANDIDATES, CHECKED_AT_LOAD, REFUSED, _DEAD_AWAITING_DECISION):
        assert set(registry) <= names, set(registry) - names
    for prefix in _BEING_MADE_LIVE:
        assert any(_being_made_live(n) for n in names if n.startswith(prefix)), prefix
    assert not set(PROOFS) & set(CHECKED_AT_LOAD)


def test_every_argument_spec_option_is_read_by_its_role() -> None:
    unread = [
        f"{role}: {option} (meta/argument_specs.yml) is read nowhere in the role"
        for role, options in argument_spec_options().items()
        for option in sorted(options)
        if option not in role_words(role)
    ]
    assert not unread, "\n".join(unread)


@pytest.mark.parametrize("name", [b[0] for b in bases()])
def test_every_rendered_variable_is_a_role_input(name: str) -> None:
    """What render writes into group_vars and the inventory is an argument-spec option of a
    role, an Ansible connection variable, or one of gpuctl's documented facts; and only those
    facts may go unread."""
    cluster = next(c for n, _, c in bases() if n == name)
    files = render_files(cluster)
    options = set().union(*argument_spec_options().values())
    strays = {
        v
        for v in rendered_variables(files)
        if v not in options and not v.startswith("ansible_") and v not in _GPUCTL_FACTS
    }
    assert not strays, f"rendered but no role's input: {sorted(strays)}"
    unread = unread_variables(files) - _GPUCTL_FACTS
    assert not unread, f"rendered and read by nothing: {sorted(unread)}"
