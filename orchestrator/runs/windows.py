"""Runs on native Windows nodes, in Windows PowerShell 5.1: detached start, stop, status, the log
tail and file listing for `fetch`. The node side of a foreground run (the follower, the watchdog,
``run.ps1`` for any other heavy job) is runs/windows_follow.py, whose scripts WindowsRuns inherits.

A run is found by its directory (runs/layout.py). launch.ps1 (run with -Log, whose
directory is the run directory) writes there ``pid`` ("PID TICKS": its process id and creation
time as a FILETIME, so a recycled pid is never taken for it), ``ranks`` (the same for every
rank it starts), node.log, and node.log.rc (written to .part, then renamed) when it ends. Its
processes are the launcher, the ranks and their descendants: found from those identities, never
by a name or a command-line pattern that could match another run.

**Every run starts outside the WinRS shell's job**, foreground or detached. WinRS puts each process
a shell starts into the shell's job object, and Windows limits that job (``MaxProcessesPerShell``
25 and ``MaxMemoryPerShellMB`` 1024 by default, every child included): ranks, their DataLoader
workers and compilers would count. So the launcher is always created by the WMI service
(``Win32_Process`` Create, :meth:`WindowsRuns.start`), and a foreground run differs from a detached
one only in who waits: the controller, through a *follower* in the WinRS shell
(runs/windows_follow.py).

Beside launch.ps1's files, `bootstrap stop` writes ``stopped`` (its time) into the run directory, as on
POSIX; the files of a foreground run are listed in runs/windows_follow.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.platforms import PowerShell
from orchestrator.records import new_nonce
from orchestrator.runs import tail
from orchestrator.runs.base import LISTING_CAP, RunOps, safe_parts
from orchestrator.runs.culprit import ROOT_CAUSE
from orchestrator.runs.windows_follow import ForegroundScripts

_WINDOWS_ABSOLUTE = re.compile(r"([A-Za-z]:[\\/]|[\\/]{2}|~)")

#: a launcher created by Win32_Process Create writes its pid file within this long (start's own limit)
START_SECONDS = 60

#: PowerShell function: every process of the run stopped (the launcher and the ranks named in
#: ``pid`` and ``ranks``, and all their descendants), launcher first so it cannot react to its ranks
#: ending; returns "COUNT LEFT" once they are gone (10 s at most). Used by `stop` and the watchdog.
STOP_RUN = (
    "function Get-CbLeft($Stopped, $Known) {\n"
    # gone: no process with that id, or one created at another time (the id was reused)
    "  $cbLeft = 0\n"
    "  foreach ($cbId in $Stopped) {\n"
    "    $cbProc = Get-Process -Id $cbId -ErrorAction SilentlyContinue\n"
    "    if ($null -eq $cbProc) { continue }\n"
    "    try {\n"
    # CIM creation times are whole microseconds: the same process is within 1 ms
    "      $cbApart = [Math]::Abs(($cbProc.StartTime - $Known[$cbId]).TotalMilliseconds)\n"
    "      if ($cbApart -lt 1) { $cbLeft++ }\n"
    "    } catch { $null = $_ }\n"
    "  }\n"
    "  return $cbLeft\n"
    "}\n"
    "function Stop-CbRun {\n"
    "  $cbKnown = @{}\n"
    "  $cbBatch = New-Object -TypeName System.Collections.Generic.List[int]\n"
    "  foreach ($cbRoot in @(Get-CbRoots)) {\n"
    "    $cbKnown[$cbRoot.Id] = $cbRoot.StartTime\n"
    "    $cbBatch.Add($cbRoot.Id)\n"
    "  }\n"
    "  foreach ($cbId in @(Find-CbTree $cbKnown)) { $cbBatch.Add($cbId) }\n"
    "  $cbStopped = New-Object -TypeName System.Collections.Generic.List[int]\n"
    "  for ($cbRound = 0; $cbRound -lt 5 -and $cbBatch.Count -gt 0; $cbRound++) {\n"
    "    foreach ($cbId in $cbBatch) {\n"
    "      Stop-Process -Id $cbId -Force -ErrorAction SilentlyContinue\n"
    "      $cbStopped.Add($cbId)\n"
    "    }\n"
    # children started while their parents were being stopped (their parents are in $cbKnown)
    "    $cbBatch = @(Find-CbTree $cbKnown)\n"
    "  }\n"
    "  $cbClock = [System.Diagnostics.Stopwatch]::StartNew()\n"
    "  while ((Get-CbLeft $cbStopped $cbKnown) -gt 0 -and $cbClock.Elapsed.TotalSeconds -lt 10) {\n"
    "    Start-Sleep -Milliseconds 100\n"
    "  }\n"
    "  return ([string]$cbStopped.Count + ' ' + (Get-CbLeft $cbStopped $cbKnown))\n"
    "}\n"
)


class WindowsRuns(ForegroundScripts, RunOps):
    """Native Windows nodes: launch.ps1 started outside the WinRS job (Win32_Process Create), found by
    the pid and creation time it records."""

    launcher = "launch.ps1"
    start_seconds = START_SECONDS

    platform: PowerShell

    def __init__(self, platform: PowerShell) -> None:
        self.platform = platform

    def functions(self, run_dir: str) -> str:
        """Variables and functions shared by start, stop, status and the tail (``$cbDir``: the run
        directory as a full path)."""
        # pid and ranks are believed only in a directory that is ours alone (owner and access list)
        trusted = self.platform.check_own_dir_in("$cbDir")
        return (
            f"$cbDir = {self.platform.full_path(run_dir)}\n"
            # files the launcher may be writing: opened with FileShare ReadWrite and Delete; one that
            # is being replaced (deleted, renamed into place: pid, follower) reads as missing
            "function Read-CbText([string]$Path) {\n"
            "  if (-not [System.IO.File]::Exists($Path)) { return '' }\n"
            "  $cbShare = [System.IO.FileShare]::ReadWrite -bor [System.IO.FileShare]::Delete\n"
            "  try {\n"
            "    $cbStream = New-Object -TypeName System.IO.FileStream -ArgumentList $Path,"
            " ([System.IO.FileMode]::Open), ([System.IO.FileAccess]::Read), $cbShare\n"
            "  } catch { return '' }\n"
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
            "}\n" + trusted + "\n"
        )

    def start(self, run_dir: str, node_log: str, marker: str, nonce: str) -> str:
        """Start launch.ps1 with ``-Log node_log`` outside this WinRM shell, so it survives it,
        wait until it has written its pid file and print the record ``started "PID TICKS"``
        (``started-before ...``, exit 3: the run directory has a pid file already).

        Why ``Win32_Process`` Create (Invoke-CimMethod) and not a scheduled task: WinRS puts every
        process of a shell in the shell's job object, which Windows ends when the shell is deleted;
        the WMI service creates the process itself, outside that job, as the connected user, and
        returns its id at once. A scheduled task would have to be registered under a name (and removed
        again), run under Task Scheduler's own limits (a default 72-hour execution time limit, its own
        stop) and, to run without an interactive logon, need the user's password stored or an S4U
        logon. The new process gets no console of ours and none of our environment: launch.ps1 sets
        everything its ranks need itself (PYTHONUNBUFFERED included).
        """
        del marker
        return (
            self.platform.record_functions(nonce)
            + "\n"
            + self.functions(run_dir)
            + self.start_launcher(run_dir, node_log)
        )

    def start_launcher(
        self,
        run_dir: str,
        node_log: str,
        *,
        tick: str = "",
        launcher: str | None = None,
    ) -> str:
        """The body of :meth:`start` (after ``functions``); ``tick``: a statement run on every look
        for the pid file (the follower's heartbeat); ``launcher``: another script than launch.ps1 in
        the run directory, with its contract (``-Log``, ``pid``, the log's ``.rc``): windows_follow.RUNNER.
        Says ``started`` and ``started-before`` as records (``Out-CbRecord`` defined before)."""

        def say(kind: str) -> str:
            return f"Out-CbRecord '{kind}' @((Read-CbText $cbPidFile).Trim())"

        return (
            f"$cbScript = {self.platform.full_path(f'{run_dir}/{launcher or self.launcher}')}\n"
            f"$cbLogPath = {self.platform.full_path(node_log)}\n"
            "$cbPidFile = Join-Path -Path $cbDir -ChildPath 'pid'\n"
            "if ([System.IO.File]::Exists($cbPidFile)) {\n"
            f"  {say('started-before')}\n"
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
            f" -or $cbClock.Elapsed.TotalSeconds -gt {START_SECONDS}) {{\n"
            "    [Console]::Error.WriteLine('the launcher (process ' + $cbChild + ') did not start: '"
            " + (Read-CbText $cbLogPath).Trim())\n"
            "    exit 5\n"
            "  }\n" + (f"  {tick}\n" if tick else "") + "  Start-Sleep -Milliseconds 50\n"
            "}\n" + say("started")
        )

    def stop(self, run_dir: str, marker: str = "", grace: float = 5.0, nonce: str | None = None) -> str:
        """Stop every process of the run: the launcher and the ranks named in the run directory's
        ``pid`` and ``ranks`` files (pid and creation time), and all their descendants. Prints one record
        like PosixRuns.stop: ``stop terminated COUNT LEFT`` or ``stop earlier TIME|exited CODE|gone|
        not-started|no-run`` (``nonce`` None: a fresh one, for a stop whose answer is not read).

        Windows has no SIGTERM for a process without a window: every process is terminated at once
        (Stop-Process -Force, TerminateProcess), launcher first so it cannot react to its ranks ending;
        ``grace`` is not used. Returns once they are gone (10 s at most), checked by id and creation
        time. Before anything is stopped, ``stopped`` gets the node's time (Unix seconds), as on POSIX:
        status and a foreground launch then tell "stopped" from "failed". ``marker`` is unused
        (PosixRuns needs it: Windows cannot read another process's environment)."""
        del marker, grace
        return (
            self.platform.record_functions(nonce or new_nonce())
            + "\n"
            + self.functions(run_dir)
            + self.stop_functions()
            + "$cbRc = Join-Path -Path $cbDir -ChildPath 'node.log.rc'\n"
            "$cbRoots = @(Get-CbRoots)\n"
            "if ($cbRoots.Count -eq 0) {\n"
            "  $cbStopped = Join-Path -Path $cbDir -ChildPath 'stopped'\n"
            "  if ([System.IO.File]::Exists($cbStopped)) {"
            " Out-CbRecord 'stop' @('earlier', (Read-CbText $cbStopped).Trim()) }\n"
            "  elseif ([System.IO.File]::Exists($cbRc)) {"
            " Out-CbRecord 'stop' @('exited', (Read-CbText $cbRc).Trim()) }\n"
            "  elseif ([System.IO.File]::Exists((Join-Path -Path $cbDir -ChildPath 'pid'))) {"
            " Out-CbRecord 'stop' @('gone') }\n"
            "  elseif ([System.IO.Directory]::Exists($cbDir)) {"
            " Out-CbRecord 'stop' @('not-started') }\n"
            "  else { Out-CbRecord 'stop' @('no-run') }\n"
            "  exit 0\n"
            "}\n"
            # said before anything is stopped: status and a foreground launch tell "stopped" from "failed"
            "$cbNow = [long][Math]::Floor(([DateTime]::UtcNow.Ticks - 621355968000000000) / 10000000)\n"
            "if (-not [System.IO.File]::Exists($cbRc)) {"
            " [System.IO.File]::WriteAllText((Join-Path -Path $cbDir -ChildPath 'stopped'),"
            ' [string]$cbNow + "`n") }\n'
            "$cbCounts = @(([string](Stop-CbRun)).Split(' '))\n"
            "Out-CbRecord 'stop' @('terminated', $cbCounts[0], $cbCounts[1])"
        )

    def stop_functions(self) -> str:
        """``Stop-CbRun``, with the ``Find-CbTree`` it uses: used by `stop` and the watchdog."""
        return self.platform.FIND_TREE + STOP_RUN

    def status(self, run_dir: str, marker: str, node_log: str, nonce: str) -> str:
        """The records PosixRuns.status prints: node clock, launcher alive,
        start/end times (file times on the node's clock), exit code, when `stop` stopped it, log size,
        last-modified time
        (the log's last write) and last line (the last
        ``[defaultN]:`` line, else the last line), one ``gpu=`` line per GPU where nvidia-smi exists.
        ``marker`` is unused."""
        del marker
        query = "--query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits"
        return (
            self.platform.record_functions(nonce)
            + "\n"
            + self.functions(run_dir)
            + f"$cbLogPath = {self.platform.full_path(node_log)}\n"
            "function Get-CbUnix([DateTime]$When) {\n"
            "  return [long][Math]::Floor(($When.ToUniversalTime().Ticks - 621355968000000000) / 10000000)\n"
            "}\n"
            "Out-CbRecord 'now' @((Get-CbUnix ([DateTime]::UtcNow)))\n"
            "if (-not [System.IO.Directory]::Exists($cbDir)) { Out-CbRecord 'state' @('no-run'); exit 0 }\n"
            "$cbPidFile = Join-Path -Path $cbDir -ChildPath 'pid'\n"
            "if ([System.IO.File]::Exists($cbPidFile)) {\n"
            "  Out-CbRecord 'started' @((Get-CbUnix ([System.IO.File]::GetLastWriteTimeUtc($cbPidFile))))\n"
            "}\n"
            "$cbAlive = if ($null -ne (Get-CbLeader)) { '1' } else { '0' }\n"
            "Out-CbRecord 'alive' @($cbAlive)\n"
            "$cbRc = $cbLogPath + '.rc'\n"
            "if ([System.IO.File]::Exists($cbRc)) {\n"
            "  Out-CbRecord 'rc' @((Read-CbText $cbRc).Trim())\n"
            "  Out-CbRecord 'ended' @((Get-CbUnix ([System.IO.File]::GetLastWriteTimeUtc($cbRc))))\n"
            "}\n"
            "$cbStopped = Join-Path -Path $cbDir -ChildPath 'stopped'\n"
            "if ([System.IO.File]::Exists($cbStopped)) {"
            " Out-CbRecord 'stopped' @((Read-CbText $cbStopped).Trim()) }\n"
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
            "  Out-CbRecord 'size' @($cbSize)\n"
            "  Out-CbRecord 'modified' @((Get-CbUnix ([System.IO.File]::GetLastWriteTimeUtc($cbLogPath))))\n"
            '  $cbLines = @(([System.Text.Encoding]::UTF8.GetString($cbBytes, 0, $cbGot)) -split "`n")\n'
            # from the middle of the file: its first line is cut
            "  if ($cbFrom -gt 0 -and $cbLines.Count -gt 1) {\n"
            "    $cbLines = $cbLines[1..($cbLines.Count - 1)]\n"
            "  }\n"
            "  $cbLines = @($cbLines | ForEach-Object { $_.TrimEnd([char]13) }"
            " | Where-Object { $_.Trim() -and $_ -notmatch 'client socket cannot be retrieved' })\n"
            "  if ($cbLines.Count -gt 0) {\n"
            "    $cbRanked = @($cbLines | Where-Object {"
            " $_ -match '^\\[default[0-9]*\\]:' -and $_ -notmatch '^\\[default[0-9]*\\]:CB_METRIC \\{' })\n"
            "    $cbLast = if ($cbRanked.Count -gt 0) { $cbRanked[-1] } else { $cbLines[-1] }\n"
            "    if ($cbLast.Length -gt 400) { $cbLast = $cbLast.Substring(0, 400) }\n"
            "    Out-CbRecord 'last' @($cbLast)\n"
            # an ended run: the fields of torchrun's own last root cause (untagged lines only)
            "    $cbOwn = @($cbLines | Where-Object { -not $_.StartsWith('[default') })\n"
            "    $cbAt = -1\n"
            "    for ($cbI = 0; $cbI -lt $cbOwn.Count; $cbI++) {"
            f" if ($cbOwn[$cbI].StartsWith({self.platform.quote(ROOT_CAUSE)})) {{ $cbAt = $cbI }} }}\n"
            "    if ([System.IO.File]::Exists($cbRc) -and $cbAt -ge 0) {\n"
            "      $cbEnd = [Math]::Min($cbOwn.Count, $cbAt + 13)\n"
            "      for ($cbI = $cbAt + 1; $cbI -lt $cbEnd; $cbI++) {\n"
            "        if ($cbOwn[$cbI].StartsWith('=====')) { break }\n"
            "        $cbC = $cbOwn[$cbI]\n"
            "        if ($cbC.Length -gt 400) { $cbC = $cbC.Substring(0, 400) }\n"
            "        Out-CbRecord 'cause' @($cbC)\n"
            "      }\n"
            "    }\n"
            "  } else { Out-CbRecord 'last' @('') }\n"
            "}\n"
            # nvidia-smi: on PATH (System32 with current drivers) or where older drivers put it
            "$cbSmi = Get-Command -CommandType Application -Name 'nvidia-smi' -ErrorAction SilentlyContinue"
            " | Select-Object -First 1\n"
            "$cbSmiPath = if ($null -ne $cbSmi) { $cbSmi.Path } else {"
            " Join-Path -Path $env:ProgramFiles -ChildPath 'NVIDIA Corporation\\NVSMI\\nvidia-smi.exe' }\n"
            "if ([System.IO.File]::Exists($cbSmiPath)) {\n"
            "  $cbInfo = New-Object -TypeName System.Diagnostics.ProcessStartInfo\n"
            "  $cbInfo.FileName = $cbSmiPath\n"
            f"  $cbInfo.Arguments = {self.platform.quote(query)}\n"
            "  $cbInfo.UseShellExecute = $false\n"
            "  $cbInfo.CreateNoWindow = $true\n"
            "  $cbInfo.RedirectStandardOutput = $true\n"
            "  $cbSmiProc = [System.Diagnostics.Process]::Start($cbInfo)\n"
            "  $cbText = $cbSmiProc.StandardOutput.ReadToEndAsync()\n"
            # a wedged driver can hang nvidia-smi: status answers without GPU lines then
            "  if ($cbText.Wait(10000)) {\n"
            '    foreach ($cbGpu in ($cbText.Result -split "`n")) {\n'
            "      if ($cbGpu.Trim()) { Out-CbRecord 'gpu' @($cbGpu.Trim()) }\n"
            "    }\n"
            "  } else { try { $cbSmiProc.Kill() } catch { $null = $_ } }\n"
            "}"
        )

    def tail(
        self,
        run_dir: str,
        marker: str,
        node_log: str,
        offset: int,
        *,
        nonce: str,
        follow: bool,
        python: str | None,
        interval: float | None,
        lines: int | None = None,
        samples: str = "",
    ) -> str:
        """The PowerShell producer of the tail protocol (``marker`` and ``python`` are not used)."""
        return tail.powershell_tail(
            self.platform,
            self.functions(run_dir),
            node_log,
            offset,
            nonce=nonce,
            follow=follow,
            interval=interval or 0.05,
            lines=lines,
            samples=samples,
        )

    def is_absolute(self, path: str) -> bool:
        return bool(_WINDOWS_ABSOLUTE.match(path))

    def local_parts(self, path: str) -> list[str] | None:
        return safe_parts(re.sub(r"^[A-Za-z]:", "", path.replace("\\", "/")).lstrip("/"))

    def which_exist(self, paths: Sequence[str], nonce: str) -> str:
        lines = [self.platform.record_functions(nonce)]
        lines += [
            f"if (Test-Path -LiteralPath {self.platform.full_path(path)}) {{ Out-CbRecord 'have' @('{i}') }}"
            for i, path in enumerate(paths)
        ]
        return "\n".join(lines)

    def list_files(
        self, candidates: Sequence[Sequence[str]], nonce: str, near: Sequence[Sequence[str]] = ()
    ) -> str:
        """As PosixRuns.list_files: for each entry the first of its candidate paths that exists, as
        the record ``file I SIZE PATH``, ``dir I PATH LISTING`` (LISTING: ``SIZE NUL RELPATH NUL``
        per file below it, ``/``-separated; ended once longer than ``LISTING_CAP``) or ``missing I``;
        PATH is the full Windows path."""
        lines = [self.platform.record_functions(nonce)]
        for index, paths in enumerate(candidates):
            words = ", ".join(self.platform.full_path(p) for p in paths)
            lines.append(
                f"$cbFound = $null\n"
                f"foreach ($cbC in @({words})) {{\n"
                "  if (Test-Path -LiteralPath $cbC) { $cbFound = $cbC; break }\n"
                "}\n"
                f"if ($null -eq $cbFound) {{ Out-CbRecord 'missing' @('{index}') }}\n"
                "elseif ([System.IO.Directory]::Exists($cbFound)) {\n"
                "  $cbRoot = $cbFound.TrimEnd('\\') + '\\'\n"
                "  $cbList = New-Object -TypeName System.Text.StringBuilder\n"
                "  foreach ($cbF in @(Get-ChildItem -LiteralPath $cbFound -Recurse -File -Force)) {\n"
                "    $cbRel = $cbF.FullName.Substring($cbRoot.Length).Replace('\\', '/')\n"
                "    $null = $cbList.Append([string]$cbF.Length).Append([char]0)\n"
                "    $null = $cbList.Append($cbRel).Append([char]0)\n"
                f"    if ($cbList.Length -gt {LISTING_CAP}) {{ break }}\n"
                "  }\n"
                f"  Out-CbRecord 'dir' @('{index}', $cbFound, $cbList.ToString())\n"
                "} else {\n"
                "  $cbSize = (Get-Item -LiteralPath $cbFound -Force).Length\n"
                f"  Out-CbRecord 'file' @('{index}', [string]$cbSize, $cbFound)\n"
                "}"
            )
        return "\n".join(lines)
