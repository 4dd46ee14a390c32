"""Values read from an inventory's YAML, and how messages name them.

:func:`orchestrator.inventory._yaml.load_yaml` builds mappings and lists that remember the 1-based line
of every key and item (:class:`YamlMap`, :class:`YamlList`) and keeps explicitly tagged scalars
(``!vault``) as :class:`Tagged`. The format readers and the model ask here for the line of a key or an
item, turn values into plain Python types before pydantic sees them (:func:`plain`), and describe
values and suggest the closest valid key in messages (:func:`describe`, :func:`did_you_mean`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "Tagged",
    "YamlList",
    "YamlMap",
    "closest",
    "describe",
    "did_you_mean",
    "item_line",
    "key_line",
    "node_line",
    "plain",
]


class Tagged:
    """A scalar carrying an explicit local YAML tag such as ``!vault`` (the value is never shown)."""

    __slots__ = ("_value", "tag")

    def __init__(self, tag: str, value: Any) -> None:
        self.tag = tag
        self._value = value

    def __repr__(self) -> str:
        return f"<{self.tag} value>"


class YamlMap(dict[Any, Any]):
    """A mapping read from YAML: ``line`` where it starts, ``key_lines`` the line of each key (1-based)."""

    __slots__ = ("key_lines", "line")

    def __init__(self, line: int | None = None) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int | None] = {}


class YamlList(list[Any]):
    """A sequence read from YAML: ``line`` where it starts, ``item_lines`` the line of each item."""

    __slots__ = ("item_lines", "line")

    def __init__(self, line: int | None = None) -> None:
        super().__init__()
        self.line = line
        self.item_lines: list[int | None] = []


# ----- lines and values ------------------------------------------------------------------------------


def key_line(mapping: Any, key: Any) -> int | None:
    """1-based line of ``key`` in a loaded mapping (a key merged with ``<<:`` has its own line)."""
    if not isinstance(mapping, YamlMap):
        return None
    line = mapping.key_lines.get(key)
    return line if line is not None else mapping.line


def item_line(seq: Any, index: int) -> int | None:
    """1-based line of item ``index`` of a loaded sequence."""
    if not isinstance(seq, YamlList):
        return None
    try:
        return seq.item_lines[index]
    except IndexError:
        return seq.line


def node_line(obj: Any) -> int | None:
    """1-based line where a loaded mapping or sequence starts."""
    return obj.line if isinstance(obj, (YamlMap, YamlList)) else None


def plain(value: Any) -> Any:
    """Convert loaded values into plain ``dict``/``list``/``str``/``int``/``float``/``bool``.

    Tagged scalars (``!vault``) stay :class:`Tagged` so callers can report them.
    """
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
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
