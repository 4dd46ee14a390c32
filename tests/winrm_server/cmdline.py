"""Windows command-line splitting, as the Microsoft C runtime does it (``main``'s argv; the rules
documented in "Parsing C command-line arguments"), which is what wsl.exe, powershell.exe and every
program built with the MSVC runtime apply to the single command-line string Windows hands a process.

Rules (outside the program name):

- spaces and tabs separate arguments, except inside a quoted part;
- ``"`` starts or ends a quoted part and is not copied;
- ``2n`` backslashes followed by ``"``: ``n`` backslashes, and the quote toggles quoting;
- ``2n+1`` backslashes followed by ``"``: ``n`` backslashes and a literal ``"``;
- backslashes not followed by ``"`` are literal;
- inside a quoted part, ``""`` is one literal ``"`` and the quoted part goes on (the runtime since
  Visual C++ 2008; shell32's CommandLineToArgvW ends the quoted part there instead: ``legacy=True``).

The program name (argv[0]) is special: it ends at the first space/tab outside quotes, quotes are removed
and backslashes are never escapes (a Windows path ends in a backslash often enough).
"""

from __future__ import annotations

from dataclasses import dataclass

_BLANKS = " \t"


@dataclass(frozen=True)
class Token:
    """One argument and where its text lies in the command line (``line[start:end]``)."""

    value: str
    start: int
    end: int


def split_tokens(line: str, legacy: bool = False) -> list[Token]:
    """Split ``line`` into arguments with their source spans; see the module docstring."""
    tokens: list[Token] = []
    n = len(line)
    i = 0
    while i < n and line[i] in _BLANKS:
        i += 1
    if i >= n:
        return tokens
    # argv[0]: quotes toggle, no escapes
    start = i
    quoted = False
    name: list[str] = []
    while i < n and (quoted or line[i] not in _BLANKS):
        if line[i] == '"':
            quoted = not quoted
        else:
            name.append(line[i])
        i += 1
    tokens.append(Token("".join(name), start, i))
    while True:
        while i < n and line[i] in _BLANKS:
            i += 1
        if i >= n:
            return tokens
        start = i
        quoted = False
        out: list[str] = []
        while i < n:
            ch = line[i]
            if ch == "\\":
                j = i
                while j < n and line[j] == "\\":
                    j += 1
                count = j - i
                if j < n and line[j] == '"':
                    out.append("\\" * (count // 2))
                    if count % 2:
                        out.append('"')
                        i = j + 1
                    else:
                        i = j  # the quote is handled below as a delimiter
                    continue
                out.append("\\" * count)
                i = j
                continue
            if ch == '"':
                if quoted and i + 1 < n and line[i + 1] == '"':
                    out.append('"')
                    i += 2
                    if legacy:
                        quoted = False
                    continue
                quoted = not quoted
                i += 1
                continue
            if ch in _BLANKS and not quoted:
                break
            out.append(ch)
            i += 1
        tokens.append(Token("".join(out), start, i))


def split(line: str, legacy: bool = False) -> list[str]:
    """The argv a C-runtime program sees for ``line`` (argv[0] included)."""
    return [t.value for t in split_tokens(line, legacy)]


def quote(arg: str) -> str:
    """Quote one argument so that :func:`split` gives it back unchanged (not for argv[0]).

    Used by the tests to build command lines; the product has its own quoting (the platform layer).
    """
    if arg and not any(c in arg for c in ' \t"'):
        return arg
    out = ['"']
    backslashes = 0
    for ch in arg:
        if ch == "\\":
            backslashes += 1
            continue
        if ch == '"':
            out.append("\\" * (2 * backslashes + 1) + '"')
        else:
            out.append("\\" * backslashes + ch)
        backslashes = 0
    out.append("\\" * (2 * backslashes) + '"')
    return "".join(out)
