"""The one atomic writer and the one bundle reader (gpuctl.fileio)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuctl.fileio import TooLarge, UnsafePath, read_inside, read_regular, write_atomic


def test_planted_symlink_at_target_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").symlink_to(victim)
    write_atomic(out / "report.html", "new\n")
    assert victim.read_text() == "keep\n"
    assert not (out / "report.html").is_symlink()
    assert (out / "report.html").read_text() == "new\n"


def test_planted_symlinks_at_old_fixed_temporary_names_are_ignored(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    out = tmp_path / "out"
    out.mkdir()
    for name in (".r.html.tmp", ".r.html.gpuctl-tmp", ".r.html"):
        (out / name).symlink_to(victim)
    write_atomic(out / "r.html", "new\n")
    assert victim.read_text() == "keep\n"
    assert (out / "r.html").read_text() == "new\n"


def test_mode_is_set_and_no_temporary_file_is_left(tmp_path: Path) -> None:
    write_atomic(tmp_path / "d" / "secret", b"x", mode=0o600, dir_mode=0o700)
    assert stat.S_IMODE(os.stat(tmp_path / "d" / "secret").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o700
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["secret"]


def test_read_inside_refuses_links_and_escapes(tmp_path: Path) -> None:
    root = tmp_path / "bundle"
    (root / "n1").mkdir(parents=True)
    (root / "n1" / "ok.txt").write_text("fine")
    (root / "n1" / "shadow.txt").symlink_to("/etc/shadow")
    (root / "linkdir").symlink_to(tmp_path)
    (tmp_path / "outside.txt").write_text("secret")
    assert read_inside(root, "n1/ok.txt", limit=100) == b"fine"
    assert read_inside(root, "n1/ok.txt", limit=2) == b"fi"
    for rel in ("n1/shadow.txt", "linkdir/outside.txt", "../outside.txt", "/etc/passwd", "n1"):
        with pytest.raises(UnsafePath):
            read_inside(root, rel, limit=100)
    with pytest.raises(FileNotFoundError):
        read_inside(root, "n1/missing.txt", limit=100)


def test_read_regular_refuses_devices_and_large_files_before_reading(tmp_path: Path) -> None:
    with pytest.raises(UnsafePath):
        read_regular(Path("/dev/zero"), limit=10)
    big = tmp_path / "big"
    with big.open("wb") as fh:
        fh.truncate(1 << 30)  # sparse
    with pytest.raises(TooLarge):
        read_regular(big, limit=1 << 20)
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    assert read_regular(small, limit=3) == b"abc"


def test_gpuctl_parse_refuses_a_device() -> None:
    from typer.testing import CliRunner

    from gpuctl.cli.app import app

    res = CliRunner().invoke(app, ["parse", "nccl", "/dev/zero"])
    assert res.exit_code == 2, res.output
    assert "not a regular file" in res.output
