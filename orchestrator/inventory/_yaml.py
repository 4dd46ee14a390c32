"""YAML loading for inventories: PyYAML (libyaml's C parser where installed), within fixed limits.

PyYAML composes the file into a node graph whose marks carry line numbers; the values are built here,
into ``dict``/``list`` subclasses that remember the 1-based line of every key and item. Building them
here is what enforces the limits below, and lets each format keep its own meaning of plain scalars:

- the native format is read with the YAML 1.2 core schema it was specified with (only ``true``/``false``
  are booleans, ``1:20`` and ``yes`` are strings); duplicate keys are refused;
- Ansible inventories are read the way Ansible reads them (PyYAML's YAML 1.1 resolver and conversions):
  ``yes``/``no``/``on``/``off`` are booleans, ``0755`` is octal, ``1:20`` is 80.

The format is told apart before the values are built, by the same test the callers use
(:func:`looks_ansible`) applied to the top two levels only. The containers, and the helpers that name
their lines and describe their values in messages, are in :mod:`orchestrator.inventory._yaml_values`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped, unused-ignore]
from yaml.nodes import MappingNode, ScalarNode, SequenceNode  # type: ignore[import-untyped, unused-ignore]

from orchestrator.errors import InventoryError, InventoryIssue
from orchestrator.inventory._yaml_values import Tagged, YamlList, YamlMap, describe

__all__ = [
    "GROUP_KEYS",
    "MAX_ALIAS_VALUES",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_INT_DIGITS",
    "load_yaml",
    "looks_ansible",
    "read_text",
]

# ----- limits: every inventory, however hostile, is read or refused in well under a second ------------

# An inventory of a few hundred nodes is well under 1 MB: 4 MiB leaves room and bounds every pass below.
MAX_FILE_BYTES = 4 * 1024 * 1024
# Values that aliases (``*name``, ``<<: *name``) add by repeating what their anchor holds. Shared
# defaults merged into a few hundred hosts add thousands; nine levels of nine-fold aliases (a "billion
# laughs" file of a few hundred bytes) would add 387 million.
MAX_ALIAS_VALUES = 100_000
# Mappings and lists nested in each other. Inventories need a few levels (Ansible groups nested through
# ``children:`` add two per level); deeper structures only serve to exhaust the stack.
MAX_DEPTH = 64
# Digits of an integer. Ports, counts and ids need a few; converting and printing an integer of
# thousands of digits costs quadratic time (Python refuses past 4300 digits with a traceback).
MAX_INT_DIGITS = 30

_STR = "tag:yaml.org,2002:str"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"
_VALUE = "tag:yaml.org,2002:value"
_STANDARD = "tag:yaml.org,2002:"
# The tag our resolver gives every untagged plain scalar: its meaning is decided when the format is known.
_PLAIN = "tag:cluster-bootstrap,2024:plain"


class _Refused(Exception):
    """A limit or a value the loader will not read; becomes one :class:`InventoryIssue`."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


_DEPTH_MESSAGE = (
    f"mappings and lists nested more than {MAX_DEPTH} levels deep: an inventory needs a few; "
    "check the file's indentation and brackets"
)


# ----- reading the file ------------------------------------------------------------------------------


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _too_big(size: int | None) -> str:
    got = f"has {size} bytes" if size is not None else "grew while it was read"
    return (
        f"the inventory file {got}, over the {MAX_FILE_BYTES // 1024 // 1024} MiB limit "
        "(an inventory of a few hundred nodes is well under 1 MB): check that this is the inventory"
    )


def _not_regular(mode: int) -> str:
    return f"is {_kind(mode)}, not a regular file: give the path of an inventory file"


def _read_bytes(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_FILE_BYTES; raises :class:`_Refused` or OSError."""
    info = os.stat(path)
    if stat.S_ISDIR(info.st_mode):
        raise _Refused("is a directory, expected an inventory file", None)
    if not stat.S_ISREG(info.st_mode):
        raise _Refused(_not_regular(info.st_mode), None)  # never opened: a FIFO would block
    if info.st_size > MAX_FILE_BYTES:
        raise _Refused(_too_big(info.st_size), None)
    # O_NONBLOCK: should a FIFO be swapped in after the stat above, opening it does not wait for a writer
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Refused(_not_regular(info.st_mode), None)
        chunks: list[bytes] = []
        left = MAX_FILE_BYTES + 1  # one byte more tells a file that grew past the limit
        while left > 0:
            chunk = os.read(fd, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:
        raise _Refused(_too_big(None), None)
    return b"".join(chunks)


def read_text(path: Path, source: str) -> str:
    """The file's text; an :class:`InventoryError` (without line) when it cannot or may not be read.

    Only regular files of at most :data:`MAX_FILE_BYTES` are read: a FIFO, a device or a directory is
    refused before it is opened.
    """
    try:
        return _read_bytes(path).decode("utf-8")
    except _Refused as exc:
        message = exc.message
    except FileNotFoundError:
        message = "inventory file not found"
    except IsADirectoryError:
        message = "is a directory, expected an inventory file"
    except PermissionError:
        message = "cannot read the inventory file: permission denied"
    except UnicodeDecodeError as exc:
        message = f"the inventory file is not UTF-8 text (byte {exc.start})"
    except OSError as exc:
        message = f"cannot read the inventory file: {exc.strerror or exc}"
    raise InventoryError([InventoryIssue(message, file=source)])


# ----- composing: PyYAML's parser, every plain scalar left unresolved ----------------------------------


def _resolve(kind: Any, value: Any, implicit: Any) -> str:
    """Tags of untagged nodes: plain scalars get ``_PLAIN`` (resolved by the format's schema later)."""
    if kind is ScalarNode:
        return _PLAIN if implicit[0] else _STR
    return _SEQ if kind is SequenceNode else _MAP


_CSafeLoader: Any = getattr(yaml, "CSafeLoader", None)

if _CSafeLoader is not None:

    class _CLoader(_CSafeLoader):  # type: ignore[misc, unused-ignore]
        """libyaml's parser and composer; libyaml itself stops at 1000 levels of nesting."""

        def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
            return _resolve(kind, value, implicit)


class _PyLoader(yaml.SafeLoader):  # type: ignore[misc, unused-ignore]
    """PyYAML's pure-Python parser (where libyaml is missing); its composer recurses: depth is capped."""

    _depth = 0

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        return _resolve(kind, value, implicit)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self._depth >= MAX_DEPTH and self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            peek: Callable[[], Any] = self.peek_event  # untyped in types-PyYAML
            mark = peek().start_mark
            raise _Refused(_DEPTH_MESSAGE, mark.line + 1)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_LOADER: Any = _CLoader if _CSafeLoader is not None else _PyLoader


def _compose(text: str) -> Any:
    loader = _LOADER(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


# ----- schemas: what a plain scalar means -----------------------------------------------------------

_SAFE: Any = yaml.constructor.SafeConstructor()
# PyYAML's YAML 1.1 implicit resolvers (what Ansible's loader uses), by first character.
_RESOLVERS_11: dict[Any, list[tuple[str, re.Pattern[str]]]] = yaml.resolver.Resolver.yaml_implicit_resolvers
_TIMESTAMP_RE = next(r for tag, r in _RESOLVERS_11["0"] if tag == _TIMESTAMP)

# YAML 1.2 core schema, as ruamel.yaml read the native format before (digit separators and 0b included).
_INT_12 = re.compile(r"[-+]?(?:[0-9][0-9_]*|0o[0-7][0-7_]*|0x[0-9a-fA-F][0-9a-fA-F_]*|0b[01][01_]*)")
_FLOAT_12 = re.compile(
    r"[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
_NUMBER_START = frozenset("-+.0123456789")
_NULLS_12 = frozenset({"", "~", "null", "Null", "NULL"})
_BOOLS_12 = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_BASES = {"0x": 16, "0o": 8, "0b": 2}


def _check_digits(node: Any) -> None:
    text = str(node.value)
    if len(text) <= MAX_INT_DIGITS:
        return
    body = text.lstrip("+-")
    if body[:2].lower() in _BASES:
        body = body[2:]
    digits = sum(ch not in "_:" for ch in body)
    if digits > MAX_INT_DIGITS:
        raise _Refused(
            f"an integer of {digits} digits (at most {MAX_INT_DIGITS} are read): quote it if it is text",
            node.start_mark.line + 1,
        )


def _number_error(node: Any, what: str) -> _Refused:
    shown = describe(str(node.value))
    return _Refused(f"cannot read {shown} as {what}: quote it if it is text", node.start_mark.line + 1)


def _construct_11(tag: str, node: Any) -> Any:
    """A scalar of YAML 1.1 ``tag``, converted as PyYAML's safe loader (and so Ansible) converts it."""
    try:
        if tag == _INT:
            _check_digits(node)
            return _SAFE.construct_yaml_int(node)
        if tag == _FLOAT:
            return _SAFE.construct_yaml_float(node)
        if tag == _BOOL:
            return _SAFE.construct_yaml_bool(node)
        if tag == _NULL:
            return None
        if tag == _TIMESTAMP:
            return _SAFE.construct_yaml_timestamp(node)
    except (ValueError, KeyError, OverflowError, TypeError):
        what = {_INT: "an integer", _FLOAT: "a number", _BOOL: "a boolean"}.get(tag, "a date or time")
        raise _number_error(node, what) from None
    return str(node.value)  # '<<' and '=' outside their places: text


def _plain_11(node: Any) -> Any:
    value: str = node.value
    for tag, regexp in _RESOLVERS_11.get(value[0] if value else "", ()):
        if regexp.match(value):
            return _construct_11(tag, node)
    return value


def _plain_12(node: Any) -> Any:
    value: str = node.value
    if not value:
        return None
    first = value[0]
    if first in _NUMBER_START:
        if _INT_12.fullmatch(value):
            _check_digits(node)
            digits = value.replace("_", "")
            sign = -1 if digits[0] == "-" else 1
            digits = digits.lstrip("+-")
            base = _BASES.get(digits[:2], 10)
            return sign * int(digits[2:] if base != 10 else digits, base)
        if _FLOAT_12.fullmatch(value):
            return _construct_11(_FLOAT, node)  # same conversion: '.inf', '1_0.5', '1e3'
        if _TIMESTAMP_RE.match(value):
            return _construct_11(_TIMESTAMP, node)
        return value
    if first in "~nN" and value in _NULLS_12:
        return None
    if first in "tTfF" and value in _BOOLS_12:
        return _BOOLS_12[value]
    return value


_EXPLICIT = {_INT: "an integer", _FLOAT: "a number", _BOOL: "a boolean", _NULL: "null", _TIMESTAMP: "a date"}


def _explicit(node: Any) -> Any:
    """A scalar with an explicit tag: ``!!int "5"`` is converted, ``!vault ...`` becomes :class:`Tagged`."""
    tag = str(node.tag)
    if tag in _EXPLICIT:
        try:
            if tag == _INT:
                _check_digits(node)
                return _SAFE.construct_yaml_int(node)
            if tag == _BOOL:
                return _SAFE.construct_yaml_bool(node)
            return _construct_11(tag, node)
        except (ValueError, KeyError, OverflowError, TypeError):
            raise _number_error(node, _EXPLICIT[tag]) from None
    shown = "!!" + tag[len(_STANDARD) :] if tag.startswith(_STANDARD) else tag
    return Tagged(shown, node.value)


# ----- building values -------------------------------------------------------------------------------


class _Builder:
    """Values of a node graph, every alias expanded into its own copy (within :data:`MAX_ALIAS_VALUES`).

    ``shallow``: collections below the second level are left empty (enough to tell the format apart).
    """

    def __init__(self, plain_scalar: Callable[[Any], Any], *, strict: bool, shallow: bool = False) -> None:
        self.plain_scalar = plain_scalar
        self.strict = strict
        self.shallow = shallow
        self.built: set[int] = set()  # collections built once: meeting one again is an alias
        self.path: set[int] = set()  # collections being built: meeting one of them is an alias loop
        self.alias_values = 0

    def scalar(self, node: Any) -> Any:
        tag = node.tag
        if tag == _PLAIN:
            return self.plain_scalar(node)
        if tag == _STR:
            return node.value
        return _explicit(node)

    def build(self, node: Any, depth: int, alias: Any) -> Any:
        """``depth``: nesting of ``node``; ``alias``: the anchored node whose copy is being built."""
        if alias is not None:
            self.alias_values += 1
            if self.alias_values > MAX_ALIAS_VALUES:
                raise _Refused(
                    f"aliases of the anchor at this line expand to more than {MAX_ALIAS_VALUES} values "
                    "(a YAML 'billion laughs'?): write the values out instead of nesting aliases",
                    alias.start_mark.line + 1,
                )
        if node.__class__ is ScalarNode:
            return self.scalar(node)
        key = id(node)
        line = node.start_mark.line + 1
        if key in self.path:
            raise _Refused("an alias refers to the mapping or list that contains it: remove the loop", line)
        if depth > MAX_DEPTH:
            raise _Refused(_DEPTH_MESSAGE, line)
        if alias is None and key in self.built:
            alias = node
        self.built.add(key)
        if self.shallow and depth > 2:
            return YamlMap(line) if isinstance(node, MappingNode) else YamlList(line)
        self.path.add(key)
        try:
            if isinstance(node, MappingNode):
                return self._mapping(node, line, depth, alias)
            return self._sequence(node, line, depth, alias)
        finally:
            self.path.discard(key)

    def _sequence(self, node: Any, line: int, depth: int, alias: Any) -> YamlList:
        result = YamlList(line)
        lines = result.item_lines
        scalar, build = self.scalar, self.build
        for item in node.value:
            if alias is None and item.__class__ is ScalarNode:  # the common case, without a call
                result.append(scalar(item))
            else:
                result.append(build(item, depth + 1, alias))
            lines.append(item.start_mark.line + 1)
        return result

    def _mapping(self, node: Any, line: int, depth: int, alias: Any) -> YamlMap:
        result = YamlMap(line)
        lines = result.key_lines
        merges: list[YamlMap] = []
        scalar, build = self.scalar, self.build
        for key_node, value_node in node.value:
            key_line_ = key_node.start_mark.line + 1
            if key_node.__class__ is ScalarNode:
                if (key_node.tag == _PLAIN and key_node.value == "<<") or key_node.tag == _MERGE:
                    merges.extend(self._merge_sources(value_node, depth, alias))
                    continue
                key = scalar(key_node) if alias is None else build(key_node, depth + 1, alias)
            else:
                raise _Refused("a mapping or a list as a key: keys must be single values", key_line_)
            if key in result and self.strict:
                shown = str(key_node.value)
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                # only the key is named: the values may be secrets
                raise _Refused(f"duplicate key '{shown}' in the same mapping", key_line_)
            if alias is None and value_node.__class__ is ScalarNode:
                result[key] = scalar(value_node)
            else:
                result[key] = build(value_node, depth + 1, alias)
            lines[key] = key_line_
        for merged in merges:  # keys written in the mapping win; among merged mappings the first wins
            for key, value in merged.items():
                if key not in result:
                    result[key] = value
                    lines[key] = merged.key_lines.get(key)
        return result

    def _merge_sources(self, value_node: Any, depth: int, alias: Any) -> list[YamlMap]:
        nodes = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
        sources: list[YamlMap] = []
        for item in nodes:
            if not isinstance(item, MappingNode):
                raise _Refused(
                    "'<<' (merge key) takes a mapping or a list of mappings (e.g. '<<: *defaults')",
                    item.start_mark.line + 1,
                )
            built = self.build(item, depth + 1, alias)
            if isinstance(built, YamlMap):
                sources.append(built)
        return sources


def _error_line(exc: yaml.MarkedYAMLError) -> int | None:
    mark = exc.problem_mark or exc.context_mark
    return int(mark.line) + 1 if mark is not None else None


#: what an Ansible group body holds
GROUP_KEYS = ("hosts", "vars", "children")


def looks_ansible(data: Mapping[Any, Any]) -> bool:
    """True when some top-level value is an Ansible group body (``hosts:``/``children:``/``vars:``)."""
    if isinstance(data.get("nodes"), list):
        return False
    if isinstance(data.get("all"), Mapping):
        return True
    return any(isinstance(body, Mapping) and any(k in body for k in GROUP_KEYS) for body in data.values())


def _looks_ansible(root: Any) -> bool:
    top = _Builder(_plain_12, strict=False, shallow=True).build(root, 1, None)
    return isinstance(top, Mapping) and looks_ansible(top)


def load_yaml(text: str, source: str) -> Any:
    """Parse ``text`` into :class:`YamlMap`/:class:`YamlList`/scalars. Every refusal is one issue."""
    try:
        if len(text) > MAX_FILE_BYTES:
            raise _Refused(_too_big(len(text.encode("utf-8", "surrogatepass"))), None)
        root = _compose(text)
        if root is None:
            return None
        if isinstance(root, MappingNode) and _looks_ansible(root):
            return _Builder(_plain_11, strict=True).build(root, 1, None)
        return _Builder(_plain_12, strict=True).build(root, 1, None)
    except _Refused as exc:
        issue = InventoryIssue(exc.message, file=source, line=exc.line)
    except yaml.MarkedYAMLError as exc:
        problem = str(exc.problem or exc.context or "invalid YAML")
        if "maximum nesting depth" in problem:  # libyaml's own limit (1000 levels)
            issue = InventoryIssue(_DEPTH_MESSAGE, file=source, line=_error_line(exc))
        elif "duplicate anchor" in str(exc.context):
            message = "an anchor name (&name) defined a second time: give each anchor its own name"
            issue = InventoryIssue(message, file=source, line=_error_line(exc))
        else:
            message = f"YAML syntax error: {problem}"
            if exc.context and exc.problem:
                message += f" ({exc.context})"
            issue = InventoryIssue(message, file=source, line=_error_line(exc))
    except yaml.reader.ReaderError as exc:
        position = exc.position if isinstance(exc.position, int) else None
        line = text.count("\n", 0, position) + 1 if position is not None else None
        issue = InventoryIssue(
            f"YAML error: {exc.reason} (character #x{exc.character:04x})"
            if isinstance(exc.character, int)
            else f"YAML error: {exc.reason}",
            file=source,
            line=line,
        )
    except RecursionError:  # a safety net: the depth limits above come first
        issue = InventoryIssue(_DEPTH_MESSAGE, file=source)
    except (yaml.YAMLError, ValueError, TypeError) as exc:
        issue = InventoryIssue(f"YAML error: {type(exc).__name__}", file=source)
    raise InventoryError([issue])
