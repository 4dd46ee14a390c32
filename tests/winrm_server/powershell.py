"""What powershell.exe does with its command line and its error stream, as far as the tests need it:
``-EncodedCommand`` / ``-Command`` / ``-File`` decoding, and error records written to stderr as CLIXML
(what Windows PowerShell 5.1 prints when its output is redirected, as under WinRS)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

POWERSHELL_NAMES = ("powershell", "powershell.exe", "pwsh", "pwsh.exe")
#: powershell.exe's exit code when the shell's job refused it (ERROR_NOT_ENOUGH_QUOTA, as a process
#: that could not be created reports it); see tests/winrm_server/processes.py
QUOTA_EXIT = 1816
CLIXML_HEADER = "#< CLIXML\r\n"
_OBJS_OPEN = '<Objs Version="1.1.0.1" xmlns="http://schemas.microsoft.com/powershell/2004/04">'
# the progress record Windows PowerShell emits the first time modules are loaded in a session: real
# stderr often starts with it, so a decoder must skip records that are not errors.
_PROGRESS = (
    '<Obj S="progress" RefId="0"><TN RefId="0"><T>System.Management.Automation.PSCustomObject</T>'
    '<T>System.Object</T></TN><MS><I64 N="SourceId">1</I64><PR N="Record"><AV>Preparing modules for '
    "first use.</AV><AI>0</AI><Nil /><PI>-1</PI><PC>-1</PC><T>Completed</T><SR>-1</SR><SD> </SD></PR>"
    "</MS></Obj>"
)
# parameters taking a value that powershell.exe accepts before the script part (any unique prefix)
_VALUE_PARAMS = (
    "executionpolicy",
    "inputformat",
    "outputformat",
    "windowstyle",
    "psconsolefile",
    "version",
    "configurationname",
    "workingdirectory",
)
_SWITCHES = ("noprofile", "noninteractive", "nologo", "noexit", "sta", "mta", "nop")


class PowerShellUsageError(Exception):
    """powershell.exe would refuse this command line (message as it prints it, exit code)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Invocation:
    """How powershell.exe was asked to run something."""

    mode: str  # "encoded" | "command" | "file"
    script: str = ""  # the script text (for "file": filled in by the caller from the fake filesystem)
    file: str | None = None
    file_args: list[str] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)


def _match(arg: str, names: tuple[str, ...]) -> str | None:
    """powershell.exe matches parameter names by unique-enough prefix (``-enc``, ``-ec``, ``-nop``)."""
    if not arg.startswith(("-", "/")) or len(arg) < 2:
        return None
    word = arg[1:].lower()
    aliases = {
        "ec": "encodedcommand",
        "e": "encodedcommand",
        "enc": "encodedcommand",
        "c": "command",
        "f": "file",
        "ep": "executionpolicy",
        "nop": "noprofile",
        "ex": "executionpolicy",
    }
    if word in aliases and aliases[word] in names:
        return aliases[word]
    hits = [n for n in names if n.startswith(word)]
    return hits[0] if len(hits) == 1 or (hits and word == hits[0]) else None


def parse_invocation(argv: list[str]) -> Invocation:
    """``argv`` without the program name."""
    options: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = _match(arg, ("encodedcommand", "command", "file", *_VALUE_PARAMS, *_SWITCHES))
        if name == "encodedcommand":
            if i + 1 >= len(argv):
                raise PowerShellUsageError(
                    "Cannot process the command because of a missing parameter. "
                    "A command must follow -EncodedCommand.",
                    1,
                )
            try:
                script = base64.b64decode(argv[i + 1], validate=True).decode("utf-16-le")
            except (binascii.Error, UnicodeDecodeError) as exc:
                raise PowerShellUsageError(
                    "Cannot process the command because the value specified with -EncodedCommand is not "
                    "properly encoded. The value must be Base64 encoded.",
                    1,
                ) from exc
            return Invocation("encoded", script=script, options=options)
        if name == "command":
            return Invocation("command", script=" ".join(argv[i + 1 :]), options=options)
        if name == "file":
            if i + 1 >= len(argv):
                raise PowerShellUsageError("Missing the argument to the -File parameter.", -196608)
            return Invocation("file", file=argv[i + 1], file_args=argv[i + 2 :], options=options)
        if name in _SWITCHES:
            options[name] = "true"
            i += 1
            continue
        if name in _VALUE_PARAMS:
            options[name] = argv[i + 1] if i + 1 < len(argv) else ""
            i += 2
            continue
        # the first non-parameter starts a -Command script (powershell.exe's default parameter)
        return Invocation("command", script=" ".join(argv[i:]), options=options)
    return Invocation("command", script="", options=options)


def decode_script_file(data: bytes) -> str:
    """How Windows PowerShell 5.1 reads a .ps1: by BOM; without one, as the ANSI code page (1252),
    so UTF-8 without BOM garbles non-ASCII text exactly as on a real machine."""
    if data.startswith(b"\xef\xbb\xbf"):
        return data[3:].decode("utf-8", "replace")
    if data.startswith(b"\xff\xfe"):
        return data[2:].decode("utf-16-le", "replace")
    if data.startswith(b"\xfe\xff"):
        return data[2:].decode("utf-16-be", "replace")
    return data.decode("cp1252", "replace")


def clixml_escape(text: str) -> str:
    """PowerShell's CLIXML string encoding: control characters and ``_x`` as ``_xHHHH_``, then XML."""
    out = []
    for i, ch in enumerate(text):
        code = ord(ch)
        if ch == "_" and text[i + 1 : i + 2] in ("x", "X"):
            out.append("_x005F_")
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF or code in (0xFFFE, 0xFFFF):
            out.append(f"_x{code:04X}_")
        elif ch == "&":
            out.append("&amp;")
        elif ch == "<":
            out.append("&lt;")
        elif ch == ">":
            out.append("&gt;")
        else:
            out.append(ch)
    return "".join(out)


def clixml_errors(text: str, progress_record: bool = True) -> str:
    """Error text as powershell.exe writes it to a redirected stderr: one ``<S S="Error">`` per line, each
    line ending in an escaped CRLF."""
    head, tail = clixml_error_parts(text, progress_record)
    return head + tail


def clixml_error_parts(text: str, progress_record: bool = True) -> tuple[str, str]:
    """:func:`clixml_errors` cut after the document's first record: plain text written to stderr while
    the document is open ([Console]::Error, a native program) lands between the two parts."""
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    records = [f'<S S="Error">{clixml_escape(line + chr(13) + chr(10))}</S>' for line in lines]
    if progress_record:
        records.insert(0, _PROGRESS)
    first = records[0] if records else ""
    return CLIXML_HEADER + _OBJS_OPEN + first, "".join(records[1:]) + "</Objs>"


def error_record_text(
    message: str,
    script_line: str = "",
    category: str = "NotSpecified: (:) [], RuntimeException",
    error_id: str = "RuntimeException",
) -> str:
    """The text of a non-terminating/terminating error the way the default view formats it."""
    lines = [message]
    if script_line:
        lines += ["At line:1 char:1", "+ " + script_line, "+ " + "~" * max(1, len(script_line))]
    lines += [
        f"    + CategoryInfo          : {category}",
        f"    + FullyQualifiedErrorId : {error_id}",
        "",
        "",
    ]
    return "\n".join(lines)


def parse_error_text(problems: list[str]) -> str:
    """What powershell.exe prints for a script that does not parse (ParseException)."""
    first = problems[0] if problems else "?"
    return (
        f"At line:{first.split(':', 1)[0]} char:1\n"
        "+ The script could not be parsed\n"
        "Unexpected token in expression or statement:\n" + "\n".join(problems) + "\n"
        "    + CategoryInfo          : ParserError: (:) [], ParentContainsErrorRecordException\n"
        "    + FullyQualifiedErrorId : UnexpectedToken\n \n"
    )


def file_not_found_text(path: str) -> str:
    return (
        f"The argument '{path}' to the -File parameter does not exist. Provide the path to an existing "
        "'.ps1' file as an argument to the -File parameter.\r\n"
    )
