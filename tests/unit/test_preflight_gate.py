"""The version gate of the preflight role, run for real: ansible-playbook on localhost.

One run plays playbooks/preflight.yml (tag ``preflight_versions`` only) on a set of local
hosts, each with its own ``preflight_versions``: the lab's set and the set of every example
inventory pass; one set per rule breaks exactly that rule and fails, naming both sides and their
versions. The rules come from the role's vars; a rule without a case here fails the test, and so
does one that docs/compatibility.md does not list.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from playbook_run import ansible_playbook

from gpuctl.config import load_cluster
from gpuctl.render import render_cluster

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "playbooks" / "roles" / "preflight"
PLAYBOOK = REPO / "playbooks" / "preflight.yml"
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
        },
        ("driver 418.87.01", "R450", "DCGM 4.4.1"),
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
# rule id -> (changes to GOOD, words of the warning); the run goes on
WARN: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "inbox-gpudirect-rdma-needs-open-modules": (
        {"kernel_modules": "proprietary"},
        ("rdma_stack inbox", "kernel_modules proprietary"),
    ),
}
UNKNOWN_CUDA = ({"cuda": "12.7"}, ("cuda 12.7 is not in the table cuda_minimum_driver",))


def _examples(tmp: Path) -> dict[str, dict[str, Any]]:
    """preflight_versions as gpuctl render writes it for every example inventory."""
    out = {}
    for path in sorted((REPO / "inventories").glob("*.yml")):
        render_dir = tmp / f"render-{path.stem}"
        render_cluster(load_cluster(path), render_dir)
        versions = yaml.safe_load((render_dir / "group_vars" / "all.yml").read_text()).get(
            "preflight_versions"
        )
        if versions is not None:  # older renders do not write it
            out[f"example_{path.stem.replace('-', '_')}"] = versions
    return out


def _run(hosts: dict[str, dict[str, Any]], tmp: Path) -> tuple[int, dict[str, list[Any]], str]:
    """Play the gate on ``hosts`` (name -> preflight_versions); results per host, in order."""
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "hosts": {name: {"preflight_versions": v} for name, v in hosts.items()},
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
    return _run(hosts, tmp)


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
    assert msg.count("(rule ") == 1, msg  # that rule alone
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


def test_docs_list_every_rule() -> None:
    doc = (REPO / "docs" / "compatibility.md").read_text()
    for rule in RULES:
        assert f"`{rule['id']}`" in doc, rule["id"]
        assert rule["source"] in doc, rule["id"]
