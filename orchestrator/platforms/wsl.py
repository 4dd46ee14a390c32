"""Commands inside a WSL2 distribution of a Windows node, started by ``wsl.exe`` over WinRM.

Inside the distribution everything is POSIX sh (this class *is* a :class:`PosixShell`); what differs
is how a script gets there: a Windows command line, ``wsl.exe -d DISTRO [-u USER] -e /bin/sh -c CODE``,
which WinRS runs through ``cmd.exe /c`` and wsl.exe splits with the Microsoft C runtime rules.
``CODE`` must survive both. It is built from characters neither treats specially inside double
quotes (no ``"``, ``%``, ``!``): the script travels base64-encoded and is decoded by::

    set -f; IFS=; eval $(echo BASE64 | base64 -d)

Empty ``IFS`` and ``set -f`` keep the unquoted ``$(...)`` one word, unglobbed (the usual
``eval "$(...)"`` needs double quotes, which would end cmd's quoted region and expose ``|`` to it);
the decoded script first restores both. ``eval`` (not a pipe into sh) keeps the channel's stdin for
the script, which :meth:`PosixShell.stop_on_hangup` relies on.

Windows-side work on the same machine (firewall, time, ``.wslconfig``, ``wsl --list``) is PowerShell:
:attr:`WslShell.windows`.

wsl.exe's own messages ("There is no distribution with the supplied name.") are UTF-16LE on a pipe
unless ``WSL_UTF8=1`` is in its environment: the transport sets it in every WinRS shell
(:data:`WSL_SHELL_ENV`), and :class:`WslOutput` decodes the UTF-16LE that a wsl.exe older than 0.64,
which ignores the variable, still writes.
"""

from __future__ import annotations

import base64
import codecs
import re
from collections.abc import Mapping

from orchestrator.platforms.posix import PosixShell
from orchestrator.platforms.powershell import MAX_COMMAND_LINE, PowerShell, cmd_command_line

__all__ = [
    "MAX_COMMAND_LINE",
    "ROOT_MARKER",
    "WSL_EXE",
    "WSL_SHELL_ENV",
    "WslOutput",
    "WslShell",
    "is_wsl_command",
]

WSL_EXE = "wsl.exe"
#: the environment of every WinRS shell on a Windows node: wsl.exe (0.64 and newer) then writes its
#: own messages in UTF-8 instead of UTF-16LE. It is not passed into the distribution (only the
#: variables WSLENV names are), so the Linux programs see nothing of it.
WSL_SHELL_ENV = {"WSL_UTF8": "1"}
#: first line of a script that must run as root in the distribution (``wsl.exe -u root``: WSL lets
#: the Windows user be root in their own distributions without a password; sudo would ask for one)
ROOT_MARKER = "#cb:wsl-root"
#: what the decoded script starts with: undo the ``set -f`` / empty IFS the decoder needed
_RESTORE = "set +f\nIFS=' \t\n'\n"
#: names WSL accepts for distributions, and Linux user names: nothing cmd.exe or wsl.exe interprets
DISTRO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9._-]*\$?\Z")
_DRIVE_PATH = re.compile(r"([A-Za-z]):[\\/](.*)\Z", re.S)


class WslShell(PosixShell):
    """A WSL distribution (``distro`` None: the user's default one) entered as ``user`` (None: the
    distribution's default user)."""

    name = "wsl"
    in_wsl = True
    #: WinRS runs the line through cmd.exe: longer scripts are uploaded and run with file_command
    MAX_COMMAND_LINE = MAX_COMMAND_LINE

    def __init__(self, distro: str | None = None, user: str | None = None) -> None:
        if distro is not None and not DISTRO_NAME.match(distro):
            raise ValueError(f"invalid WSL distribution name {distro!r}: letters, digits, '.', '_', '-'")
        if user is not None and not USER_NAME.match(user):
            raise ValueError(f"invalid Linux user name {user!r}")
        self.distro = distro
        self.user = user
        #: the Windows side of the same node
        self.windows = PowerShell()

    @property
    def host_shell(self) -> PowerShell:
        return self.windows

    # -- privilege -------------------------------------------------------------------------------------

    def wrap(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        become: bool = False,
    ) -> str:
        """As PosixShell, except ``become``: the script is marked to start as root (``wsl.exe -u
        root``), since the distribution's user usually needs a password for sudo."""
        script = self._script(command, env, cwd)
        if become:
            return f"{ROOT_MARKER}\n{script}"
        if script.startswith(ROOT_MARKER):
            return f":\n{script}"  # a command cannot mark itself
        return script

    def stop_on_hangup(self, script: str, *, silence: float | None = None) -> str:
        stopped = super().stop_on_hangup(script, silence=silence)
        return f"{ROOT_MARKER}\n{stopped}" if script.startswith(ROOT_MARKER) else stopped

    # -- the Windows command line ----------------------------------------------------------------------

    def _wsl_options(self, script: str) -> list[str]:
        options = [WSL_EXE]
        if self.distro:
            options += ["-d", self.distro]
        user = "root" if script.startswith(ROOT_MARKER) else self.user
        if user:
            options += ["-u", user]
        return options

    def decoder(self, script: str) -> str:
        """The sh one-liner that decodes and runs ``script`` (no character cmd.exe or wsl.exe would
        interpret inside double quotes)."""
        encoded = base64.b64encode((_RESTORE + script).encode()).decode("ascii")
        return f"set -f; IFS=; eval $(echo {encoded} | base64 -d)"

    def windows_argv(self, script: str) -> tuple[str, list[str]]:
        """``(program, arguments)`` for a WinRS Command: each argument is already a quoted
        command-line word (WinRS joins Command and Arguments with spaces)."""
        words = cmd_words(self.argv(script))
        return words[0], words[1:]

    def login_command(self, script: str) -> str:
        """The Windows command line running ``script`` in the distribution (see the module doc).

        Longer than :data:`MAX_COMMAND_LINE`: upload the script and use :meth:`file_command`."""
        return cmd_command_line(self.argv(script))

    def argv(self, script: str) -> list[str]:
        """The wsl.exe argv running ``script`` in the distribution (unquoted: for a program that
        starts processes itself, like :meth:`PowerShell.native` on the Windows side)."""
        return [*self._wsl_options(script), "-e", "/bin/sh", "-c", self.decoder(script)]

    def local_argv(self, script: str) -> list[str]:
        return self.argv(script)

    def run_long_script(self, path: str, script: str) -> str:
        """``script`` uploaded to ``path`` inside the distribution (written from inside it: no
        Windows path mapping), run by /bin/sh as the user the script asks for: a script marked to
        run as root has a runner carrying the mark too."""
        marker = ROOT_MARKER + "\n" if script.startswith(ROOT_MARKER) else ""
        return self.login_command(marker + self.run_script(path))

    def file_command(self, windows_path: str, *, root: bool = False) -> str:
        """Run a script uploaded to the Windows side at ``windows_path`` (``C:\\...``) with the
        distribution's /bin/sh, through its ``/mnt/<drive>`` mount."""
        options = self._wsl_options(ROOT_MARKER if root else "")
        return cmd_command_line([*options, "-e", "/bin/sh", self.linux_path(windows_path)])

    # -- paths -----------------------------------------------------------------------------------------

    @staticmethod
    def linux_path(windows_path: str) -> str:
        """``C:\\Users\\me\\x`` as the distribution sees it: ``/mnt/c/Users/me/x`` (WSL's default
        automount root; a wsl.conf ``[automount] root`` elsewhere is not supported)."""
        match = _DRIVE_PATH.match(windows_path)
        if not match:
            raise ValueError(f"not an absolute Windows path with a drive letter: {windows_path!r}")
        drive, rest = match.groups()
        rest = rest.replace("\\", "/")
        return f"/mnt/{drive.lower()}/{rest}" if rest else f"/mnt/{drive.lower()}"

    def unc_path(self, linux_path: str) -> str:
        """An absolute path inside the distribution as Windows programs reach it:
        ``\\\\wsl.localhost\\<distro>\\...`` (Windows 11 and current Windows 10; older ones
        ``\\\\wsl$\\``). Needs a named distribution."""
        if not self.distro:
            raise ValueError("the default distribution has no fixed name: set windows.distro")
        if not linux_path.startswith("/"):
            raise ValueError(f"not an absolute Linux path: {linux_path!r}")
        return "\\\\wsl.localhost\\" + self.distro + linux_path.replace("/", "\\")


def cmd_words(argv: list[str]) -> list[str]:
    """Each element of ``argv`` as the word :func:`cmd_command_line` writes for it."""
    return [cmd_command_line([argv[0]]), *(cmd_command_line(["x", a])[2:] for a in argv[1:])]


def is_wsl_command(command_line: str) -> bool:
    """Whether a Windows command line starts ``wsl.exe`` (as :meth:`WslShell.login_command` and
    :meth:`WslShell.file_command` write it, or with a path)."""
    words = command_line.split(None, 1)
    program = words[0].strip('"').replace("/", "\\").rsplit("\\", 1)[-1].lower() if words else ""
    return program in ("wsl.exe", "wsl")


class WslOutput:
    """One output stream (stdout or stderr) of a ``wsl.exe`` command, as UTF-8 bytes.

    Two writers share the stream: the Linux program, whose bytes pass unchanged, and wsl.exe itself
    ("There is no distribution with the supplied name.", warnings before the program starts), in
    UTF-16LE unless ``WSL_UTF8=1`` took effect. Text never holds a NUL byte, and UTF-16LE has one
    after every ASCII character (the line feed included: ``0A 00``): a line in which a NUL shows
    up is decoded as UTF-16LE from its start to that line feed; every other line passes as it is,
    at once (a training log is not held back). Chunks may split the stream anywhere.
    """

    def __init__(self) -> None:
        self._held = b""  # the odd last byte of a UTF-16LE line, until the next chunk
        self._utf16: codecs.IncrementalDecoder | None = None  # set while inside a UTF-16LE line
        self._column = 0  # bytes of the current line passed on already (as UTF-8)
        self._after_lf = False  # the last bytes passed on were an empty line ("\n" alone)

    def __call__(self, data: bytes, *, final: bool = False) -> bytes:
        buf = self._held + data
        self._held = b""
        out = bytearray()
        i, n = 0, len(buf)
        while i < n:
            if self._utf16 is not None:
                j = i
                while j + 1 < n and buf[j : j + 2] != b"\n\x00":
                    j += 2
                if j + 1 < n:  # its line feed: the line ends here
                    out += self._utf16.decode(buf[i : j + 2], final=True).encode("utf-8")
                    self._utf16 = None
                    self._column, self._after_lf = 0, False
                    i = j + 2
                    continue
                end = i + (n - i) // 2 * 2
                out += self._utf16.decode(buf[i:end]).encode("utf-8")
                self._held = buf[end:]
                break
            if self._after_lf and buf[i] == 0:
                # the high byte of a UTF-16LE line feed that ended the previous chunk: that empty
                # line was wsl.exe's, passed on as a line feed already
                self._after_lf = False
                i += 1
                continue
            lf = buf.find(b"\n", i)
            end = n if lf < 0 else lf + 1
            # an empty line is wsl.exe's when the byte after its line feed is a NUL
            empty = lf == i and self._column == 0
            if buf.find(b"\x00", i, min(end + 1, n) if empty else end) < 0:
                out += buf[i:end]
                self._column = 0 if lf >= 0 else self._column + end - i
                self._after_lf = empty
                i = end
                continue
            # a UTF-16LE line, from its start: an odd number of its bytes passed on already leaves
            # the high byte of the last one here
            self._utf16 = codecs.getincrementaldecoder("utf-16-le")(errors="replace")
            i += self._column % 2
            self._column, self._after_lf = 0, False
        if final:
            if self._utf16 is not None:
                out += self._utf16.decode(self._held, final=True).encode("utf-8")
            self._held, self._utf16 = b"", None
        return bytes(out)
