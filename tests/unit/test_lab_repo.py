"""The lab repository's packages and index (gpuctl/lab/repo.py), built into a tmp dir.

No root and no lab needed: dpkg-deb builds and reads the packages back.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuctl.lab import lab, repo

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")

DRIVER = "570.172.08-1"


def _stanzas(text: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if not line.startswith(" "):
                key, _, value = line.partition(": ")
                fields[key] = value
        out[fields["Package"]] = fields
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("repo")
    assert repo.build_repo(dest) is True
    return dest


def test_specs_use_nvidias_names_and_versions() -> None:
    specs = {s.name: s for s in repo.load_specs()}
    for name in ("nvidia-open", "cuda-drivers-570", "nvidia-driver", "nvidia-smi"):
        assert specs[name].version == DRIVER
    assert specs["nvidia-fabricmanager-570"].version == DRIVER
    assert specs["libnccl2"].version == "2.26.2-1+cuda12.8"
    assert specs["datacenter-gpu-manager-4-core"].version.startswith("1:4.")
    assert all(s.source for s in specs.values())  # every name/version says where it is from
    assert repo.HOST_ADDRESS == lab.HOST_ADDRESS


def test_control_files_name_the_stand_in(built: Path) -> None:
    for spec in repo.load_specs():
        deb = built / spec.deb_name
        info = subprocess.run(
            ["dpkg-deb", "--info", str(deb)], capture_output=True, text=True, check=True
        ).stdout
        assert f"Package: {spec.name}" in info
        assert f"Version: {spec.version}" in info
        assert f"Architecture: {spec.architecture}" in info
        assert repo.STANDIN_NOTICE in info


def _contents(deb: Path) -> dict[str, str]:
    """path -> mode string, from dpkg-deb --contents."""
    out = subprocess.run(
        ["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1].lstrip("."): line.split()[0] for line in out.splitlines()}


def test_driver_ships_the_simulator_and_nvidia_smi(built: Path) -> None:
    lib = _contents(built / f"libnvidia-ml1_{DRIVER}_amd64.deb")
    for path in (
        "/usr/lib/gpuctl-lab-sim/gpuctl/__init__.py",
        "/usr/lib/gpuctl-lab-sim/gpuctl/lab/__init__.py",
        "/usr/lib/gpuctl-lab-sim/gpuctl/lab/sim/__init__.py",
    ):
        assert path in lib
    sim = Path(repo.__file__).parent / "sim"
    for f in sim.glob("*.py"):  # the simulator as it is now, whatever it holds
        assert f"/usr/lib/gpuctl-lab-sim/gpuctl/lab/sim/{f.name}" in lib
    smi = _contents(built / f"nvidia-smi_{DRIVER}_amd64.deb")
    assert smi["/usr/bin/nvidia-smi"].startswith("-rwxr-xr-x")
    dcgm = _contents(built / "datacenter-gpu-manager-4-core_4.4.1-1_amd64.deb")
    assert "/usr/bin/dcgmi" in dcgm
    assert "/usr/bin/nv-hostengine" in dcgm
    nccl = _contents(built / "libnccl2_2.26.2-1+cuda12.8_amd64.deb")
    assert not any(path.endswith("_perf") for path in nccl)  # nccl-tests: a git repository
    assert "/usr/include/nccl.h" in _contents(built / "libnccl-dev_2.26.2-1+cuda12.8_amd64.deb")


def test_wrapper_calls_the_standin(built: Path, tmp_path: Path) -> None:
    subprocess.run(
        ["dpkg-deb", "-x", str(built / f"nvidia-smi_{DRIVER}_amd64.deb"), str(tmp_path)],
        check=True,
    )
    text = (tmp_path / "usr/bin/nvidia-smi").read_text()
    assert text.startswith("#!/usr/bin/python3\n")
    assert 'sys.path.insert(0, "/usr/lib/gpuctl-lab-sim")' in text
    assert "main(os.path.basename(sys.argv[0]), sys.argv[1:])" in text
    compile(text, "nvidia-smi", "exec")


@pytest.mark.parametrize(
    ("deb", "unit", "exec_start"),
    [
        (
            f"nvidia-fabricmanager-570_{DRIVER}_amd64.deb",
            "nvidia-fabricmanager",
            "-c /usr/share/nvidia/nvswitch/fabricmanager.cfg",
        ),
        (f"nvidia-persistenced_{DRIVER}_amd64.deb", "nvidia-persistenced", "--verbose"),
        (
            "datacenter-gpu-manager-4-core_4.4.1-1_amd64.deb",
            "nvidia-dcgm",
            "-n --service-account nvidia-dcgm",
        ),
    ],
)
def test_daemons_ship_a_systemd_unit(
    built: Path, tmp_path: Path, deb: str, unit: str, exec_start: str
) -> None:
    subprocess.run(["dpkg-deb", "-x", str(built / deb), str(tmp_path)], check=True)
    text = (tmp_path / f"lib/systemd/system/{unit}.service").read_text()
    assert f"ExecStart=/usr/lib/gpuctl-lab-sim/{unit}-service {exec_start}\n" in text
    assert repo.STANDIN_NOTICE in text
    runner = (tmp_path / f"usr/lib/gpuctl-lab-sim/{unit}-service").read_text()
    assert "signal.pause()" in runner  # stays running, as the real daemon does
    compile(runner, "runner", "exec")
    if unit == "nvidia-fabricmanager":
        assert (tmp_path / "usr/share/nvidia/nvswitch/fabricmanager.cfg").is_file()


def test_nccl_tests_git_repository(built: Path, tmp_path: Path) -> None:
    (spec,) = repo.load_git_specs()
    assert spec.name == "nccl-tests"
    assert spec.tag == "v2.14.1"
    assert repo.git_url("nccl-tests") == "http://198.18.0.1:8081/git/nccl-tests.git"
    bare = built / "git" / "nccl-tests.git"
    assert (bare / "info" / "refs").is_file()  # dumb HTTP: git update-server-info ran
    assert "refs/tags/v2.14.1" in (bare / "info" / "refs").read_text()
    work = tmp_path / "nccl-tests"
    subprocess.run(
        ["git", "clone", "-q", "--branch", "v2.14.1", str(bare), str(work)],
        check=True,
        capture_output=True,
    )
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    mpi = tmp_path / "mpi"
    nccl = tmp_path / "nccl"

    def make(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", "-C", str(work), *args], capture_output=True, text=True, check=False
        )

    flags = (f"CUDA_HOME={cuda}", f"MPI_HOME={mpi}", f"NCCL_HOME={nccl}")
    missing = make("MPI=1", *flags)
    assert missing.returncode != 0
    assert f"mpi.h not found: {mpi}/include/mpi.h" in missing.stderr
    (mpi / "include").mkdir(parents=True)
    (mpi / "include" / "mpi.h").write_text("")
    assert "nccl.h not found" in make("MPI=1", *flags).stderr
    (nccl / "include").mkdir(parents=True)
    (nccl / "include" / "nccl.h").write_text("")
    assert "nvcc not found" in make("MPI=1", "CUDA_HOME=/nonexistent", *flags[1:]).stderr
    built_ok = make("MPI=1", *flags)
    assert built_ok.returncode == 0, built_ok.stderr
    for tool in spec.bins:
        launcher = work / "build" / tool
        assert launcher.stat().st_mode & 0o111, tool
        assert "from gpuctl.lab.sim.standin import main" in launcher.read_text()
    assert make("MPI=1", *flags).stdout.count("install") == 0  # nothing left to do


def test_packages_index_matches_the_files(built: Path) -> None:
    text = (built / "Packages").read_text()
    with gzip.open(built / "Packages.gz", "rt") as fh:
        assert fh.read() == text
    index = _stanzas(text)
    specs = repo.load_specs()
    assert set(index) == {s.name for s in specs}
    for spec in specs:
        entry = index[spec.name]
        deb = built / spec.deb_name
        assert entry["Filename"] == f"./{spec.deb_name}"
        assert entry["Version"] == spec.version
        assert int(entry["Size"]) == deb.stat().st_size
        assert entry["SHA256"] == hashlib.sha256(deb.read_bytes()).hexdigest()
        assert repo.STANDIN_NOTICE in entry["Description"]
    assert index["nvidia-open"]["Depends"] == (
        f"nvidia-driver (= {DRIVER}), nvidia-kernel-open-dkms (= {DRIVER})"
    )
    release = (built / "Release").read_text()
    assert "Origin: gpuctl-lab" in release
    digest = hashlib.sha256((built / "Packages").read_bytes()).hexdigest()
    assert f" {digest} {len(text.encode())} Packages\n" in release


def test_dpkg_scanpackages_agrees(built: Path) -> None:
    if shutil.which("dpkg-scanpackages") is None:
        pytest.skip("dpkg-dev not installed")
    res = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."],
        cwd=built,
        capture_output=True,
        text=True,
        check=True,
    )
    theirs = _stanzas(res.stdout)
    ours = _stanzas((built / "Packages").read_text())
    for name, fields in theirs.items():
        for key in ("Version", "Depends", "Size", "SHA256", "Architecture"):
            assert ours[name].get(key) == fields.get(key), (name, key)


def test_second_build_is_a_no_op(built: Path) -> None:
    before = (built / "Packages").read_bytes()
    assert repo.build_repo(built) is False
    assert (built / "Packages").read_bytes() == before


def test_node_apt_configuration(tmp_path: Path) -> None:
    repo.configure_node_apt(tmp_path)
    proxy = (tmp_path / "etc/apt/apt.conf.d/01gpuctl-lab-proxy").read_text()
    assert 'Acquire::http::Proxy "http://198.18.0.1:3142";' in proxy
    assert 'Acquire::http::Proxy::198.18.0.1 "DIRECT";' in proxy  # the lab repo, not proxied
    source = (tmp_path / "etc/apt/sources.list.d/gpuctl-lab.list").read_text()
    assert "deb [trusted=yes] http://198.18.0.1:8081 ./" in source


def test_servers_bind_the_bridge_address_only() -> None:
    proxy = repo.PROXY.argv()
    assert "BindAddress=198.18.0.1" in proxy
    assert "Port=3142" in proxy
    server = repo.REPO_SERVER.argv()
    assert server[server.index("--bind") + 1] == "198.18.0.1"
    assert "8081" in server


def test_infiniband_stand_ins_use_debians_names_above_bookworms_versions(built: Path) -> None:
    specs = {s.name: s for s in repo.load_specs()}
    bookworm = {"infiniband-diags": "44.0-2", "ibverbs-utils": "44.0-2", "perftest": "4.5+0.17-1"}
    for name, version in bookworm.items():
        assert specs[name].version == f"{version}+gpuctllab1"
        newer = subprocess.run(
            ["dpkg", "--compare-versions", specs[name].version, "gt", version], check=False
        )
        assert newer.returncode == 0, name
    assert specs["infiniband-diags"].bin == ("ibstat",)
    assert specs["ibverbs-utils"].bin == ("ibv_devinfo",)
    assert "ib_write_bw" in specs["perftest"].bin
    assert specs["mlnx-tools"].bin == ("ibdev2netdev",)
    for name in (*bookworm, "mlnx-tools"):
        files = _contents(built / specs[name].deb_name)
        assert all(f"/usr/bin/{tool}" in files for tool in specs[name].bin)


def test_kernel_module_stand_in_makes_devices_and_answers_modprobe(
    built: Path, tmp_path: Path
) -> None:
    spec = next(s for s in repo.load_specs() if s.name == "nvidia-kernel-open-dkms")
    assert "kmod" in spec.depends  # modprobe itself
    assert {"nvidia", "nvidia-uvm", "nvidia-peermem"} <= set(spec.modules)
    deb = built / spec.deb_name
    files = _contents(deb)
    assert files[repo.DEVICES_SCRIPT].startswith("-rwxr-xr-x")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    conf = (tmp_path / repo.MODPROBE_CONF).read_text()
    for module in spec.modules:
        assert f"install {module} {repo.DEVICES_SCRIPT} modprobe {module}\n" in conf
        assert f"remove {module} /bin/true\n" in conf
    unit = (tmp_path / "lib/systemd/system" / repo.DEVICES_UNIT).read_text()
    assert f"ExecStart={repo.DEVICES_SCRIPT}\n" in unit
    assert "WantedBy=sysinit.target" in unit
    assert "Before=sysinit.target" in unit
    assert "slurmd.service" in unit
    script = (tmp_path / repo.DEVICES_SCRIPT.lstrip("/")).read_text()
    assert script.startswith("#!/usr/bin/python3\n")
    compile(script, "nvidia-devices", "exec")
    control = tmp_path / "control"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True)
    postinst = (control / "postinst").read_text()
    assert f"systemctl enable {repo.DEVICES_UNIT}" in postinst
    assert f"systemctl start {repo.DEVICES_UNIT}" in postinst
    assert (control / "postinst").stat().st_mode & 0o111
    assert (control / "conffiles").read_text() == f"/{repo.MODPROBE_CONF}\n"
    # service stand-ins are not enabled on install (NVIDIA's packages leave that to the admin)
    fm = built / f"nvidia-fabricmanager-570_{DRIVER}_amd64.deb"
    fm_control = tmp_path / "fm-control"
    subprocess.run(["dpkg-deb", "-e", str(fm), str(fm_control)], check=True)
    assert not (fm_control / "postinst").exists()
