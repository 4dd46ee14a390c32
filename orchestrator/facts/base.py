"""Facts: one small class per thing we learn about a node (pyinfra's FactBase shape).

A fact knows the command that reveals it (in the node's shell dialect) and how to parse that
command's output. It never decides anything. ``gather`` runs many facts in one round trip.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from orchestrator.platforms import Platform
from orchestrator.transports.base import Result, Transport

T = TypeVar("T")


class FactParseError(ValueError):
    """The command ran but its output was not what the fact expects."""


class Fact(ABC, Generic[T]):
    #: key in fact tables and --json
    name: ClassVar[str]

    @abstractmethod
    def command(self, platform: Platform) -> str:
        """Shell text (in ``platform``'s dialect) whose stdout reveals the fact."""

    @abstractmethod
    def parse(self, output: str, exit_code: int) -> T:
        """Turn the command's stdout (and exit code) into the fact's value."""


@dataclass
class FactSet:
    """Every fact gathered from one node: values, and why the missing ones are missing."""

    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        return self.values.get(name)


def gather(transport: Transport, facts: list[Fact[Any]], *, timeout: float = 120.0) -> FactSet:
    """Run every fact's command on the node in one script and parse each section."""
    token = "cb-" + secrets.token_hex(6)  # unguessable frame markers: no output can fake them
    platform = transport.platform
    script = platform.sectioned([(f.name, f.command(platform)) for f in facts], token)
    result = transport.run(script, timeout=timeout)
    return collect(facts, result, token)


def collect(facts: list[Fact[Any]], result: Result, token: str) -> FactSet:
    """Parse every fact's section of ``result`` (a run of a ``sectioned`` script framed with ``token``)."""
    sections = split_sections(result.stdout, token)
    found = FactSet()
    for fact in facts:
        if fact.name not in sections:
            why = "timed out" if result.timed_out else f"no output (exit code {result.exit_code})"
            found.errors[fact.name] = why
            continue
        output, code = sections[fact.name]
        try:
            found.values[fact.name] = fact.parse(output, code)
        except (FactParseError, ValueError, KeyError, IndexError) as exc:
            found.errors[fact.name] = f"unexpected output (exit code {code}): {exc}"
    return found


def split_sections(stdout: str, token: str) -> dict[str, tuple[str, int]]:
    """Parse the framed output of ``Platform.sectioned`` into ``{name: (output, exit_code)}``."""
    sections: dict[str, tuple[str, int]] = {}
    begin, end = f"@@{token} begin ", f"@@{token} end "
    current: str | None = None
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith(begin) and line.endswith("@@"):
            current, lines = line[len(begin) : -2], []
        elif line.startswith(end) and line.endswith("@@") and current is not None:
            name, _, code = line[len(end) : -2].rpartition(" ")
            # the end marker is preceded by a newline we added: drop that one empty line
            if lines and lines[-1] == "":
                lines.pop()
            sections[name] = ("\n".join(lines), int(code))
            current = None
        elif current is not None:
            lines.append(line)
    return sections
