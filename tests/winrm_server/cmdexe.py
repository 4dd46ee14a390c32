"""What cmd.exe does to a WinRS command line before the program sees it (WinRS runs ``cmd.exe /c LINE``
unless WINRS_SKIP_CMD_SHELL is TRUE), for the lines the server interprets itself (powershell.exe,
wsl.exe): ``%NAME%`` expansion (also inside double quotes; unknown names stay as written), ``^`` escapes
outside quotes, and the operators ``& && | || < >`` outside quotes, which would split or redirect the
line: the server refuses those (:class:`CmdSyntaxError`) so a quoting mistake of the product shows up as a
failed test instead of being silently "handled" differently than real cmd.exe would."""

from __future__ import annotations

import re

_VAR = re.compile(r"%([^%=\r\n]+)%")


class CmdSyntaxError(ValueError):
    """cmd.exe would not pass this line to the program unchanged."""


def windows_env(user: str, computer: str) -> dict[str, str]:
    """The variables of a fresh WinRS cmd.exe that tests most likely meet (case-insensitive names)."""
    home = f"C:\\Users\\{user}"
    return {
        "USERPROFILE": home,
        "USERNAME": user,
        "HOMEDRIVE": "C:",
        "HOMEPATH": f"\\Users\\{user}",
        "APPDATA": f"{home}\\AppData\\Roaming",
        "LOCALAPPDATA": f"{home}\\AppData\\Local",
        "TEMP": f"{home}\\AppData\\Local\\Temp",
        "TMP": f"{home}\\AppData\\Local\\Temp",
        "PROGRAMDATA": "C:\\ProgramData",
        "PROGRAMFILES": "C:\\Program Files",
        "SYSTEMROOT": "C:\\Windows",
        "WINDIR": "C:\\Windows",
        "SYSTEMDRIVE": "C:",
        "COMPUTERNAME": computer,
        "COMSPEC": "C:\\Windows\\system32\\cmd.exe",
    }


def expand(line: str, env: dict[str, str]) -> str:
    """``line`` after cmd.exe's ``%NAME%`` expansion (names case-insensitive; unknown ones stay)."""
    upper = {k.upper(): v for k, v in env.items()}
    return _VAR.sub(lambda m: upper.get(m.group(1).upper(), m.group(0)), line)


def preprocess(line: str, env: dict[str, str]) -> str:
    """The line as the program receives it after cmd.exe; CmdSyntaxError for unquoted operators."""
    expanded = expand(line, env)
    out: list[str] = []
    quoted = False
    i = 0
    while i < len(expanded):
        ch = expanded[i]
        if ch == '"':
            quoted = not quoted
            out.append(ch)
        elif quoted:
            out.append(ch)
        elif ch == "^":
            if i + 1 < len(expanded):
                out.append(expanded[i + 1])
                i += 1
        elif ch in "&|<>":
            raise CmdSyntaxError(
                f"cmd.exe would treat the unquoted {ch!r} at column {i + 1} as an operator in: {line[:200]}"
            )
        else:
            out.append(ch)
        i += 1
    return "".join(out)
