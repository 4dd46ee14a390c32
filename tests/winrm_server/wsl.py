"""``wsl.exe`` as the server plays it: management commands (``--list --verbose``, ``--status``,
``--version``) answer canned text, and wsl.exe's own messages ("There is no distribution with the
supplied name.") are written, in UTF-16LE without BOM, as the real wsl.exe writes to a pipe, unless
``WSL_UTF8=1`` is in its environment (the WinRS shell's, from the Create request): then in UTF-8, as
wsl.exe 0.64 and newer do (``WslConfig.honours_utf8 = False`` plays an older one, which ignores it).
A command for a distribution runs FOR REAL as a Linux process on this machine (in the server's
network namespace when the server runs inside a test host); what that program prints is its own.

Stopping the command (WinRS terminate, the shell deleted) ends wsl.exe only: the Linux processes run
on, stdin open, output unread (:meth:`~tests.winrm_server.server.Command.end_wsl_exe`); closing the
command's stdin (Send ``End="true"``) is an end-of-file for the Linux process. Ctrl+C is passed on as
SIGINT, and the command ends when the Linux process does.

Accepted forms (wsl.exe's own syntax)::

    wsl.exe [-d|--distribution NAME] [-u|--user USER] [--cd DIR] -e|--exec PROGRAM ARGS...
    wsl.exe [-d NAME] [-u USER] [--cd DIR] -- COMMAND LINE  (the rest of the line, as written, to $SHELL -c)
    wsl.exe [-d NAME] [-u USER] [--cd DIR] COMMAND LINE     (the same, from the first non-option on)

Arguments are split from the Windows command line with the C runtime rules (:mod:`cmdline`).
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tests.winrm_server import cmdline

if TYPE_CHECKING:
    from tests.winrm_server.server import Answer, Command, WinRMServer

WSL_E_DISTRO_NOT_FOUND = 4294967295  # wsl.exe exits -1 (0xFFFFFFFF as WinRS reports it)


@dataclass
class Distro:
    name: str
    state: str = "Running"  # "Running" / "Stopped"
    version: int = 2
    default: bool = False


@dataclass
class WslConfig:
    """What the fake WSL installation reports; tests change it before the command runs.

    ``on_wsl(argv)`` may answer any wsl.exe command itself (return an Answer; None: default behaviour).
    ``encoding`` is how wsl.exe's own messages are written without ``WSL_UTF8=1`` ("utf-16-le": the
    real default); ``honours_utf8``: whether ``WSL_UTF8=1`` in the shell's environment makes them
    UTF-8 (wsl.exe 0.64 and newer; False: an older wsl.exe, which ignores the variable).
    ``written`` records the encoding of every message written (tests assert on it).
    """

    distros: list[Distro] = field(default_factory=lambda: [Distro("Ubuntu-22.04", default=True)])
    encoding: str = "utf-16-le"
    honours_utf8: bool = True
    written: list[str] = field(default_factory=list)
    installed: bool = True
    version_text: str = (
        "WSL version: 2.3.26.0\n"
        "Kernel version: 5.15.167.4-1\n"
        "WSLg version: 1.0.65\n"
        "MSRDC version: 1.2.5620\n"
        "Direct3D version: 1.611.1-81528511\n"
        "DXCore version: 10.0.26100.1-240331-1435.ge-release\n"
        "Windows version: 10.0.22631.4460\n"
    )
    networking_mode: str = "mirrored"
    shell: str = "/bin/bash"
    on_wsl: Callable[[list[str]], Answer | None] | None = None

    def default(self) -> Distro | None:
        return next((d for d in self.distros if d.default), self.distros[0] if self.distros else None)

    def list_verbose(self) -> str:
        width = max([len(d.name) for d in self.distros] + [4]) + 4
        lines = [f"  {'NAME':<{width}}STATE           VERSION"]
        for d in self.distros:
            mark = "*" if d.default else " "
            lines.append(f"{mark} {d.name:<{width}}{d.state:<16}{d.version}")
        return "\n".join(lines) + "\n"

    def status(self) -> str:
        d = self.default()
        return f"Default Distribution: {d.name if d else ''}\nDefault Version: 2\n"

    def encoding_for(self, env: dict[str, str]) -> str:
        """How wsl.exe writes its own messages in a process with environment ``env`` (Windows
        compares variable names without case; wsl.exe wants the value 1)."""
        utf8 = any(k.upper() == "WSL_UTF8" and v == "1" for k, v in env.items())
        return "utf-8" if utf8 and self.honours_utf8 else self.encoding

    def encode(self, text: str, env: dict[str, str] | None = None) -> bytes:
        encoding = self.encoding_for(env or {})
        self.written.append(encoding)
        return text.replace("\r\n", "\n").replace("\n", "\r\n").encode(encoding)


def run_wsl(server: WinRMServer, cmd: Command, line: str, tokens: list[cmdline.Token]) -> None:
    from tests.winrm_server.server import WSL_TOKEN_ENV, Answer

    config: WslConfig = server.wsl
    cmd.wsl = True  # stopping it ends wsl.exe only (Command.end_wsl_exe)
    argv = [t.value for t in tokens]
    if config.on_wsl is not None:
        answer = config.on_wsl(argv)
        if answer is not None:
            server.play(cmd, answer, clixml=False)
            return

    def say(text: str, code: int, stream: str = "stdout") -> None:
        """wsl.exe's own messages: UTF-16LE (config.encoding) unless WSL_UTF8=1 is in the shell's
        environment; those of WSL's init inside the distribution (``<3>WSL ...``, stderr) are plain
        UTF-8 with LF."""
        data = text.encode("utf-8") if stream == "stderr" else config.encode(text, cmd.shell.env)
        cmd.emit(stream, data)
        cmd.finish(code)

    if not config.installed:
        say(
            "Windows Subsystem for Linux is not installed. You can install by running 'wsl.exe --install'.\n"
            "For more information please visit https://aka.ms/wslinstall\n",
            50,
        )
        return
    args = argv[1:]
    lowered = [a.lower() for a in args]
    if lowered[:1] in (["--list"], ["-l"]) and any(a in ("--verbose", "-v") for a in lowered[1:]):
        say(config.list_verbose(), 0)
        return
    if lowered[:1] in (["--list"], ["-l"]):
        d = config.default()
        names = [f"{x.name}{' (Default)' if x is d else ''}" for x in config.distros]
        say("Windows Subsystem for Linux Distributions:\n" + "\n".join(names) + "\n", 0)
        return
    if lowered[:1] == ["--status"]:
        say(config.status(), 0)
        return
    if lowered[:1] in (["--version"], ["-v"]):
        say(config.version_text, 0)
        return

    distro = config.default()
    user: str | None = None
    cwd: str | None = None
    i = 1
    program: list[str] | None = None
    shell_line: str | None = None
    while i < len(tokens):
        word = tokens[i].value
        low = word.lower()
        if low in ("-d", "--distribution") and i + 1 < len(tokens):
            name = tokens[i + 1].value
            distro = next((d for d in config.distros if d.name.lower() == name.lower()), None)
            if distro is None:
                say(
                    "There is no distribution with the supplied name.\n"
                    "Error code: Wsl/Service/WSL_E_DISTRO_NOT_FOUND\n",
                    WSL_E_DISTRO_NOT_FOUND,
                )
                return
            i += 2
        elif low in ("-u", "--user") and i + 1 < len(tokens):
            user = tokens[i + 1].value
            i += 2
        elif low == "--cd" and i + 1 < len(tokens):
            cwd = tokens[i + 1].value
            i += 2
        elif low in ("-e", "--exec"):
            program = [t.value for t in tokens[i + 1 :]]
            break
        elif word == "--":
            shell_line = line[tokens[i].end :].lstrip(" \t")
            break
        elif word.startswith("-"):
            say(
                f"Invalid command line argument: {word}\nPlease use 'wsl.exe --help' to get a list of "
                "supported arguments.\nError code: Wsl/E_INVALIDARG\n",
                WSL_E_DISTRO_NOT_FOUND,
            )
            return
        else:
            shell_line = line[tokens[i].start :]
            break
    if distro is None:
        say(
            "Windows Subsystem for Linux has no installed distributions.\n"
            "Error code: Wsl/Service/WSL_E_DEFAULT_DISTRO_NOT_FOUND\n",
            WSL_E_DISTRO_NOT_FOUND,
        )
        return
    if program is None and shell_line is None:
        say("interactive shells are not supported by the test server\n", 1, "stderr")
        return
    if program is not None and not program:
        say("Invalid command line argument: --exec\n", WSL_E_DISTRO_NOT_FOUND)
        return

    popen: dict[str, object] = {}
    env = dict(os.environ)
    home = "/root"
    if user is not None:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            say(f"<3>WSL (1) ERROR: CreateProcessEntryCommon:370: getpwnam({user}) failed 0\n", 1, "stderr")
            return
        home = entry.pw_dir
        env.update({"USER": entry.pw_name, "LOGNAME": entry.pw_name, "HOME": entry.pw_dir})
        if entry.pw_uid != os.getuid():
            groups = [g for g in os.getgrouplist(entry.pw_name, entry.pw_gid) if g != entry.pw_gid]
            popen = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": groups}

    env["WSL_DISTRO_NAME"] = distro.name
    env[WSL_TOKEN_ENV] = cmd.token  # not WSL's: how the server finds what this command started
    if cwd in (None, ""):
        workdir = None
    elif cwd == "~":
        workdir = home
    else:
        workdir = cwd
    if workdir is not None and not os.path.isdir(workdir):
        say(f"chdir({workdir}) failed 2\n", 1, "stderr")
        return
    if program is None:
        assert shell_line is not None
        shell = config.shell if shutil.which(config.shell) else "/bin/sh"
        argv_linux = [shell, "-c", shell_line]
    else:
        argv_linux = program
    _ = Answer  # (imported for on_wsl users' type hints)
    cmd.spawn(argv_linux, workdir, env, **popen)
