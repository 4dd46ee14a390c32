"""Which rank of a node's failed torchrun is the culprit, from torchrun's failure summary and the
ranks' last lines.

torchrun's "Root Cause (first observed failure)" is the failure with the smallest timestamp, and its
timestamps have one-second resolution: when a rank dies and a co-located rank dies of the closed
gloo connection within the same second (the same monitor poll), the tie goes to the lower local
rank, which may be the victim. The victim's last lines are gloo's "Connection closed by peer" (or
"reset by peer"); among the failures of the root cause's second, one whose last lines are not that
is the culprit. Pure: the callers give the text and each rank's lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ROOT_CAUSE = "Root Cause (first observed failure):"
#: the last lines of a rank that died because a peer's connection went away (gloo's words)
_VICTIM = re.compile(r"Connection (?:closed|reset) by peer")
#: how many of a rank's last lines are looked at for the victim's words (its traceback's last lines)
VICTIM_LINES = 5
_ENTRY = re.compile(r"^\[\d+\]:\s*$")
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode)\s*:\s*(.*?)\s*$")
_RANK = re.compile(r"(\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_CODE = re.compile(r"(-?\d+)")


@dataclass(frozen=True)
class Failure:
    """One failed worker as torchrun's summary lists it."""

    rank: int
    local_rank: int | None
    exit_code: int
    time: str
    root: bool  # torchrun's own "first observed failure"
    fields: tuple[str, ...]  # its "host : ...", "rank : ...", "exitcode : ..." lines, stripped


def torchrun_failures(text: str) -> list[Failure]:
    """Every failure of torchrun's last failure summary in ``text`` (the root cause among them);
    ``[]`` when there is none."""
    start = text.rfind(ROOT_CAUSE)
    if start < 0:
        return []
    begin = text.rfind("Failures:", 0, start)
    section = text[begin if begin >= 0 else start :]
    end = section.find("\n=====", section.find(ROOT_CAUSE))
    section = section if end < 0 else section[:end]
    out: list[Failure] = []
    root = False
    values: dict[str, str] = {}
    shown: list[str] = []

    def close() -> None:
        rank, code = _RANK.match(values.get("rank", "")), _CODE.match(values.get("exitcode", ""))
        if rank is not None and code is not None:
            local = rank.group(2)
            out.append(
                Failure(
                    int(rank.group(1)),
                    None if local is None else int(local),
                    int(code.group(1)),
                    values.get("time", ""),
                    root,
                    tuple(shown),
                )
            )
        values.clear()
        shown.clear()

    for line in section.split("\n"):
        if line.startswith(ROOT_CAUSE):
            close()
            root = True
        elif _ENTRY.match(line):
            close()
        else:
            field = _FIELD.match(line)
            if field is not None:
                values.setdefault(field.group(1), field.group(2))
                if field.group(1) != "time":
                    shown.append(line.strip())
    close()
    return out


def is_victim(lines: Sequence[str]) -> bool:
    """Whether a rank's last lines say it died of a peer's closed connection."""
    return any(_VICTIM.search(line) for line in lines[-VICTIM_LINES:])


def culprit(failures: Sequence[Failure], last_lines: Callable[[Failure], Sequence[str]]) -> Failure | None:
    """torchrun's root cause, unless its last lines are gloo's closed connection and another failure
    of the same second's are not (then the lowest such rank); None without a root cause."""
    root = next((f for f in failures if f.root), None)
    if root is None or not is_victim(last_lines(root)):
        return root
    tied = sorted((f for f in failures if f.time == root.time and f is not root), key=lambda f: f.rank)
    return next((f for f in tied if not is_victim(last_lines(f))), root)


def tagged_lines(text: str, tag: int, keep: int = VICTIM_LINES) -> list[str]:
    """The last ``keep`` lines of ``text`` tagged ``[default<tag>]:`` by the rank capture."""
    prefix = f"[default{tag}]:"
    found: list[str] = []
    end = len(text)
    while len(found) < keep:
        at = text.rfind("\n" + prefix, 0, end)
        if at < 0:
            if text.startswith(prefix):
                found.append(text[len(prefix) : text.find("\n") if "\n" in text else len(text)])
            break
        stop = text.find("\n", at + 1)
        found.append(text[at + 1 + len(prefix) : stop if stop >= 0 else len(text)])
        end = at
    return found[::-1]
