"""slurm.conf and gres.conf that a real cluster can run (issue 15).

Each test pins one way the rendered files used to mislead Slurm:

- a compute group without ``cpu``/``memory_mb`` became a NodeName line Slurm reads as 1 CPU and
  RealMemory 1 (slurm.conf(5): "RealMemory ... The default value is 1"), so with CR_Core_Memory
  and ConstrainRAMSpace every job got a 1 MiB cgroup;
- two SlurmctldHost lines shared a StateSaveLocation that was local to each controller
  (slurm.conf(5), StateSaveLocation: "If you have a secondary SlurmctldHost configured, this
  location should be readable and writable by both systems");
- the submitting shell's memlock limit reached the jobs (https://slurm.schedmd.com/faq.html#memlock:
  "PropagateResourceLimitsExcept=MEMLOCK might be used to prevent the propagation of a user's
  locked memory limit"), which breaks RDMA memory registration;
- gres.conf had no ``Cores=``, so Slurm knew no GPU-CPU affinity. gres.conf(5) of current Slurm
  (SchedMD/slurm doc/man/man5/gres.conf.5): Cores are *logical core indices* ("Core 0 will be the
  first core on the first socket ... coincides with the logical core number (Core L#) seen in
  lstopo -l"), and "all the cores in a socket must be specified together".
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from helpers import ROOT

from gpuctl.config import load_cluster, load_cluster_text
from gpuctl.errors import ConfigError, Problem
from gpuctl.render import render_files
from gpuctl.starter import PROFILES, starter

INVENTORIES = sorted((ROOT / "inventories").glob("*.yml"))
TOPO = ROOT / "tests" / "fixtures" / "topo"

Doc = dict[str, Any]


def _hgx() -> Doc:
    """The hgx-h100 starter: head01 (controller, login), gpu[001-004] 8 x H100, 2 sockets."""
    doc: Doc = yaml.safe_load(starter("hgx-h100", 4))
    assert doc["node_groups"][1]["name"] == "hgx"
    return doc


def _problems(doc: Doc) -> list[Problem]:
    try:
        load_cluster_text(yaml.safe_dump(doc, sort_keys=False), "c.yml")
    except ConfigError as exc:
        return list(exc.problems)
    return []


def _files(doc: Doc) -> dict[str, str]:
    return render_files(load_cluster_text(yaml.safe_dump(doc, sort_keys=False), "c.yml"))


def _only(problems: list[Problem], path: str) -> Problem:
    found = [p for p in problems if p.path == path]
    assert len(found) == 1, "\n".join(map(str, problems))
    return found[0]


def _examples() -> list[tuple[str, Doc]]:
    docs = [(p.name, yaml.safe_load(p.read_text(encoding="utf-8"))) for p in INVENTORIES]
    docs += [(f"starter:{name}", yaml.safe_load(starter(name))) for name in sorted(PROFILES)]
    return docs


# --- 1. CPU and memory of compute nodes ---------------------------------------------------------


@pytest.mark.parametrize("key", ["cpu", "memory_mb"])
def test_a_compute_group_without_its_cpu_or_memory_is_refused(key: str) -> None:
    doc = _hgx()
    doc["node_groups"][1].pop(key)
    problem = _only(_problems(doc), f"node_groups[1].{key}")
    assert problem.line is not None
    expected = "1 CPU per node" if key == "cpu" else "1 MiB memory limit"
    assert expected in problem.message


def test_groups_without_the_compute_role_need_no_cpu_or_memory() -> None:
    doc = _hgx()
    head = doc["node_groups"][0]
    assert "compute" not in head["roles"]
    assert "cpu" not in head
    assert "memory_mb" not in head
    assert _problems(doc) == []


@pytest.mark.parametrize(("name", "doc"), _examples(), ids=[n for n, _ in _examples()])
def test_every_example_describes_its_compute_nodes(name: str, doc: Doc) -> None:
    """Every example inventory and starter: CPUs= and RealMemory= on every NodeName line."""
    for group in doc["node_groups"]:
        if "compute" in group["roles"]:
            assert {"cpu", "memory_mb"} <= set(group), (name, group["name"])
    text = yaml.safe_dump(doc)
    conf = render_files(load_cluster_text(text, name))["slurm/slurm.conf"]
    lines = [ln for ln in conf.splitlines() if ln.startswith("NodeName=")]
    assert lines
    for line in lines:
        assert " CPUs=" in line
        assert " RealMemory=" in line


def test_the_lab_keeps_the_cpus_its_containers_have() -> None:
    """The lab's containers have 2 CPUs: a NodeName line asking for more would not register."""
    doc: Doc = yaml.safe_load(starter("lab", 2))
    group = doc["node_groups"][1]
    assert group["cpu"] == {"sockets": 1, "cores_per_socket": 2, "threads_per_core": 1}
    assert group["memory_mb"] == 1024
    assert "cpu_affinity" not in group["gpus"]  # one socket: no Cores=
    assert "Cores=" not in _files(doc)["slurm/gres.conf"]


# --- 2. StateSaveLocation and the backup controller ----------------------------------------------


def _with_backup(doc: Doc) -> Doc:
    doc["node_groups"][0]["nodes"] = "head[01-02]"
    doc["slurm"]["backup_controller"] = "head02"
    return doc


def test_the_state_save_location_defaults_to_the_local_directory() -> None:
    files = _files(_hgx())
    assert "\nStateSaveLocation=/var/lib/slurm/slurmctld\n" in files["slurm/slurm.conf"]
    all_vars = yaml.safe_load(files["group_vars/all.yml"])
    assert all_vars["slurm_controller_state_dir"] == "/var/lib/slurm/slurmctld"


def test_a_backup_controller_without_a_declared_shared_state_directory_is_refused() -> None:
    problem = _only(_problems(_with_backup(_hgx())), "slurm.backup_controller")
    assert "slurm.conf(5)" in problem.message
    assert "slurm.state_save_location" in problem.message


def test_a_declared_state_directory_is_rendered_and_created_by_the_controller_role() -> None:
    doc = _with_backup(_hgx())
    doc["slurm"]["state_save_location"] = "/shared/slurm/state"
    files = _files(doc)
    conf = files["slurm/slurm.conf"]
    assert "SlurmctldHost=head01\nSlurmctldHost=head02\n" in conf
    assert "\nStateSaveLocation=/shared/slurm/state\n" in conf
    # the role creates it owned by SlurmUser and checks slurm.conf names the same directory
    all_vars = yaml.safe_load(files["group_vars/all.yml"])
    assert all_vars["slurm_controller_state_dir"] == "/shared/slurm/state"
    role = ROOT / "playbooks" / "roles" / "slurm_controller" / "tasks"
    configure = yaml.safe_load((role / "configure.yml").read_text(encoding="utf-8"))
    task = next(t for t in configure if "{{ slurm_controller_state_dir }}" in t.get("loop", []))
    assert task["ansible.builtin.file"]["owner"] == "{{ slurm_controller_user }}"
    assert task["ansible.builtin.file"]["state"] == "directory"
    assert "slurm_controller_state_dir" in (role / "preflight.yml").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "path", ["var/lib/slurm", "/var/../etc", "/var/lib/slurm/", "/a b", "/x;rm", "/."]
)
def test_the_state_save_location_is_a_plain_absolute_directory(path: str) -> None:
    doc = _hgx()
    doc["slurm"]["state_save_location"] = path
    assert any(p.path == "slurm.state_save_location" for p in _problems(doc))


def test_the_example_with_a_backup_controller_declares_shared_state() -> None:
    cluster = load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml")
    assert cluster.slurm.backup_controller is not None
    assert "state_save_location" in cluster.slurm.model_fields_set


# --- 3. memlock --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_jobs_do_not_inherit_the_submitters_memlock_limit(name: str) -> None:
    conf = _files(yaml.safe_load(starter(name)))["slurm/slurm.conf"]
    assert "\nPropagateResourceLimitsExcept=MEMLOCK\n" in conf


@pytest.mark.parametrize("key", ["PropagateResourceLimitsExcept", "PropagateResourceLimits"])
def test_slurm_extra_cannot_undo_the_memlock_exception(key: str) -> None:
    doc = _hgx()
    doc["slurm"]["extra"] = {key: "NONE"}
    problem = _only(_problems(doc), f"slurm.extra.{key}")
    assert "written by gpuctl" in problem.message


# --- 4. GPU-CPU affinity in gres.conf ----------------------------------------------------------


def _gres_lines(doc: Doc) -> list[str]:
    return [ln for ln in _files(doc)["slurm/gres.conf"].splitlines() if ln.startswith("NodeName=")]


def test_gres_conf_binds_each_gpu_to_the_cores_of_its_socket() -> None:
    """2 sockets x 56 cores x 2 threads: Cores= counts cores (0-111), not threads (0-223)."""
    assert _gres_lines(_hgx()) == [
        "NodeName=gpu[001-004] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-55",
        "NodeName=gpu[001-004] Name=gpu Type=h100 File=/dev/nvidia[4-7] Cores=56-111",
    ]


def test_gpus_on_alternating_sockets_get_one_line_per_run_in_device_order() -> None:
    doc = _hgx()
    doc["node_groups"][1]["gpus"]["cpu_affinity"] = [1, 1, 0, 0, 0, 0, 1, 1]
    assert _gres_lines(doc) == [
        "NodeName=gpu[001-004] Name=gpu Type=h100 File=/dev/nvidia[0-1] Cores=56-111",
        "NodeName=gpu[001-004] Name=gpu Type=h100 File=/dev/nvidia[2-5] Cores=0-55",
        "NodeName=gpu[001-004] Name=gpu Type=h100 File=/dev/nvidia[6-7] Cores=56-111",
    ]


def test_a_multi_socket_gpu_group_without_affinity_is_refused() -> None:
    doc = _hgx()
    doc["node_groups"][1]["gpus"].pop("cpu_affinity")
    problem = _only(_problems(doc), "node_groups[1].gpus")
    assert "cpu_affinity" in problem.message
    assert "gres_autodetect: nvml" in problem.message


def test_nvml_autodetect_detects_the_affinity_instead() -> None:
    """gres.conf(5): AutoDetect "will automatically detect files, cores, links"."""
    doc = _hgx()
    doc["node_groups"][1]["gpus"].pop("cpu_affinity")
    doc["slurm"]["gres_autodetect"] = "nvml"
    assert _files(doc)["slurm/gres.conf"].splitlines()[1:] == ["AutoDetect=nvml"]
    doc["node_groups"][1]["gpus"]["cpu_affinity"] = [0, 0, 0, 0, 1, 1, 1, 1]
    problem = _only(_problems(doc), "node_groups[1].gpus.cpu_affinity")
    assert "nvml" in problem.message  # a setting that would do nothing is refused


@pytest.mark.parametrize(
    ("affinity", "fragment"),
    [
        ([0, 0, 0, 0, 1, 1, 1], "7 entries for 8 GPUs"),
        ([0, 0, 0, 0, 2, 2, 2, 2], "socket 2 does not exist"),
    ],
)
def test_an_affinity_that_does_not_fit_the_node_is_refused(
    affinity: list[int], fragment: str
) -> None:
    doc = _hgx()
    doc["node_groups"][1]["gpus"]["cpu_affinity"] = affinity
    assert fragment in _only(_problems(doc), "node_groups[1].gpus.cpu_affinity").message


def test_a_single_socket_group_needs_no_affinity() -> None:
    doc = _hgx()
    group = doc["node_groups"][1]
    group["cpu"] = {"sockets": 1, "cores_per_socket": 64, "threads_per_core": 2}
    group["gpus"].pop("cpu_affinity")
    assert _gres_lines(doc) == [
        "NodeName=gpu[001-004] Name=gpu Type=h100 File=/dev/nvidia[0-7]",
    ]


def _numa_affinity(fixture: str) -> list[int]:
    expect = yaml.safe_load((TOPO / fixture).read_text(encoding="utf-8"))
    numa = expect["data"]["numa_affinity"]
    return [int(numa[f"GPU{i}"]) for i in range(len(numa))]


@pytest.mark.parametrize(
    ("example", "fixture", "numa_per_socket"),
    [
        # HGX H100 (2 x Xeon 8468): one NUMA node per socket
        ("hgx-h100-ndr.yml", "nvsmi-topo-m-h100-8gpu-6nic-blank-cpuaffinity.expect.yml", 1),
        # HGX A100 8-GPU board of Azure NDv4: 4 NUMA nodes on 2 sockets (CPUs 0-47, 48-95)
        (
            "a100-roce.yml",
            "nvsmi-topo-m-a100-40gb-8gpu-azure-ndv4-blank-nic-names-ansi.expect.yml",
            2,
        ),
    ],
)
def test_the_examples_affinity_is_what_nvidia_smi_shows_on_that_board(
    example: str, fixture: str, numa_per_socket: int
) -> None:
    doc = yaml.safe_load((ROOT / "inventories" / example).read_text(encoding="utf-8"))
    group = next(g for g in doc["node_groups"] if "gpus" in g)
    sockets = [n // numa_per_socket for n in _numa_affinity(fixture)]
    assert group["gpus"]["cpu_affinity"] == sockets
