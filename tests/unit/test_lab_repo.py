"""The lab repository's packages and index (gpuctl/lab/repo.py), built into a tmp dir.

No root and no lab needed: dpkg-deb builds and reads the packages back.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import require_tool

from gpuctl.lab import lab, repo


@pytest.fixture(scope="module", autouse=True)
def _dpkg_deb() -> None:
    """Every test here builds or reads packages with dpkg-deb."""
    require_tool("dpkg-deb", "apt install dpkg")


DRIVER = "570.172.08-1"
NEWER = "570.195.03-1"  # more_versions: driver (what a driver rollout in the lab goes to)
# every package versioned with the driver, built at both versions
DRIVER_PACKAGES = {
    "libnvidia-ml1",
    "nvidia-smi",
    "nvidia-persistenced",
    "nvidia-kernel-open-dkms",
    "nvidia-driver",
    "nvidia-open",
    "cuda-drivers-570",
    "nvidia-fabricmanager-570",
    "libnvidia-nscq-570",
}


def _stanzas(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """(Package, Version) -> fields of each stanza of a Packages index."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if not line.startswith(" "):
                key, _, value = line.partition(": ")
                fields[key] = value
        out[fields["Package"], fields["Version"]] = fields
    return out


def _defaults() -> dict[str, repo.PackageSpec]:
    """The packages at the lab's default versions, by name."""
    return {s.name: s for s in repo.load_specs() if s.default}


def _deb(built: Path, spec: repo.PackageSpec) -> Path:
    """Where the build put ``spec``: the repository, or more/ for a further version."""
    return (built if spec.default else built / repo.MORE_DIR) / spec.deb_name


def _index(built: Path) -> dict[tuple[str, str], dict[str, str]]:
    """Both indexes (the repository's and more/'s)."""
    text = (
        (built / "Packages").read_text() + "\n" + (built / repo.MORE_DIR / "Packages").read_text()
    )
    return _stanzas(text)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("repo")
    assert repo.build_repo(dest) is True
    return dest


def test_specs_use_nvidias_names_and_versions() -> None:
    specs = _defaults()
    for name in ("nvidia-open", "cuda-drivers-570", "nvidia-driver", "nvidia-smi"):
        assert specs[name].version == DRIVER
    assert specs["nvidia-fabricmanager-570"].version == DRIVER
    assert specs["libnccl2"].version == "2.26.2-1+cuda12.8"
    assert specs["datacenter-gpu-manager-4-core"].version.startswith("1:4.")
    assert all(s.source for s in specs.values())  # every name/version says where it is from
    assert repo.HOST_ADDRESS == lab.HOST_ADDRESS


def test_control_files_name_the_stand_in(built: Path) -> None:
    for spec in repo.load_specs():
        deb = _deb(built, spec)
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
    spec = next(s for s in repo.load_git_specs() if s.name == "nccl-tests")
    assert spec.tag == "v2.17.9"
    assert repo.git_url("nccl-tests") == "http://198.18.0.1:8081/git/nccl-tests.git"
    bare = built / "git" / "nccl-tests.git"
    assert (bare / "info" / "refs").is_file()  # dumb HTTP: git update-server-info ran
    assert "refs/tags/v2.17.9" in (bare / "info" / "refs").read_text()
    work = tmp_path / "nccl-tests"
    subprocess.run(
        ["git", "clone", "-q", "--branch", "v2.17.9", str(bare), str(work)],
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


def _on_this_machine(path: str) -> bool:
    """Whether the stand-in's configure finds ``include/...`` or ``lib/...`` in the system's
    own directories (where it looks after CPPFLAGS' and LDFLAGS')."""
    kind, _, rel = path.partition("/")
    roots = (
        ["/usr/local/include", *glob.glob("/usr/include/*-linux-gnu"), "/usr/include"]
        if kind == "include"
        else ["/usr/local/lib", "/usr/lib64", *glob.glob("/usr/lib/*-linux-gnu"), "/usr/lib"]
    )
    return any(Path(root, rel).exists() for root in roots)


def test_perftest_git_repository(built: Path, tmp_path: Path) -> None:
    """The perftest stand-in builds as linux-rdma/perftest does (./autogen.sh, ./configure
    --prefix CUDA_H_PATH, make, make install), checks what that build needs and installs
    launchers of the simulator's <tool>+cuda handlers where configure found cuda.h."""
    spec = next(s for s in repo.load_git_specs() if s.name == "perftest")
    assert spec.tag == "25.10.0-0.128"
    assert spec.bins == ("ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat")
    bare = built / "git" / "perftest.git"
    assert "refs/tags/25.10.0-0.128" in (bare / "info" / "refs").read_text()
    work = tmp_path / "perftest"
    subprocess.run(
        ["git", "clone", "-q", "--branch", spec.tag, str(bare), str(work)],
        check=True,
        capture_output=True,
    )
    tools = tmp_path / "tools"  # the autotools and a compiler, as the role installs them
    tools.mkdir()
    env = {"PATH": f"{tools}:/usr/bin:/bin", "LC_ALL": "C"}

    def tool(name: str) -> None:
        (tools / name).write_text("#!/bin/sh\n")
        (tools / name).chmod(0o755)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), cwd=work, env=env, capture_output=True, text=True, check=False
        )

    if shutil.which("libtoolize", path="/usr/bin:/bin") is None:  # (libtool not installed here)
        missing = run("./autogen.sh")
        assert (missing.returncode, missing.stderr) == (
            127,
            "./autogen.sh: libtoolize: not found\n",
        )
    for name in ("libtoolize", "aclocal", "autoheader", "automake", "autoconf", "gcc"):
        tool(name)
    assert run("./autogen.sh").returncode == 0
    dev = tmp_path / "dev"  # the -dev packages' headers and libraries
    flags = (f"CPPFLAGS=-I{dev}/include", f"LDFLAGS=-L{dev}/lib")
    prefix = tmp_path / "opt" / "perftest-cuda" / spec.tag
    cuda_h = tmp_path / "cuda-12.8" / "include" / "cuda.h"
    configure = ("./configure", f"--prefix={prefix}", f"CUDA_H_PATH={cuda_h}", *flags)
    needs = [
        ("include/infiniband/verbs.h", "ibverbs header files not found"),
        ("lib/libibverbs.so", "libibverbs not found"),
        ("lib/librdmacm.so", "librdmacm-devel not found"),
        ("lib/libibumad.so", "libibumad not found"),
        ("include/pci/pci.h", "pciutils header files not found"),
        ("lib/libpci.so", "libpci not found"),
    ]
    for path, says in needs:
        if not _on_this_machine(path):  # (a -dev package installed here satisfies configure)
            failed = run(*configure)
            assert failed.returncode == 1
            assert failed.stderr.startswith(f"configure: error: {says}"), failed.stderr
        (dev / path).parent.mkdir(parents=True, exist_ok=True)
        (dev / path).write_text("")

    # no cuda.h at CUDA_H_PATH: configure goes on as perftest's from 25.07 does, with
    # /usr/local/cuda's cuda.h where this machine has one and without CUDA where it has none
    no_cuda = run(*configure)
    assert no_cuda.returncode == 0, no_cuda.stderr
    if Path("/usr/local/cuda/include/cuda.h").is_file():
        assert "found at /usr/local/cuda/include/cuda.h\n" in no_cuda.stdout
    else:
        assert "checking for CUDA header file... no\n" in no_cuda.stdout
        assert "HAVE_CUDA" not in (work / "config.h").read_text()
    cuda_h.parent.mkdir(parents=True)
    cuda_h.write_text("#define CUDA_VERSION 12080\n")
    with_cuda = run(*configure)
    assert f"checking for CUDA header file... found at {cuda_h}\n" in with_cuda.stdout
    assert "#define HAVE_CUDA 1\n" in (work / "config.h").read_text()
    made = run("make")
    assert made.returncode == 0, made.stderr
    installed = run("make", "install")
    assert installed.returncode == 0, installed.stderr
    for name in spec.bins:
        launcher = prefix / "bin" / name
        assert launcher.stat().st_mode & 0o111, name
        text = launcher.read_text()
        assert 'main(os.path.basename(sys.argv[0]) + "+cuda", sys.argv[1:])' in text
        compile(text, name, "exec")
    assert run("make").stdout.count("install") == 0  # nothing left to do


def test_packages_index_matches_the_files(built: Path) -> None:
    for where in (built, built / repo.MORE_DIR):
        with gzip.open(where / "Packages.gz", "rt") as fh:
            assert fh.read() == (where / "Packages").read_text()
    index = _index(built)
    specs = repo.load_specs()
    assert set(index) == {(s.name, s.version) for s in specs}
    assert set(_stanzas((built / "Packages").read_text())) == {
        (s.name, s.version) for s in specs if s.default
    }
    for spec in specs:
        entry = index[spec.name, spec.version]
        deb = _deb(built, spec)
        assert entry["Filename"] == f"./{spec.deb_name}"
        assert entry["Version"] == spec.version
        assert int(entry["Size"]) == deb.stat().st_size
        assert entry["SHA256"] == hashlib.sha256(deb.read_bytes()).hexdigest()
        assert repo.STANDIN_NOTICE in entry["Description"]
    for version in (DRIVER, NEWER):
        assert index["nvidia-open", version]["Depends"] == (
            f"nvidia-driver (= {version}), nvidia-kernel-open-dkms (= {version})"
        )
    release = (built / "Release").read_text()
    assert "Origin: gpuctl-lab" in release
    assert "NotAutomatic" not in release
    data = (built / "Packages").read_bytes()
    assert f" {hashlib.sha256(data).hexdigest()} {len(data)} Packages\n" in release
    # the further versions: apt installs them only when asked for (backports' priority 100)
    more = (built / repo.MORE_DIR / "Release").read_text()
    assert "Suite: gpuctl-lab-more\n" in more
    assert "NotAutomatic: yes\nButAutomaticUpgrades: yes\n" in more


def test_dpkg_scanpackages_agrees(built: Path) -> None:
    require_tool("dpkg-scanpackages", "apt install dpkg-dev")
    for where in (built, built / repo.MORE_DIR):
        res = subprocess.run(
            ["dpkg-scanpackages", "--multiversion", "."],
            cwd=where,
            capture_output=True,
            text=True,
            check=True,
        )
        theirs = _stanzas(res.stdout)
        ours = _stanzas((where / "Packages").read_text())
        assert set(ours) <= set(theirs)
        for name, fields in theirs.items():
            if where == built and name[1] not in {v for _, v in ours}:
                continue  # scanpackages also walks into more/
            for key in ("Version", "Depends", "Size", "SHA256", "Architecture"):
                assert ours[name].get(key) == fields.get(key), (name, key)


def test_second_build_is_a_no_op(built: Path) -> None:
    before = (built / "Packages").read_bytes()
    assert repo.build_repo(built) is False
    assert (built / "Packages").read_bytes() == before


def test_node_apt_configuration(tmp_path: Path) -> None:
    """The lab adds its repository to a node and no proxy: the proxy (or the OS mirror) comes
    from cluster.yml's package_sources when gpuctl provisions the node; a stale lab proxy file
    (from before this rule) is removed."""
    stale = tmp_path / repo.APT_PROXY_CONF
    stale.parent.mkdir(parents=True)
    stale.write_text(repo.proxy_conf())
    repo.configure_node_apt(tmp_path)
    assert not stale.exists()
    assert not list((tmp_path / "etc/apt/apt.conf.d").iterdir())
    pin = (tmp_path / repo.APT_PREFERENCES).read_text()
    assert "Pin: release o=gpuctl-lab,a=gpuctl-lab\nPin-Priority: 1001" in pin
    assert "Package: infiniband-diags ibverbs-utils perftest pciutils\n" in pin
    proxy = repo.proxy_conf()  # what tests use on unprovisioned nodes
    assert 'Acquire::http::Proxy "http://198.18.0.1:3142";' in proxy
    assert 'Acquire::http::Proxy::198.18.0.1 "DIRECT";' in proxy  # the lab repo, not proxied
    source = (tmp_path / "etc/apt/sources.list.d/gpuctl-lab.list").read_text()
    assert "deb [trusted=yes] http://198.18.0.1:8081 ./" in source
    assert "deb [trusted=yes] http://198.18.0.1:8081/more ./" in source


def test_servers_bind_the_bridge_address_only() -> None:
    proxy = repo.PROXY.argv()
    assert "BindAddress=198.18.0.1" in proxy
    assert "Port=3142" in proxy
    server = repo.REPO_SERVER.argv()
    assert server[server.index("--bind") + 1] == "198.18.0.1"
    assert "8081" in server


def test_infiniband_stand_ins_use_debians_names_above_bookworms_versions(built: Path) -> None:
    specs = _defaults()
    bookworm = {"infiniband-diags": "44.0-2", "ibverbs-utils": "44.0-2", "perftest": "4.5+0.17-1"}
    for name, version in bookworm.items():
        assert specs[name].version == f"{version}+gpuctllab1"
        newer = subprocess.run(
            ["dpkg", "--compare-versions", specs[name].version, "gt", version], check=False
        )
        assert newer.returncode == 0, name
    assert specs["infiniband-diags"].bin == ("ibstat", "perfquery")
    assert specs["ibverbs-utils"].bin == ("ibv_devinfo",)
    assert "ib_write_bw" in specs["perftest"].bin
    assert specs["mlnx-tools"].bin == ("ibdev2netdev", "mlnx_qos")
    for name in (*bookworm, "mlnx-tools"):
        files = _contents(built / specs[name].deb_name)
        assert all(f"/usr/bin/{tool}" in files for tool in specs[name].bin)


def test_kernel_module_stand_in_makes_devices_and_answers_modprobe(
    built: Path, tmp_path: Path
) -> None:
    spec = _defaults()["nvidia-kernel-open-dkms"]
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


# ------------------------------------------------------------------------------------------
# Two driver versions: what a driver rollout in the lab installs (more_versions)


def test_every_driver_package_is_offered_at_both_versions(built: Path) -> None:
    specs = repo.load_specs()
    versions: dict[str, set[str]] = {}
    for spec in specs:
        versions.setdefault(spec.name, set()).add(spec.version)
    for name in DRIVER_PACKAGES:
        assert versions[name] == {DRIVER, NEWER}, name
    assert all(len(v) == 1 for n, v in versions.items() if n not in DRIVER_PACKAGES)
    for spec in specs:
        assert spec.default == (spec.version != NEWER), spec
        assert _deb(built, spec).is_file()
        if spec.version == NEWER:  # its dependencies are pinned to the same version
            assert all(DRIVER not in d for d in spec.depends), spec
    # Fabric Manager does not pin the driver's version (a driver upgrade goes first)
    fm = [s for s in specs if s.name == "nvidia-fabricmanager-570"]
    assert all(s.depends == ("libnvidia-ml1",) for s in fm)


def test_driver_packages_ship_their_version_for_the_simulator(built: Path, tmp_path: Path) -> None:
    from gpuctl.lab.sim import driver

    specs = {(s.name, s.version): s for s in repo.load_specs()}
    for name, path in driver.VERSION_FILES.items():
        for version in (DRIVER, NEWER):
            spec = specs[name, version]
            assert spec.version_file == path
            out = tmp_path / f"{name}-{version}"
            subprocess.run(["dpkg-deb", "-x", str(_deb(built, spec)), str(out)], check=True)
            text = (out / path.lstrip("/")).read_text()
            assert text == version.rsplit("-", 1)[0] + "\n"
    assert specs["libnvidia-ml1", NEWER].upstream_version == "570.195.03"
    assert specs["datacenter-gpu-manager-4-core", "1:4.4.1-1"].upstream_version == "4.4.1"


def test_more_versions_of_an_unknown_placeholder_are_refused(tmp_path: Path) -> None:
    doc = tmp_path / "packages.yml"
    doc.write_text(
        "versions: {driver: '1.0-1'}\nmore_versions: {drvier: ['2.0-1']}\npackages: []\n"
    )
    with pytest.raises(ValueError, match="unknown placeholders"):
        repo.load_specs(doc)


def _apt_root(built: Path, tmp_path: Path, installed: dict[str, str]) -> list[str]:
    """apt options for a private root: the node's sources with the lab repository as file:
    URIs, and a dpkg status with python3, kmod and ``installed`` (name -> version of the
    repository's stanza; "hold:" in front holds it)."""
    root = tmp_path / "root"
    repo.configure_node_apt(root)
    assert not (root / repo.APT_PROXY_CONF).exists()  # the lab gives nodes no proxy
    source = root / repo.APT_SOURCE
    source.write_text(source.read_text().replace(repo.REPO_URL, f"file:{built}"))
    for d in ("var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/lib/dpkg"):
        (root / d).mkdir(parents=True, exist_ok=True)
    index = _index(built)
    status = [
        f"Package: {name}\nStatus: install ok installed\nVersion: {v}\nArchitecture: amd64\n"
        for name, v in (("python3", "3.11.2-1+b1"), ("kmod", "30+20221128-1"))
    ]
    for name, version in installed.items():
        held, _, version = version.rpartition(":")
        fields = index[name, version]
        lines = [f"Package: {name}", f"Status: {held or 'install'} ok installed"]
        lines += [
            f"{k}: {fields[k]}" for k in ("Version", "Architecture", "Depends") if k in fields
        ]
        status.append("\n".join(lines) + "\n")
    (root / "var/lib/dpkg/status").write_text("\n".join(status))
    opts = [
        f"-oDir={root}",
        f"-oDir::State::status={root}/var/lib/dpkg/status",
        "-oDebug::NoLocking=1",
        "-oAPT::Architecture=amd64",
        "-oDir::Etc::TrustedParts=/nonexistent",
    ]
    subprocess.run(["apt-get", *opts, "-q", "update"], check=True, capture_output=True)
    return opts


ROLE_PACKAGES = ("nvidia-open", "nvidia-driver", "nvidia-kernel-open-dkms", "nvidia-smi",
                 "libnvidia-ml1", "nvidia-persistenced")  # fmt: skip


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt")
def test_apt_installs_the_default_unless_asked_and_either_pin(built: Path, tmp_path: Path) -> None:
    def apt(opts: list[str], *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["apt-get", *opts, "-s", "-q", "--allow-downgrades", "--allow-change-held-packages",
             "install", *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip

    fresh = _apt_root(built, tmp_path / "fresh", {})
    plain = apt(fresh, "nvidia-open", "nvidia-fabricmanager-570")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert f"Inst nvidia-open ({DRIVER} " in plain.stdout
    assert f"Inst nvidia-fabricmanager-570 ({DRIVER} " in plain.stdout
    # a node provisioned at the default, every package held (the roles hold them): the
    # nvidia_driver role's pins of the newer version, then the fabric_manager role's
    held = dict.fromkeys(DRIVER_PACKAGES - {"cuda-drivers-570"}, f"hold:{DRIVER}")
    node = _apt_root(built, tmp_path / "node", held)
    up = apt(node, *(f"{name}={NEWER}" for name in ROLE_PACKAGES))
    assert up.returncode == 0, up.stdout + up.stderr
    for name in ROLE_PACKAGES:
        assert f"Inst {name} [{DRIVER}] ({NEWER} " in up.stdout
    assert "Remv" not in up.stdout  # Fabric Manager stays, at its version, until its role runs
    fm = apt(node, f"nvidia-fabricmanager-570={NEWER}", f"libnvidia-nscq-570={NEWER}")
    assert fm.returncode == 0, fm.stdout + fm.stderr
    assert f"Inst nvidia-fabricmanager-570 [{DRIVER}] ({NEWER} " in fm.stdout
    # and back (a rollout to the lab's pin): a downgrade, Fabric Manager still at the newer one
    newer = dict.fromkeys(DRIVER_PACKAGES - {"cuda-drivers-570"}, f"hold:{NEWER}")
    back = apt(
        _apt_root(built, tmp_path / "back", newer), *(f"{n}={DRIVER}" for n in ROLE_PACKAGES)
    )
    assert back.returncode == 0, back.stdout + back.stderr
    assert f"Inst nvidia-open [{NEWER}] ({DRIVER} " in back.stdout
    assert "Remv" not in back.stdout


_BEST_MATCH = """
import json, sys
sys.path.insert(0, sys.argv[1])
import apt_pkg
apt_pkg.init_config()
for option in sys.argv[3:]:
    key, _, value = option[2:].partition("=")
    apt_pkg.config.set(key, value)
apt_pkg.init_system()
from ansible.modules.apt import package_best_match
cache = apt_pkg.Cache(None)
out = {}
for name in json.loads(sys.argv[2]):
    for version in (None, "{driver}", "{newer}"):
        out[f"{name}={version}"] = package_best_match(
            name, "=" if version else None, version, None, cache
        )
print(json.dumps(out))
"""


def _system_python_apt() -> bool:
    res = subprocess.run(
        ["/usr/bin/python3", "-c", "import apt_pkg"], capture_output=True, check=False
    )
    return res.returncode == 0


@pytest.mark.skipif(
    shutil.which("apt-get") is None or not Path("/usr/bin/python3").exists()
    or not _system_python_apt(),
    reason="needs apt and python3-apt",
)  # fmt: skip
def test_ansibles_apt_module_finds_either_pinned_version(built: Path, tmp_path: Path) -> None:
    """The roles install ``NAME=VERSION`` with ansible.builtin.apt, which picks the candidate
    through python-apt with a pin of its own (priority 1001) added after the node's: on a fresh
    node, at the default and at the newer version, both versions must come out of it (a pin in
    the node's apt preferences would hide one: apt keeps the first pin matching a version), and
    for a name alone the default, or the newer one once installed (no downgrade)."""
    import sysconfig

    names = [*ROLE_PACKAGES, "nvidia-fabricmanager-570", "libnvidia-nscq-570"]
    code = _BEST_MATCH.replace("{driver}", DRIVER).replace("{newer}", NEWER)
    for at in (None, DRIVER, NEWER):
        installed = dict.fromkeys(names, f"hold:{at}") if at else {}
        opts = _apt_root(built, tmp_path / str(at), installed)
        res = subprocess.run(
            ["/usr/bin/python3", "-c", code, sysconfig.get_paths()["purelib"], json.dumps(names),
             *opts],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        best = json.loads(res.stdout)
        for name in names:
            assert best[f"{name}=None"] == (at or DRIVER), (at, name)
            assert best[f"{name}={DRIVER}"] == DRIVER, (at, name)
            assert best[f"{name}={NEWER}"] == NEWER, (at, name)
