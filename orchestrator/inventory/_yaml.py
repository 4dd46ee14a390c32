"""YAML loading for inventories: ruamel.yaml round-trip mode, so every key and item keeps its line.

Line numbers returned by the helpers here are 1-based (ruamel stores 0-based ones). Values are read from
the round-trip containers directly (they are ``dict``/``list`` subclasses); :func:`plain` turns a value
into plain Python types before it is handed to pydantic.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from orchestrator.errors import InventoryError, InventoryIssue

__all__ = [
    "Tagged",
    "closest",
    "describe",
    "did_you_mean",
    "item_line",
    "key_line",
    "load_yaml",
    "node_line",
    "plain",
    "read_text",
]

_DUPLICATE_KEY = re.compile(r'found duplicate key "(?P<key>.*?)" with value')


class Tagged:
    """A scalar carrying an explicit local YAML tag such as ``!vault`` (the value is never shown)."""

    __slots__ = ("_value", "tag")

    def __init__(self, tag: str, value: Any) -> None:
        self.tag = tag
        self._value = value

    def __repr__(self) -> str:
        return f"<{self.tag} value>"


def read_text(path: Path, source: str) -> str:
    """The file's text; an :class:`InventoryError` (without line) when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
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


def load_yaml(text: str, source: str) -> Any:
    """Parse ``text`` in round-trip mode. Syntax errors become one :class:`InventoryIssue` with its line."""
    yaml = YAML(typ="rt")
    try:
        return yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = str(exc.problem or exc.context or "invalid YAML")
        dup = _DUPLICATE_KEY.match(problem)
        if dup:
            # ruamel's message repeats both values; they may be secrets, so only the key is named.
            message = f"duplicate key '{dup.group('key')}' in the same mapping"
        else:
            message = f"YAML syntax error: {problem}"
            if exc.context and exc.problem:
                message += f" ({exc.context})"
        raise InventoryError([InventoryIssue(message, file=source, line=line)]) from None
    except (YAMLError, ValueError, TypeError) as exc:
        name = type(exc).__name__
        raise InventoryError([InventoryIssue(f"YAML error: {name}", file=source)]) from None


def key_line(mapping: Any, key: Any) -> int | None:
    """1-based line of ``key`` in a round-trip mapping (also through ``<<:`` merge keys)."""
    if not isinstance(mapping, CommentedMap):
        return None
    try:
        return int(mapping.lc.key(key)[0]) + 1
    except (KeyError, TypeError, AttributeError):
        pass
    try:
        merged: Iterable[Any] = getattr(mapping, "merge", ()) or ()
        for other in merged:
            if isinstance(other, CommentedMap) and key in other:
                return key_line(other, key)
    except TypeError:
        pass
    return node_line(mapping)


def item_line(seq: Any, index: int) -> int | None:
    """1-based line of item ``index`` of a round-trip sequence."""
    if not isinstance(seq, CommentedSeq):
        return None
    try:
        return int(seq.lc.item(index)[0]) + 1
    except (KeyError, IndexError, TypeError, AttributeError):
        return node_line(seq)


def node_line(obj: Any) -> int | None:
    """1-based line where a round-trip mapping or sequence starts."""
    lc = getattr(obj, "lc", None)
    line = getattr(lc, "line", None)
    return int(line) + 1 if isinstance(line, int) else None


def plain(value: Any) -> Any:
    """Convert ruamel round-trip values into plain ``dict``/``list``/``str``/``int``/``float``/``bool``.

    Tagged scalars (``!vault``) become :class:`Tagged` so callers can report them.
    """
    if isinstance(value, TaggedScalar):
        tag = value.tag.value if value.tag is not None else "!"
        return Tagged(str(tag), value.value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


def describe(value: Any) -> str:
    """A short description of a (user-supplied, non-secret) value for messages."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, Tagged):
        return f"a {value.tag}-tagged value"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return repr(shown)
    return repr(value)


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (difflib), or None when nothing is reasonably close."""
    options = list(dict.fromkeys(str(c) for c in candidates))
    matches = difflib.get_close_matches(str(word), options, n=1, cutoff=0.6)
    if matches:
        return matches[0]
    lowered = {o.lower(): o for o in options}
    return lowered.get(str(word).lower())


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` or ``""``."""
    match = closest(word, candidates)
    return f"; did you mean '{match}'?" if match is not None and match != word else ""
