"""The generated part of ``docs/cluster-yml.md``: every field of cluster.yml and the GPU catalog.

``field_reference()`` walks the pydantic model from :class:`~gpuctl.config.model.Cluster` and
renders one Markdown table per model; ``gpu_model_table()`` renders ``gpuctl/data/gpu_models.yml``.
Both are pure and deterministic, so a test can compare them with the checked-in document.

``python -m gpuctl.config.docs`` rewrites the generated section of the document in place;
``python -m gpuctl.config.docs --check`` exits 1 when the document is out of date.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from gpuctl.config.catalog import gpu_specs
from gpuctl.config.model import Cluster, Thresholds
from gpuctl.config.types import Name, NodeSetStr, Url, Version
from gpuctl.fileio import write_atomic

BEGIN_MARKER = "<!-- BEGIN GENERATED: field reference (python -m gpuctl.config.docs) -->"
END_MARKER = "<!-- END GENERATED -->"
DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "cluster-yml.md"

ROOT_HEADING = "Top level"


# --------------------------------------------------------------------------------------------
# Walking the model


@dataclass(frozen=True, slots=True)
class Section:
    """One model in the tree, at its dotted path (``""`` for the root)."""

    path: str
    model: type[BaseModel]


def join_path(parent: str, name: str) -> str:
    """``("node_groups[]", "gpus")`` -> ``node_groups[].gpus``."""
    return f"{parent}.{name}" if parent else name


def nested_models(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """The models inside a field's type, each with its path suffix.

    ``[]`` marks a list item and ``{}`` a dict value: ``list[Nic] | None`` -> ``[("[]", Nic)]``.
    """
    origin = get_origin(annotation)
    if origin is Annotated:
        return nested_models(get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    if origin in (Union, types.UnionType):
        return [found for arg in get_args(annotation) for found in nested_models(arg)]
    if origin in (list, tuple, set, frozenset, Sequence):
        items = [a for a in get_args(annotation) if a is not Ellipsis]
        return [("[]" + s, sub) for a in items for s, sub in nested_models(a)]
    if origin is dict:
        kv = get_args(annotation)
        return [("{}" + s, sub) for s, sub in nested_models(kv[1])] if len(kv) == 2 else []
    return []


def sections(root: type[BaseModel] = Cluster) -> list[Section]:
    """Every model under ``root``, depth first in field order (a model on a cycle is cut)."""
    out: list[Section] = []

    def visit(model: type[BaseModel], path: str, stack: tuple[type[BaseModel], ...]) -> None:
        out.append(Section(path, model))
        for name, info in model.model_fields.items():
            for suffix, sub in nested_models(info.annotation):
                if sub not in stack:
                    visit(sub, join_path(path, name) + suffix, (*stack, sub))

    visit(root, "", (root,))
    return out


# --------------------------------------------------------------------------------------------
# Rendering types and defaults


def _annotated_parts(alias: Any) -> list[Any]:
    """The metadata of an ``Annotated`` alias, with ``Field(...)`` flattened to its constraints."""
    return _flatten(list(get_args(alias)[1:]))


def _flatten(meta: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for item in meta:
        if isinstance(item, FieldInfo):
            out.extend(item.metadata)
        else:
            out.append(item)
    return out


def _validator_funcs(meta: Sequence[Any]) -> set[Any]:
    return {item.func for item in meta if isinstance(item, BeforeValidator)}


def _pattern(meta: Sequence[Any]) -> str | None:
    for item in meta:
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            return pattern
    return None


def _bound(meta: Sequence[Any], name: str) -> Any:
    for item in meta:
        value = getattr(item, name, None)
        if value is not None:
            return value
    return None


# The model's named field types, recognised by what pydantic keeps of them.
_NODESET_FUNCS = _validator_funcs(_annotated_parts(NodeSetStr))
_VERSION_FUNCS = _validator_funcs(_annotated_parts(Version))
NAME_PATTERN = _pattern(_annotated_parts(Name))
URL_PATTERN = _pattern(_annotated_parts(Url))

_PLURALS = {
    "string": "strings",
    "integer": "integers",
    "number": "numbers",
    "boolean": "booleans",
    "mapping": "mappings",
    "name": "names",
    "node set": "node sets",
    "URL": "URLs",
    "version": "versions",
}


def _plural(text: str) -> str:
    for one, many in _PLURALS.items():
        if text == one or text.startswith((one + " ", one + ",")):
            return many + text[len(one) :]
    return text


def _or(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]


def _choices(values: Sequence[Any]) -> str:
    return " | ".join(f"`{to_jsonable_python(v)}`" for v in values)


def _number(kind: str, meta: Sequence[Any]) -> str:
    ge, gt, le, lt = (_bound(meta, k) for k in ("ge", "gt", "le", "lt"))
    low = f"at least {ge}" if ge is not None else f"more than {gt}" if gt is not None else None
    high = f"at most {le}" if le is not None else f"less than {lt}" if lt is not None else None
    if ge is not None and le is not None:
        return f"{kind} ({ge} to {le})"
    bounds = [b for b in (low, high) if b is not None]
    return f"{kind} ({', '.join(bounds)})" if bounds else kind


def _string(meta: Sequence[Any]) -> str:
    funcs = _validator_funcs(meta)
    if funcs & _NODESET_FUNCS:
        return "node set"
    if funcs & _VERSION_FUNCS:
        return "version (quoted string)"
    pattern = _pattern(meta)
    if pattern is not None and pattern == NAME_PATTERN:
        return "name"
    if pattern is not None and pattern == URL_PATTERN:
        return "URL"
    if pattern is not None:
        return f"string matching `{pattern}`"
    min_length, max_length = _bound(meta, "min_length"), _bound(meta, "max_length")
    text = "non-empty string" if min_length == 1 else "string"
    if max_length is not None:
        text += f" (at most {max_length} characters)"
    return text


def type_text(annotation: Any, meta: Sequence[Any] = ()) -> str:
    """A field type as an operator reads it: ``list of integers or null``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extra = get_args(annotation)
        return type_text(base, [*meta, *_flatten(extra)])
    if annotation is type(None):
        return "null"
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        parts = [type_text(a, meta) for a in args if a is not type(None)]
        if type(None) in args:
            parts.append("null")
        return _or(parts)
    if origin is Literal:
        return _choices(get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return _choices([member.value for member in annotation])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    if origin in (list, tuple, set, frozenset, Sequence):
        items = [a for a in get_args(annotation) if a is not Ellipsis]
        item = _plural(type_text(items[0])) if items else "values"
        min_length = _bound(meta, "min_length")
        prefix = "non-empty list" if min_length == 1 else "list"
        text = f"{prefix} of {item}"
        if min_length is not None and min_length > 1:
            text += f" (at least {min_length} items)"
        return text
    if origin is dict:
        kv = get_args(annotation)
        if len(kv) != 2:
            return "mapping"
        return f"mapping of {type_text(kv[0])} to {type_text(kv[1])}"
    if annotation is bool:
        return "boolean"
    if annotation is int:
        return _number("integer", meta)
    if annotation is float:
        return _number("number", meta)
    if annotation is str:
        return _string(meta)
    if annotation is Any:
        return "any value"
    return str(getattr(annotation, "__name__", annotation))


def field_type(info: FieldInfo) -> str:
    return type_text(info.annotation, info.metadata)


def value_text(value: Any) -> str:
    """A default value, JSON-ish; a model at its own defaults is ``{}``."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_defaults=True)
    return "`" + json.dumps(to_jsonable_python(value), ensure_ascii=False) + "`"


def field_default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory_takes_validated_data:
        return "computed"
    return value_text(info.get_default(call_default_factory=True))


# --------------------------------------------------------------------------------------------
# Markdown


def cell(text: str) -> str:
    """Text fit for one table cell: one line, ``|`` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [_row(header), "|" + "|".join("---" for _ in header) + "|", *(_row(r) for r in rows)]


def _docstring(obj: type) -> str:
    doc = obj.__dict__.get("__doc__")
    if not isinstance(doc, str):
        return ""
    first = inspect.cleandoc(doc).split("\n\n")[0]
    return " ".join(first.split()).replace("``", "`")


def _intro() -> list[str]:
    return [
        "## Field reference",
        "",
        "Generated from `gpuctl/config/model/` by `python -m gpuctl.config.docs`; "
        "do not edit this part by hand.",
        "",
        "A key path names a key from the top of the file. `[]` stands for every item of a "
        "list: `node_groups[].gpus.model` is the `model` key of the `gpus` mapping of each "
        "entry of `node_groups`. Error messages name the same paths with the item's index, "
        "as in `node_groups[1].gpus.model`. Keys not listed here are errors.",
        "",
        "Types:",
        "",
        f"- **name**: a string matching `{NAME_PATTERN}`: a lower-case letter, then lower-case "
        "letters, digits, `_` or `-`.",
        "- **node set**: host names in ClusterShell syntax, e.g. `gpu[001-064]` or `a,b,c[1-3]`.",
        '- **version (quoted string)**: write it in quotes (`"12.8"`); an unquoted '
        "number is an error.",
        f"- **URL**: a string matching `{URL_PATTERN}`.",
        "- **`a` \\| `b`**: exactly one of the listed values.",
        "- **... or null**: `null` is accepted as well; the description says what it means.",
        "",
        "Defaults: **required** keys must be given; `{}` means the mapping may be left out "
        "and each key inside takes its own default.",
        "",
    ]


def field_reference() -> str:
    """Every field of cluster.yml: one section per model, one table row per field."""
    lines = _intro()
    for section in sections():
        heading = section.path or ROOT_HEADING
        lines += [f"### {heading}", ""]
        about = _docstring(section.model)
        if about:
            lines += [about, ""]
        rows = [
            [
                f"`{join_path(section.path, name)}`",
                field_type(info),
                field_default(info),
                info.description or "",
            ]
            for name, info in section.model.model_fields.items()
        ]
        lines += [*_table(["Key", "Type", "Default", "Description"], rows), ""]
    return "\n".join(lines) + "\n"


def _threshold_keys() -> list[str]:
    used = {k for spec in gpu_specs().values() for k in spec.thresholds}
    ordered = [k for k in Thresholds.model_fields if k in used]
    return ordered + sorted(used - set(ordered))


def _plain(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def gpu_model_table() -> str:
    """The GPU model catalog (``gpuctl/data/gpu_models.yml``) as two Markdown tables."""
    specs = list(gpu_specs().values())  # the order of gpu_models.yml
    facts = [
        [
            f"`{s.key}`",
            s.product_name,
            s.architecture,
            s.form_factor,
            str(s.memory_gib),
            ", ".join(f"`{ic}`" for ic in s.interconnects),
            f"{s.nvswitch_gpus} GPUs" if s.nvswitch_gpus is not None else "none",
            str(s.max_per_node),
            s.open_modules,
            f"`{s.gres_type}`",
        ]
        for s in specs
    ]
    keys = _threshold_keys()
    limits = [
        [f"`{s.key}`", *(_plain(s.thresholds.get(k)) for k in keys), ", ".join(s.sources)]
        for s in specs
    ]
    lines = [
        "## GPU models",
        "",
        "The values of `node_groups[].gpus.model`, from `gpuctl/data/gpu_models.yml`. "
        "*Interconnects* are the values `node_groups[].gpus.interconnect` accepts for the model; "
        "*NVSwitch baseboard* is how many GPUs an NVSwitch (HGX) board of it holds; "
        "*open kernel modules* says whether `software.driver.kernel_modules: open` is "
        "supported or required.",
        "",
        *_table(
            [
                "Model",
                "Product name (nvidia-smi)",
                "Architecture",
                "Form factor",
                "Memory (GiB)",
                "Interconnects",
                "NVSwitch baseboard",
                "Max per node",
                "Open kernel modules",
                "Slurm GRES type",
            ],
            facts,
        ),
        "",
        "Default validation thresholds per GPU model, in the units of `validation.thresholds` "
        "(GB/s). *none* means no published "
        "number: set the threshold under `validation.thresholds` or "
        "`node_groups[].validation.thresholds`, or the check judges the node against the "
        "fleet only.",
        "",
        *_table(["Model", *(f"`{k}`" for k in keys), "Sources"], limits),
    ]
    return "\n".join(lines) + "\n"


def generated() -> str:
    """The whole generated section, as it stands between the markers."""
    return field_reference() + gpu_model_table()


# --------------------------------------------------------------------------------------------
# The document


def _marker_lines(text: str) -> tuple[int, int]:
    """Offsets just after the BEGIN marker line and at the start of the END marker line."""
    lines = text.splitlines(keepends=True)
    begins = [i for i, ln in enumerate(lines) if ln.strip() == BEGIN_MARKER]
    ends = [i for i, ln in enumerate(lines) if ln.strip() == END_MARKER]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise ValueError(f"expected one line {BEGIN_MARKER!r} followed by one line {END_MARKER!r}")
    start = sum(len(ln) for ln in lines[: begins[0] + 1])
    stop = sum(len(ln) for ln in lines[: ends[0]])
    return start, stop


def replace_generated(text: str, body: str) -> str:
    """``text`` with the part between the marker lines replaced by ``body``."""
    start, stop = _marker_lines(text)
    return text[:start] + "\n" + body.strip("\n") + "\n\n" + text[stop:]


def _iter_paths() -> Iterator[str]:
    for section in sections():
        for name in section.model.model_fields:
            yield join_path(section.path, name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuctl.config.docs",
        description="Rewrite the generated field reference in docs/cluster-yml.md.",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the document is out of date"
    )
    parser.add_argument("path", nargs="?", type=Path, default=DOC_PATH, help="the document")
    args = parser.parse_args(argv)
    path: Path = args.path
    try:
        text = path.read_text(encoding="utf-8")
        updated = replace_generated(text, generated())
    except (OSError, ValueError) as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if updated != text:
            print(
                f"{path} is out of date with the model or the GPU catalog: "
                "run `python -m gpuctl.config.docs`",
                file=sys.stderr,
            )
            return 1
        return 0
    if updated != text:
        write_atomic(path, updated)
        print(f"updated {path} ({sum(1 for _ in _iter_paths())} fields)")
    else:
        print(f"{path} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
