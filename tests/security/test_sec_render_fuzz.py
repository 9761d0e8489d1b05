"""Random strings in every string field of cluster.yml: what renders holds no template marker,
no control character and no line or key the model did not produce (issue 14).

The fields are found by walking the model, so a string field added later is fuzzed too. Each
example either is refused at load (ConfigError) or renders files that are compared with the
render of the same document with a harmless value in that field.
"""

from __future__ import annotations

import copy
import re
import types
import typing
from typing import Any

import pytest
import yaml
from helpers import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from gpuctl.config.loader import validate_data
from gpuctl.config.model import Cluster
from gpuctl.errors import ConfigError
from gpuctl.render import render_files

EXAMPLE = ROOT / "inventories" / "hgx-h100-ndr.yml"
BASE: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
# a list of strings the example leaves empty, so that its element is fuzzed too
BASE["package_sources"].setdefault("no_proxy", ["mirror.example.com"])
# list fields are fuzzed at this element of the example (node_groups[2]: the GPU group)
LIST_INDEX = {"node_groups": 2}

Path_ = tuple[str | int, ...]


def _accepts_str(annotation: Any) -> bool:
    if annotation is str:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _accepts_str(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_accepts_str(a) for a in typing.get_args(annotation))
    return False


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


def string_fields(model: type[BaseModel] = Cluster, prefix: Path_ = ()) -> list[Path_]:
    """Paths of every field that holds a string: plain, in a list, or a dict's keys/values."""
    out: list[Path_] = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        path: Path_ = (*prefix, name)
        origin = typing.get_origin(ann)
        args = typing.get_args(ann)
        if origin is list and args:
            inner = args[0]
            subs = _models_in(inner)
            if subs:
                out.extend(string_fields(subs[0], (*path, LIST_INDEX.get(name, 0))))
            elif _accepts_str(inner):
                out.append((*path, 0))
            continue
        if origin is dict:
            out.append((*path, "<key>"))
            out.append((*path, "<value>"))
            continue
        subs = _models_in(ann)
        if subs:
            out.extend(string_fields(subs[0], path))
        elif _accepts_str(ann):
            out.append(path)
    return out


FIELDS = string_fields()


def _set(doc: dict[str, Any], path: Path_, value: str) -> bool:
    """Put ``value`` at ``path``; False when the example has no such list element."""
    target: Any = doc
    for part in path[:-1]:
        if part in ("<key>", "<value>"):
            break
        if isinstance(part, int):
            if not isinstance(target, list) or len(target) <= part:
                return False
            target = target[part]
        else:
            nxt = target.get(part)
            if nxt is None:
                nxt = {}
                target[part] = nxt
            target = nxt
    last = path[-1]
    if last == "<key>":
        target.clear()
        target[value] = "1"
    elif last == "<value>":
        target.clear()
        target["SchedulerParameters"] = value
    elif isinstance(last, int):
        if not isinstance(target, list):
            return False
        if not target:
            target.append(value)
        target[last] = value
    else:
        target[last] = value
    return True


def _render(doc: dict[str, Any]) -> dict[str, str] | None:
    try:
        cluster = validate_data(copy.deepcopy(doc), None, "cluster.yml")
    except ConfigError:
        return None
    return render_files(cluster)


UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
MARKERS = ("{{", "{%", "{#")


def _yaml_keys(data: Any, prefix: Path_ = ()) -> set[Path_]:
    out: set[Path_] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            out.add((*prefix, str(key)))
            out |= _yaml_keys(value, (*prefix, str(key)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out |= _yaml_keys(value, (*prefix, i))
    return out


def _conf_keys(text: str) -> list[str]:
    keys = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.match(r"^[A-Za-z_][A-Za-z0-9_ ]*(?==)|^\[[a-z_]+\]$", line)
        assert match is not None, f"a line no template of gpuctl writes: {line!r}"
        keys.append(match[0].strip())
    return keys


def _shape(files: dict[str, str]) -> dict[str, Any]:
    shape: dict[str, Any] = {}
    for rel, text in files.items():
        if rel.endswith(".yml"):
            shape[rel] = _yaml_keys(yaml.safe_load(text))
        else:
            shape[rel] = _conf_keys(text)
    return shape


def _benign(path: Path_) -> str:
    name = str(path[-1])
    if name in ("os_mirror", "cuda", "doca", "nccl_tests", "slurm", "pypi_index", "url"):
        return "http://benign.example.com/x"
    if name == "http_proxy":
        return "http://proxy.example.com:3128"
    if name == "gpuctl_wheelhouse":
        return "/srv/wheels"
    if name == "<key>":
        return "SchedulerParameters"
    return "benign"


HOSTILE = st.sampled_from(
    [
        "{{ lookup('pipe', 'id') }}",
        "{% raw %}",
        "{# x #}",
        "x\nAuthType=auth/none",
        "x\rAuthType=auth/none",
        "x\u2028y",
        "x\x85y",
        "\x1b[31m",
        "\x00",
        "a: b\nc: d",
        "'\"",
        "- x",
        "*alias",
        "&anchor x",
        "!!python/object:os.system",
        "%h %p %%",
        "$(id)",
        "`id`",
        "; id",
        " ",
        "#",
        "=",
        "\\",
    ]
)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
# what a URL or a path may hold: printable, no blank (so that many examples get rendered)
WORD = st.text(
    st.one_of(st.characters(min_codepoint=0x21, max_codepoint=0x7E), st.sampled_from("éü中")),
    min_size=1,
    max_size=40,
)
PREFIXES = st.sampled_from(["", "/srv/", "x", "570"])


def values_for(path: Path_) -> st.SearchStrategy[str]:
    """Strings for one field: the shape its valid values start with, then anything."""
    benign = _benign(path)
    start = st.just("http://h.example.com/") if benign.startswith("http") else PREFIXES
    return st.one_of(
        st.builds(lambda p, w: p + w, start, WORD),
        st.builds(
            lambda p, a, b: p + a + b,
            start,
            st.one_of(HOSTILE, TEXT),
            st.one_of(st.just(""), WORD),
        ),
    )


def test_every_string_field_of_the_model_is_fuzzed() -> None:
    paths = {".".join(str(p) for p in f) for f in FIELDS}
    for expected in (
        "ssh.user",
        "ssh.private_key",
        "ssh.jump_host.host",
        "package_sources.http_proxy",
        "slurm.extra.<value>",
        "software.mpi.url",
        "node_groups.2.nodes",
        "bmc.system_id",
    ):
        assert expected in paths
    assert len(FIELDS) > 40, len(FIELDS)


@pytest.mark.parametrize("path", FIELDS, ids=lambda f: ".".join(str(p) for p in f))
@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_strings_never_become_code_or_extra_lines(path: Path_, data: st.DataObject) -> None:
    value = data.draw(values_for(path))
    doc = copy.deepcopy(BASE)
    baseline_doc = copy.deepcopy(BASE)
    if not _set(doc, path, value) or not _set(baseline_doc, path, _benign(path)):
        pytest.skip(f"the example has no {path}")  # pragma: no cover - FIELDS come from it
    files = _render(doc)
    if files is None:
        return  # refused at load: the safe outcome
    baseline = _render(baseline_doc) or _render(BASE)
    assert baseline is not None
    for rel, text in files.items():
        bad = UNSAFE.search(text)
        assert bad is None, f"{rel}: control character {bad[0]!r} from {value!r}"
        for marker in MARKERS:
            assert text.count(marker) == baseline.get(rel, "").count(marker), (
                f"{rel}: {marker} from {value!r}"
            )
    if path[-1] in ("nodes", "addresses", "devices", "switches", "controller"):
        return  # node sets and names change the shape on purpose
    shape = _shape(files)
    if path[-1] == "<key>":  # the key itself is the one line slurm.extra adds
        conf = shape["slurm/slurm.conf"]
        shape["slurm/slurm.conf"] = ["SchedulerParameters" if k == value else k for k in conf]
    assert shape == _shape(baseline), f"the shape of the render changed for {value!r}"
