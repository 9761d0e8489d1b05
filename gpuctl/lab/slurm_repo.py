"""The lab's separate Slurm repository: Debian's Slurm build under SchedMD's package names.

A real cluster often takes Slurm from somewhere other than its OS: a site repository or
SchedMD-built packages (``package_sources.slurm`` of cluster.yml, ``packages: schedmd``). To
show that path, the lab serves the Slurm of the lab's node OS as SchedMD names its packages:
Debian's own ``.deb`` files (real binaries, nothing rebuilt or simulated) with only their
control files changed: ``slurmd`` becomes ``slurm-smd-slurmd``, ``slurmctld``
``slurm-smd-slurmctld``, ``slurm-client`` ``slurm-smd-client``, ``slurm-wlm-basic-plugins``
(plugins and libslurm) ``slurm-smd``, each conflicting with and replacing Debian's name, as
SchedMD's debian/control does. They are served as a flat repository at
``http://198.18.0.1:8081/slurm`` (``repo/slurm/`` under the lab directory). The OS archive has no
package of these names, so a node that has them took them from here; the lab repository's
server logs every file a node fetches, which the lab test reads as well.

Which packages: slurmctld, slurmd, slurm-client and every package of their dependency closure
built from Debian's ``slurm-wlm`` source, downloaded on this host with a private apt state
through the lab's apt proxy, with Debian's archive keys checked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from gpuctl.lab import repo
from gpuctl.lab.system import LabError, run

DIR = "slurm"
ROOTS = ("slurmctld", "slurmd", "slurm-client")
SOURCE = "slurm-wlm"  # Debian's source package of Slurm
ARCHIVE = os.environ.get("GPUCTL_LAB_MIRROR", "http://deb.debian.org/debian")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
ORIGIN = "gpuctl-lab-slurm"
_STAMP = ".gpuctl-slurm-stamp"
# Debian's name -> SchedMD's (https://github.com/SchedMD/slurm/blob/master/debian/control)
RENAMES = {
    "slurmd": "slurm-smd-slurmd",
    "slurmctld": "slurm-smd-slurmctld",
    "slurm-client": "slurm-smd-client",
    "slurm-wlm-basic-plugins": "slurm-smd",
}
_RELATIONS = ("Depends", "Pre-Depends", "Conflicts", "Breaks", "Replaces", "Provides")
# the Slurm version each suite carries (the lab's cluster.yml pins it: software.slurm); build()
# stops when the archive has moved on, so a changed pin is a visible change here
VERSIONS = {"bookworm": "22.05.8", "trixie": "24.11.5"}


def url() -> str:
    return f"{repo.REPO_URL}/{DIR}"


def repo_path() -> Path:
    return repo.repo_dir() / DIR


def _apt_options(root: Path) -> list[str]:
    return [
        f"-oDir={root}",
        f"-oDir::State::status={root}/status",
        f"-oDir::Etc::SourceList={root}/sources.list",
        "-oDir::Etc::SourceParts=/nonexistent",
        "-oDebug::NoLocking=1",
        "-oAPT::Architecture=amd64",
        "-oAPT::Architectures::=amd64",
        f"-oAcquire::http::Proxy={repo.PROXY_URL}",
    ]


def _closure(opts: list[str]) -> list[str]:
    """ROOTS and their dependencies that Debian builds from SOURCE."""
    deps = run(
        [
            "apt-cache",
            *opts,
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            *ROOTS,
        ],
        timeout=120,
    ).stdout
    names = sorted({line.strip() for line in deps.splitlines() if line and line[0] != " "})
    names = [n for n in names if not n.startswith("<")]
    shown = run(["apt-cache", *opts, "show", "--no-all-versions", *names], timeout=120).stdout
    ours: list[str] = []
    for stanza in shown.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        source = fields.get("Source", fields.get("Package", "")).split(" ", 1)[0]
        if source == SOURCE and "Package" in fields:
            ours.append(fields["Package"])
    missing = set(ROOTS) - set(ours)
    if missing:
        raise LabError(f"Debian's archive lists no {', '.join(sorted(missing))} from {SOURCE}")
    return sorted(set(ours))


def schedmd_control(control: str) -> str:
    """Debian's control file of a Slurm package under SchedMD's names: the package renamed,
    every relation to a renamed package renamed, Recommends and Suggests dropped (they name
    Debian's other Slurm packages, which would pull Debian's names back in), and a conflict with
    Debian's own name."""
    out: list[str] = []
    old_name = ""
    for line in control.splitlines():
        field, sep, value = line.partition(": ")
        if not sep or line[0] in " \t":
            out.append(line)
            continue
        if field == "Package":
            old_name = value.strip()
            out.append(f"Package: {RENAMES.get(old_name, old_name)}")
        elif field in ("Recommends", "Suggests"):
            continue
        elif field in _RELATIONS:
            out.append(f"{field}: {_rename_relations(value)}")
        elif field == "Description":
            out.append(f"{line} (gpuctl lab: Debian's build under SchedMD's package names)")
        else:
            out.append(line)
    if old_name in RENAMES:
        for field in ("Conflicts", "Replaces"):
            at = next((i for i, ln in enumerate(out) if ln.startswith(f"{field}: ")), None)
            if at is None:
                out.insert(1, f"{field}: {old_name}")
            else:
                out[at] = f"{out[at]}, {old_name}"
    return "\n".join(out) + "\n"


def _rename_relations(value: str) -> str:
    parts = []
    for alternative in value.split(","):
        names = []
        for item in alternative.split("|"):
            name, space, rest = item.strip().partition(" ")
            names.append(f"{RENAMES.get(name, name)}{space}{rest}")
        parts.append(" | ".join(names))
    return ", ".join(parts)


def _rename(deb: Path, out: Path, work: Path) -> None:
    """Write ``deb`` into ``out`` under its SchedMD name (schedmd_control); the files inside,
    maintainer scripts included, stay Debian's."""
    shutil.rmtree(work, ignore_errors=True)
    run(["dpkg-deb", "-R", str(deb), str(work)], timeout=120)
    control = work / "DEBIAN" / "control"
    control.write_text(schedmd_control(control.read_text(encoding="utf-8")), encoding="utf-8")
    name, version, arch = deb.name.removesuffix(".deb").split("_")
    target = out / f"{RENAMES.get(name, name)}_{version}_{arch}.deb"
    run(["dpkg-deb", "-Zxz", "-b", str(work), str(target)], timeout=300)
    shutil.rmtree(work, ignore_errors=True)


def build(suite: str) -> bool:
    """Fetch Debian ``suite``'s Slurm packages into repo/slurm once; False when current."""
    dest = repo_path()
    stamp = dest / _STAMP
    want_stamp = f"{suite} {hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]}"
    if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == want_stamp:
        return False
    repo.repo_dir().mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".slurm-", dir=repo.repo_dir()))
    try:
        state = tmp / ".apt"
        for d in ("var/lib/apt/lists/partial", "var/cache/apt/archives/partial"):
            (state / d).mkdir(parents=True)
        (state / "status").write_text("", encoding="utf-8")
        (state / "sources.list").write_text(
            f"deb [signed-by={KEYRING}] {ARCHIVE} {suite} main\n", encoding="utf-8"
        )
        opts = _apt_options(state)
        run(["apt-get", *opts, "-q", "update"], timeout=600)
        packages = _closure(opts)
        want = VERSIONS.get(suite)
        listed = run(["apt-cache", *opts, "show", "--no-all-versions", "slurmd"]).stdout
        version = next(
            (v for line in listed.splitlines() if (v := line.removeprefix("Version: ")) != line),
            "",
        )
        if want is None or not version.startswith(f"{want}-"):
            raise LabError(
                f"Debian {suite} has slurmd {version or 'nowhere'}, the lab pins {want}: update "
                "VERSIONS in gpuctl/lab/slurm_repo.py"
            )
        out = tmp / "debs"
        out.mkdir()
        # apt-get download writes into the current directory; -oDir::Cache::archives does not
        # apply to it, so the files are fetched to the archive cache and copied from there
        run(["apt-get", *opts, "-q", "-y", "--download-only", "--no-install-recommends",
             "install", *packages], timeout=900)  # fmt: skip
        for deb in (state / "var/cache/apt/archives").glob("*.deb"):
            if deb.name.split("_", 1)[0] in packages:
                _rename(deb, out, tmp / "unpacked")
        repo.write_index(
            out,
            origin=ORIGIN,
            description=f"Debian {suite}'s Slurm ({SOURCE}) under SchedMD's names, gpuctl lab",
        )
        shutil.rmtree(dest, ignore_errors=True)
        out.rename(dest)
        (dest / _STAMP).write_text(want_stamp + "\n", encoding="utf-8")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True
