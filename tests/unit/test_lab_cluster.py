"""The running lab's cluster.yml follows its hardware profile (no lab or root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster_text
from gpuctl.config.derived import summarize
from gpuctl.lab import lab, repo
from gpuctl.lab.sim import profiles
from gpuctl.lab.system import LabError


@pytest.mark.parametrize("name", profiles.names())
def test_lab_cluster_yml_matches_each_profile(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_LAB_DIR", str(tmp_path))
    hw = profiles.load(name)
    summary = summarize(load_cluster_text(lab.lab_cluster_text(2, name), name))
    assert summary.gpus_by_model == {hw["model"]: 2 * int(hw["gpus"]["count"])}
    ports = [p["name"] for p in (hw.get("nics") or {}).get("ports") or []]
    if ports:
        [fabric] = summary.fabrics
        assert fabric.rate_gbps == hw["nics"]["rate"]
        assert fabric.kind == ("infiniband" if hw["nics"]["link_layer"] == "InfiniBand" else "roce")
    else:
        assert summary.fabrics == ()
    assert summary.versions["driver"] == hw["driver_version"]
    assert str(tmp_path) in lab.lab_cluster_text(2, name)  # the lab's own key, absolute


@pytest.mark.parametrize("name", ["nccl-tests", "perftest"])
def test_the_lab_builds_its_git_stand_ins_at_the_tags_it_serves(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cluster.yml's source and version of each source tree a role builds are the lab's git
    mirror of the stand-in and its tag (nccl-tests' tag is v<version>, perftest's the version)."""
    monkeypatch.setenv("GPUCTL_LAB_DIR", str(tmp_path))
    spec = next(s for s in repo.load_git_specs() if s.name == name)
    for profile in profiles.names():
        cluster = load_cluster_text(lab.lab_cluster_text(2, profile), profile)
        field = name.replace("-", "_")
        assert getattr(cluster.package_sources, field) == repo.git_url(name)
        version = getattr(cluster.software, field)
        assert spec.tag == (f"v{version}" if name == "nccl-tests" else version)


def test_inventories_lab_yml_is_the_default_lab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example the docs point at is what `gpuctl lab up` writes (but for the paths of the
    key, the known hosts and the wheelhouse, which are under the lab directory)."""
    monkeypatch.setenv("GPUCTL_LAB_DIR", str(tmp_path))
    example = (ROOT / "inventories" / "lab.yml").read_text()
    running = lab.lab_cluster_text(2, lab.DEFAULT_PROFILE)
    key = str(lab.ssh_key())
    hosts = str(lab.known_hosts())
    wheels = str(tmp_path / "wheelhouse")
    assert running == example.replace(".gpuctl/lab/id_ed25519", key).replace(
        ".gpuctl/lab/known_hosts", hosts
    ).replace("/var/lib/gpuctl-lab/wheelhouse", wheels).replace(
        ".gpuctl/lab/bmc/", f"{tmp_path / 'bmc'}/"
    )


def test_several_profiles_make_one_node_group_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_LAB_DIR", str(tmp_path))
    groups = lab.parse_profiles(0, ["a100-hdr:2", "l40s-pcie:2", "single-gpu:1"])
    assert groups == [("a100-hdr", 2), ("l40s-pcie", 2), ("single-gpu", 1)]
    cluster = load_cluster_text(lab.lab_cluster_text(5, "a100-hdr", "debian13", groups), "lab")
    compute = {g.name: g for g in cluster.node_groups if g.gpus is not None}
    assert {n: str(g.nodes) for n, g in compute.items()} == {
        "a100_hdr": "gpu[001-002]",
        "l40s_pcie": "gpu[003-004]",
        "single_gpu": "gpu005",
    }
    assert [f.kind.value for f in cluster.fabrics] == ["infiniband", "roce"]
    assert all(f.topology is None for f in cluster.fabrics)  # topology.conf holds one fabric
    # no catalog floor for L40S: the threshold an operator sets from a healthy run
    floor = compute["l40s_pcie"].validation.thresholds.nccl_all_reduce_busbw_gbs
    assert floor == pytest.approx(17.8)
    assert compute["a100_hdr"].validation.thresholds.nccl_all_reduce_busbw_gbs is None


@pytest.mark.parametrize(
    ("profiles", "says"),
    [
        (["nope:2"], "unknown profile"),
        (["a100-hdr:0"], "1 to 16"),
        (["a100-hdr:2", "l40s-pcie"], "with its node count"),
        (["a100-hdr:2", "a100-hdr:1"], "give each one once"),
        (["a100-hdr:9", "l40s-pcie:8"], "at most 16"),
    ],
)
def test_bad_profile_lists_are_refused(profiles: list[str], says: str) -> None:
    with pytest.raises(LabError, match=says):
        lab.parse_profiles(2, profiles)
