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
  whose command line would pass cmd.exe's 8191 characters is uploaded by the transport and run with
  :meth:`PowerShell.file_command` (UTF-8 *with* BOM: 5.1 reads a BOM-less .ps1 in the ANSI code page).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence

from orchestrator.platforms.base import Platform, check_env_name

#: cmd.exe's command-line limit: WinRS runs commands through it (8191 characters, including the
#: program name); longer PowerShell scripts are uploaded and run with ``file_command``
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
    #: longer login_command lines are uploaded and run with file_command (read by the WinRM transport)
    MAX_COMMAND_LINE = MAX_COMMAND_LINE

    # -- quoting -------------------------------------------------------------------------------------

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

    def _full_path(self, path: str) -> str:
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
            return f"[void][System.IO.Directory]::CreateDirectory({self._full_path(path)})"
        acl = "System.Security.AccessControl"
        return (
            "& {\n"
            f"  $cbDir = [System.IO.Directory]::CreateDirectory({self._full_path(path)})\n"
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

    def say_if_exists(self, path: str, word: str) -> str:
        """A statement that prints ``word`` and ends the script (exit 0) when ``path`` exists."""
        test = f"Test-Path -LiteralPath {self.path_word(path)}"
        return f"if ({test}) {{ Write-Output {self.quote(word)}; exit 0 }}"

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

    def sectioned(self, sections: Sequence[tuple[str, str]], token: str) -> str:
        """Each section in its own script block (its variables stay there; ``return`` ends it).

        Framing as :meth:`PosixShell.sectioned`: a begin line, the section's stdout, an empty line, an
        end line with its exit code, which is ``$LASTEXITCODE`` after the block (a section sets it to
        report a code: ``exit`` would end the whole script), or 1 when the block threw (its message
        then ends the section's output). Objects a block outputs are printed as text.
        """
        parts = []
        for name, command in sections:
            begin = self.quote(f"@@{token} begin {name}@@")
            end = self.quote(f"@@{token} end {name} ")
            parts.append(
                f"[Console]::Out.WriteLine({begin})\n"
                "$global:LASTEXITCODE = 0\n"
                "try {\n"
                "  & {\n"
                f"{command}\n"
                "  } | Out-String -Stream -Width 4096 | ForEach-Object { [Console]::Out.WriteLine($_) }\n"
                "  $cbCode = $global:LASTEXITCODE\n"
                "} catch {\n"
                "  [Console]::Out.WriteLine('error: ' + $_.Exception.Message)\n"
                "  $cbCode = 1\n"
                "}\n"
                "[Console]::Out.WriteLine()\n"
                f"[Console]::Out.WriteLine({end} + $cbCode + '@@')"
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

    # -- stopping --------------------------------------------------------------------------------------

    def stop_on_hangup(self, script: str, *, heartbeat: float | None = None) -> str:
        """``script`` unchanged: Windows stops the whole tree itself (``heartbeat``: not used; WinRM
        gives up on a silent host through its operation timeout).

        WinRS starts every process of a shell inside one job object; when the transport cancels (the
        WS-Man Signal ``terminate``, then Delete of the shell), the job is closed and every process
        in it ends: powershell.exe, the native programs :meth:`native` starts (they inherit the job)
        and their children. Only processes created outside the job (``Win32_Process`` Create,
        scheduled tasks: what detached runs use on purpose) survive; stop those with
        :meth:`kill_tree` or :meth:`stop_run`.
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
    _FIND_TREE = (
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
        return self._FIND_TREE + self._tree_killer(
            f"Get-CimInstance -ClassName Win32_Process -Filter 'ProcessId = {pid}'"
        )

    # -- runs: detached start, identity, stop, status, log tail from a byte offset ------------------
    # A run is found by its directory (steps/launch.run_dir_for). launch.ps1 (run with -Log, whose
    # directory is the run directory) writes there ``pid`` ("PID TICKS": its process id and creation
    # time as a FILETIME, so a recycled pid is never taken for it), ``ranks`` (the same for every
    # rank it starts), node.log, and node.log.rc (written to .part, then renamed) when it ends. Its
    # processes are the launcher, the ranks and their descendants: found from those identities, never
    # by a name or a command-line pattern that could match another run.

    def _run_functions(self, run_dir: str) -> str:
        """Variables and functions shared by start, stop, status and the tail (``$cbDir``: the run
        directory as a full path)."""
        return (
            f"$cbDir = {self._full_path(run_dir)}\n"
            # files the launcher may be writing: opened with FileShare ReadWrite and Delete
            "function Read-CbText([string]$Path) {\n"
            "  if (-not [System.IO.File]::Exists($Path)) { return '' }\n"
            "  $cbShare = [System.IO.FileShare]::ReadWrite -bor [System.IO.FileShare]::Delete\n"
            "  $cbStream = New-Object -TypeName System.IO.FileStream -ArgumentList $Path,"
            " ([System.IO.FileMode]::Open), ([System.IO.FileAccess]::Read), $cbShare\n"
            "  try {\n"
            "    $cbReader = New-Object -TypeName System.IO.StreamReader -ArgumentList $cbStream\n"
            "    return $cbReader.ReadToEnd()\n"
            "  } finally { $cbStream.Dispose() }\n"
            "}\n"
            # the process a "PID TICKS" line names, while it still runs: same id, same creation time
            "function Get-CbLive([string]$Line) {\n"
            "  $cbWords = @($Line.Trim() -split '\\s+')\n"
            "  if ($cbWords.Count -lt 2) { return $null }\n"
            "  try {\n"
            "    $cbProc = [System.Diagnostics.Process]::GetProcessById([int]$cbWords[0])\n"
            "    if ($cbProc.HasExited) { return $null }\n"
            "    if ([string]$cbProc.StartTime.ToFileTimeUtc() -ne $cbWords[1]) { return $null }\n"
            "    return $cbProc\n"
            "  } catch { return $null }\n"
            "}\n"
            "function Get-CbLeader {\n"
            "  return Get-CbLive (Read-CbText (Join-Path -Path $cbDir -ChildPath 'pid'))\n"
            "}\n"
            # the launcher and every rank still running (a rank outlives a launcher killed outright)
            "function Get-CbRoots {\n"
            "  $cbLive = New-Object -TypeName System.Collections.Generic.List[object]\n"
            "  $cbLines = @((Read-CbText (Join-Path -Path $cbDir -ChildPath 'pid')) -split \"`n\")\n"
            "  $cbLines += @((Read-CbText (Join-Path -Path $cbDir -ChildPath 'ranks')) -split \"`n\")\n"
            "  foreach ($cbLine in $cbLines) {\n"
            "    $cbProc = Get-CbLive $cbLine\n"
            "    if ($null -ne $cbProc) { $cbLive.Add($cbProc) }\n"
            "  }\n"
            "  return $cbLive\n"
            "}\n"
        )

    def start_detached(self, run_dir: str, script: str, log: str) -> str:
        """Start ``script`` (launch.ps1) with ``-Log log`` outside this WinRM shell, so it survives it,
        wait until it has written its pid file and print ``@@started PID TICKS`` (``@@started-before
        ...``, exit 3: the run directory has a pid file already).

        Why ``Win32_Process`` Create (Invoke-CimMethod) and not a scheduled task: WinRS puts every
        process of a shell in the shell's job object, which Windows ends when the shell is deleted;
        the WMI service creates the process itself, outside that job, as the connected user, and
        returns its id at once. A scheduled task would have to be registered under a name (and removed
        again), run under Task Scheduler's own limits (a default 72-hour execution time limit, its own
        stop) and, to run without an interactive logon, need the user's password stored or an S4U
        logon. The new process gets no console of ours and none of our environment: launch.ps1 sets
        everything its ranks need itself (PYTHONUNBUFFERED included).
        """
        return (
            self._run_functions(run_dir) + f"$cbScript = {self._full_path(script)}\n"
            f"$cbLogPath = {self._full_path(log)}\n"
            "$cbPidFile = Join-Path -Path $cbDir -ChildPath 'pid'\n"
            "if ([System.IO.File]::Exists($cbPidFile)) {\n"
            "  [Console]::Out.WriteLine('@@started-before ' + (Read-CbText $cbPidFile).Trim())\n"
            "  exit 3\n"
            "}\n"
            # the command line Windows splits (C runtime rules): Windows paths hold no double quote,
            # and these end in a file name, never in a backslash
            "$cbExe = [System.Diagnostics.Process]::GetCurrentProcess().MainModule.FileName\n"
            "$cbLine = '\"' + $cbExe + '\" -NoProfile -NonInteractive -ExecutionPolicy Bypass -File \"'"
            " + $cbScript + '\" -Log \"' + $cbLogPath + '\"'\n"
            "$cbCreate = @{ CommandLine = $cbLine; CurrentDirectory = $cbDir }\n"
            "$cbResult = Invoke-CimMethod -ClassName Win32_Process -MethodName Create -Arguments $cbCreate\n"
            "if ($cbResult.ReturnValue -ne 0) {\n"
            "  [Console]::Error.WriteLine('Win32_Process Create failed with code ' + $cbResult.ReturnValue"
            " + ' (2 access denied, 3 insufficient privilege, 9 path not found)')\n"
            "  exit 4\n"
            "}\n"
            "$cbChild = [int]$cbResult.ProcessId\n"
            "$cbClock = [System.Diagnostics.Stopwatch]::StartNew()\n"
            "while (-not [System.IO.File]::Exists($cbPidFile)) {\n"
            "  $cbGone = $null -eq (Get-Process -Id $cbChild -ErrorAction SilentlyContinue)\n"
            "  if (($cbGone -and -not [System.IO.File]::Exists($cbPidFile))"
            " -or $cbClock.Elapsed.TotalSeconds -gt 60) {\n"
            "    [Console]::Error.WriteLine('the launcher (process ' + $cbChild + ') did not start: '"
            " + (Read-CbText $cbLogPath).Trim())\n"
            "    exit 5\n"
            "  }\n"
            "  Start-Sleep -Milliseconds 50\n"
            "}\n"
            "[Console]::Out.WriteLine('@@started ' + (Read-CbText $cbPidFile).Trim())"
        )

    def stop_run(self, run_dir: str, marker: str = "", grace: float = 5.0) -> str:
        """Stop every process of the run: the launcher and the ranks named in the run directory's
        ``pid`` and ``ranks`` files (pid and creation time), and all their descendants. Prints one line
        like PosixShell.stop_run: ``@@stop terminated COUNT LEFT`` or ``@@stop exited CODE|gone|
        not-started|no-run``.

        Windows has no SIGTERM for a process without a window: every process is terminated at once
        (Stop-Process -Force, TerminateProcess), launcher first so it cannot react to its ranks ending;
        ``grace`` is not used. Returns once they are gone (10 s at most), checked by id and creation
        time. ``marker`` is unused (PosixShell needs it: Windows cannot read another process's
        environment)."""
        del marker, grace
        return (
            self._run_functions(run_dir)
            + self._FIND_TREE
            + "$cbRc = Join-Path -Path $cbDir -ChildPath 'node.log.rc'\n"
            "$cbRoots = @(Get-CbRoots)\n"
            "if ($cbRoots.Count -eq 0) {\n"
            "  if ([System.IO.File]::Exists($cbRc)) {"
            " [Console]::Out.WriteLine('@@stop exited ' + (Read-CbText $cbRc).Trim()) }\n"
            "  elseif ([System.IO.File]::Exists((Join-Path -Path $cbDir -ChildPath 'pid'))) {"
            " [Console]::Out.WriteLine('@@stop gone') }\n"
            "  elseif ([System.IO.Directory]::Exists($cbDir)) {"
            " [Console]::Out.WriteLine('@@stop not-started') }\n"
            "  else { [Console]::Out.WriteLine('@@stop no-run') }\n"
            "  exit 0\n"
            "}\n"
            "$cbKnown = @{}\n"
            "$cbBatch = New-Object -TypeName System.Collections.Generic.List[int]\n"
            "foreach ($cbRoot in $cbRoots) {\n"
            "  $cbKnown[$cbRoot.Id] = $cbRoot.StartTime\n"
            "  $cbBatch.Add($cbRoot.Id)\n"
            "}\n"
            "foreach ($cbId in @(Find-CbTree $cbKnown)) { $cbBatch.Add($cbId) }\n"
            "$cbStopped = New-Object -TypeName System.Collections.Generic.List[int]\n"
            "for ($cbRound = 0; $cbRound -lt 5 -and $cbBatch.Count -gt 0; $cbRound++) {\n"
            "  foreach ($cbId in $cbBatch) {\n"
            "    Stop-Process -Id $cbId -Force -ErrorAction SilentlyContinue\n"
            "    $cbStopped.Add($cbId)\n"
            "  }\n"
            # children started while their parents were being stopped (their parents are in $cbKnown)
            "  $cbBatch = @(Find-CbTree $cbKnown)\n"
            "}\n"
            # gone: no process with that id, or one created at another time (the id was reused)
            "function Get-CbLeft {\n"
            "  $cbLeft = 0\n"
            "  foreach ($cbId in $cbStopped) {\n"
            "    $cbProc = Get-Process -Id $cbId -ErrorAction SilentlyContinue\n"
            "    if ($null -eq $cbProc) { continue }\n"
            "    try {\n"
            # CIM creation times are whole microseconds: the same process is within 1 ms
            "      $cbApart = [Math]::Abs(($cbProc.StartTime - $cbKnown[$cbId]).TotalMilliseconds)\n"
            "      if ($cbApart -lt 1) { $cbLeft++ }\n"
            "    } catch { $null = $_ }\n"
            "  }\n"
            "  return $cbLeft\n"
            "}\n"
            "$cbClock = [System.Diagnostics.Stopwatch]::StartNew()\n"
            "while ((Get-CbLeft) -gt 0 -and $cbClock.Elapsed.TotalSeconds -lt 10) {\n"
            "  Start-Sleep -Milliseconds 100\n"
            "}\n"
            "[Console]::Out.WriteLine('@@stop terminated ' + $cbStopped.Count + ' ' + (Get-CbLeft))"
        )

    def run_status(self, run_dir: str, marker: str, log: str) -> str:
        """``key=value`` lines as PosixShell.run_status prints them: node clock, launcher alive,
        start/end times (file times on the node's clock), exit code, log size, last-modified time
        (the log's last write) and last line (the last
        ``[defaultN]:`` line, else the last line), one ``gpu=`` line per GPU where nvidia-smi exists.
        ``marker`` is unused."""
        del marker
        query = "--query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits"
        return (
            self._run_functions(run_dir) + f"$cbLogPath = {self._full_path(log)}\n"
            "function Get-CbUnix([DateTime]$When) {\n"
            "  return [long][Math]::Floor(($When.ToUniversalTime().Ticks - 621355968000000000) / 10000000)\n"
            "}\n"
            "function Out-Cb([string]$Text) { [Console]::Out.WriteLine($Text) }\n"
            "Out-Cb ('now=' + (Get-CbUnix ([DateTime]::UtcNow)))\n"
            "if (-not [System.IO.Directory]::Exists($cbDir)) { Out-Cb 'state=no-run'; exit 0 }\n"
            "$cbPidFile = Join-Path -Path $cbDir -ChildPath 'pid'\n"
            "if ([System.IO.File]::Exists($cbPidFile)) {\n"
            "  Out-Cb ('started=' + (Get-CbUnix ([System.IO.File]::GetLastWriteTimeUtc($cbPidFile))))\n"
            "}\n"
            "if ($null -ne (Get-CbLeader)) { Out-Cb 'alive=1' } else { Out-Cb 'alive=0' }\n"
            "$cbRc = $cbLogPath + '.rc'\n"
            "if ([System.IO.File]::Exists($cbRc)) {\n"
            "  Out-Cb ('rc=' + (Read-CbText $cbRc).Trim())\n"
            "  Out-Cb ('ended=' + (Get-CbUnix ([System.IO.File]::GetLastWriteTimeUtc($cbRc))))\n"
            "}\n"
            "if ([System.IO.File]::Exists($cbLogPath)) {\n"
            "  $cbShare = [System.IO.FileShare]::ReadWrite -bor [System.IO.FileShare]::Delete\n"
            "  $cbStream = New-Object -TypeName System.IO.FileStream -ArgumentList $cbLogPath,"
            " ([System.IO.FileMode]::Open), ([System.IO.FileAccess]::Read), $cbShare\n"
            "  try {\n"
            "    $cbSize = $cbStream.Length\n"
            "    $cbFrom = [Math]::Max([long]0, $cbSize - 65536)\n"
            "    $null = $cbStream.Seek($cbFrom, [System.IO.SeekOrigin]::Begin)\n"
            "    $cbBytes = New-Object -TypeName byte[] -ArgumentList ([int]($cbSize - $cbFrom))\n"
            "    $cbGot = 0\n"
            "    while ($cbGot -lt $cbBytes.Length) {\n"
            "      $cbN = $cbStream.Read($cbBytes, $cbGot, $cbBytes.Length - $cbGot)\n"
            "      if ($cbN -le 0) { break }\n"
            "      $cbGot += $cbN\n"
            "    }\n"
            "  } finally { $cbStream.Dispose() }\n"
            "  Out-Cb ('size=' + $cbSize)\n"
            "  Out-Cb ('modified=' + (Get-CbUnix ([System.IO.File]::GetLastWriteTimeUtc($cbLogPath))))\n"
            '  $cbLines = @(([System.Text.Encoding]::UTF8.GetString($cbBytes, 0, $cbGot)) -split "`n")\n'
            # from the middle of the file: its first line is cut
            "  if ($cbFrom -gt 0 -and $cbLines.Count -gt 1) {\n"
            "    $cbLines = $cbLines[1..($cbLines.Count - 1)]\n"
            "  }\n"
            "  $cbLines = @($cbLines | ForEach-Object { $_.TrimEnd([char]13) }"
            " | Where-Object { $_.Trim() })\n"
            "  if ($cbLines.Count -gt 0) {\n"
            "    $cbRanked = @($cbLines | Where-Object { $_ -match '^\\[default[0-9]*\\]:' })\n"
            "    $cbLast = if ($cbRanked.Count -gt 0) { $cbRanked[-1] } else { $cbLines[-1] }\n"
            "    if ($cbLast.Length -gt 400) { $cbLast = $cbLast.Substring(0, 400) }\n"
            "    Out-Cb ('last=' + $cbLast)\n"
            "  } else { Out-Cb 'last=' }\n"
            "}\n"
            # nvidia-smi: on PATH (System32 with current drivers) or where older drivers put it
            "$cbSmi = Get-Command -CommandType Application -Name 'nvidia-smi' -ErrorAction SilentlyContinue"
            " | Select-Object -First 1\n"
            "$cbSmiPath = if ($null -ne $cbSmi) { $cbSmi.Path } else {"
            " Join-Path -Path $env:ProgramFiles -ChildPath 'NVIDIA Corporation\\NVSMI\\nvidia-smi.exe' }\n"
            "if ([System.IO.File]::Exists($cbSmiPath)) {\n"
            "  $cbInfo = New-Object -TypeName System.Diagnostics.ProcessStartInfo\n"
            "  $cbInfo.FileName = $cbSmiPath\n"
            f"  $cbInfo.Arguments = {self.quote(query)}\n"
            "  $cbInfo.UseShellExecute = $false\n"
            "  $cbInfo.CreateNoWindow = $true\n"
            "  $cbInfo.RedirectStandardOutput = $true\n"
            "  $cbSmiProc = [System.Diagnostics.Process]::Start($cbInfo)\n"
            "  $cbText = $cbSmiProc.StandardOutput.ReadToEndAsync()\n"
            # a wedged driver can hang nvidia-smi: status answers without GPU lines then
            "  if ($cbText.Wait(10000)) {\n"
            '    foreach ($cbGpu in ($cbText.Result -split "`n")) {\n'
            "      if ($cbGpu.Trim()) { Out-Cb ('gpu=' + $cbGpu.Trim()) }\n"
            "    }\n"
            "  } else { try { $cbSmiProc.Kill() } catch { $null = $_ } }\n"
            "}"
        )

    def tail_log(
        self,
        run_dir: str,
        log: str,
        offset: int,
        *,
        follow: bool,
        interval: float = 0.05,
        lines: int | None = None,
    ) -> str:
        """``log`` from byte ``offset``, with PosixShell.tail_log's protocol (steps/runs.py
        FOLLOW_PROGRAM does the same in Python): complete lines sent as they are (a line starting with
        ``@@`` gets one more ``@``), each batch followed by ``@@. OFFSET`` (the byte offset just past
        it); a last line without its newline waits until the launcher has ended. ``@@end CODE|none
        OFFSET`` at the end, ``@@missing`` when there is no run directory. With ``follow`` it polls
        until the launcher has ended (exit-code file, or its process gone) and everything is read.

        The log is opened with FileShare ReadWrite (the launcher is writing it) and its bytes are
        written to our stdout unchanged (``[Console]::OpenStandardOutput()``): offsets are bytes of the
        UTF-8 file. The ``@@`` escape is done on the bytes read as Latin-1, one character per byte.

        ``lines`` (``logs --tail``): start at the ``lines``-th last complete line instead of
        ``offset``, found by reading back from the end with the same FileStream (a block at a time,
        newlines counted with ``[Array]::LastIndexOf``), and print ``@@start OFFSET`` first (0 when
        there is no log yet). The end is checked before the size is taken: a last line without
        newline counts only once the launcher has ended, as it is sent only then.
        """
        start = ""
        if lines is not None:
            start = (
                f"  $cbTail = [long]{max(0, int(lines))}\n"
                "  $cbFin = Test-CbEnded\n"
                "  $cbOffset = [long]0\n"  # no log yet: everything the launcher writes is new
                "  if ([System.IO.File]::Exists($cbLogPath)) {\n"
                "    $cbFile = New-CbLogStream\n"
                "    $cbSize = $cbFile.Length\n"
                # newlines to pass going back: the last line's own, then one per line wanted
                "    $cbNeed = $cbTail + 1\n"
                "    if ($cbFin -and $cbSize -gt 0) {\n"
                "      $null = $cbFile.Seek($cbSize - 1, [System.IO.SeekOrigin]::Begin)\n"
                "      if ($cbFile.ReadByte() -ne 10) { $cbNeed = $cbTail }\n"
                "    }\n"
                "    $cbOffset = $cbSize\n"
                "    $cbPos = $cbSize\n"
                "    while ($cbNeed -gt 0) {\n"
                "      if ($cbPos -le 0) { $cbOffset = [long]0; break }\n"
                "      $cbWant = [int][Math]::Min($cbPos, [long]$cbBlock)\n"
                "      $cbPos -= $cbWant\n"
                "      $cbGot = Read-CbBlock $cbFile $cbPos $cbWant\n"
                "      $cbAt = $cbGot\n"
                "      while ($cbNeed -gt 0 -and $cbAt -gt 0) {\n"
                "        $cbAt = [Array]::LastIndexOf($cbBuf, [byte]10, $cbAt - 1)\n"
                "        if ($cbAt -lt 0) { break }\n"
                "        $cbNeed -= 1\n"
                "        if ($cbNeed -eq 0) { $cbOffset = $cbPos + $cbAt + 1 }\n"
                "      }\n"
                "    }\n"
                "  }\n"
                "  Send-Cb ('@@start ' + $cbOffset + \"`n\")\n"
            )
        return (
            self._run_functions(run_dir) + f"$cbLogPath = {self._full_path(log)}\n"
            f"$cbOffset = [long]{int(offset)}\n"
            f"$cbFollow = {'$true' if follow else '$false'}\n"
            "$cbOut = [Console]::OpenStandardOutput()\n"
            "$cbLatin = [System.Text.Encoding]::GetEncoding(28591)\n"
            "function Send-Cb([string]$Text) {\n"
            "  $cbData = $cbLatin.GetBytes($Text)\n"
            "  $cbOut.Write($cbData, 0, $cbData.Length)\n"
            "  $cbOut.Flush()\n"
            "}\n"
            'if (-not [System.IO.Directory]::Exists($cbDir)) { Send-Cb "@@missing`n"; exit 0 }\n'
            "$cbRc = $cbLogPath + '.rc'\n"
            "$cbPidFile = Join-Path -Path $cbDir -ChildPath 'pid'\n"
            "function Test-CbEnded {\n"
            "  if ([System.IO.File]::Exists($cbRc)) { return $true }\n"
            "  return [System.IO.File]::Exists($cbPidFile) -and $null -eq (Get-CbLeader)\n"
            "}\n"
            "$cbBlock = 1048576\n"
            "$cbBuf = New-Object -TypeName byte[] -ArgumentList $cbBlock\n"
            "$cbFile = $null\n"
            # up to Want bytes from At into $cbBuf (a read may return fewer): how many it got
            "function Read-CbBlock([System.IO.FileStream]$Stream, [long]$At, [int]$Want) {\n"
            "  $null = $Stream.Seek($At, [System.IO.SeekOrigin]::Begin)\n"
            "  $got = 0\n"
            "  while ($got -lt $Want) {\n"
            "    $n = $Stream.Read($cbBuf, $got, $Want - $got)\n"
            "    if ($n -le 0) { break }\n"
            "    $got += $n\n"
            "  }\n"
            "  return $got\n"
            "}\n"
            "function New-CbLogStream {\n"
            "  $cbShare = [System.IO.FileShare]::ReadWrite -bor [System.IO.FileShare]::Delete\n"
            "  New-Object -TypeName System.IO.FileStream -ArgumentList $cbLogPath,"
            " ([System.IO.FileMode]::Open), ([System.IO.FileAccess]::Read), $cbShare\n"
            "}\n"
            "try {\n" + start + "  while ($true) {\n"
            # taken before the size: what the launcher wrote before it ended is all read
            "    $cbFin = Test-CbEnded\n"
            "    if ($null -eq $cbFile -and [System.IO.File]::Exists($cbLogPath)) {\n"
            "      $cbFile = New-CbLogStream\n"
            "    }\n"
            "    while ($null -ne $cbFile) {\n"
            "      $cbSize = $cbFile.Length\n"
            "      if ($cbSize -le $cbOffset) { break }\n"
            "      $cbWant = [int][Math]::Min($cbSize - $cbOffset, [long]$cbBlock)\n"
            "      $cbGot = Read-CbBlock $cbFile $cbOffset $cbWant\n"
            "      if ($cbGot -eq 0) { break }\n"
            "      $cbCut = [Array]::LastIndexOf($cbBuf, [byte]10, $cbGot - 1) + 1\n"
            "      if ($cbFin -and $cbGot -eq $cbSize - $cbOffset) {\n"
            "        $cbCut = $cbGot\n"  # the launcher has ended: a last line without newline is final
            "      } elseif ($cbCut -eq 0) {\n"
            "        if ($cbGot -lt $cbBlock) { break }\n"  # a line still being written
            "        $cbCut = $cbGot\n"  # a line longer than a block: sent in pieces
            "      }\n"
            "      $cbText = $cbLatin.GetString($cbBuf, 0, $cbCut)\n"
            "      $cbOffset += $cbCut\n"
            '      if (-not $cbText.EndsWith("`n")) { $cbText += "`n" }\n'
            "      if ($cbText.Contains('@@')) {\n"
            '        $cbText = ("`n" + $cbText).Replace("`n@@", "`n@@@").Substring(1)\n'
            "      }\n"
            "      Send-Cb ($cbText + '@@. ' + $cbOffset + \"`n\")\n"
            "    }\n"
            "    if ($cbFin -or -not $cbFollow) { break }\n"
            f"    Start-Sleep -Milliseconds {max(1, round(interval * 1000))}\n"
            "  }\n"
            "} finally {\n"
            "  if ($null -ne $cbFile) { $cbFile.Dispose() }\n"
            "}\n"
            "$cbCode = (Read-CbText $cbRc).Trim()\n"
            "if (-not $cbCode) { $cbCode = 'none' }\n"
            "Send-Cb ('@@end ' + $cbCode + ' ' + $cbOffset + \"`n\")"
        )

    def list_files(self, candidates: Sequence[Sequence[str]]) -> str:
        """As PosixShell.list_files: for each entry the first of its candidate paths that exists, as
        ``@@file I SIZE PATH``, ``@@dir I PATH`` followed by ``SIZE RELPATH`` per file below it
        (``/``-separated), or ``@@missing I``; PATH is the full Windows path."""
        lines = ["function Out-Cb([string]$Text) { [Console]::Out.WriteLine($Text) }"]
        for index, paths in enumerate(candidates):
            words = ", ".join(self._full_path(p) for p in paths)
            lines.append(
                f"$cbFound = $null\n"
                f"foreach ($cbC in @({words})) {{\n"
                "  if (Test-Path -LiteralPath $cbC) { $cbFound = $cbC; break }\n"
                "}\n"
                f"if ($null -eq $cbFound) {{ Out-Cb '@@missing {index}' }}\n"
                "elseif ([System.IO.Directory]::Exists($cbFound)) {\n"
                f"  Out-Cb ('@@dir {index} ' + $cbFound)\n"
                "  $cbRoot = $cbFound.TrimEnd('\\') + '\\'\n"
                "  foreach ($cbF in @(Get-ChildItem -LiteralPath $cbFound -Recurse -File -Force)) {\n"
                "    $cbRel = $cbF.FullName.Substring($cbRoot.Length).Replace('\\', '/')\n"
                "    Out-Cb ([string]$cbF.Length + ' ' + $cbRel)\n"
                "  }\n"
                "} else {\n"
                "  $cbSize = (Get-Item -LiteralPath $cbFound -Force).Length\n"
                f"  Out-Cb ('@@file {index} ' + $cbSize + ' ' + $cbFound)\n"
                "}"
            )
        return "\n".join(lines)

    @staticmethod
    def not_elevated(exit_code: int | None) -> bool:
        """True when a ``become`` script stopped because the session is not elevated."""
        return exit_code == NOT_ELEVATED_EXIT
