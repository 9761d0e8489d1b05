"""The layout docs/architecture.md describes holds: every module it names exists, no module is
over 800 lines, no import cycle (a deferred import inside a function that dodges a cycle counts
too), the simulation stays in gpuctl/lab, and gpuctl-node-check imports only what it needs.

Pure: reads the source files with ast, imports nothing of gpuctl."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from helpers import ROOT

PACKAGE = ROOT / "gpuctl"
MAX_LINES = 800


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(sub) for sub in ast.walk(node))
    return skip


def _imports(path: Path, name: str) -> Iterator[str]:
    """Every module ``path`` imports, anywhere in it (TYPE_CHECKING blocks excepted)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


@cache
def _graph() -> dict[str, frozenset[str]]:
    mods = _modules()
    graph: dict[str, frozenset[str]] = {}
    for name, path in mods.items():
        deps = {d for d in _imports(path, name) if d in mods and d != name}
        graph[name] = frozenset(deps)
    return graph


def _third_party(name: str) -> set[str]:
    path = _modules()[name]
    return {d.split(".")[0] for d in _imports(path, name) if not d.startswith("gpuctl")}


def _cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _closure(start: str) -> set[str]:
    """The gpuctl modules importing ``start`` loads: its imports, theirs, and every parent
    package of each (Python runs a package's __init__ before its submodule)."""
    graph = _graph()
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += graph.get(name, frozenset())
    return seen


def test_no_module_is_over_800_lines() -> None:
    over = {
        name: n
        for name, path in _modules().items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert over == {}


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_deferred_import_cycle() -> None:
    graph = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_simulation_outside_the_lab() -> None:
    leaks = {
        name: sorted(d for d in deps if d.startswith("gpuctl.lab"))
        for name, deps in _graph().items()
        if not name.startswith("gpuctl.lab")
        and any(d.startswith("gpuctl.lab") for d in deps)
        and not name.startswith("gpuctl.cli")  # `gpuctl lab ...` is a command of the CLI
    }
    assert leaks == {}


# What Slurm's HealthCheckProgram must not pay for on every node, every few minutes.
NODE_CHECK_MUST_NOT_LOAD = (
    "gpuctl.validation.collector",
    "gpuctl.validation.multinode",
    "gpuctl.validation.reports.html",
    "gpuctl.validation.reports.junit",
    "gpuctl.validation.reports.prom",
    "gpuctl.remote.ssh",
    "gpuctl.render",
    "gpuctl.provision",
    "gpuctl.rollout",
    "gpuctl.lab",
    "gpuctl.cli.app",
)
NODE_CHECK_THIRD_PARTY_NOT = {"paramiko", "jinja2", "ansible_runner", "rich"}


def test_node_check_loads_only_what_it_needs() -> None:
    loaded = _closure("gpuctl.cli.nodecheck_main")
    assert "gpuctl.validation.nodecheck" in loaded  # the finder follows the real imports
    heavy = sorted(
        m for m in loaded for bad in NODE_CHECK_MUST_NOT_LOAD if m == bad or m.startswith(bad + ".")
    )
    assert heavy == []
    third = set().union(*(_third_party(m) for m in loaded))
    assert third & NODE_CHECK_THIRD_PARTY_NOT == set()


_NAMED = re.compile(r"`(gpuctl/[A-Za-z0-9_/]+(?:\.py)?|playbooks/roles/[A-Za-z0-9_]+/?)`")


def _named_in_architecture() -> list[str]:
    doc = ROOT / "docs" / "architecture.md"
    text = doc.read_text(encoding="utf-8") if doc.is_file() else ""  # none: the next test fails
    return sorted(set(_NAMED.findall(text)))


def test_architecture_doc_names_modules() -> None:
    assert len(_named_in_architecture()) >= 30


@pytest.mark.parametrize("named", _named_in_architecture())
def test_every_module_the_architecture_doc_names_exists(named: str) -> None:
    assert (ROOT / named).exists(), f"docs/architecture.md names {named}, which does not exist"


def test_every_module_is_in_the_architecture_doc() -> None:
    """A newcomer finds every module in one hop: each is named, itself or by its package."""
    named = {n.rstrip("/").removesuffix(".py") for n in _named_in_architecture()}
    missing = []
    for path in _modules().values():
        rel = path.relative_to(ROOT).with_suffix("").as_posix()
        # itself, or the package it is in (gpuctl/validation/parsers/ for one parser); a package's
        # __init__ by the package
        own = rel.removesuffix("/__init__")
        if own == "gpuctl":
            continue  # the package itself: the doc is its map
        parents = [own, own.rsplit("/", 1)[0]] if path.name != "__init__.py" else [own]
        if not any(p in named for p in parents if p != "gpuctl"):
            missing.append(rel)
    assert missing == []
