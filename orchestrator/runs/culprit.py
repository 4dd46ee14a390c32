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
#: how many of a rank's last lines are looked at for the victim's words: its last traceback, from
#: its last "Traceback (most recent call last):" (an error raised through C++, such as DDP's "Got the
#: following error when running the callback", ends with an "At:" list of frames after its message),
#: else its last ``LAST_LINES``
VICTIM_LINES = 40
LAST_LINES = 5
_TRACEBACK = "Traceback (most recent call last):"
_ENTRY = re.compile(r"^\[\d+\]:\s*$")
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode)\s*:\s*(.*?)\s*$")
_RANK = re.compile(r"(\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_CODE = re.compile(r"(-?\d+)")
_PID = re.compile(r"\(pid: (\d+)\)")
#: torchrun's agent stopping its other workers once one failed (their failures are its own doing)
_STOPPING = re.compile(r"Sending process (\d+) closing signal SIG[A-Z]+")


@dataclass(frozen=True)
class Failure:
    """One failed worker as torchrun's summary lists it."""

    rank: int
    local_rank: int | None
    exit_code: int
    time: str
    root: bool  # torchrun's own "first observed failure"
    fields: tuple[str, ...]  # its "host : ...", "rank : ...", "exitcode : ..." lines, stripped
    pid: int | None = None


def launcher_lines(text: str) -> str:
    """``text`` without the ranks' lines (tagged ``[defaultN]:`` by the rank capture): what torchrun
    and the launch script printed. A rank's words are never read as theirs."""
    return "\n".join(line for line in text.split("\n") if not line.startswith("[default"))


def torchrun_failures(text: str) -> list[Failure]:
    """Every failure of torchrun's last failure summary in ``text`` (the root cause among them);
    ``[]`` when there is none. Only torchrun's own lines are read (:func:`launcher_lines`); what a
    rank wrote into its error file (``TORCHELASTIC_ERROR_FILE``), torchrun prints as its own."""
    text = launcher_lines(text)
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
            local, pid = rank.group(2), _PID.search(values.get("exitcode", ""))
            out.append(
                Failure(
                    int(rank.group(1)),
                    None if local is None else int(local),
                    int(code.group(1)),
                    values.get("time", ""),
                    root,
                    tuple(shown),
                    None if pid is None else int(pid.group(1)),
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
    """Whether a rank's last lines say it died of a peer's closed connection (its last traceback's
    exception, or its last few lines without one)."""
    window = list(lines[-VICTIM_LINES:])
    start = next((i for i in range(len(window) - 1, -1, -1) if _TRACEBACK in window[i]), None)
    shown = window[-LAST_LINES:] if start is None else window[start:]
    return any(_VICTIM.search(line) for line in shown)


def stopped_pids(text: str) -> frozenset[int]:
    """The workers torchrun itself stopped in ``text`` (``Sending process N closing signal SIGTERM``,
    once one of them had failed): their failures are not causes."""
    return frozenset(int(pid) for pid in _STOPPING.findall(launcher_lines(text)))


def culprit(
    failures: Sequence[Failure],
    last_lines: Callable[[Failure], Sequence[str]],
    stopped: frozenset[int] = frozenset(),
) -> Failure | None:
    """torchrun's root cause, unless its last lines are gloo's closed connection and another failure
    of the same second's are not (then the lowest such rank), or torchrun stopped it itself (pid in
    ``stopped``: then the first failure of its own, one not of the closed connection if any); None
    without a root cause."""
    root = next((f for f in failures if f.root), None)
    if root is None:
        return None
    if root.pid is not None and root.pid in stopped:
        own = sorted(
            (f for f in failures if f.pid is None or f.pid not in stopped), key=lambda f: (f.time, f.rank)
        )
        return next((f for f in own if not is_victim(last_lines(f))), own[0] if own else root)
    if not is_victim(last_lines(root)):
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


#: gloo's words for a peer that went away, with its address: ``... by peer [10.0.0.12]:27048``
_PEER = re.compile(r"Connection (?:closed|reset) by peer \[([0-9A-Fa-f:.]+)\]")


def peers_gone(lines: Sequence[str], node_of: Callable[[str], str | None]) -> list[tuple[str, str]]:
    """(address, node) of every peer the ``lines`` say closed its connection, once each, in order,
    for the addresses ``node_of`` knows: the node whose ranks went away first, which a rank dying of
    it (torchrun's root cause on another node) does not name."""
    found: dict[str, str] = {}
    for line in lines:
        for address in _PEER.findall(line):
            node = node_of(address)
            if node is not None and address not in found:
                found[address] = node
    return list(found.items())


def disk_full(text: str) -> bool:
    """Whether a node's output says a write failed for want of space (ENOSPC's words, as Python,
    tee, torch.save and the launcher's own exit-code line put them)."""
    return "No space left on device" in text
