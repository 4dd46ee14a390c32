"""Node text made safe to show a human: no line a node prints can drive the operator's terminal.

A node's output is untrusted text. Written to a terminal raw, its control sequences act there: OSC 52
writes the clipboard, OSC 0/2 sets the window title, OSC 8 makes hyperlinks, CSI moves the cursor and
erases (``ESC [ 2 J``, ``ESC [ H``), a lone ``\\r`` or ``\\b`` overwrites what was shown (a fake
``[other-node:3]`` line over a real one), SO/SI switch character sets. :func:`neutralise` shows every
control character visibly instead, in the caret notation of ``cat -v`` and ``less``: ESC as ``^[``,
CR as ``^M``, BEL as ``^G``, DEL as ``^?``, and a C1 control (``\\x9b`` is an 8-bit CSI for many
terminals) as ``<U+009B>``. Once its ESC is shown as ``^[``, the rest of a sequence is plain text.
Invisible format characters are shown the same way (``<U+202E>``): the bidirectional controls
(U+202A-U+202E, U+2066-U+2069, U+200E/U+200F, U+061C) reorder what follows them on the line, so a node
could make ``[w2] ok`` read as something else ("Trojan Source", CVE-2021-42574); the zero-width ones
(U+200B-U+200D, U+2060, U+FEFF) hide text or make two different strings look equal; U+2028/U+2029 end
a line in some terminals and viewers, which could fake a line without our prefix.

Kept as they are: tab, newline, every other character (UTF-8 text stays intact), and, when
``keep_colour``, colour: SGR sequences (``ESC [ params m``), which cannot move the cursor, erase or
talk to the clipboard. A line's colour then ends with its line (a reset before every newline), so
it cannot spill into the next line or into what is printed after the output. Without
``keep_colour`` SGR sequences are removed (colour off: piped output, ``--no-color``, ``NO_COLOR``).

Only what is *shown* is neutralised: the controller's ``runs/<id>/<node>.log`` and the node's
``node.log`` keep the text as the node wrote it, and ``--json`` carries it exactly (JSON escapes
every control character as ``\\u001b``...).

Cost: text without control characters (nearly every block of a training log) is returned as is
after one scan in C (``str.translate``'s ASCII fast path, else one character-class search); only a
block that holds a control character pays a substitution, per control character found.
"""

from __future__ import annotations

import logging
import re

#: SGR ("select graphic rendition"): colours and text attributes, nothing else
_SGR = r"\x1b\[[0-9;:]*m"
#: invisible format characters that reorder, hide or break lines (module docstring)
_FORMAT_CODES = (
    0x061C,
    *range(0x200B, 0x2010),
    *range(0x2028, 0x202F),
    0x2060,
    *range(0x2066, 0x206A),
    0xFEFF,
)
_FORMAT = "".join(chr(c) for c in _FORMAT_CODES)
#: every C0 control but tab (\x09) and newline (\x0a), DEL, every C1 control (U+0080-U+009F), and the
#: format characters above
_CONTROLS = r"\x00-\x08\x0b-\x1f\x7f-\x9f" + _FORMAT
_ANY_CONTROL = re.compile(f"[{_CONTROLS}]")
#: ASCII controls deleted: a length change tells that the text has one (ASCII text only)
_DROP_ASCII_CONTROLS = str.maketrans(dict.fromkeys([*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F]))
#: what is shown visibly: an ESC that does not start an SGR, and any other control character
_UNSAFE_KEEPING_SGR = re.compile(r"\x1b(?!\[[0-9;:]*m)|[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f-\x9f" + _FORMAT + "]")
#: the same, SGR sequences matched too (to be removed)
_UNSAFE_WITH_SGR = re.compile(rf"{_SGR}|[{_CONTROLS}]")

#: each control character as it is shown (an SGR sequence, not in here, is removed)
_SHOWN: dict[str, str] = {chr(c): "^" + chr(c ^ 0x40) for c in range(0x20)}
_SHOWN["\x7f"] = "^?"
_SHOWN.update({chr(c): f"<U+{c:04X}>" for c in range(0x80, 0xA0)})
_SHOWN.update({chr(c): f"<U+{c:04X}>" for c in _FORMAT_CODES})

_RESET = "\x1b[0m"


def _shown(match: re.Match[str]) -> str:
    return _SHOWN.get(match.group(), "")


def has_control(text: str) -> bool:
    """Whether ``text`` holds any control character other than tab and newline."""
    if text.isascii():  # O(1) in CPython; translate then runs its ASCII fast path
        return len(text.translate(_DROP_ASCII_CONTROLS)) != len(text)
    return _ANY_CONTROL.search(text) is not None


def one_line(text: str) -> str:
    """A node's text (a file name, a message) shown inside one line of ours: :func:`neutralise`, and
    each newline shown as ``^J``, so that it cannot start a line of its own (a fake ``error:``)."""
    return neutralise(text).replace("\n", "^J")


def neutralise(text: str, *, keep_colour: bool = False) -> str:
    """``text`` (node output: any number of lines) as it may be shown to a human: every control
    character but tab and newline shown visibly (``^[``, ``^M``, ``<U+009B>``); SGR colour kept
    when ``keep_colour`` (reset at every line end), else removed."""
    if not has_control(text):
        return text
    if not keep_colour:
        return _UNSAFE_WITH_SGR.sub(_shown, text)
    text = _UNSAFE_KEEPING_SGR.sub(_shown, text)
    if "\x1b" in text:  # only SGR is left: it ends with its line
        text = text.replace("\n", _RESET + "\n")
        if not text.endswith("\n"):
            text += _RESET
    return text


class NeutralFormatter(logging.Formatter):
    """Log lines quote what nodes sent (errors, a server's banner at -vv): neutralised like every
    other node text shown; newlines of tracebacks kept."""

    def format(self, record: logging.LogRecord) -> str:
        return neutralise(super().format(record))
