"""Node answers in framed records (orchestrator/records.py), as the scripts under test print them:
fakes of a node answer with the nonce found in the script they were sent."""

from __future__ import annotations

from orchestrator import records

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
