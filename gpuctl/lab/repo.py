"""Packages for lab nodes, the way a real cluster gets them: an apt proxy and a package repository.

- **apt proxy**: Debian's apt-cacher-ng, run in the foreground by the lab, bound to the bridge
  address only (198.18.0.1:3142), its cache in ``<lab dir>/apt-cache``. Nodes have no route
  anywhere but the bridge: they reach deb.debian.org through this proxy and nothing else.
- **lab repository**: ``.deb`` stand-ins under NVIDIA's real package names and versions
  (``repo_packages.yml``), built with ``dpkg-deb --build`` into ``<lab dir>/repo`` as a flat
  apt repository (Packages, Packages.gz, Release) and served by ``python3 -m http.server`` bound
  to 198.18.0.1:8081. The driver stand-in ships the simulator (``gpuctl/lab/sim``) and
  ``/usr/bin/nvidia-smi``; nothing of it is installed anywhere but inside lab nodes. The
  packages' further versions (``more_versions``) are a second flat repository, ``more/``,
  whose Release says ``NotAutomatic: yes`` and ``ButAutomaticUpgrades: yes`` as Debian's
  backports do: apt gives it priority 100, so it installs them only when asked for by version.

Both servers are lab-owned processes: pid file and log under ``<lab dir>/run``, started by
`gpuctl lab up` (idempotent) and ended by `gpuctl lab down`.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import signal
import socket
import stat
import string
import sys
import tempfile
import time
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Any

import yaml

from gpuctl.lab import git_trees
from gpuctl.lab.git_trees import source_tree
from gpuctl.lab.system import LabError, run, spawn
from gpuctl.lab.system import lab_dir as _lab_dir
from gpuctl.lab.system import run_dir as _run_dir

HOST_ADDRESS = "198.18.0.1"
PROXY_PORT = 3142
REPO_PORT = 8081
PROXY_URL = f"http://{HOST_ADDRESS}:{PROXY_PORT}"
REPO_URL = f"http://{HOST_ADDRESS}:{REPO_PORT}"
STANDIN_NOTICE = "gpuctl lab SIMULATION stand-in, not the real package"
SIM_PREFIX = "/usr/lib/gpuctl-lab-sim"
PACKAGES_YML = Path(__file__).with_name("repo_packages.yml")
APT_PROXY_CONF = "etc/apt/apt.conf.d/01gpuctl-lab-proxy"
APT_SOURCE = "etc/apt/sources.list.d/gpuctl-lab.list"
APT_PREFERENCES = "etc/apt/preferences.d/gpuctl-lab-standins"
# stand-ins under names Debian's main archive also has: Debian 13's real versions (rdma-core 56.1,
# perftest 25.01, pciutils 3.13) are above the stand-ins', so the lab pins its own (a real
# cluster gets Debian's)
DEBIAN_NAMED_STANDINS = ("infiniband-diags", "ibverbs-utils", "perftest", "pciutils")
MORE_DIR = "more"  # the further versions' repository, under the lab repository
ORIGIN = "gpuctl-lab"
_STAMP = ".gpuctl-repo-stamp"


def repo_dir() -> Path:
    return _lab_dir() / "repo"


def cache_dir() -> Path:
    return _lab_dir() / "apt-cache"


# ------------------------------------------------------------------------------------------
# Package definitions


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A systemd unit a stand-in package ships: ``daemon`` (a stand-in tool) runs and stays up."""

    name: str  # unit name without .service
    daemon: str  # the stand-in tool the unit runs (its checks and faults apply)
    args: str  # ExecStart arguments, as the real unit has them
    description: str


@dataclass(frozen=True, slots=True)
class PackageSpec:
    name: str
    version: str
    architecture: str
    depends: tuple[str, ...]
    description: str
    sim: bool
    bin: tuple[str, ...]
    service: ServiceSpec | None
    source: str
    modules: tuple[str, ...] = ()  # kernel modules: modprobe.d install lines + device nodes
    files: tuple[tuple[str, str], ...] = ()  # (absolute path, text) shipped as they are
    executable: tuple[str, ...] = ()  # which of ``files`` are 0755
    version_file: str | None = None  # a file holding the upstream version (the simulator reads it)
    default: bool = True  # False: a version of ``more_versions`` (in the more/ repository)

    @property
    def deb_name(self) -> str:
        # the epoch is not part of a .deb file name (dpkg-name drops it too)
        version = self.version.split(":", 1)[-1]
        return f"{self.name}_{version}_{self.architecture}.deb"

    @property
    def upstream_version(self) -> str:
        """``[epoch:]upstream[-revision]`` -> upstream (Debian Policy 5.6.12)."""
        version = self.version.split(":", 1)[-1]
        return version.rsplit("-", 1)[0] if "-" in version else version


def _service_spec(value: Any) -> ServiceSpec | None:
    if not value:
        return None
    return ServiceSpec(
        name=str(value["name"]),
        daemon=str(value["daemon"]),
        args=str(value.get("args", "")),
        description=str(value["description"]),
    )


def _placeholders(p: dict[str, Any]) -> set[str]:
    """The ``{name}`` placeholders a package's version and Depends use."""
    texts = [str(p["version"]), *(str(d) for d in p.get("depends") or ())]
    return {field for text in texts for _, field, _, _ in string.Formatter().parse(text) if field}


def load_specs(path: Path = PACKAGES_YML) -> list[PackageSpec]:
    """Every package at every version the repository offers: each at ``versions`` (the
    default), then once more per entry of ``more_versions`` of a placeholder it uses."""
    doc: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    versions = {k: str(v) for k, v in doc["versions"].items()}
    more = {k: [str(v) for v in vs] for k, vs in (doc.get("more_versions") or {}).items()}
    unknown = set(more) - set(versions)
    if unknown:
        raise ValueError(f"{path}: more_versions of unknown placeholders {sorted(unknown)}")
    specs = []
    for p in doc["packages"]:
        variants = [versions]
        for key in sorted(_placeholders(p) & set(more)):
            variants += [{**versions, key: value} for value in more[key]]
        for values in variants:
            specs.append(_package_spec(p, values, default=values is versions))
    return specs


def _package_spec(p: dict[str, Any], versions: dict[str, str], *, default: bool) -> PackageSpec:
    return PackageSpec(
        name=str(p["name"]),
        version=str(p["version"]).format(**versions),
        architecture=str(p.get("architecture", "amd64")),
        depends=tuple(str(d).format(**versions) for d in p.get("depends") or ()),
        description=str(p["description"]),
        sim=bool(p.get("sim", False)),
        bin=tuple(str(b) for b in p.get("bin") or ()),
        service=_service_spec(p.get("service")),
        source=str(p.get("source", "")),
        modules=tuple(str(m) for m in p.get("modules") or ()),
        files=tuple((str(k), str(v)) for k, v in (p.get("files") or {}).items()),
        executable=tuple(str(x) for x in p.get("executable") or ()),
        version_file=str(p["version_file"]) if p.get("version_file") else None,
        default=default,
    )


# ------------------------------------------------------------------------------------------
# Building the .deb files and the index


def standin_launcher(tool: str) -> str:
    """The launcher of stand-in ``tool`` for a file the lab writes itself, outside a package
    (``rdma``: iproute2's is real and stays installed)."""
    return _wrapper(tool)


def _wrapper(tool: str, suffix: str = "") -> str:
    """The launcher of a stand-in tool: the simulator's handler of the program's own name, plus
    ``suffix`` (``+cuda``: perftest built with CUDA)."""
    handler = "os.path.basename(sys.argv[0])" + (f' + "{suffix}"' if suffix else "")
    return (
        "#!/usr/bin/python3\n"
        f'"""{tool}: {STANDIN_NOTICE} (the gpuctl lab simulator)."""\n'
        "import os\n"
        "import sys\n\n"
        f'sys.path.insert(0, "{SIM_PREFIX}")\n'
        "try:\n"
        "    from gpuctl.lab.sim.standin import main\n"
        "except ImportError as exc:\n"
        f'    sys.exit(f"{tool}: the gpuctl lab simulator is incomplete ({{exc}})")\n\n'
        f"sys.exit(main({handler}, sys.argv[1:]))\n"
    )


def _service_runner(tool: str) -> str:
    """The unit's ExecStart: run the stand-in once (its checks, its faults), then stay up."""
    return (
        "#!/usr/bin/python3\n"
        f'"""{tool} service: {STANDIN_NOTICE}; runs the stand-in, then stays running."""\n'
        "import signal\n"
        "import sys\n\n"
        f'sys.path.insert(0, "{SIM_PREFIX}")\n'
        "from gpuctl.lab.sim.standin import main  # noqa: E402\n\n"
        f'rc = main("{tool}", sys.argv[1:])\n'
        "if rc != 0:\n"
        "    sys.exit(rc)\n"
        "print('" + tool + ": running (gpuctl lab simulation)', flush=True)\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "while True:\n"
        "    signal.pause()\n"
    )


def _unit(service: ServiceSpec) -> str:
    exec_start = f"{SIM_PREFIX}/{service.name}-service {service.args}".rstrip()
    return (
        "[Unit]\n"
        f"Description={service.description} ({STANDIN_NOTICE})\n"
        "After=network-online.target\n\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={exec_start}\n"
        "TimeoutStopSec=10\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


DEVICES_UNIT = "gpuctl-lab-nvidia-devices.service"
DEVICES_SCRIPT = f"{SIM_PREFIX}/kernel/nvidia-devices"
MODPROBE_CONF = "etc/modprobe.d/gpuctl-lab-nvidia.conf"


def _devices_unit() -> str:
    """Boot: the device nodes the loaded module would give the node (see sim/devices.py)."""
    return (
        "[Unit]\n"
        f"Description=NVIDIA device nodes /dev/nvidia* ({STANDIN_NOTICE})\n"
        "DefaultDependencies=no\n"
        "After=systemd-tmpfiles-setup-dev.service\n"
        "Before=sysinit.target shutdown.target nvidia-persistenced.service slurmd.service\n"
        "Conflicts=shutdown.target\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart={DEVICES_SCRIPT}\n\n"
        "[Install]\n"
        "WantedBy=sysinit.target\n"
    )


def _modprobe_conf(modules: tuple[str, ...]) -> str:
    """``install``/``remove`` lines: modprobe runs these instead of (un)loading a module."""
    lines = [
        f"# {STANDIN_NOTICE}: a lab node (a container) has no kernel modules;",
        "# modprobe runs these commands instead (man modprobe.d, install / remove).",
    ]
    for module in modules:
        lines.append(f"install {module} {DEVICES_SCRIPT} modprobe {module}")
        lines.append(f"remove {module} /bin/true")
    return "\n".join(lines) + "\n"


def _maintainer_scripts(spec: PackageSpec) -> dict[str, str]:
    """DEBIAN/postinst and prerm of a kernel module stand-in: its devices unit enabled and run.

    Service units (Fabric Manager, DCGM) are not enabled on install: NVIDIA's packages leave
    that to the administrator ("systemctl enable --now ..." in their install guides).
    """
    if not spec.modules:
        return {}
    postinst = (
        f"#!/bin/sh\n# {STANDIN_NOTICE}\nset -e\n"
        'if [ "$1" = configure ]; then\n'
        f"    systemctl enable {DEVICES_UNIT} >/dev/null 2>&1 || true\n"
        "    if [ -d /run/systemd/system ]; then\n"
        "        systemctl daemon-reload\n"
        f"        systemctl start {DEVICES_UNIT}\n"
        "    fi\n"
        "fi\n"
    )
    prerm = (
        f"#!/bin/sh\n# {STANDIN_NOTICE}\nset -e\n"
        'if [ "$1" = remove ] && [ -d /run/systemd/system ]; then\n'
        f"    systemctl disable --now {DEVICES_UNIT} >/dev/null 2>&1 || true\n"
        "fi\n"
    )
    return {"postinst": postinst, "prerm": prerm}


def _sim_sources(src_root: Path) -> list[tuple[Path, str]]:
    """(file on this machine, path under SIM_PREFIX) for the simulator as it is right now."""
    pkg = src_root / "gpuctl"
    files = [(pkg / "__init__.py", "gpuctl/__init__.py")]
    files.append((pkg / "lab" / "__init__.py", "gpuctl/lab/__init__.py"))
    sim = pkg / "lab" / "sim"
    for f in sorted(sim.rglob("*")):
        rel = f.relative_to(sim)
        if rel.parts[0] == "bmc":  # the simulated BMCs run on the lab host, not in a node
            continue
        if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".pyo"):
            files.append((f, f"gpuctl/lab/sim/{rel.as_posix()}"))
    if not (sim / "__init__.py").is_file():
        files.append((Path(os.devnull), "gpuctl/lab/sim/__init__.py"))
    return files


def control_text(spec: PackageSpec, installed_kib: int = 1) -> str:
    fields = [
        ("Package", spec.name),
        ("Version", spec.version),
        ("Architecture", spec.architecture),
        ("Maintainer", "gpuctl lab <gpuctl-lab@localhost>"),
        ("Installed-Size", str(max(installed_kib, 1))),
    ]
    if spec.depends:
        fields.append(("Depends", ", ".join(spec.depends)))
    fields += [
        ("Section", "non-free/libs"),
        ("Priority", "optional"),
        ("Description", f"{spec.description} ({STANDIN_NOTICE})"),
    ]
    body = "".join(f"{k}: {v}\n" for k, v in fields)
    return body + (
        f" {STANDIN_NOTICE}: built by gpuctl for lab nodes only; it drives no hardware.\n"
        f" Name and version as in NVIDIA's repository; see gpuctl/lab/repo_packages.yml.\n"
    )


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)


def build_deb(spec: PackageSpec, out_dir: Path, src_root: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="gpuctl-deb-") as tmp:
        root = Path(tmp) / "pkg"
        doc = root / "usr" / "share" / "doc" / spec.name / "README.gpuctl-lab"
        _write(doc, f"{spec.name} {spec.version}: {STANDIN_NOTICE}.\nSource: {spec.source}\n")
        if spec.sim:
            for src, rel in _sim_sources(src_root):
                dest = root / SIM_PREFIX.lstrip("/") / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
                os.chmod(dest, 0o644)
        for tool in spec.bin:
            # a name goes to /usr/bin; an absolute path (a tool a package keeps elsewhere,
            # such as DCGM's nvbandwidth under /usr/libexec) to that path
            where = root / tool.lstrip("/") if tool.startswith("/") else root / "usr" / "bin" / tool
            _write(where, _wrapper(os.path.basename(tool)), 0o755)
        if spec.service:
            svc = spec.service
            runner = root / SIM_PREFIX.lstrip("/") / f"{svc.name}-service"
            _write(runner, _service_runner(svc.daemon), 0o755)
            _write(root / "lib" / "systemd" / "system" / f"{svc.name}.service", _unit(svc))
        for path, text in spec.files:
            _write(root / path.lstrip("/"), text, 0o755 if path in spec.executable else 0o644)
        if spec.version_file:
            _write(root / spec.version_file.lstrip("/"), f"{spec.upstream_version}\n")
        if spec.modules:
            script = src_root / "gpuctl" / "lab" / "sim" / "devices.py"
            text = "#!/usr/bin/python3\n" + script.read_text(encoding="utf-8")
            _write(root / DEVICES_SCRIPT.lstrip("/"), text, 0o755)
            _write(root / "lib" / "systemd" / "system" / DEVICES_UNIT, _devices_unit())
            _write(root / MODPROBE_CONF, _modprobe_conf(spec.modules))
            _write(root / "DEBIAN" / "conffiles", f"/{MODPROBE_CONF}\n")
        for name, text in _maintainer_scripts(spec).items():
            _write(root / "DEBIAN" / name, text, 0o755)
        for d in root.rglob("*"):
            if d.is_dir():
                os.chmod(d, 0o755)  # noqa: S103 - package directories are 0755
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        control = root / "DEBIAN" / "control"
        _write(control, control_text(spec, (size + 1023) // 1024))
        os.chmod(control.parent, 0o755)  # noqa: S103 - DEBIAN/ must be 0755
        out = out_dir / spec.deb_name
        run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
            timeout=120,
        )
    return out


def _digests(path: Path) -> dict[str, str]:
    data = path.read_bytes()
    return {
        "MD5sum": hashlib.md5(data).hexdigest(),  # noqa: S324 - apt index field, not security
        "SHA1": hashlib.sha1(data).hexdigest(),  # noqa: S324 - apt index field
        "SHA256": hashlib.sha256(data).hexdigest(),
    }


def _deb_control(deb: Path) -> str:
    return run(["dpkg-deb", "--field", str(deb)], timeout=60).stdout.rstrip("\n")


def write_index(
    repo: Path, *, more: bool = False, origin: str = ORIGIN, description: str | None = None
) -> None:
    """Packages, Packages.gz and Release for a flat repository (``deb ... ./``); ``more``: the
    further versions' one, which apt uses only when asked (NotAutomatic, as backports)."""
    stanzas = []
    for deb in sorted(repo.glob("*.deb")):
        control = _deb_control(deb)
        sums = _digests(deb)
        extra = [f"Filename: ./{deb.name}", f"Size: {deb.stat().st_size}"]
        extra += [f"{k}: {v}" for k, v in sums.items()]
        # the index keeps the control file's order, with the file fields before Description
        lines = control.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("Description:"))
        stanzas.append("\n".join(lines[:at] + extra + lines[at:]))
    packages = ("\n\n".join(stanzas) + "\n").encode("utf-8")
    (repo / "Packages").write_bytes(packages)
    with gzip.GzipFile(repo / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(packages)
    suite = f"{origin}-{MORE_DIR}" if more else origin
    release = [
        f"Origin: {origin}",
        f"Label: {origin}",
        f"Suite: {suite}",
        f"Codename: {suite}",
        f"Date: {formatdate(usegmt=True)}",
        "Architectures: amd64 all",
    ]
    if more:
        # apt_preferences(5): priority 100 for such an archive: installed when asked for by
        # version (NAME=VERSION, what the roles install), upgraded once installed, else never
        release += ["NotAutomatic: yes", "ButAutomaticUpgrades: yes"]
    release.append(
        f"Description: {description or f'gpuctl lab package repository ({STANDIN_NOTICE}s)'}"
    )
    for field, algo in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        release.append(f"{field}:")
        for name in ("Packages", "Packages.gz"):
            data = (repo / name).read_bytes()
            digest = hashlib.new(algo, data).hexdigest()
            release.append(f" {digest} {len(data)} {name}")
    (repo / "Release").write_text("\n".join(release) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------
# Git repositories (served as dumb HTTP git: a bare repository after `git update-server-info`)

GIT_DATE = "2025-06-01T00:00:00+00:00"  # fixed: the same commit ids on every build


@dataclass(frozen=True, slots=True)
class GitRepoSpec:
    name: str  # served at <REPO_URL>/git/<name>.git
    tag: str
    bins: tuple[str, ...]
    source: str


def load_git_specs(path: Path = PACKAGES_YML) -> list[GitRepoSpec]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [
        GitRepoSpec(
            name=str(g["name"]),
            tag=str(g["tag"]),
            bins=tuple(str(b) for b in g["bins"]),
            source=str(g.get("source", "")),
        )
        for g in doc.get("git_repositories") or ()
    ]


def git_url(name: str) -> str:
    return f"{REPO_URL}/git/{name}.git"


def _git(cwd: Path, *args: str) -> None:
    env = {
        "GIT_AUTHOR_NAME": "gpuctl lab",
        "GIT_AUTHOR_EMAIL": "gpuctl-lab@localhost",
        "GIT_COMMITTER_NAME": "gpuctl lab",
        "GIT_COMMITTER_EMAIL": "gpuctl-lab@localhost",
        "GIT_AUTHOR_DATE": GIT_DATE,
        "GIT_COMMITTER_DATE": GIT_DATE,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    run(["git", "-C", str(cwd), *args], env=env, timeout=60)


def build_git_repo(spec: GitRepoSpec, out_dir: Path) -> Path:
    """A bare repository ``out_dir/<name>.git`` with one commit tagged ``spec.tag``."""
    bare = out_dir / f"{spec.name}.git"
    with tempfile.TemporaryDirectory(prefix="gpuctl-git-") as tmp:
        work = Path(tmp) / spec.name
        tree = source_tree(spec.name, spec.bins, spec.source, STANDIN_NOTICE, _wrapper)
        for rel, (text, mode) in tree.items():
            _write(work / rel, text, mode)
        _git(work, "init", "-q", "-b", "master")
        _git(work, "add", "-A")
        _git(work, "commit", "-q", "-m", f"{spec.name} {spec.tag}: {STANDIN_NOTICE}")
        _git(work, "tag", "-a", spec.tag, "-m", f"{spec.name} {spec.tag}")
        out_dir.mkdir(parents=True, exist_ok=True)
        run(["git", "clone", "-q", "--bare", str(work), str(bare)], timeout=60)
    _git(bare, "update-server-info")  # the files a dumb HTTP client reads (info/refs, packs)
    return bare


def _source_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _inputs_digest(src_root: Path) -> str:
    h = hashlib.sha256()
    own = [Path(__file__), Path(git_trees.__file__), PACKAGES_YML]
    for path in own + [s for s, _ in _sim_sources(src_root)]:
        h.update(str(path).encode())
        with contextlib.suppress(OSError):
            h.update(path.read_bytes())
    return h.hexdigest()


def build_repo(dest: Path | None = None, src_root: Path | None = None) -> bool:
    """Build the lab repository into ``dest``; False (and nothing done) when it is current.

    The stamp covers this module, git_trees.py, repo_packages.yml and every simulator file, so
    a changed simulator or stand-in source tree is built again on the next `gpuctl lab up`.
    """
    dest = dest or repo_dir()
    src_root = src_root or _source_root()
    want = _inputs_digest(src_root)
    stamp = dest / _STAMP
    if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == want:
        return False
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=dest))
    try:
        (tmp / MORE_DIR).mkdir()
        for spec in load_specs():
            build_deb(spec, tmp if spec.default else tmp / MORE_DIR, src_root)
        write_index(tmp)
        write_index(tmp / MORE_DIR, more=True)
        for git_spec in load_git_specs():
            build_git_repo(git_spec, tmp / "git")
        # replace the contents in place: the server keeps serving the same directory
        for old in dest.iterdir():
            if old.name != tmp.name and (old.suffix == ".deb" or old.name.startswith("Pack")):
                old.unlink()
        shutil.rmtree(dest / "git", ignore_errors=True)
        shutil.rmtree(dest / MORE_DIR, ignore_errors=True)
        for new in tmp.iterdir():
            new.replace(dest / new.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stamp.write_text(want + "\n", encoding="utf-8")
    return True


# ------------------------------------------------------------------------------------------
# The two servers


@dataclass(frozen=True, slots=True)
class Service:
    name: str  # pid file / log name under run/
    port: int
    marker: str  # a string in the process's command line (guards against a reused pid)

    def argv(self) -> list[str]:
        if self.name == "apt-proxy":
            cache = cache_dir()
            return [
                "/usr/sbin/apt-cacher-ng",
                "-c",
                str(_proxy_conf_dir()),
                "ForeGround=1",
                f"BindAddress={HOST_ADDRESS}",
                f"Port={self.port}",
                f"CacheDir={cache}",
                f"LogDir={cache / 'log'}",
                f"SocketPath={_lab_dir() / 'run' / 'apt-proxy.socket'}",
            ]
        return [
            sys.executable,
            "-m",
            "http.server",
            "--bind",
            HOST_ADDRESS,
            str(self.port),
            "--directory",
            str(repo_dir()),
        ]


def _proxy_conf_dir() -> Path:
    return _lab_dir() / "apt-proxy"


ACNG_CONF = """\
# gpuctl lab apt proxy (written by gpuctl/lab/repo.py on every start; edits are lost).
# Not /etc/apt-cacher-ng: its Debian remap sends deb.debian.org requests to the mirrors of
# backends_debian (ftp.debian.org when that is empty); here each request goes to the host the
# node asked for (deb.debian.org from the node's sources.list), and is cached by that name.
SupportDir: /usr/lib/apt-cacher-ng
ReportPage: acng-report.html
ExThreshold: 4
"""


def _write_proxy_conf() -> None:
    d = _proxy_conf_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / "acng.conf").write_text(ACNG_CONF, encoding="utf-8")


PROXY = Service("apt-proxy", PROXY_PORT, "apt-cacher-ng")
REPO_SERVER = Service("repo-http", REPO_PORT, "http.server")
SERVICES = (PROXY, REPO_SERVER)


def _pidfile(svc: Service) -> Path:
    return _run_dir() / f"{svc.name}.pid"


def service_pid(svc: Service) -> int | None:
    try:
        pid = int(_pidfile(svc).read_text(encoding="utf-8").strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[-1].split()
    except (OSError, ValueError):
        return None
    if state[0] == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return None
    return pid if svc.marker in cmdline else None


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST_ADDRESS, port)) == 0


def start_service(svc: Service, timeout: float = 15) -> bool:
    """Start one server unless it runs; True when it was started now."""
    if service_pid(svc) is not None:
        return False
    if svc is PROXY:
        if not Path("/usr/sbin/apt-cacher-ng").exists():
            raise LabError("apt-cacher-ng is not installed (run scripts/bootstrap.sh --lab)")
        (cache_dir() / "log").mkdir(parents=True, exist_ok=True)
        _write_proxy_conf()
    if _port_open(svc.port):
        raise LabError(f"{HOST_ADDRESS}:{svc.port} is taken by a process the lab did not start")
    proc = spawn(svc.argv(), _run_dir() / f"{svc.name}.log", cwd="/")
    _pidfile(svc).write_text(f"{proc.pid}\n", encoding="utf-8")
    deadline = time.monotonic() + timeout
    while not _port_open(svc.port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_service(svc)
            raise LabError(
                f"{svc.name} did not start on {HOST_ADDRESS}:{svc.port} "
                f"(see {_run_dir()}/{svc.name}.log)"
            )
        time.sleep(0.05)
    return True


def stop_service(svc: Service, timeout: float = 10) -> None:
    pid = service_pid(svc)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while service_pid(svc) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        if service_pid(svc) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while service_pid(svc) is not None and time.monotonic() < deadline + 5:
                time.sleep(0.05)
    _pidfile(svc).unlink(missing_ok=True)
    (_run_dir() / f"{svc.name}.socket").unlink(missing_ok=True)


def start_services() -> list[str]:
    """Build the repository when stale and start both servers (idempotent); names started."""
    build_repo()
    return [svc.name for svc in SERVICES if start_service(svc)]


def stop_services() -> None:
    for svc in SERVICES:
        stop_service(svc)


# ------------------------------------------------------------------------------------------
# Node configuration


def proxy_conf() -> str:
    return (
        "// gpuctl lab: Debian packages through the lab's apt proxy (apt-cacher-ng on the bridge)\n"
        f'Acquire::http::Proxy "{PROXY_URL}";\n'
        f'Acquire::http::Proxy::{HOST_ADDRESS} "DIRECT";\n'
    )


def source_list() -> str:
    return (
        f"# gpuctl lab repository: {STANDIN_NOTICE}s under NVIDIA's package names\n"
        f"deb [trusted=yes] {REPO_URL} ./\n"
        "# their further versions (a driver to roll out to), installed only when asked for by\n"
        "# version, as backports are (its Release: NotAutomatic, ButAutomaticUpgrades)\n"
        f"deb [trusted=yes] {REPO_URL}/{MORE_DIR} ./\n"
    )


def standin_preferences() -> str:
    return (
        "# gpuctl lab: its SIMULATED stand-ins win over Debian's real packages of the same name\n"
        f"Package: {' '.join(DEBIAN_NAMED_STANDINS)}\n"
        f"Pin: release o={ORIGIN},a={ORIGIN}\n"
        "Pin-Priority: 1001\n"
    )


def configure_node_apt(root: Path) -> None:
    """Add the lab repository to a node's apt sources (its root, before boot), as a site's
    mirror would be. No proxy: the proxy or OS mirror comes from cluster.yml's package_sources
    when gpuctl provisions the node (preflight), so until then the node reaches no Debian
    archive, as a fresh node behind a proxy does not. proxy_conf() is for tests that run apt on
    unprovisioned nodes."""
    (root / APT_PROXY_CONF).unlink(missing_ok=True)
    for rel, text in ((APT_SOURCE, source_list()), (APT_PREFERENCES, standin_preferences())):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
