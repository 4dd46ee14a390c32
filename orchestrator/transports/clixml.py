"""CLIXML: how powershell.exe writes its error stream when stderr is not a console.

A WinRS command's stderr is a pipe, so Windows PowerShell serialises its error, warning, verbose and
debug records (and progress records) as a ``#< CLIXML`` document instead of the text a console
shows. :class:`ClixmlDecoder` turns that back into the text a person would have read, as the bytes
arrive (a record may be split anywhere between two Receive rounds).
"""

from __future__ import annotations

import html
import re

__all__ = ["CLIXML_HEADER", "ClixmlDecoder", "decode_clixml", "unescape_clixml"]

CLIXML_HEADER = "#< CLIXML"
_ESCAPE = re.compile(r"_x([0-9A-Fa-f]{4})_")
#: prefixes PowerShell's console host puts before non-error streams
_STREAM_PREFIX = {"error": "", "warning": "WARNING: ", "verbose": "VERBOSE: ", "debug": "DEBUG: "}
_STRING_RECORD = re.compile(r'<S(?:\s+S="([^"]*)")?\s*>(.*?)</S>', re.DOTALL)


def unescape_clixml(text: str) -> str:
    """A CLIXML string value as text: XML entities, then ``_xHHHH_`` escapes (PowerShell encodes CR,
    LF and other characters XML cannot carry that way; ``_x005F_`` is a literal underscore).
    Surrogate pairs written as two escapes become one character."""
    text = html.unescape(text)
    if "_x" not in text:
        return text
    decoded = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)
    # two escapes may have produced a UTF-16 surrogate pair: join it into one code point
    return decoded.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class ClixmlDecoder:
    """Turns a stderr stream into readable text as it arrives (chunks may split anywhere).

    Plain text passes through. After a ``#< CLIXML`` line, ``<S S="Error">`` records become their text
    (PowerShell splits each error into records ending in ``_x000D__x000A_``), warnings, verbose and
    debug records get the prefix the console would show, and progress records (``<Obj S="progress">``,
    e.g. "Preparing modules for first use.") are dropped: they are screen updates, not messages.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._in_xml = False

    def feed(self, text: str) -> str:
        self._buf += text
        out: list[str] = []
        while self._buf:
            if not self._in_xml:
                start = self._buf.find(CLIXML_HEADER)
                if start < 0:
                    # keep a tail that could be the start of a header split across chunks
                    keep = _partial_suffix(self._buf, CLIXML_HEADER)
                    out.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                out.append(self._buf[:start])
                end = self._buf.find("\n", start)
                if end < 0:
                    self._buf = self._buf[start:]
                    break
                self._buf = self._buf[end + 1 :]
                self._in_xml = True
                continue
            consumed = self._record(out)
            if consumed == 0:
                break
            self._buf = self._buf[consumed:]
        return "".join(out)

    def _record(self, out: list[str]) -> int:
        """Consume one complete element (or whitespace) from the buffer; 0 when more input is needed."""
        buf = self._buf
        stripped = len(buf) - len(buf.lstrip())
        if stripped:
            return stripped
        if buf.startswith("</Objs>"):
            self._in_xml = False
            return len("</Objs>")
        if buf.startswith("<Objs"):
            end = buf.find(">")
            return end + 1 if end >= 0 else 0
        if buf.startswith("<S") and buf[2:3] in (" ", ">", "\t"):
            match = _STRING_RECORD.match(buf)
            if match is None:
                return 0 if "</S>" not in buf else buf.index("</S>") + 4
            stream = (match.group(1) or "error").lower()
            prefix = _STREAM_PREFIX.get(stream, "")
            text = unescape_clixml(match.group(2))
            out.append(prefix + text if prefix and text.strip() else text)
            if prefix and not text.endswith("\n"):
                out.append("\r\n")
            return match.end()
        if buf.startswith("<Obj"):
            return _element_end(buf, "Obj")
        if buf.startswith("<"):
            end = buf.find(">")
            if end < 0:
                return 0
            if buf[end - 1] == "/":
                return end + 1
            name = re.match(r"<([A-Za-z0-9_]+)", buf)
            return _element_end(buf, name.group(1)) if name else end + 1
        # text that is not XML after all (a native program wrote to stderr mid-document): keep it
        nxt = buf.find("<")
        if nxt < 0:
            out.append(buf)
            return len(buf)
        out.append(buf[:nxt])
        return nxt

    def close(self) -> str:
        """The rest: a truncated document's plain-looking remainder, never half a tag."""
        rest, self._buf = self._buf, ""
        if self._in_xml:
            return "".join(unescape_clixml(m.group(2)) for m in _STRING_RECORD.finditer(rest))
        return rest


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``token``."""
    for size in range(min(len(token) - 1, len(text)), 0, -1):
        if token.startswith(text[-size:]):
            return size
    return 0


def _element_end(buf: str, name: str) -> int:
    """End offset of the element named ``name`` starting at 0 (nested ones counted), or 0."""
    depth = 0
    pattern = re.compile(rf"<(/?){name}(?=[\s>/])([^>]*)>")
    for match in pattern.finditer(buf):
        if match.group(1):
            depth -= 1
        elif not match.group(2).endswith("/"):
            depth += 1
        if depth == 0:
            return match.end()
    return 0


def decode_clixml(text: str) -> str:
    """Whole stderr text as a person would have seen it in a console."""
    decoder = ClixmlDecoder()
    return decoder.feed(text) + decoder.close()
