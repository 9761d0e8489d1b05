"""The version gate of the preflight role, run for real: ansible-playbook on localhost.

One run plays playbooks/preflight.yml (tag ``preflight_versions`` only) on a set of local
hosts, each with its own ``preflight_versions``: the lab's set and the set of every example
inventory pass; one set per rule breaks exactly that rule and fails, naming both sides and their
versions. The rules come from the role's vars; a rule without a case here fails the test, and so
does one that docs/compatibility.md does not list. The gate fails closed: a version no rule
covers (a CUDA minor, DCGM major or GPU model missing from its table, an NCCL version without
``+cudaX.Y``) stops the run naming the table, unless ``preflight_unverified_versions`` (cluster.yml
``software.unverified_versions``) lists its key; DCGM 3, which the dcgm role cannot install, is
refused even then.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT
from playbook_run import ansible_playbook

from gpuctl.config import load_cluster
from gpuctl.render import render_cluster

ROLE = ROOT / "playbooks" / "roles" / "preflight"
PLAYBOOK = ROOT / "playbooks" / "preflight.yml"
RULES: list[dict[str, Any]] = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())[
    "__preflight_rules"
]

GOOD: dict[str, Any] = {
    "driver": "570.172.08",
    "driver_branch": "570",
    "kernel_modules": "open",
    "fabric_manager": "570.172.08",
    "cuda": "12.8",
    "nccl": "2.26.2-1+cuda12.8",
    # DCGM 4 releases: 4.4.1 is the lab's (a published Depends line "datacenter-gpu-manager-4-core
    # (= 1:4.4.1-1)", gpuctl/lab/repo_packages.yml); the examples pin 4.2.3, which dcgm-exporter
    # 4.2.3-4.3.0 installs from NVIDIA's CUDA repository (NEW_DCGM_VERSION=4.2.3 in
    # https://github.com/NVIDIA/dcgm-exporter/blob/a765d62c70de3976fb8dd5afe2d78f0894e4c813/hack/VERSION)
    "dcgm": "4.4.1",
    "rdma_stack": "inbox",
    "doca": None,
    "gpu_models": ["h100-sxm"],
}

# rule id -> (changes to GOOD that break only that rule, words the finding must name)
BAD: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "driver-branch": ({"driver_branch": "575"}, ("driver 570.172.08", "driver_branch 575")),
    "fabric-manager-equals-driver": (
        {"fabric_manager": "570.158.01"},
        ("Fabric Manager 570.158.01", "driver version 570.172.08"),
    ),
    "cuda-minimum-driver": (
        {
            "driver": "550.54.15",
            "driver_branch": "550",
            "fabric_manager": "550.54.15",
            "nccl": "2.21.5-1+cuda12.4",
        },
        ("driver 550.54.15 is older than 570.26, the minimum for CUDA 12.8",),
    ),
    "nccl-cuda-supported-by-driver": (
        {"nccl": "2.27.3-1+cuda12.9"},
        ("NCCL 2.27.3-1+cuda12.9", "CUDA 12.9", "CUDA 12.8", "driver 570.172.08"),
    ),
    "dcgm-minimum-driver": (
        {
            "driver": "418.87.01",
            "driver_branch": "418",
            "fabric_manager": None,
            "cuda": None,
            "nccl": None,
            "gpu_models": [],
        },
        ("driver 418.87.01", "R450", "DCGM 4.4.1"),
    ),
    "dcgm-major-the-role-installs": (
        # DCGM 4.x.y with x.y not a release would pass; only the major is the role's business
        {"dcgm": "3.3.8"},
        ("DCGM 3.3.8 is not DCGM 4", "datacenter-gpu-manager-4-*"),
    ),
    "gpu-model-minimum-driver": (
        {"gpu_models": ["b200"], "driver": "570.124.06", "fabric_manager": "570.124.06"},
        ("driver 570.124.06 is older than 570.133.20", "b200"),
    ),
    "blackwell-open-kernel-modules": (
        {
            "gpu_models": ["b200"],
            "kernel_modules": "proprietary",
            "rdma_stack": "doca-ofed",
            "doca": "2.9.1",
        },
        ("b200 GPUs", "kernel_modules proprietary"),
    ),
    "doca-version-for-doca-ofed": (
        {"rdma_stack": "doca-ofed", "doca": None},
        ("rdma_stack doca-ofed", "DOCA version"),
    ),
}
# DCGM 3 has no row in dcgm_minimum_driver either: that rule reports it too
ALSO = {"dcgm-major-the-role-installs": ("dcgm-minimum-driver",)}
# rule id -> (changes to GOOD, words of the warning); the run goes on
WARN: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "inbox-gpudirect-rdma-needs-open-modules": (
        {"kernel_modules": "proprietary"},
        ("rdma_stack inbox", "kernel_modules proprietary"),
    ),
}
UNKNOWN_CUDA = ({"cuda": "12.7"}, ("cuda 12.7 is not in the table cuda_minimum_driver",))
# key of the version set -> (changes to GOOD no rule covers, words of the finding): an error,
# or with the key in preflight_unverified_versions a warning
UNKNOWN: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "cuda": UNKNOWN_CUDA,
    "gpu_models": (
        {"gpu_models": ["h100-sxm", "gb200"]},
        (
            "gpu_models gb200 is not in the table gpu_model_minimum_driver",
            "b200, h100-nvl, h100-sxm",
        ),
    ),
    "nccl": ({"nccl": "2.26.2-1"}, ("nccl 2.26.2-1 does not name the CUDA it is built for",)),
    # DCGM 5 is no DCGM 4 either: refused twice, and the override lifts only the table's part
    "dcgm": ({"dcgm": "5.0.0"}, ("dcgm 5.0.0 is not in the table dcgm_minimum_driver (4)",)),
}


def _examples(tmp: Path) -> dict[str, dict[str, Any]]:
    """preflight_versions as gpuctl render writes it for every example inventory."""
    out = {}
    for path in sorted((ROOT / "inventories").glob("*.yml")):
        render_dir = tmp / f"render-{path.stem}"
        render_cluster(load_cluster(path), render_dir)
        versions = yaml.safe_load((render_dir / "group_vars" / "all.yml").read_text()).get(
            "preflight_versions"
        )
        if versions is not None:  # older renders do not write it
            out[f"example_{path.stem.replace('-', '_')}"] = versions
    return out


def _run(
    hosts: dict[str, dict[str, Any]],
    tmp: Path,
    unverified: dict[str, list[str]] | None = None,
) -> tuple[int, dict[str, list[Any]], str]:
    """Play the gate on ``hosts`` (name -> preflight_versions; ``unverified``: name ->
    preflight_unverified_versions); results per host, in order."""
    unverified = unverified or {}

    def host_vars(name: str, versions: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"preflight_versions": versions}
        if name in unverified:
            out["preflight_unverified_versions"] = unverified[name]
        return out

    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "hosts": {name: host_vars(name, v) for name, v in hosts.items()},
        }
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = {
        "ANSIBLE_ROLES_PATH": str(ROLE.parent),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.oneline",
        "ANSIBLE_GATHERING": "explicit",
        "ANSIBLE_FORKS": "8",
    }
    args = ["-i", str(tmp / "inventory.yml"), str(PLAYBOOK), "--tags", "preflight_versions"]
    res = ansible_playbook(tmp, args, env)
    results: dict[str, list[Any]] = {name: [] for name in hosts}
    for m in re.finditer(r"^(\S+) \| (\w+)!? => (\{.*\})$", res.stdout, re.M):
        results.setdefault(m.group(1), []).append((m.group(2), json.loads(m.group(3))))
    return res.returncode, results, res.stdout + res.stderr


def _failure(results: list[Any]) -> str | None:
    return next((r["msg"] for status, r in results if status == "FAILED"), None)


def _warnings(results: list[Any]) -> list[str]:
    out = []
    for _status, r in results:
        out += [x["msg"] for x in r.get("results", []) if str(x.get("msg", "")).startswith("WARN")]
    return out


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, list[Any]], str]:
    tmp = tmp_path_factory.mktemp("preflight-gate")
    hosts: dict[str, dict[str, Any]] = {"good": GOOD, **_examples(tmp)}
    for rule_id, (change, _words) in {**BAD, **WARN}.items():
        hosts[rule_id.replace("-", "_")] = {**GOOD, **change}
    hosts["unknown_cuda"] = {**GOOD, **UNKNOWN_CUDA[0]}
    unverified: dict[str, list[str]] = {}
    for key, (change, _words) in UNKNOWN.items():
        hosts[f"no_rule_{key}"] = {**GOOD, **change}
        hosts[f"unverified_{key}"] = {**GOOD, **change}
        unverified[f"unverified_{key}"] = [key]
    # an override of another key lifts nothing
    hosts["unverified_other_key"] = {**GOOD, **UNKNOWN["cuda"][0]}
    unverified["unverified_other_key"] = ["dcgm", "nccl"]
    return _run(hosts, tmp, unverified)


def test_every_gpu_model_gpuctl_knows_has_a_driver_row() -> None:
    """The gate refuses a model without a row: every model of cluster.yml's catalog has one."""
    from gpuctl.config.model import GpuModel

    tables = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__preflight_tables"]
    assert sorted(tables["gpu_model_minimum_driver"]) == sorted(m.value for m in GpuModel)


def test_every_rule_has_a_case_and_a_source() -> None:
    ids = [r["id"] for r in RULES]
    assert len(ids) == len(set(ids)), ids
    assert sorted(ids) == sorted([*BAD, *WARN])
    for rule in RULES:
        assert str(rule["source"]).startswith("https://"), rule["id"]
        assert rule.get("severity", "error") == ("warning" if rule["id"] in WARN else "error")


def test_the_lab_set_and_every_example_pass(gate: tuple[int, dict[str, list[Any]], str]) -> None:
    _rc, results, out = gate
    passing = ["good", *(h for h in results if h.startswith("example_"))]
    assert len(passing) >= 2, out[-3000:]
    for host in passing:
        assert results[host], (host, out[-3000:])
        assert _failure(results[host]) is None, (host, _failure(results[host]))
        assert _warnings(results[host]) == [], host


@pytest.mark.parametrize("rule_id", sorted(BAD))
def test_a_bad_set_fails_naming_both_sides(
    gate: tuple[int, dict[str, list[Any]], str], rule_id: str
) -> None:
    rc, results, out = gate
    assert rc != 0
    msg = _failure(results[rule_id.replace("-", "_")])
    assert msg is not None, out[-3000:]
    assert msg.startswith("Incompatible versions: ")
    assert f"rule {rule_id}," in msg
    also = ALSO.get(rule_id, ())
    for other in also:
        assert f"rule {other}," in msg
    assert msg.count("(rule ") == 1 + len(also), msg  # that rule alone
    for words in BAD[rule_id][1]:
        assert words in msg, (words, msg)
    source = next(r["source"] for r in RULES if r["id"] == rule_id)
    assert f"source: {source})" in msg


@pytest.mark.parametrize("rule_id", sorted(WARN))
def test_a_warning_is_reported_and_the_run_goes_on(
    gate: tuple[int, dict[str, list[Any]], str], rule_id: str
) -> None:
    _rc, results, _out = gate
    host = rule_id.replace("-", "_")
    assert _failure(results[host]) is None
    warnings = _warnings(results[host])
    assert len(warnings) == 1, warnings
    for words in WARN[rule_id][1]:
        assert words in warnings[0], (words, warnings)


def test_a_cuda_version_missing_from_the_table_fails(
    gate: tuple[int, dict[str, list[Any]], str],
) -> None:
    msg = _failure(gate[1]["unknown_cuda"])
    assert msg is not None
    assert UNKNOWN_CUDA[1][0] in msg
    assert "12.6, 12.8, 12.9" in msg  # the known versions, in order


@pytest.mark.parametrize("key", sorted(UNKNOWN))
def test_a_version_without_a_rule_is_refused_naming_the_table(
    gate: tuple[int, dict[str, list[Any]], str], key: str
) -> None:
    """Fail closed: no rule for a version is no pass."""
    msg = _failure(gate[1][f"no_rule_{key}"])
    assert msg is not None, gate[2][-3000:]
    for words in UNKNOWN[key][1]:
        assert words in msg, (words, msg)
    assert f"list {key} in software.unverified_versions" in msg


@pytest.mark.parametrize("key", sorted(UNKNOWN))
def test_unverified_versions_turn_a_missing_rule_into_a_warning(
    gate: tuple[int, dict[str, list[Any]], str], key: str
) -> None:
    results = gate[1][f"unverified_{key}"]
    warnings = _warnings(results)
    assert any(UNKNOWN[key][1][0] in w for w in warnings), warnings
    assert all("unverified, as software.unverified_versions allows" in w for w in warnings)
    msg = _failure(results)
    if key == "dcgm":  # DCGM 5 is still not what the dcgm role installs
        assert msg is not None
        assert "rule dcgm-major-the-role-installs," in msg
        assert msg.count("(rule ") == 1, msg
    else:
        assert msg is None, msg


def test_an_override_of_another_key_lifts_nothing(
    gate: tuple[int, dict[str, list[Any]], str],
) -> None:
    msg = _failure(gate[1]["unverified_other_key"])
    assert msg is not None
    assert UNKNOWN_CUDA[1][0] in msg


def test_dcgm_3_is_refused_even_when_unverified(tmp_path: Path) -> None:
    """The examples pinned 3.3.8, which the dcgm role (DCGM 4 packages only) cannot install."""
    rc, results, out = _run({"dcgm3": {**GOOD, "dcgm": "3.3.8"}}, tmp_path, {"dcgm3": ["dcgm"]})
    assert rc != 0
    msg = _failure(results["dcgm3"])
    assert msg is not None, out[-3000:]
    assert "DCGM 3.3.8 is not DCGM 4" in msg


def test_the_examples_pin_dcgm_4() -> None:
    for path in sorted((ROOT / "inventories").glob("*.yml")):
        assert load_cluster(path).software.dcgm.split(".")[0] == "4", path.name
    for path in sorted((ROOT / "templates" / "init").glob("*.j2")):
        pins = re.findall(r'^  dcgm: "?([0-9.]+)"?', path.read_text(), re.M)
        assert pins, path.name
        assert all(p.startswith("4.") for p in pins), (path.name, pins)


def test_render_passes_the_override_to_the_gate(tmp_path: Path) -> None:
    from gpuctl.config import load_cluster_text

    text = (ROOT / "inventories" / "lab.yml").read_text()
    rendered = {}
    for name, extra in (
        ("plain", ""),
        ("unverified", "  unverified_versions: [gpu_models, cuda]\n"),
    ):
        doc = text.replace("\nsoftware:\n", "\nsoftware:\n" + extra, 1)
        assert extra == "" or doc != text
        out = tmp_path / name
        render_cluster(load_cluster_text(doc, "c"), out)
        rendered[name] = yaml.safe_load((out / "group_vars" / "all.yml").read_text())
    assert rendered["plain"]["preflight_unverified_versions"] == []
    assert rendered["unverified"]["preflight_unverified_versions"] == ["cuda", "gpu_models"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["preflight_unverified_versions"] == []


def test_docs_list_every_rule() -> None:
    doc = (ROOT / "docs" / "compatibility.md").read_text()
    for rule in RULES:
        assert f"`{rule['id']}`" in doc, rule["id"]
        assert rule["source"] in doc, rule["id"]
