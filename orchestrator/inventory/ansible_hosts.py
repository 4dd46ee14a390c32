"""Host patterns of Ansible inventories: ``web[01:03]`` ranges and a ``:2222`` port suffix.

A key under ``hosts:`` may stand for many hosts; it is expanded the way Ansible expands it (numeric
ranges keep zero padding, letter ranges, an optional step, several ranges in one name), within limits:
a LAN cluster is a few hundred machines, while ``n[0:99999999]`` would build a hundred million names
(gigabytes) before anything could be checked. A malformed or oversized pattern is one issue and gives
no host.
"""

from __future__ import annotations

import re
import string

from orchestrator.inventory.issues import IssueLog

__all__ = ["MAX_RANGE_HOSTS", "HostPatterns"]

_RANGE = re.compile(r"\[(?P<start>[0-9]+|[a-z]):(?P<end>[0-9]+|[a-z])(?::(?P<step>[0-9]+))?\]")
# Host names one range pattern (``n[0:99]``, ``r[0:9]n[0:99]``) may expand to, and all the range
# patterns of one file together.
MAX_RANGE_HOSTS = 4096
# Digits of a range bound or step (zero-padded bounds included): enough for any host numbering.
_MAX_RANGE_DIGITS = 12
# Ranges in one host name (each one is one more pass over the names made so far).
_MAX_RANGES = 8


class HostPatterns:
    """Expands the host patterns of one file, reporting to ``log``; counts the hosts ranges made so far
    (:data:`MAX_RANGE_HOSTS` in all)."""

    def __init__(self, log: IssueLog) -> None:
        self.log = log
        self._range_hosts = 0

    def expand(self, pattern: str, line: int | None) -> list[tuple[str, int | None]]:
        """Host names of one ``hosts:`` key: ``web[01:03]`` ranges and a ``:port`` suffix, like Ansible."""
        pattern, port = _split_port(pattern)
        if _RANGE.search(pattern) is None:
            return [(pattern, port)]
        if self._range_hosts > MAX_RANGE_HOSTS:
            return []  # already reported: the file's ranges give too many hosts
        if pattern.count("[") > _MAX_RANGES:
            message = f"bad host range in '{_shorten(pattern)}': at most {_MAX_RANGES} ranges in one name"
            self.log.add(message, line=line)
            return []
        names = [pattern]
        while any(_RANGE.search(n) for n in names):
            expanded: list[str] = []
            for name in names:
                found = _RANGE.search(name)
                if found is None:
                    expanded.append(name)
                    continue
                values = self._range_values(found, line, pattern, MAX_RANGE_HOSTS - len(expanded))
                if values is None:
                    return []
                expanded.extend(name[: found.start()] + v + name[found.end() :] for v in values)
            names = expanded
        self._range_hosts += len(names)
        if self._range_hosts > MAX_RANGE_HOSTS:
            self.log.add(
                f"the host ranges of this file give more than {MAX_RANGE_HOSTS} hosts "
                f"(reached at '{_shorten(pattern)}'): list fewer hosts",
                line=line,
            )
            return []
        return [(n, port) for n in names]

    def _range_values(
        self, found: re.Match[str], line: int | None, pattern: str, room: int
    ) -> list[str] | None:
        """The values of one range; None (with an issue) when it is malformed or gives more than ``room``."""
        start, end, step_text = found.group("start"), found.group("end"), found.group("step")
        shown = _shorten(pattern)
        if any(len(t) > _MAX_RANGE_DIGITS for t in (start, end, step_text or "")):
            self.log.add(
                f"bad host range in '{shown}': bounds and step have at most {_MAX_RANGE_DIGITS} digits",
                line=line,
            )
            return None
        step = int(step_text) if step_text else 1
        if start.isdigit() != end.isdigit() or step < 1:
            self.log.add(f"bad host range in '{shown}': expected [1:9], [01:10:2] or [a:f]", line=line)
            return None
        width = len(start) if start.isdigit() and start.startswith("0") else 0
        if start.isdigit():
            first, last = int(start), int(end)
        else:
            first, last = string.ascii_lowercase.index(start), string.ascii_lowercase.index(end)
        if last < first:
            self.log.add(f"bad host range in '{shown}': the end is before the start", line=line)
            return None
        if (last - first) // step + 1 > room:
            self.log.add(
                f"host range '{shown}' gives more than {MAX_RANGE_HOSTS} hosts: split it or list fewer hosts",
                line=line,
            )
            return None
        if start.isdigit():
            return [str(i).zfill(width) for i in range(first, last + 1, step)]
        return [string.ascii_lowercase[i] for i in range(first, last + 1, step)]


def _split_port(pattern: str) -> tuple[str, int | None]:
    """``web[1:3]:2222`` -> (``web[1:3]``, 2222); colons inside ranges and IPv6 addresses are not ports."""
    outside = re.sub(r"\[[^\]]*\]", "", pattern)
    if outside.count(":") != 1:
        return pattern, None
    head, _, tail = pattern.rpartition(":")
    if not tail.isdigit() or head.count("[") != head.count("]"):
        return pattern, None
    return head, int(tail)


def _shorten(pattern: str) -> str:
    """A host pattern as shown in a message (a key may be megabytes long)."""
    return pattern if len(pattern) <= 80 else pattern[:77] + "..."
