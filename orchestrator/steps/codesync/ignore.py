"""Which project files code sync leaves out: default excludes, ``.gitignore`` files, ``code.excludes``.

The pattern language is gitignore's (``man gitignore``), implemented here for source trees that are
not git work trees (a tarball, a copy without ``.git``) and to decide which files on a node are
protected from deletion (a node's ``__pycache__``, training outputs written into the code directory):

- blank lines and ``#`` comments are skipped; ``\\#`` and ``\\!`` escape; trailing spaces are dropped
  unless escaped with a backslash;
- ``!pattern`` re-includes what an earlier pattern excluded, except below an excluded directory (git
  does not look inside one, so neither do we);
- a trailing ``/`` matches directories only;
- a pattern with a ``/`` at its start or in its middle is anchored to the directory of the file that
  holds it; one without matches a name at any depth;
- ``*`` and ``?`` never match ``/``; ``[a-z]`` / ``[!a-z]`` are classes; ``**/x``, ``x/**`` and
  ``a/**/b`` span directories.

Later rules win, so the order is: default excludes, then ``.gitignore`` files from the top down, then
the inventory's ``excludes`` (which can therefore re-include a default with ``!``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_EXCLUDES",
    "RESERVED_PREFIX",
    "IgnoreRules",
    "Rule",
    "parse_lines",
    "parse_pattern",
]

#: Left out of every sync: version-control data, bytecode, virtual environments (a venv is tied to
#: its own path and platform: `bootstrap sync` builds the node's), tool caches, and ``runs/`` at the
#: top (bootstrap's own run logs on the controller). Listed in docs/sync.md.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    "*.pyc",
    "*.pyo",
    ".venv*/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    ".DS_Store",
    "/runs/",
)

#: names at the top of the destination that belong to code sync itself (its cache, uploads)
RESERVED_PREFIX = ".bootstrap-code"
#: its record of what syncs shipped there (steps/probes/code_tree.py SHIPPED), which launch reads
SHIPPED_RECORD = RESERVED_PREFIX + "-shipped.json"
#: what `launch` put into the code directory since the last sync, a line each (``SHA256 "REL"``, REL
#: as JSON writes it; appended, so every script launched is there): the controller counts the last
#: one of a project path as shipped (probes/code_tree.py ``load_launched``, codesync.sync ``_shipped``)
LAUNCHED_RECORD = RESERVED_PREFIX + "-launched"


@dataclass(frozen=True)
class Rule:
    """One pattern line, compiled."""

    pattern: str  # as written (for messages)
    base: str  # directory (relative to the source, "" = top) whose .gitignore holds it
    negate: bool
    dir_only: bool
    regex: re.Pattern[str]
    origin: str  # "default", "excludes", "sub/.gitignore:3"

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1 :]
        return self.regex.fullmatch(rel) is not None


def _class(pattern: str, start: int) -> tuple[str, int] | None:
    """The regex of the bracket expression at ``pattern[start] == "["`` and the index after it."""
    i = start + 1
    negate = i < len(pattern) and pattern[i] in "!^"
    if negate:
        i += 1
    body = ""
    first = True
    while i < len(pattern):
        c = pattern[i]
        if c == "]" and not first:
            return ("[^" if negate else "[") + body + "]", i + 1
        if c == "\\" and i + 1 < len(pattern):
            i += 1
            c = pattern[i]
        body += "\\" + c if c in "\\^][" else c  # "-" stays a range operator
        first = False
        i += 1
    return None  # no closing bracket: git treats the "[" literally


def _glob(pattern: str) -> str:
    """Regex text for a glob in which ``*``/``?`` stop at ``/`` and ``**`` spans directories.

    A star followed by more pattern matches the next piece at its first place and keeps it (an
    atomic lookahead: ``(?=(?P<sN>[^/]*?PIECE))(?P=sN)``, as fnmatch.translate does): a glob star has
    no better choice than the first one (whatever a later place could match, the first can too), and
    a backtracking ``[^/]*a[^/]*a...b`` took minutes on one long file name. The star of the last
    piece stays greedy, since that piece must end the name."""
    tokens: list[tuple[str, str]] = []  # ("star", ""), ("any", regex: ** parts), ("lit", regex)
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            stars = j - i
            at_start = i == 0 or pattern[i - 1] == "/"
            at_end = j == n or pattern[j] == "/"
            if stars >= 2 and at_start and at_end:
                if j == n:  # "x/**" (or a lone "**"): everything below
                    tokens.append(("any", ".*"))
                else:  # "**/" : zero or more directories
                    tokens.append(("any", "(?:[^/]*/)*"))
                    j += 1
            else:  # other runs of stars are ordinary stars
                tokens.append(("star", ""))
            i = j
        elif c == "?":
            tokens.append(("lit", "[^/]"))
            i += 1
        elif c == "[":
            compiled = _class(pattern, i)
            if compiled is None:
                tokens.append(("lit", re.escape(c)))
                i += 1
            else:
                tokens.append(("lit", compiled[0]))
                i = compiled[1]
        elif c == "\\" and i + 1 < n:
            tokens.append(("lit", re.escape(pattern[i + 1])))
            i += 2
        else:
            tokens.append(("lit", re.escape(c)))
            i += 1
    out: list[str] = []
    groups = 0
    k = 0
    while k < len(tokens):
        kind, text = tokens[k]
        k += 1
        if kind != "star":
            out.append(text)
            continue
        piece = []
        while k < len(tokens) and tokens[k][0] == "lit":
            piece.append(tokens[k][1])
            k += 1
        if not piece or k == len(tokens):  # nothing after it, or the last piece: greedy
            out.append("[^/]*" + "".join(piece))
            continue
        name = f"s{groups}"
        groups += 1
        out.append(f"(?=(?P<{name}>[^/]*?{''.join(piece)}))(?P={name})")
    return "".join(out)


def _strip_trailing_spaces(line: str) -> str:
    end = len(line)
    while end > 0 and line[end - 1] == " ":
        # an escaped space ("\ ") stays: count the backslashes before it
        backslashes = 0
        k = end - 2
        while k >= 0 and line[k] == "\\":
            backslashes += 1
            k -= 1
        if backslashes % 2:
            break
        end -= 1
    return line[:end]


def parse_pattern(line: str, *, base: str = "", origin: str = "") -> Rule | None:
    """One gitignore line -> a rule (None for blank lines and comments)."""
    text = _strip_trailing_spaces(line.rstrip("\r\n"))
    if not text or text.startswith("#"):
        return None
    negate = False
    if text.startswith("!"):
        negate = True
        text = text[1:]
    elif text.startswith(("\\!", "\\#")):
        text = text[1:]
    dir_only = text.endswith("/") and not text.endswith("\\/")
    text = text.rstrip("/") if dir_only else text
    if not text:
        return None
    anchored = "/" in text
    text = text.lstrip("/")
    if not text:
        return None
    body = _glob(text)
    regex = body if anchored else "(?:[^/]*/)*" + body
    return Rule(line.strip(), base.strip("/"), negate, dir_only, re.compile(regex, re.DOTALL), origin)


def parse_lines(lines: Iterable[str], *, base: str = "", origin: str = "") -> list[Rule]:
    """Every rule of a gitignore-style text; ``origin`` plus the line number names each."""
    rules = []
    for number, line in enumerate(lines, 1):
        rule = parse_pattern(line, base=base, origin=f"{origin}:{number}" if origin else "")
        if rule is not None:
            rules.append(rule)
    return rules


class IgnoreRules:
    """An ordered rule list (later rules win) with the excludes kept last whatever is added."""

    def __init__(self, head: Sequence[Rule] = (), tail: Sequence[Rule] = ()) -> None:
        self.head = tuple(head)  # defaults, then .gitignore files as they are found
        self.tail = tuple(tail)  # the inventory's excludes: highest priority

    @classmethod
    def build(
        cls, excludes: Sequence[str] = (), *, defaults: Sequence[str] = DEFAULT_EXCLUDES
    ) -> IgnoreRules:
        return cls(parse_lines(defaults, origin="default"), parse_lines(excludes, origin="excludes"))

    def with_gitignore(self, text: str, base: str, origin: str) -> IgnoreRules:
        """These rules plus a .gitignore found in directory ``base``."""
        added = parse_lines(text.splitlines(), base=base, origin=origin)
        return IgnoreRules((*self.head, *added), self.tail) if added else self

    def verdict(self, rel: str, is_dir: bool) -> bool | None:
        """True: excluded, False: re-included by a ``!`` rule, None: no rule matches ``rel`` itself."""
        for rule in reversed((*self.head, *self.tail)):
            if rule.matches(rel, is_dir):
                return not rule.negate
        return None

    def excluded(self, rel: str, is_dir: bool = False) -> bool:
        """Is ``rel`` (a path relative to the source, "/"-separated) left out, itself or through a
        directory above it?"""
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if self.verdict("/".join(parts[:depth]), True):
                return True
        return bool(self.verdict(rel, is_dir))
