"""``nvidia-smi`` structured outputs: ``-q`` text and ``-q -x`` XML (``--query-gpu`` CSV:
:mod:`gpuctl.validation.parsers.nvsmi_csv`).

Kinds (documented in docs/parse.md):

- ``smi-q``: the text of ``nvidia-smi -q`` / ``-a``, also filtered (``-q -d ECC,...``) and
  fragments of it (one section pasted without its GPU header).
- ``smi-xml``: ``nvidia-smi -q -x``, the same facts as XML; same data shape as ``smi-q``.

``smi-q`` and ``smi-xml`` are both read into one tree of ``Node``
(:mod:`gpuctl.validation.parsers.nvsmi_tree`; key normalised to ``snake_case``; XML tag names
mostly equal the normalised text labels), then one extractor
(:mod:`gpuctl.validation.parsers.nvsmi_gpu`) pulls the documented keys out of either tree,
naming each alternative spelling of a field.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from functools import lru_cache

from gpuctl.validation.parsers.nvsmi_gpu import extract
from gpuctl.validation.parsers.nvsmi_tree import (
    ERROR_VALUES,
    MAX_DEPTH,
    Leaf,
    Node,
    is_error_banner,
    may_have_banner,
    norm_key,
)
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

KIND_Q = "smi-q"
KIND_XML = "smi-xml"

# ------------------------------------------------------------------------------------------
# smi-q: the text form

_KV = re.compile(r"(\S.*?)\s+:(?:\s(.*))?")
_GPU_HEADER = re.compile(r"GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_BANNER = re.compile(r"=+\s*NVSMI LOG\s*=+")
# What a -q label looks like ("GPU T.Limit Temp", "Clocks Event Reasons", "SRAM Uncorrectable
# SEC-DED", "Bank Remap Availability Histogram"): no table characters such as "|" or "+---".
_LABEL = re.compile(r"[A-Za-z][A-Za-z0-9 ._()/-]*")
_ELISION = re.compile(r"\[?(?:\.\.\.|…)\]?")
_TOP_KEYS = frozenset(
    {
        "timestamp",
        "driver_version",
        "cuda_version",
        "kmd_version",  # 610 and later
        "cuda_umd_version",  # 610 and later
        "attached_gpus",
    }
)
# Section/field names that identify a fragment of one GPU's -q section.
_GPU_KEYS = frozenset(
    {
        "product_name",
        "product_brand",
        "gpu_uuid",
        "serial_number",
        "persistence_mode",
        "mig_mode",
        "pci",
        "fb_memory_usage",
        "ecc_mode",
        "ecc_errors",
        "retired_pages",
        "remapped_rows",
        "temperature",
        "power_readings",
        "gpu_power_readings",
        "clocks_event_reasons",
        "clocks_throttle_reasons",
        "fabric",
        "processes",
    }
)


@lru_cache(maxsize=8192)
def _is_label(text: str) -> bool:
    return _LABEL.fullmatch(text) is not None  # labels repeat for every GPU and every node


@lru_cache(maxsize=8192)
def _is_section(text: str) -> bool:
    return _GPU_HEADER.fullmatch(text) is not None or _LABEL.fullmatch(text) is not None


def _split_kv(stripped: str) -> tuple[str, str] | None:
    """``Label   : value`` -> (label, value); what ``_KV`` matches, without the regex for the
    common case (a space before the colon, then a space or the end of the line)."""
    at = stripped.find(" :")
    if at > 0:
        after = stripped[at + 2 : at + 3]
        if after in ("", " ") and not stripped[:at].rstrip().endswith(("\t",)):
            head = stripped[:at].rstrip()
            if "\t" not in head and head[:1].strip():
                return head, stripped[at + 2 :].strip()
    m = _KV.fullmatch(stripped)
    if m is None:
        return None
    return m.group(1).strip(), (m.group(2) or "").strip()


_ELIDED = ("", "", None)

# What a line of the body is (the first item of :func:`_read_line`'s answer).
_NODE = 0  # a -q line: a section header or a "Label : value" line
_NODE_READ_ERROR = 1  # a -q line whose value is a read failure (ERROR_VALUES)
_BLANK = 2
_ODD = 3  # table borders, prose, anything that is not a -q line
_ELIDED_LINE = 4  # "[...]": something was cut out
_LOG_BANNER = 5  # "==============NVSMI LOG=============="
_WARNING = 6  # "WARNING: ..." lines nvidia-smi prints before the log
_ERROR_BANNER = 7  # an error message (is_error_banner), when the text may hold one


@lru_cache(maxsize=65536)
def _classify_line(stripped: str) -> tuple[str, str, str | None] | None:
    """(key, label, value) of a -q line, ``_ELIDED`` for an elision mark, None when it is not
    a -q line. Cached: the lines of one GPU repeat for every GPU (and across a fleet)."""
    if stripped[0] in "[.…" and _ELISION.fullmatch(stripped):
        return _ELIDED
    kv = _split_kv(stripped)
    if kv is not None and _is_label(kv[0]):
        label, value = kv
        key = norm_key(label)
    elif _is_section(stripped):
        label, value, key = stripped, None, norm_key(stripped)
    else:
        return None
    return (key, label, value) if key else None


_LineInfo = tuple[int, int, tuple[str, str, str | None] | None, Leaf | None]


def _read_line(line: str) -> _LineInfo:
    """(what the line is, its indent, what :func:`_classify_line` says of a -q line, the
    :class:`Leaf` of a "Label : value" line); the classification is None where the line is no
    -q line (then the indent may be 0)."""
    if is_error_banner(line):
        return _ERROR_BANNER, 0, None, None
    return _read_plain_line(line)


def _read_plain_line(line: str) -> _LineInfo:
    """:func:`_read_line` of a line that is not taken for an error message."""
    stripped = line.strip()
    if not stripped:
        return _BLANK, 0, None, None
    head = stripped[0]
    if head == "=" and _BANNER.fullmatch(stripped):
        return _LOG_BANNER, 0, None, None
    if head in ("=", "w", "W") and stripped[:7].upper() == "WARNING":
        return _WARNING, 0, None, None
    width = len(line) - len(line.lstrip(" \t"))
    indent = len(line[:width].expandtabs(4)) if "\t" in line[:width] else width
    kind = _classify_line(stripped)
    if kind is None:
        return _ODD, indent, None, None
    if kind is _ELIDED:
        return _ELIDED_LINE, indent, None, None
    value = kind[2]
    if value is None:  # a section header: a node of its own in each tree (it gets children)
        return _NODE, indent, kind, None
    if _is_read_error(value):  # rare: a node of its own too, where _read_body notes it
        return _NODE_READ_ERROR, indent, kind, None
    return _NODE, indent, kind, Leaf(*kind)


def _is_read_error(value: str) -> bool:
    return value.strip().lower() in ERROR_VALUES  # as nvsmi_gpu reads a value


# Whole lines as read before (the lines of one GPU repeat, indentation included, for every GPU
# and across a fleet), with their Leaf: every tree with the line holds that one object (it
# cannot change); longer lines (none in real output) are read every time, never kept.
_read_known_line = lru_cache(maxsize=65536)(_read_line)
_LINE_CACHED = 160


@dataclass(slots=True)
class _Body:
    """What :func:`_read_body` found in the lines of ``nvidia-smi -q``."""

    root: Node  # the -q lines as a tree (indentation -> nesting)
    has_banner: bool = False  # the "==NVSMI LOG==" line
    banners: list[str] = field(default_factory=list)  # error messages (is_error_banner)
    warnings: list[str] = field(default_factory=list)
    elided: int = 0  # "[...]" lines
    odd: int = 0  # lines not understood (also those nested deeper than MAX_DEPTH)
    read_errors: bool = False  # a value in the tree is a read failure (ERROR_VALUES)


def _read_body(text: str, lines: list[str]) -> _Body:
    """One pass over the lines: error messages (where ``may_have_banner(text)``), the
    "==NVSMI LOG==" banner and WARNING lines leave the body; the rest, by indentation -> tree.

    The open nodes are the last node read and the nodes it is under (``parents``, the root
    first). A line goes under the innermost open node with a smaller indent (the root's, -1,
    is smaller than every line's) and closes the open nodes after that one; a line that would
    go deeper than MAX_DEPTH is not kept."""
    first: list[Node] = []
    body = _Body(Node("", "", None, first))
    parents: list[tuple[int, Node, list[Node]]] = []  # (indent, node, its children)
    # the last node: its children are None until the first (a Leaf is replaced then)
    last_kids: list[Node] | None = first
    last_indent, last_node = -1, body.root
    gate: bool | None = None  # may_have_banner(text), worked out at the first error message
    read_errors = False
    for line in lines:
        what, indent, kind, leaf = (
            _read_known_line(line) if len(line) <= _LINE_CACHED else _read_line(line)
        )
        if kind is None:  # not a line of the tree
            if what == _ERROR_BANNER:
                if gate is None:
                    gate = may_have_banner(text)
                if gate:
                    body.banners.append(line.strip())
                    continue
                what, indent, kind, leaf = _read_plain_line(line)
            if kind is None:
                if what == _ODD:
                    body.odd += 1
                elif what == _ELIDED_LINE:
                    body.elided += 1
                elif what == _LOG_BANNER:
                    body.has_banner = True
                elif what == _WARNING:
                    body.warnings.append(line.strip())
                continue
        if indent > last_indent:  # under the last node
            if len(parents) >= MAX_DEPTH:
                body.odd += 1
                continue
            if last_kids is None:  # its first child
                last_kids = []
                if isinstance(last_node, Leaf):  # a line with a value and lines under it
                    last_node = Node(last_node.key, last_node.label, last_node.value)
                    parents[-1][2][-1] = last_node  # (the leaf is its parent's last child)
                last_node.children = last_kids
            parents.append((last_indent, last_node, last_kids))
            siblings = last_kids
        else:  # the last node is closed, and the parents with an indent as large as this
            while parents[-1][0] >= indent:
                parents.pop()
            siblings = parents[-1][2]  # (no deeper than the last node: no depth to check)
        if leaf is None:  # a section header, or a read failure (a line with no Leaf)
            node = Node(*kind)
            if what == _NODE_READ_ERROR:
                read_errors = True
        else:
            node = leaf
        siblings.append(node)
        last_indent, last_node, last_kids = indent, node, None
    body.read_errors = read_errors
    return body


@parser(
    KIND_Q,
    description="nvidia-smi -q / -a text (also -q -d ECC,PAGE_RETIREMENT,... and fragments)",
)
def parse_smi_q(text: str) -> ParseResult:
    lines = clean(text).split("\n")
    if not any(line.strip() for line in lines):
        return unrecognised(KIND_Q, "empty input")
    if any(line.lstrip().startswith("<") and "nvidia_smi_log" in line for line in lines[:5]):
        return unrecognised(KIND_Q, "this is the XML form (nvidia-smi -q -x): parse as smi-xml")
    problems: list[str] = []
    body = _read_body(text, lines)
    root, banners, warnings = body.root, body.banners, body.warnings

    gpus: list[tuple[Node, str | None]] = []
    loose: list[Node] = []
    for node in root.children:
        header = _GPU_HEADER.fullmatch(node.label) if node.value is None else None
        if header:
            gpus.append((node, header.group(1)))
        elif node.key not in _TOP_KEYS:
            loose.append(node)
    fragment = not gpus and any(n.key in _GPU_KEYS for n in loose)
    top_seen = [n.key for n in root.children if n.key in _TOP_KEYS]
    if not (body.has_banner or gpus or fragment or top_seen):
        reason = "not nvidia-smi -q output (no NVSMI LOG banner, no 'GPU <bus id>' section)"
        return unrecognised(KIND_Q, f"{reason}: {banners[0]}" if banners else reason)
    if fragment:
        gpus = [(Node("gpu", "GPU", None, loose), None)]
        problems.append("fragment: no 'GPU <bus id>' line, read as one GPU's section(s)")
    elif loose:
        labels = ", ".join(repr(n.label) for n in loose[:3])
        problems.append(f"{len(loose)} line(s) outside any GPU section not understood: {labels}")
    missing = [
        label
        for keys, label in (
            (("driver_version", "kmd_version"), "Driver Version"),
            (("cuda_version", "cuda_umd_version"), "CUDA Version"),
            (("attached_gpus",), "Attached GPUs"),
        )
        if not any(key in top_seen for key in keys)
    ]
    if missing:
        problems.append(f"header line(s) missing: {', '.join(missing)}")
    if body.elided:
        problems.append(f"output elided: {body.elided} '[...]' line(s), sections may be missing")
    if body.odd:
        problems.append(f"{body.odd} line(s) not understood")
    problems += [f"error message in output: {b}" for b in banners]
    problems += [f"warning in output: {w}" for w in warnings]
    data = extract(root, gpus, problems, read_errors=body.read_errors)
    data["warnings"] = warnings
    return ParseResult(KIND_Q, True, data, tuple(problems))


# ------------------------------------------------------------------------------------------
# smi-xml

# The one DOCTYPE nvidia-smi prints: an external DTD by file name, never read, no internal subset.
_DOCTYPE_OK = re.compile(
    r"<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+\"nvsmi_device(?:_v\d+)?\.dtd\"\s*>"
)
_DECL = re.compile(r"<\?xml[^>]*\?>")


def _depth(root: ET.Element) -> int:
    deepest, todo = 0, [(root, 0)]
    while todo:
        elem, depth = todo.pop()
        deepest = max(deepest, depth)
        todo.extend((c, depth + 1) for c in elem)
    return deepest


def _xml_node(elem: ET.Element, depth: int = 0) -> Node:
    children = [_xml_node(c, depth + 1) for c in elem] if depth < MAX_DEPTH else []
    value = None if children else (elem.text or "").strip()
    tag = elem.tag if isinstance(elem.tag, str) else ""
    return Node(tag.lower(), tag, value, children, dict(elem.attrib))


@parser(
    KIND_XML,
    description="nvidia-smi -q -x (XML); same data as smi-q",
)
def parse_smi_xml(text: str) -> ParseResult:
    body = clean(text)
    if not body.strip():
        return unrecognised(KIND_XML, "empty input")
    problems: list[str] = []
    if re.search(r"<!ENTITY", body, re.IGNORECASE):
        return unrecognised(KIND_XML, "refused: the XML declares entities (<!ENTITY>)")
    doctypes = list(re.finditer(r"<!DOCTYPE", body, re.IGNORECASE))
    if doctypes:
        ok = _DOCTYPE_OK.search(body)
        if len(doctypes) > 1 or ok is None or ok.start() != doctypes[0].start():
            return unrecognised(
                KIND_XML, "refused: DOCTYPE other than nvidia-smi's external nvsmi_device DTD"
            )
        body = body[: ok.start()] + body[ok.end() :]  # the DTD is never read
    start = body.find("<nvidia_smi_log")
    if start < 0:
        reason = "no <nvidia_smi_log> element: not nvidia-smi -q -x output"
        banners = [ln.strip() for ln in body.split("\n") if is_error_banner(ln)]
        return unrecognised(KIND_XML, f"{reason}: {banners[0]}" if banners else reason)
    before = _DECL.sub("", body[:start]).strip()
    if before:
        problems.append(f"text before the XML document ignored: {before.splitlines()[0][:80]!r}")
    # No DTD is read and no entity can be declared (refused above): expat sees plain XML.
    pull: ET.XMLPullParser[ET.Element] = ET.XMLPullParser(events=("start",))
    pull.feed(body[start:])
    try:
        pull.close()
    except ET.ParseError as exc:  # truncated or damaged: keep what was read before
        problems.append(f"XML not well-formed ({exc}): parsed what came before")
    root: ET.Element | None = None
    try:
        for event in pull.read_events():
            elem = event[1] if isinstance(event, tuple) and len(event) == 2 else None
            if isinstance(elem, ET.Element):
                root = elem
                break
    except ET.ParseError:
        pass  # the same error close() reported; the elements started before it are kept
    if root is None or root.tag != "nvidia_smi_log":
        return unrecognised(KIND_XML, "no <nvidia_smi_log> root element could be read")
    if _depth(root) > MAX_DEPTH:
        problems.append(f"XML nested deeper than {MAX_DEPTH} levels: the deeper elements ignored")
    top = _xml_node(root)
    gpus = [(n, (n.attrs or {}).get("id")) for n in top.children if n.key == "gpu"]
    if not any(c.key in _TOP_KEYS for c in top.children):
        problems.append("no <driver_version>/<attached_gpus> in <nvidia_smi_log>")
    data = extract(top, gpus, problems)
    data["warnings"] = []
    return ParseResult(KIND_XML, True, data, tuple(problems))
