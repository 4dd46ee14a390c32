"""Facts and reads: what we learn about a node, each with the command that reveals it and its parser.

A :class:`Fact` is one small class per thing (pyinfra's FactBase shape): the command (in the node's
shell dialect) and the parser of its output. A :class:`Read` is what the step runner
(orchestrator/runner.py) asks a node for: a session key, the sections that reveal it, their parser,
as root or not. :func:`facts_read` makes a list of facts one read (its value: a :class:`FactSet`), so
facts travel like any other read: one mechanism. :func:`read_script` puts many reads in one script
(the root ones nested in it, one command either way) and :func:`parse_reads` gives each its value;
``gather`` runs facts through them. Nothing here decides anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from orchestrator import records
from orchestrator.platforms import Platform
from orchestrator.transports.base import Result, Transport

T = TypeVar("T")


class FactParseError(ValueError):
    """The command ran but its output was not what the fact expects."""


class Fact(ABC, Generic[T]):
    #: key in fact tables and --json
    name: ClassVar[str]

    #: set where one command answers several facts (one interpreter start answers the Python and
    #: torch facts): the section they all read; "" (most facts): a section of its own
    shared_section: ClassVar[str] = ""

    @property
    def section(self) -> str:
        """The section of a read script whose output this fact parses."""
        return self.shared_section or self.name

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


#: the sections of one read as the node answered them: name -> (output, exit code)
Sections = Mapping[str, tuple[str, int]]


@dataclass(frozen=True)
class Read:
    """Something a step learns from a node: ``sections(platform)`` is the ``(name, shell text)`` list
    whose outputs reveal it (run in one script with the other reads of the node), ``parse`` turns
    their answers (and the whole round trip's result, for its exit code and stderr) into the value or
    raises a ``BootstrapError`` saying why it could not be read. ``key`` names the value in the
    session: the same key, the same value, read once per session (until a step that changed the node
    forgets it). ``become``: the sections run as root (``what``: for the message when sudo wants a
    password)."""

    key: str
    sections: Callable[[Platform], list[tuple[str, str]]]
    parse: Callable[[Sections, Result], Any]
    become: bool = False
    what: str = ""
    timeout: float = 60.0
    #: asked every time, never taken from nor kept in the session (a wait, a measurement)
    fresh: bool = False


def facts_read(key: str, facts: Sequence[Fact[Any]], *, timeout: float = 120.0) -> Read:
    """``facts`` as one read under ``key``: its value is their :class:`FactSet` (a fact without an
    answer has its reason in ``errors``; the read itself never fails)."""
    chosen = list(facts)

    def parse(sections: Sections, ran: Result) -> FactSet:
        why = "timed out" if ran.timed_out else f"no output (exit code {ran.exit_code})"
        return parse_sections(chosen, dict(sections), why)

    return Read(key, lambda platform: fact_sections(chosen, platform), parse, timeout=timeout)


def fact_sections(facts: Sequence[Fact[Any]], platform: Platform) -> list[tuple[str, str]]:
    """The ``(section, command)`` list asking every fact of ``facts``: a section several facts read
    is asked once."""
    return _once([(f.section, f.command(platform)) for f in facts])


#: the section that carries a round trip's root reads (their own sections inside, framed with a
#: second nonce), so that a node whose reads need both its login user and root is asked ONE command
AS_ROOT = "as_root"


@dataclass
class ReadScript:
    """The script of some reads of one node and what :func:`parse_reads` needs to answer them."""

    platform: Platform
    top: list[tuple[str, str]]  # the top-level (name, command) sections, in order
    reads: list[tuple[Read, list[tuple[str, str]]]]
    inner: str | None  # the nonce of the nested root sections (None: there are none)
    become: bool  # the whole script runs as root (every read does)

    def script(self, token: str) -> str:
        """The sections as one script, framed with ``token``."""
        return self.platform.sectioned(self.top, token)


def read_script(platform: Platform, reads: Sequence[Read]) -> ReadScript:
    """One script asking every read of ``reads``: as root when all of them are, else as the login user
    with the root ones nested in one :data:`AS_ROOT` section (``sudo -n``, which fails at once where
    it would want a password; its message is that section's output). A section several reads ask
    (the same name and command: the route to the master is the time step's, the preflight's and the
    firewall's) is sent once, as the login user when one of them reads as the login user."""
    asked = [(r, r.sections(platform)) for r in reads]
    own = _once([s for r, sections in asked if not r.become for s in sections])
    # the same shell text asked as root too (the firewall's view of the route and addresses) is
    # answered by the login user's: a command whose answer depends on root is never a user read's
    root = [s for s in _once([s for r, sections in asked if r.become for s in sections]) if s not in own]
    if not own:
        return ReadScript(platform, root, asked, None, True)
    inner = None
    if root:
        inner = records.new_nonce()  # the records' nonce: no output of the node can fake them
        nested = platform.wrap(platform.sectioned(root, inner), become=True)
        own.append((AS_ROOT, f"{{ {nested}\n}} 2>&1"))
    return ReadScript(platform, own, asked, inner, False)


def _once(sections: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``sections`` without repeats; two different commands under one name are a bug."""
    seen: dict[str, str] = {}
    for name, command in sections:
        assert seen.setdefault(name, command) == command, f"two reads ask section {name!r} differently"
    return list(seen.items())


def parse_reads(plan: ReadScript, found: Sections, result: Result) -> list[tuple[Read, Any]]:
    """Each read of ``plan`` with its value from the top-level sections ``found`` (a root read's from
    the nested ones), or the exception its parser raised (the caller decides which to raise: a
    refused sudo is said once)."""
    nested: dict[str, tuple[str, int]] = {}
    if plan.inner is not None and AS_ROOT in found:
        nested = split_sections(found[AS_ROOT][0], plan.inner)
    out: list[tuple[Read, Any]] = []
    for read, own in plan.reads:
        sections = {**found, **nested} if read.become and plan.inner is not None else found
        answered = {name: sections[name] for name, _ in own if name in sections}
        try:
            out.append((read, read.parse(answered, result)))
        except Exception as exc:  # handed back: the caller names the node
            out.append((read, exc))
    return out


def gather(transport: Transport, facts: list[Fact[Any]], *, timeout: float = 120.0) -> FactSet:
    """Run every fact's command on the node in one script and parse each section (a :func:`facts_read`
    asked over ``transport``)."""
    plan = read_script(transport.platform, [facts_read("facts", facts, timeout=timeout)])
    token = records.new_nonce()  # the records' nonce: no output of the node can fake them
    result = transport.run(plan.script(token), timeout=timeout)
    ((_, value),) = parse_reads(plan, split_sections(result.stdout, token), result)
    if isinstance(value, Exception):
        raise value
    return value  # type: ignore[no-any-return]


def collect(facts: list[Fact[Any]], result: Result, token: str) -> FactSet:
    """Parse every fact's section of ``result`` (a run of a ``sectioned`` script framed with ``token``)."""
    why = "timed out" if result.timed_out else f"no output (exit code {result.exit_code})"
    return parse_sections(facts, split_sections(result.stdout, token), why)


def parse_sections(facts: list[Fact[Any]], sections: dict[str, tuple[str, int]], missing: str) -> FactSet:
    """Each fact's value from its section (``missing``: why a fact without a section has no value)."""
    found = FactSet()
    for fact in facts:
        if fact.section not in sections:
            found.errors[fact.name] = missing
            continue
        output, code = sections[fact.section]
        try:
            found.values[fact.name] = fact.parse(output, code)
        except (FactParseError, ValueError, KeyError, IndexError) as exc:
            found.errors[fact.name] = f"unexpected output (exit code {code}): {exc}"
    return found


class SectionStream:
    """The answers of ``Platform.sectioned`` read line by line while the script still runs: the
    sections are known the moment their answer is complete, and what follows the last one (a command
    that keeps running, such as the preflight's listener) is handed back to the caller.

    Keeps the arrival time of each section's end (``time.time()``), written the moment its command
    ended: a section that prints the node's clock is dated by it."""

    def __init__(self, token: str, names: list[str]) -> None:
        self._reader = records.SectionReader(token)
        self._waiting = set(names)
        self.sections: dict[str, tuple[str, int]] = {}
        self.first_line_at: dict[str, float] = {}

    @property
    def complete(self) -> bool:
        """Every expected section ended."""
        return not self._waiting

    def feed(self, line: str, at: float) -> str | None:
        """Take one stdout line received at ``at``; returns it when every section ended (the
        caller's), else None (framing, and what a section's command printed)."""
        if self.complete:
            return line
        found = self._reader.feed(line)
        if found is not None:
            name = _take(found, self.sections)
            self.first_line_at.setdefault(name, at)
            self._waiting.discard(name)
        return None


def _take(found: tuple[str, str, int], sections: dict[str, tuple[str, int]]) -> str:
    """A section's answer into ``sections`` (its text with Windows tools' CRLF as LF, without its
    last newline); returns its name."""
    name, text, code = found
    text = text.replace("\r\n", "\n")
    sections[name] = (text[:-1] if text.endswith("\n") else text, code)
    return name


def split_sections(stdout: str, token: str) -> dict[str, tuple[str, int]]:
    """The answers of a ``Platform.sectioned`` script as ``{name: (output, exit_code)}`` (the output
    without its last newline)."""
    sections: dict[str, tuple[str, int]] = {}
    if records.MARK + token not in stdout:
        return sections
    reader = records.SectionReader(token)
    for line in stdout.split("\n"):  # only "\n", as the transports split lines
        found = reader.feed(line)
        if found is not None:
            _take(found, sections)
    return sections
