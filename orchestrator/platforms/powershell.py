"""Windows PowerShell (5.1, the one every Windows 10/11 has; PowerShell 7 reads the same text).

What this module owns, and why each choice:

- **Quoting**: PowerShell single-quoted strings keep every character except the single quote, which is
  written twice. PowerShell treats the typographic quotes U+2018, U+2019, U+201A and U+201B as single
  quotes too (a value pasted from a word processor would otherwise end the string early): each is
  doubled as well.
- **Native programs** (``python.exe``, ``nvidia-smi.exe``, ``wsl.exe``): Windows passes a program
  one command-line *string*, which the program splits itself (the Microsoft C runtime rules, the same
  as ``CommandLineToArgvW``). Windows PowerShell 5.1 builds that string badly: embedded double quotes
  are not escaped, empty arguments vanish, and PowerShell 7.3 changed the rules again
  (``$PSNativeCommandArgumentPassing``). ``--%`` (stop-parsing) is no escape either: it still
  expands ``%NAME%`` and cannot carry a newline. So :meth:`PowerShell.native` builds the command line
  itself (:func:`argv_to_command_line`, tested against a reference splitter) and starts the process
  with ``[Diagnostics.ProcessStartInfo]``: the program receives exactly our argv on every PowerShell
  version. Its stdout/stderr are the script's own handles (inherited, not captured), so output
  streams live and unchanged (no re-encoding by PowerShell, and no 5.1 ``NativeCommandError`` when a
  program writes to stderr under ``$ErrorActionPreference = 'Stop'``). Its exit code lands in
  ``$LASTEXITCODE`` as for ``& prog``.
- **Scripts** travel as ``-EncodedCommand`` (base64 of UTF-16LE: no quoting layer at all); a script
  whose command line would pass cmd.exe's 8191 characters once WinRS wraps it (the transport keeps a
  margin: transports/winrm_shell.py) is uploaded by the transport and run with
  :meth:`PowerShell.file_command` (UTF-8 *with* BOM: 5.1 reads a BOM-less .ps1 in the ANSI code page).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence

import orchestrator.platforms.transfer as transfer
from orchestrator.platforms.base import UNSAFE_DIR_EXIT, Platform, ScriptFile, check_env_name
from orchestrator.records import check_nonce

#: cmd.exe's command-line limit: WinRS runs commands through it (8191 characters, including the
#: program name, counted after ``%NAME%`` expansion); the WinRM transport keeps room under it for
#: WinRS's own ``cmd.exe /c`` (transports/winrm_shell.py); longer PowerShell scripts are uploaded and run
#: with ``file_command``
MAX_COMMAND_LINE = 8191

#: exit code when the working directory cannot be entered (what PosixShell and ``env -C`` use)
CWD_FAILED_EXIT = 125
#: exit code when a native program is not found (as in sh, so facts read both alike)
NOT_FOUND_EXIT = 127
#: exit code when ``become`` is asked in a session that is not elevated: Windows' own
#: ERROR_ELEVATION_REQUIRED (740), which no ordinary program returns
NOT_ELEVATED_EXIT = 740

#: the characters PowerShell reads as a single quote: ' and the typographic ones
SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"

#: arguments to powershell.exe shared by every way we start it
POWERSHELL_EXE = "powershell.exe"
POWERSHELL_OPTIONS = ("-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass")

_NEEDS_QUOTES = re.compile(r'[\s"]')
#: what cmd.exe still interprets inside double quotes (variables, delayed expansion) or what we would
#: have to put inside them (a quote ends cmd's quoted region): never sent through cmd
_CMD_UNSAFE = re.compile(r'[%!"\r\n\x00]')
_CMD_SPECIAL = re.compile(r"[\s&|<>^()]")

#: what Windows says when a process of a WinRS shell's job meets one of the shell's quotas, for each
#: setting: the job's process limit refuses a new process with ERROR_NOT_ENOUGH_QUOTA (1816), its memory
#: limit refuses an allocation with ERROR_COMMITMENT_LIMIT (1455; what users of shells over
#: MaxMemoryPerShellMB report: ansible issue 39327), and the remote operation is then ended
SHELL_QUOTA_TEXTS = {
    "MaxProcessesPerShell": "Not enough quota is available to process this command",
    "MaxMemoryPerShellMB": "The paging file is too small for this operation to complete",
}

NOT_ELEVATED_MESSAGE = (
    "this step needs an elevated (administrator) session and this one is not: connect as a member of the "
    "local Administrators group (WinRM sessions of administrators are elevated; for a local account "
    "other than Administrator set LocalAccountTokenFilterPolicy=1, as Enable-PSRemoting does)"
)


def argv_to_command_line(argv: Sequence[str]) -> str:
    """A Windows command line that the Microsoft C runtime (and ``CommandLineToArgvW``) splits back
    into exactly ``argv``.

    The program name (``argv[0]``) follows simpler rules (quotes only group, backslashes are
    literal): it may not contain a double quote. Every other argument: as is when it has no
    whitespace or quote (and is not empty); else in double quotes, where a run of backslashes is
    doubled when a quote follows it (the closing quote included) and a quote is written ``\\"``.
    """
    if not argv:
        raise ValueError("empty argv")
    program, *args = argv
    if '"' in program or not program:
        raise ValueError(f"a program name cannot be empty or contain a double quote: {program!r}")
    words = [f'"{program}"' if _NEEDS_QUOTES.search(program) else program]
    words.extend(windows_arg(a) for a in args)
    return " ".join(words)


def windows_arg(value: str, *, force: bool = False) -> str:
    """One argument (not the program name) quoted for the C runtime's command-line splitting;
    ``force`` puts it in double quotes even when it would not need them."""
    if value and not force and not _NEEDS_QUOTES.search(value):
        return value
    out = ['"']
    backslashes = 0
    for char in value:
        if char == "\\":
            backslashes += 1
            continue
        if char == '"':
            out.append("\\" * (2 * backslashes + 1) + '"')
        else:
            out.append("\\" * backslashes + char)
        backslashes = 0
    out.append("\\" * (2 * backslashes) + '"')
    return "".join(out)


def cmd_command_line(argv: Sequence[str]) -> str:
    """A command line that reaches the program unchanged whether or not cmd.exe parses it first.

    WinRS runs a command through ``cmd.exe /c``, which expands ``%NAME%`` (and ``!NAME!`` when delayed
    expansion is on) everywhere and treats ``& | < > ^ ( )`` as syntax outside double quotes. So an
    argument with any of those is always put in double quotes, and arguments holding ``%``, ``!``, a
    double quote (it would end cmd's quoted region), a line break or NUL are refused: nothing we send
    this way needs them (scripts travel base64-encoded).
    """
    words = []
    for index, value in enumerate(argv):
        if _CMD_UNSAFE.search(value):
            raise ValueError(f"argument {value!r} cannot pass through cmd.exe safely")
        if index == 0:
            argv_to_command_line([value])  # the program name's own rules (refuses what they cannot hold)
            words.append(f'"{value}"' if _CMD_SPECIAL.search(value) else value)
        else:
            words.append(windows_arg(value, force=bool(_CMD_SPECIAL.search(value))))
    return " ".join(words)


class PowerShell(Platform):
    """Native Windows nodes: every script is Windows PowerShell 5.1 text."""

    name = "powershell"
    file_modes = False

    #: longer login_command lines are uploaded and run with file_command (read by the WinRM transport)
    MAX_COMMAND_LINE = MAX_COMMAND_LINE

    # -- quoting -------------------------------------------------------------------------------------

    def as_powershell(self) -> PowerShell:
        return self

    def quote(self, value: str) -> str:
        return "'" + "".join(c + c if c in SINGLE_QUOTES else c for c in value) + "'"

    def join(self, argv: Sequence[str]) -> str:
        """Run the native program ``argv[0]`` with arguments ``argv[1:]`` exactly (see :meth:`native`)."""
        return self.native(argv)

    def native(self, argv: Sequence[str], *, program: str | None = None) -> str:
        """A statement running a native program with exactly ``argv[1:]`` as its arguments.

        The program is looked up as PowerShell would (PATH, PATHEXT, or a path); ``program`` may
        instead be a PowerShell expression giving the path. Not found: ``$LASTEXITCODE`` is 127, as in
        sh. Batch files (.cmd/.bat) are refused: cmd.exe re-parses their arguments, so no quoting is
        safe for them (the "BatBadBut" class of bugs). The child runs in the current location and
        environment (``$env:`` changes included); its exit code lands in ``$LASTEXITCODE``.
        """
        if not argv:
            raise ValueError("empty argv")
        name = program or self.quote(argv[0])
        shown = self.quote(argv[0])
        arguments = self.quote(argv_to_command_line(["x", *argv[1:]])[2:])
        return (
            "& {\n"
            f"  $cbExe = Get-Command -CommandType Application -Name {name} -ErrorAction SilentlyContinue"
            " | Select-Object -First 1\n"
            "  if ($null -eq $cbExe) {\n"
            f"    [Console]::Error.WriteLine({shown} + ': command not found')\n"
            f"    $global:LASTEXITCODE = {NOT_FOUND_EXIT}\n"
            "    return\n"
            "  }\n"
            "  if ($cbExe.Path -match '\\.(cmd|bat)$') {\n"
            "    throw ($cbExe.Path + ': batch files cannot receive arguments safely;"
            " run the program itself')\n"
            "  }\n"
            "  $cbInfo = New-Object -TypeName System.Diagnostics.ProcessStartInfo\n"
            "  $cbInfo.FileName = $cbExe.Path\n"
            f"  $cbInfo.Arguments = {arguments}\n"
            "  $cbInfo.UseShellExecute = $false\n"
            "  $cbInfo.WorkingDirectory = (Get-Location -PSProvider FileSystem).ProviderPath\n"
            "  $cbProc = [System.Diagnostics.Process]::Start($cbInfo)\n"
            "  $cbProc.WaitForExit()\n"
            "  $global:LASTEXITCODE = $cbProc.ExitCode\n"
            "}"
        )

    # -- paths ---------------------------------------------------------------------------------------

    def path_word(self, path: str) -> str:
        """``path`` as a PowerShell expression: ``~`` is the user's profile directory on the node
        (``$HOME``), forward slashes become backslashes, the rest stays literal (no wildcards)."""
        path = path.replace("/", "\\")
        if path == "~":
            return "$HOME"
        if path.startswith("~\\"):
            return f"($HOME + {self.quote(path[1:])})"
        return self.quote(path)

    def transfer_path(self, path: str) -> str:
        """A Windows path for file transfer: relative paths are relative to the WinRS shell's start
        directory, the user's profile (``%USERPROFILE%``), so ``~\\x`` becomes ``x``."""
        path = path.replace("/", "\\")
        if path == "~":
            return "."
        if path.startswith("~\\"):
            return path[2:]
        return path

    def full_path(self, path: str) -> str:
        """``path`` as a PowerShell expression giving the full path on the node."""
        # .NET resolves relative paths against the process directory, which Set-Location does not
        # move: resolve against PowerShell's current location first.
        word = self.path_word(path)
        return f"$ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath({word})"

    def mkdir(self, path: str, *, private: bool = False) -> str:
        """Create ``path`` and its parents; no error when it exists (``mkdir -p``).

        ``private`` (what ``chmod 700`` is on POSIX): the directory's access list is replaced by one
        entry, full control for the connecting user, inherited by everything created in it, and
        nothing inherited from its parent; the user is made its owner. Set on every call (also when
        the directory existed), before anything is put there; a failure (a volume without ACLs)
        stops the script: the directory is never used unprotected.

        Why no entry for SYSTEM or Administrators, as Windows gives a profile: nothing of ours
        running under another account opens a run directory (launch.ps1 runs as the connecting
        user, in the WinRM shell or started by ``Win32_Process`` Create with the caller's token; the
        file transfers run in that shell), and administrators and SYSTEM reach any file anyway
        through their privileges (take ownership, backup): an entry for them would protect nothing
        and would let every service running as SYSTEM read the launch script's secrets. A profile
        is no substitute: ``workdir`` may put run directories anywhere, and inside a profile a
        directory inherits whatever was granted on its parents.

        ``DirectoryInfo.SetAccessControl`` (.NET Framework, under powershell.exe 5.1) writes only
        what was set on the new ``DirectorySecurity``: owner and access list, never the audit list
        (Set-Acl may try to, which needs SeSecurityPrivilege).
        """
        if not private:
            return f"[void][System.IO.Directory]::CreateDirectory({self.full_path(path)})"
        acl = "System.Security.AccessControl"
        return (
            "& {\n"
            f"  $cbDir = [System.IO.Directory]::CreateDirectory({self.full_path(path)})\n"
            "  $cbMe = [System.Security.Principal.WindowsIdentity]::GetCurrent().User\n"
            f"  $cbAcl = New-Object -TypeName {acl}.DirectorySecurity\n"
            "  $cbAcl.SetOwner($cbMe)\n"
            "  $cbAcl.SetAccessRuleProtection($true, $false)\n"
            f"  $cbAcl.AddAccessRule((New-Object -TypeName {acl}.FileSystemAccessRule -ArgumentList @($cbMe,"
            f" [{acl}.FileSystemRights]::FullControl,"
            f" [{acl}.InheritanceFlags]'ContainerInherit, ObjectInherit',"
            f" [{acl}.PropagationFlags]::None, [{acl}.AccessControlType]::Allow)))\n"
            "  $cbDir.SetAccessControl($cbAcl)\n"
            "}"
        )

    def _refuse_unless_own(self, path_var: str, *, empty: bool = False) -> str:
        """Statements that end the script (one line on stderr, exit UNSAFE_DIR_EXIT) unless the
        directory at ``path_var`` is not a link (reparse point), belongs to the connecting user and
        its access list allows no one else (``empty``: and holds nothing yet)."""
        sid = "[System.Security.Principal.SecurityIdentifier]"
        return (
            "$cbMe = [System.Security.Principal.WindowsIdentity]::GetCurrent().User\n"
            f"$cbItem = Get-Item -LiteralPath {path_var} -Force\n"
            f"$cbHeld = Get-Acl -LiteralPath {path_var}\n"
            f"$cbOwner = $cbHeld.GetOwner({sid})\n"
            f"$cbOthers = @($cbHeld.GetAccessRules($true, $true, {sid}) | Where-Object"
            " { $_.AccessControlType -eq 'Allow' -and $_.IdentityReference -ne $cbMe }"
            " | ForEach-Object { $_.IdentityReference.Value })\n"
            "$cbWhy = ''\n"
            "if ($cbItem.Attributes -band [System.IO.FileAttributes]::ReparsePoint) {"
            " $cbWhy = 'it is a link (reparse point)' }\n"
            "elseif ($cbOwner -ne $cbMe) { $cbWhy = 'it belongs to ' + $cbHeld.Owner + ' (' + $cbOwner.Value"
            " + '), not to you' }\n"
            "elseif ($cbOthers.Count -gt 0) {"
            " $cbWhy = 'its access list also allows ' + ($cbOthers -join ', ') }\n"
            + (
                "elseif (@(Get-ChildItem -LiteralPath " + path_var + " -Force).Count -gt 0) {"
                " $cbWhy = 'something was put in it while bootstrap was creating it' }\n"
                if empty
                else ""
            )
            + "if ($cbWhy) {\n"
            f"  [Console]::Error.WriteLine('refusing ' + {path_var} + ': ' + $cbWhy + ': its files"
            " (launch.ps1, pid) are not trusted, so nothing there is run, read or stopped; use a run"
            " directory only you can reach (check who made this one)')\n"
            f"  exit {UNSAFE_DIR_EXIT}\n"
            "}"
        )

    def new_private_dir(self, path: str) -> str:
        """Create ``path``, which must not exist, owner-only (``mkdir`` with ``private``), then check
        what was set (owner, access list, empty) rather than trust it: a directory raced in by
        another user between the test and the creation is refused. Refusals: one line on stderr, exit
        UNSAFE_DIR_EXIT."""
        return (
            f"$cbNew = {self.full_path(path)}\n"
            "if (Test-Path -LiteralPath $cbNew) {\n"
            "  [Console]::Error.WriteLine('refusing ' + $cbNew + ': the run directory exists already (owner '"
            " + (Get-Acl -LiteralPath $cbNew).Owner + \"): a run's directory is created new by bootstrap;"
            " choose another --run-id (and remove this directory if it is an earlier launch's that"
            ' failed)")\n'
            f"  exit {UNSAFE_DIR_EXIT}\n"
            "}\n" + self.mkdir(path, private=True) + "\n" + self._refuse_unless_own("$cbNew", empty=True)
        )

    def check_path(self, path: str) -> str:
        """Nothing: the directories above a path are not checked on Windows (their access lists have
        no sticky bit to reason with; docs/security.md)."""
        return "# the path's directories are not checked on Windows"

    def no_group_write(self, script: str) -> str:
        """``script`` as it is: what it creates inherits its parent's access list."""
        return script

    def check_own_dir(self, path: str) -> str:
        """End the script (one line on stderr, exit UNSAFE_DIR_EXIT) before anything in ``path`` is
        read or acted on, unless it is the connecting user's own and no one else's (owner and access
        list checked); a ``path`` that does not exist passes."""
        return f"$cbOwn = {self.full_path(path)}\n" + self.check_own_dir_in("$cbOwn")

    def check_own_dir_in(self, variable: str) -> str:
        """``check_own_dir`` for the full path a script holds in ``variable`` already."""
        return f"if (Test-Path -LiteralPath {variable}) {{\n" + self._refuse_unless_own(variable) + "\n}"

    def mkdir_marked(self, path: str, marker: str) -> str:
        """Create ``path`` (and its parents) when it is not there, with an empty file ``marker`` in
        it: a directory this command created is known later as bootstrap's own."""
        full = self.full_path(path)
        marker_path = self.full_path(f"{path.rstrip('/')}/{marker}")
        return (
            f"if (-not [System.IO.Directory]::Exists({full})) {{ "
            f"[void][System.IO.Directory]::CreateDirectory({full}); "
            f"[System.IO.File]::WriteAllText({marker_path}, '') }}"
        )

    def say_if_exists(self, path: str, word: str) -> str:
        """A statement that prints ``word`` and ends the script (exit 0) when ``path`` exists."""
        test = f"Test-Path -LiteralPath {self.path_word(path)}"
        return f"if ({test}) {{ Write-Output {self.quote(word)}; exit 0 }}"

    def say_if_listening(self, port: int, said: str) -> str:
        """Statements that print ``said`` (a whole line) and end the script (exit 0) when a TCP socket
        of this machine listens on ``port``, on any address (``Get-NetTCPConnection``; a Windows
        without that cmdlet checks nothing, as before, rather than failing the launch)."""
        ask = f"Get-NetTCPConnection -State Listen -LocalPort {int(port)} -ErrorAction SilentlyContinue"
        return (
            f"try {{ $cbListening = @({ask}) }} catch {{ $cbListening = @() }}\n"
            f"if ($cbListening.Count -gt 0) {{ Write-Output {self.quote(said)}; exit 0 }}"
        )

    def run_script(self, path: str) -> str:
        """Run the .ps1 file at ``path`` (on the node); its ``exit N`` becomes our exit code."""
        return f"& {self.path_word(path)}"

    # -- scripts -------------------------------------------------------------------------------------

    def prelude(self) -> str:
        """Settings every script starts with: errors stop the script (not just print), undefined
        variables are errors, no progress records (they become CLIXML noise on a WinRS stderr), UTF-8
        output where the host has a console encoding to set."""
        return (
            "$ErrorActionPreference = 'Stop'\n"
            "Set-StrictMode -Version Latest\n"
            "$ProgressPreference = 'SilentlyContinue'\n"
            "try {\n"
            "  [Console]::OutputEncoding = New-Object -TypeName System.Text.UTF8Encoding"
            " -ArgumentList $false\n"
            "} catch { $null = $_ }"
        )

    def elevation_check(self) -> str:
        """Stop with exit code 740 and a clear message unless the session is elevated.

        There is no sudo: a WinRM session of an administrator is already elevated (remote logons get
        the full token), any other session cannot become one. So ``become`` only checks."""
        return (
            "$cbIdentity = [System.Security.Principal.WindowsIdentity]::GetCurrent()\n"
            "$cbPrincipal = New-Object -TypeName System.Security.Principal.WindowsPrincipal"
            " -ArgumentList $cbIdentity\n"
            "$cbAdmin = [System.Security.Principal.WindowsBuiltInRole]::Administrator\n"
            "if (-not $cbPrincipal.IsInRole($cbAdmin)) {\n"
            f"  [Console]::Error.WriteLine({self.quote(NOT_ELEVATED_MESSAGE)})\n"
            f"  exit {NOT_ELEVATED_EXIT}\n"
            "}"
        )

    def wrap(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        become: bool = False,
    ) -> str:
        """``command`` (PowerShell text) with the prelude, ``env`` set, inside ``cwd``.

        Exit code: ``exit N`` in the command wins; else the last native program's ``$LASTEXITCODE``;
        a terminating error (every error, under ``Stop``) prints its message and position on stderr
        as plain text (not CLIXML) and exits 1. A missing ``cwd`` exits 125 naming it.
        """
        lines = [self.prelude(), "$global:LASTEXITCODE = 0"]
        if become:
            lines.append(self.elevation_check())
        lines.append("try {")
        for name, value in (env or {}).items():
            lines.append(f"  $env:{check_env_name(name)} = {self.quote(value)}")
        if cwd:
            shown = self.quote(cwd)
            lines.append(
                f"  try {{ Set-Location -LiteralPath {self.path_word(cwd)} }} catch {{\n"
                f"    [Console]::Error.WriteLine('cannot enter the working directory ' + {shown}"
                " + ': ' + $_.Exception.Message)\n"
                f"    exit {CWD_FAILED_EXIT}\n"
                "  }"
            )
        lines.append(command)
        lines.append(
            "} catch {\n"
            "  [Console]::Error.WriteLine('ERROR: ' + $_.Exception.Message)\n"
            "  [Console]::Error.WriteLine($_.InvocationInfo.PositionMessage)\n"
            "  exit 1\n"
            "}\n"
            "exit $global:LASTEXITCODE"
        )
        return "\n".join(lines)

    def record_functions(self, nonce: str) -> str:
        """``Out-CbRecord KIND @(FIELD, ...)`` prints one record; each field is taken as a string
        and travels as its UTF-8 bytes (``$null``: an empty field)."""
        return f"$cbNonce = {self.quote(check_nonce(nonce))}\n" + self.record_function()

    def record_function(self) -> str:
        """``Out-CbRecord`` alone, with the nonce in ``$cbNonce`` (a script whose nonce is its
        parameter: the foreground follower's rounds)."""
        return (
            "function Out-CbRecord([string]$Kind, [object[]]$Fields) {\n"
            "  $cbLine = New-Object -TypeName System.Text.StringBuilder\n"
            "  $null = $cbLine.Append('@@').Append($cbNonce).Append(' ').Append($Kind)\n"
            "  if ($null -ne $Fields) {\n"
            "    foreach ($cbField in $Fields) {\n"
            "      $cbBytes = [System.Text.Encoding]::UTF8.GetBytes([string]$cbField)\n"
            "      $null = $cbLine.Append(' :').Append([System.Convert]::ToBase64String($cbBytes))\n"
            "    }\n"
            "  }\n"
            "  [Console]::Out.Write($cbLine.Append([char]10).ToString())\n"
            "}"
        )

    def sectioned(self, sections: Sequence[tuple[str, str]], token: str) -> str:
        """Each section in its own script block (its variables stay there; ``return`` ends it).

        Answers as :meth:`PosixShell.sectioned`: one record (``token`` the nonce) ``section NAME
        DATA``, DATA its output lines, a NUL, its exit code: ``$LASTEXITCODE`` after the block (a
        section sets it to report a code: ``exit`` would end the whole script), or 1 when the block
        threw (its message then ends the section's output). Objects a block outputs are text lines.
        """
        parts = [self.record_functions(token)]
        for name, command in sections:
            parts.append(
                "$cbSectionLines = New-Object -TypeName System.Collections.Generic.List[string]\n"
                "$global:LASTEXITCODE = 0\n"
                "try {\n"
                "  & {\n"
                f"{command}\n"
                "  } | Out-String -Stream -Width 4096 | ForEach-Object { $cbSectionLines.Add($_) }\n"
                "  $cbCode = $global:LASTEXITCODE\n"
                "} catch {\n"
                "  $cbSectionLines.Add('error: ' + $_.Exception.Message)\n"
                "  $cbCode = 1\n"
                "}\n"
                f"Out-CbRecord 'section' @({self.quote(name)},"
                ' (($cbSectionLines -join "`n") + [char]0 + [string]$cbCode))'
            )
        return "\n".join(parts)

    # -- starting powershell.exe -----------------------------------------------------------------------

    def login_command(self, script: str) -> str:
        """``powershell.exe ... -EncodedCommand <base64 of UTF-16LE>``: no quoting layer at all.

        When this is longer than :data:`MAX_COMMAND_LINE`, the transport uploads
        :meth:`script_file` ``(script)`` and runs :meth:`file_command` instead.
        """
        encoded = base64.b64encode(script.encode("utf-16-le")).decode("ascii")
        return " ".join([POWERSHELL_EXE, *POWERSHELL_OPTIONS, "-EncodedCommand", encoded])

    def file_command(self, path: str) -> str:
        """Run the uploaded script at ``path`` (a Windows path ending in ``.ps1``) with ``-File``:
        ``exit N`` in it becomes powershell.exe's exit code."""
        if not path.lower().endswith(".ps1"):
            raise ValueError(f"powershell.exe -File needs a .ps1 path, got {path!r}")
        return cmd_command_line([POWERSHELL_EXE, *POWERSHELL_OPTIONS, "-File", path])

    @staticmethod
    def script_file(script: str) -> bytes:
        """The bytes of a .ps1 file holding ``script``: UTF-8 with a BOM (Windows PowerShell 5.1 reads a
        file without BOM in the ANSI code page, mangling every non-ASCII character)."""
        return b"\xef\xbb\xbf" + script.encode("utf-8")

    def local_argv(self, script: str) -> list[str]:
        encoded = base64.b64encode(script.encode("utf-16-le")).decode("ascii")
        return [POWERSHELL_EXE, *POWERSHELL_OPTIONS, "-EncodedCommand", encoded]

    def long_script(self, script: str) -> ScriptFile:
        return ScriptFile(self.script_file(script), ".ps1", None)

    def run_long_script(self, path: str, script: str) -> str:
        return self.file_command(path)

    # -- files through a command (protocol: platforms/transfer.py) ----------------------------------------

    def upload_script(
        self, remote: str | None, expected_sha256: str, *, mode: int | None = None, suffix: str = ".tmp"
    ) -> str:
        """``mode`` has no meaning here: the file inherits its directory's access list."""
        target = None if remote is None else self.transfer_path(remote)
        return transfer.put_script(self, target, expected_sha256, suffix=suffix)

    def download_script(self, remote: str, chunk: int = transfer.GET_CHUNK) -> str:
        return transfer.get_script(self, self.transfer_path(remote), chunk)

    def remove_file(self, remote: str) -> str:
        return transfer.remove_script(self, self.transfer_path(remote))

    def shell_quota(self, output: str) -> str | None:
        """The WinRS quota (``MaxProcessesPerShell``, ``MaxMemoryPerShellMB``) whose Windows message
        ``output`` holds: every process a WinRS command starts is in the shell's job, which has both."""
        for setting, text in SHELL_QUOTA_TEXTS.items():
            if text in output:
                return setting
        return None

    # -- stopping --------------------------------------------------------------------------------------

    def stop_on_hangup(self, script: str, *, silence: float | None = None) -> str:
        """``script`` unchanged: Windows stops the whole tree itself (``silence``: not used; WinRM
        gives up on a silent host through its operation timeout).

        WinRS starts every process of a shell inside one job object; when the transport cancels (the
        WS-Man Signal ``terminate``, then Delete of the shell), the job is closed and every process
        in it ends: powershell.exe, the native programs :meth:`native` starts (they inherit the job)
        and their children. Only processes created outside the job (``Win32_Process`` Create,
        scheduled tasks: what detached runs use on purpose) survive; stop those with
        :meth:`kill_tree` or runs/windows.py.
        """
        return script

    def _tree_killer(self, roots: str) -> str:
        # Children are found by ParentProcessId; a child created before its "parent" is not one
        # (Windows reuses process ids, and a dead parent's id may belong to another process now).
        # Parents are stopped before their children: a launcher stopped first cannot react to its
        # ranks ending (start others, write an exit code) while the tree is being taken down.
        return (
            f"$cbRoots = @({roots})\n"
            "$cbKnown = @{}\n"
            "$cbOrder = New-Object -TypeName System.Collections.Generic.List[int]\n"
            "foreach ($cbRoot in $cbRoots) {\n"
            "  $cbKnown[[int]$cbRoot.ProcessId] = $cbRoot.CreationDate\n"
            "  $cbOrder.Add([int]$cbRoot.ProcessId)\n"
            "}\n"
            "foreach ($cbId in @(Find-CbTree $cbKnown)) { $cbOrder.Add($cbId) }\n"
            "foreach ($cbId in $cbOrder) {\n"
            "  Stop-Process -Id $cbId -Force -ErrorAction SilentlyContinue\n"
            "  [Console]::Out.WriteLine('stopped ' + $cbId)\n"
            "}"
        )

    #: PowerShell function: every live process descending from ``$Known`` (process id -> creation
    #: time of processes of the tree, alive or just stopped), added to it, parents first. A child is one
    #: whose ParentProcessId is in the tree and that was created after that parent (a recycled id's
    #: older processes are not its children). Walking from stopped processes too finds a child started
    #: while its parent was being stopped.
    FIND_TREE = (
        "function Find-CbTree($Known) {\n"
        "  $cbFound = New-Object -TypeName System.Collections.Generic.List[int]\n"
        "  $cbAll = @(Get-CimInstance -ClassName Win32_Process)\n"
        "  $cbGrew = $true\n"
        "  while ($cbGrew) {\n"
        "    $cbGrew = $false\n"
        "    foreach ($cbP in $cbAll) {\n"
        "      $cbChild = [int]$cbP.ProcessId\n"
        "      $cbParent = [int]$cbP.ParentProcessId\n"
        "      if ($cbChild -ne $cbParent -and -not $Known.ContainsKey($cbChild)"
        " -and $Known.ContainsKey($cbParent) -and $cbP.CreationDate -ge $Known[$cbParent]) {\n"
        "        $Known[$cbChild] = $cbP.CreationDate\n"
        "        $cbFound.Add($cbChild)\n"
        "        $cbGrew = $true\n"
        "      }\n"
        "    }\n"
        "  }\n"
        "  return $cbFound\n"
        "}\n"
    )

    def kill_tree(self, pid: int) -> str:
        """Stop process ``pid`` and every descendant (parents first), printing ``stopped <pid>`` for
        each; nothing (exit 0) when it is gone already."""
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ValueError(f"not a process id: {pid!r}")
        return self.FIND_TREE + self._tree_killer(
            f"Get-CimInstance -ClassName Win32_Process -Filter 'ProcessId = {pid}'"
        )

    @staticmethod
    def not_elevated(exit_code: int | None) -> bool:
        """True when a ``become`` script stopped because the session is not elevated."""
        return exit_code == NOT_ELEVATED_EXIT
