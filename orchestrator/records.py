"""Framed records: the one way a node's scripts send structured answers back to the controller.

A record is one line ``@@<nonce> <kind> :<field> :<field> ...`` ending in ``\\n`` (a ``\\r`` before
it is allowed: Windows consoles). ``nonce`` is chosen by the controller for each command
(:func:`new_nonce`), ``kind`` is ``[a-z][a-z-]*``, and every field is base64 of its bytes after a
``:`` (so an empty field is ``:``). No byte of user data (a file name, a log line, an environment
value) can end a record, start one, or look like one: it only ever travels base64-encoded, and a
whole line must match the grammar with the nonce of this command. Everything else a script prints
is plain output, which the decoder never splits on anything but ``\\n``.

The encoders, all writing the same wire format:
- Python: :func:`record` here (its source, :data:`PYTHON_ENCODER`, is what node-side Python helpers
  embed: it needs only ``base64``);
- POSIX sh: ``PosixShell.record_functions`` (``_cb_rec KIND FIELD...``, ``_cb_recin KIND FIELD...``
  whose last field is its stdin, binary-safe);
- PowerShell: ``PowerShell.record_functions`` (``Out-CbRecord KIND @(FIELD, ...)``, UTF-8 bytes).

A *sectioned* script's answers (``Platform.sectioned``: many commands' outputs in one round trip) are
``section NAME DATA`` records (DATA: the output, a NUL, the exit code), or, from POSIX sh, *raw
sections*, which cost the node no encoder process per command: a record ``section-raw NAME BOUNDARY``,
then the command's output as it printed it, then a newline and the line ``@@BOUNDARY CODE``. BOUNDARY
is 32 hex digits the node's shell drew from the kernel's random source when the script started (no
other program, no command line and no other user sees it, and it never travels to the controller
before the output it closes: a command cannot print it), so no byte of a command's output can end its
section or start another; while a section is open, only a line holding its boundary (its end, or the
next section's start: a command killed before it ended) is framing. :class:`SectionReader` reads both.

A *stream* (a node's log relayed as it is: `logs --follow`, a foreground run's follower) is plain
lines with records between them. Its plain lines travel raw, except that one starting with ``@@``
gets one more ``@`` (:func:`escape`; no record starts with ``@@@``), so no log line can be, end or
hide a record, whatever nonce it names; :class:`Stream` reads it back.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

#: a command's nonce: the shape of every frame token the controller uses (tests replace it by pattern)
NONCE = re.compile(r"cb-[0-9a-f]{12}")
#: where our rank workers (validation, the throughput probe) find the nonce of their run's records
NONCE_ENV = "CB_RECORD_NONCE"
_KIND = re.compile(r"[a-z][a-z-]*")
_LINE = re.compile(r"@@(cb-[0-9a-f]{12}) ([a-z][a-z-]*)((?: :[A-Za-z0-9+/]*={0,2})*)\r?")


def new_nonce() -> str:
    """A fresh unguessable nonce for one command."""
    return "cb-" + secrets.token_hex(6)


@dataclass(frozen=True)
class Record:
    """One decoded record: its kind and its fields' bytes."""

    kind: str
    fields: tuple[bytes, ...]

    def text(self, index: int, default: str = "") -> str:
        """Field ``index`` as text (UTF-8; undecodable bytes replaced), ``default`` when absent."""
        if index >= len(self.fields):
            return default
        return self.fields[index].decode("utf-8", "replace")

    @property
    def texts(self) -> list[str]:
        return [self.text(i) for i in range(len(self.fields))]


def record(nonce: "str", kind: "str", *fields: "bytes | str") -> "str":  # noqa: UP037
    """One record line, newline included. ``str`` fields travel as their UTF-8 bytes."""
    # the annotations are strings and only base64 is used: node-side Python (3.8 and later) runs this
    # very source (PYTHON_ENCODER)
    parts = ["@@" + nonce, kind]
    for value in fields:
        data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
        parts.append(":" + base64.b64encode(data).decode("ascii"))
    return " ".join(parts) + "\n"


#: the Python encoder's source, for scripts that run on the node (``import base64`` before it)
PYTHON_ENCODER = inspect.getsource(record)


def check_nonce(nonce: str) -> str:
    """``nonce`` when it has a nonce's shape (it is written into scripts), else ValueError."""
    if not NONCE.fullmatch(nonce):
        raise ValueError(f"not a record nonce: {nonce!r}")
    return nonce


def check_kind(kind: str) -> str:
    """``kind`` when it is a valid record kind (scripts write kinds as literals), else ValueError."""
    if not _KIND.fullmatch(kind):
        raise ValueError(f"not a record kind: {kind!r}")
    return kind


def decode_line(line: str, nonce: str) -> Record | None:
    """The record ``line`` (without its ``\\n``) holds for ``nonce``, or None: it is plain output."""
    found = _LINE.fullmatch(line)
    if found is None or found.group(1) != nonce:
        return None
    fields = []
    for text in found.group(3).split(" :")[1:]:
        try:
            fields.append(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError):
            return None
    return Record(found.group(2), tuple(fields))


def decode(output: str, nonce: str) -> list[Record]:
    """Every record of ``nonce`` in ``output``, in order (everything else is plain output)."""
    return list(_records(output, nonce))


def _records(output: str, nonce: str) -> Iterator[Record]:
    if "@@" + nonce not in output:
        return
    for line in output.split("\n"):  # only "\n": never str.splitlines, which splits on \x1c, \u2028, ...
        if line.startswith("@@"):
            found = decode_line(line, nonce)
            if found is not None:
                yield found


def find(output: str, nonce: str, kind: str) -> Record | None:
    """The first record of ``kind`` in ``output``, None when there is none."""
    return next((r for r in _records(output, nonce) if r.kind == kind), None)


def plain(output: str, nonce: str) -> str:
    """``output`` without its records: what the node printed besides them."""
    return "\n".join(
        line for line in output.split("\n") if not line.startswith("@@") or decode_line(line, nonce) is None
    )


def unnonced(texts: list[str]) -> list[str]:
    """``texts`` with every nonce replaced by one placeholder: scripts comparable across runs (a
    dry run and the real one each choose their own)."""
    return [NONCE.sub("cb-NONCE", text) for text in texts]


# -- streams: plain lines relayed as they are, with records between them ------------------------------

#: how a record starts, and what a stream's plain line starting with it gets one more "@" of
MARK = "@@"


def line_pattern(nonce: str) -> str:
    """A whole record line of ``nonce`` (its ``\\n`` not included) as a regular expression that awk
    (POSIX ERE), Python's ``re`` and .NET read alike: for a node-side script that must tell such a
    line in a log without decoding it (`logs --tail N` does not count the node's samples)."""
    return f"^{MARK}{check_nonce(nonce)} [a-z][a-z-]*( :[A-Za-z0-9+/]*=?=?)*\\r?$"


def mentions(text: str, nonce: str) -> bool:
    """A quick test before decoding: may ``text`` hold records of ``nonce``? (False: surely not.)"""
    return bool(nonce) and MARK + nonce in text


def escape(data: "bytes") -> "bytes":  # noqa: UP037
    """Complete lines ``data`` as a stream carries them: each line starting with "@@" gets one more "@"."""
    # node-side Python runs this very source (PYTHON_ESCAPE): bytes in, bytes out, nothing imported
    if b"@@" not in data:
        return data
    return (b"\n" + data).replace(b"\n@@", b"\n@@@")[1:]


#: the stream escape's source, for scripts that run on the node
PYTHON_ESCAPE = inspect.getsource(escape)


class Stream:
    """The controller's side of a stream: :meth:`feed` takes the command's stdout as it arrives
    (complete lines) and returns, in order, the plain text between records (unescaped, each piece
    whole: passed on only once the record after it arrived) and the records of ``nonce``. What came
    after the last record waits for the next one; :meth:`restart` drops it (a dropped connection: the
    producer sends it again) and takes the next command's nonce."""

    def __init__(self, nonce: str) -> None:
        self.nonce = check_nonce(nonce)
        self._pending: list[str] = []

    def restart(self, nonce: str) -> None:
        self.nonce = check_nonce(nonce)
        self._pending.clear()

    def feed(self, text: str) -> list[str | Record]:
        out: list[str | Record] = []
        pos = 0  # start of the text not yet passed on
        line = 0
        while True:
            # a record is a line starting "@@" but not "@@@" (an escaped plain line)
            if text.startswith(MARK, line):
                at = line
            else:
                at = text.find("\n" + MARK, line)
                if at < 0:
                    break
                at += 1
            end = text.find("\n", at)
            if end < 0:
                break
            found = None if text.startswith("@", at + 2) else decode_line(text[at:end], self.nonce)
            line = end + 1
            if found is None:
                continue  # plain text (an escaped line, or not a record of this command)
            self._flush(text[pos:at], out)
            out.append(found)
            pos = line
        if pos < len(text):
            self._pending.append(text[pos:])
        return out

    def _flush(self, text: str, out: list[str | Record]) -> None:
        if self._pending:
            text = "".join(self._pending) + text
            self._pending.clear()
        if not text:
            return
        if "@@@" in text:
            text = ("\n" + text).replace("\n@@@", "\n@@")[1:]
        out.append(text)


# -- sectioned scripts' answers -----------------------------------------------------------------------------

#: the record that opens a raw section (see the module docstring)
RAW_SECTION = "section-raw"
_BOUNDARY = re.compile(r"[0-9a-f]{32}")
_RAW_END = re.compile(r"@@([0-9a-f]{32}) ([0-9]{1,3})\r?")


class SectionReader:
    """The answers of a sectioned script of ``nonce``, one stdout line (without its ``\n``) at a time:
    :meth:`feed` returns ``(name, output, exit code)`` when a section's answer is complete, else None.
    ``output`` is the text as sent (a ``section`` record's bytes decoded as UTF-8, undecodable bytes
    replaced); a section record without a NUL has exit code 1. Everything else is plain output."""

    def __init__(self, nonce: str) -> None:
        self.nonce = check_nonce(nonce)
        self._open = MARK + nonce + " " + RAW_SECTION + " :"
        self._name: str | None = None  # the raw section being read
        self._boundary = ""
        self._lines: list[str] = []

    def feed(self, line: str) -> tuple[str, str, int] | None:
        if self._name is not None:
            if self._boundary not in line:
                self._lines.append(line)
                return None
            end = _RAW_END.fullmatch(line)
            if end is not None and end.group(1) == self._boundary:
                name, text = self._name, "\n".join(self._lines)
                self._name, self._lines = None, []
                return name, text, int(end.group(2))
            self._name, self._lines = None, []  # the next section's start: this one never ended
        if not line.startswith(MARK):
            return None
        found = decode_line(line, self.nonce)
        if found is None or len(found.fields) < 1:
            return None
        if found.kind == RAW_SECTION:
            boundary = line.rstrip("\r").rpartition(" :")[2]
            if len(found.fields) == 2 and _BOUNDARY.fullmatch(boundary):
                self._name, self._boundary = found.text(0), boundary
            return None
        if found.kind != "section":
            return None
        output, _, code = (found.fields[1] if len(found.fields) > 1 else b"").rpartition(b"\0")
        number = code.decode("ascii", "replace").strip()
        return (
            found.text(0),
            output.decode("utf-8", "replace"),
            int(number) if number.lstrip("-").isdigit() else 1,
        )
