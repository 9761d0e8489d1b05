"""Every node: munge installed and running, the cluster's one key with owner munge and mode
0600 (role munge). The key's contents are never read into a message: only digests compared."""

# ruff: noqa: S101 - pytest test module: assert is how it reports

from __future__ import annotations

from gpuctl.acceptance import expect
from gpuctl.acceptance.plugin import Node, assert_packages, assert_services, fail, not_applicable


def test_munge_installed_and_active(node: Node) -> None:
    assert_packages(node, "munge", [expect.PackageSpec("munge")])
    assert_services(node, ["munge"])


def test_munge_key_owner_and_mode(node: Node) -> None:
    found = node.stat(expect.MUNGE_KEY)
    assert found is not None, f"{node.name}: {expect.MUNGE_KEY} is missing"
    owner, group, mode, kind = found
    want = (expect.MUNGE_USER, expect.MUNGE_USER, "600", "regular file")
    assert (owner, group, mode, kind) == want, (
        f"{node.name}: {expect.MUNGE_KEY} is {kind} {owner}:{group} mode 0{mode}, "
        f"expected regular file {expect.MUNGE_USER}:{expect.MUNGE_USER} mode 0600"
    )


def test_munge_credential_roundtrip(node: Node) -> None:
    """munged encodes and decodes a credential with its key (``munge -n | unmunge``)."""
    result = node.sh("munge -n | unmunge")
    status = [line for line in result.stdout.splitlines() if line.startswith("STATUS:")]
    shown = (status[0] if status else result.stderr.strip())[:200]
    if result.rc != 0 or not status or "Success" not in status[0]:
        fail(f"{node.name}: munge -n | unmunge failed (rc {result.rc}): {shown}")


def _key_digest(node: Node) -> str:
    result = node.run("sha256sum", expect.MUNGE_KEY)
    words = result.stdout.split()
    if result.rc != 0 or not words or len(words[0]) != 64:
        # the digest is not a secret, but only the error is shown
        fail(
            f"{node.name}: cannot read the munge key's digest (rc {result.rc}): "
            f"{result.stderr.strip()[:200]}"
        )
    return words[0]


def test_munge_key_is_the_clusters(node: Node) -> None:
    """The same key as the host it is adopted from (munge_key_source_host: the controller)."""
    source = str(node.vars.get("munge_key_source_host") or "")
    if not source:
        fail(f"{node.name}: munge_key_source_host is missing from the rendered inventory")
    if source == node.name:
        not_applicable(f"{node.name} is the key's source host")
    same = _key_digest(node) == _key_digest(node.other(source))
    assert same, f"{node.name}: {expect.MUNGE_KEY} differs from {source}'s (digests compared)"
