"""Node answers in framed records (orchestrator/records.py), as the scripts under test print them:
fakes of a node answer with the nonce found in the script they were sent."""

from __future__ import annotations

import base64
import re

from orchestrator import records
from orchestrator.facts.base import AS_ROOT, split_sections

#: a nonce for answers parsed directly (not in reply to a script)
NONCE = "cb-00112233aabb"


def nonce_of(script: str) -> str:
    """The record nonce a script was given (the first one in it)."""
    found = records.NONCE.search(script)
    assert found is not None, "the script prints no records"
    return found.group(0)


def said(script: str, *answers: tuple[str, ...]) -> str:
    """What a node prints in reply to ``script``: one record per ``(kind, field, ...)``."""
    nonce = nonce_of(script)
    return "".join(records.record(nonce, kind, *fields) for kind, *fields in answers)


def status_said(text: str, nonce: str = NONCE) -> str:
    """``key=value`` lines (one per status value) as the status script's records."""
    lines = [line.partition("=") for line in text.split("\n") if line]
    return "".join(records.record(nonce, key, value) for key, _, value in lines)


def sections_said(nonce: str, sections: dict[str, tuple[str, int]]) -> str:
    """What a ``Platform.sectioned`` script prints: per section its ``exit`` and ``section`` records."""
    return "".join(
        records.record(nonce, "section", name, (text + "\n" if text else "") + f"\0{code}")
        for name, (text, code) in sections.items()
    )


def framed(recording: str, token: str) -> str:
    """A recording in the readable framing of tests/unit/data (``@@TOKEN begin NAME@@``, the
    section's lines, ``@@TOKEN end NAME CODE@@``) as the records the node sends."""
    sections: dict[str, tuple[str, int]] = {}
    begin, end = f"@@{token} begin ", f"@@{token} end "
    current: str | None = None
    lines: list[str] = []
    for line in recording.split("\n"):
        if line.startswith(begin) and line.endswith("@@"):
            current, lines = line[len(begin) : -2], []
        elif line.startswith(end) and line.endswith("@@") and current is not None:
            name, _, code = line[len(end) : -2].rpartition(" ")
            if lines and lines[-1] == "":
                lines.pop()
            sections[name] = ("\n".join(lines), int(code))
            current = None
        elif current is not None:
            lines.append(line)
    return sections_said(token, sections)


#: how sectioned scripts name their nonce and sections (POSIX sh, PowerShell)
_ASKED = re.compile(
    r"_cb_nonce=(?:'\"'\"')?'?(cb-[0-9a-f]{12})|\$cbNonce = '(cb-[0-9a-f]{12})'"
    r"|\n_cb_sec ([A-Za-z0-9+/=]+)|Out-CbRecord 'section' @\('([A-Za-z0-9_.-]+)'"
)


def sections_asked(script: str) -> list[tuple[str, str]]:
    """(nonce, name) of every section a sectioned script (or several, one after another) asks for."""
    asked, nonce = [], ""
    for found in _ASKED.finditer(script):
        if found.group(1) or found.group(2):
            nonce = found.group(1) or found.group(2)
        else:
            name = found.group(4) or base64.b64decode(found.group(3)).decode()
            asked.append((nonce, name))
    return asked


def answer_sections(script: str, sections: dict[str, tuple[str, int]]) -> str:
    """The answer of a node that has ``sections`` (name: (output, code)) to a sectioned script; its
    root sections nested in one ``as_root`` section (facts/base.py ``read_script``) are answered
    inside that one, with their own nonce (``sections["as_root"]``, when given, answers instead:
    a sudo that refused)."""
    asked = sections_asked(script)
    outer = nonce_of(script)
    if not any(name == AS_ROOT for _, name in asked):
        return "".join(sections_said(nonce, {name: sections[name]}) for nonce, name in asked)
    nested = [(nonce, name) for nonce, name in asked if nonce != outer and name != AS_ROOT]
    own = [name for nonce, name in asked if nonce == outer and name != AS_ROOT]
    inner = "".join(sections_said(nonce, {name: sections[name]}) for nonce, name in nested)
    root = sections.get(AS_ROOT, (inner, 0))
    return sections_said(outer, {**{name: sections[name] for name in own}, AS_ROOT: root})


def asks(script: str, name: str) -> bool:
    """Whether a sectioned script asks for section ``name``."""
    return any(asked == name for _, asked in sections_asked(script))


def ask_at(script: str, name: str) -> int:
    """Where in ``script`` section ``name`` is asked for (its record's line)."""
    if f"'{name}'" in script and "Out-CbRecord 'section'" in script:
        return script.index(f"Out-CbRecord 'section' @('{name}'")
    return script.index(f"\n_cb_sec {base64.b64encode(name.encode()).decode()}")


def tail_batch(nonce: str, data: bytes, start: int, end: int) -> bytes:
    """Bytes ``start:end`` of a log as a tail producer sends them (runs/tail.py): escaped as the
    codec's stream form says, then the ``batch`` record with the offset just past them."""
    return records.escape(data[start:end]) + records.record(nonce, "batch", str(end)).encode()


def tail_said(nonce: str, *answers: tuple[str, ...]) -> bytes:
    """A tail producer's control records, as bytes: one per ``(kind, field, ...)``."""
    return "".join(records.record(nonce, kind, *fields) for kind, *fields in answers).encode()


#: where a section's own answers name their nonce (``PosixShell.section_answer``), also once quoted
_ANSWER_NONCE = re.compile(r"@@%s %s\S* (cb-[0-9a-f]{12})")


def answer_nonce(script: str) -> str | None:
    """The nonce of the answers framed inside a section of ``script`` (None: it asks none)."""
    found = _ANSWER_NONCE.search(script)
    return found.group(1) if found else None


def firewall_recorded(recording: str, token: str, nonce: str) -> dict[str, tuple[str, int]]:
    """A firewall detection recording (tests/unit/data/firewall: readable framing, nonce ``token``) as
    the sections a node answers now: ufw's two readable pieces, ``ufw`` (``ufw status``) and
    ``ufw_added`` (``ufw show added``, exit 3 when ufw is off), become the one ``ufw`` section
    holding them as the records ``status`` and ``added`` of ``nonce``."""
    sections = split_sections(framed(recording, token), token)
    if "ufw" not in sections:
        return sections
    status, code = sections.pop("ufw")
    added, added_code = sections.pop("ufw_added", ("", 127))
    said = "" if code == 127 else records.record(nonce, "status", status + "\n")
    if added_code == 0:
        said += records.record(nonce, "added", added + "\n")
    return {**sections, "ufw": (said.rstrip("\n"), code)}
