"""The node side of a foreground run on a native Windows node: the follower and the watchdog, and
``run.ps1``, which gives any other heavy job launch.ps1's contract. :class:`ForegroundScripts` holds
these scripts and WindowsRuns (runs/windows.py) inherits them: they build on its shared functions,
its start and its stop. The controller's side (the rounds, run_outside_job) is runs/start.py.

A foreground run starts outside the WinRS shell's job as a detached one does (runs/windows.py); it
differs only in who waits: the controller, through a *follower* in the WinRS shell.

The follower (``follow.ps1`` in the run directory, one powershell.exe inside the job: it counts as
one process there) reads node.log in the tail protocol (runs/tail.py) from an offset. It runs in
*rounds*: each ends after :data:`ROUND_SECONDS` with the record ``more OFFSET`` while the launcher
runs on, and the controller starts the next one from that offset (``& follow.ps1 -Offset N -Nonce
NONCE``, a short command: the first round wrote the file; each round's records carry the nonce the
controller gave it). The first round (:meth:`WindowsRuns.foreground`, the
last action of a foreground plan) also starts the *watchdog* and then the launcher.

The controller's hangup guarantee (POSIX: ``stop_on_hangup``, a run stops when its controller's
connection or heartbeats stop) is the watchdog's job here. ``watchdog.ps1`` is created outside the
job too (``Win32_Process`` Create), before the launcher, and stops the run (the same ``Stop-CbRun``
as `bootstrap stop`, every process of the run by identity) when:

- the follower that wrote ``follower`` ("PID TICKS", replaced at the start of each round and deleted
  when a round ends normally) is gone while the file still names it: it was killed, which is what
  Windows does to every process of the job when the controller cancels (fail fast, Ctrl-C, a
  timeout: WS-Man Signal terminate, then Delete of the shell) or when Windows deletes a shell whose
  client went silent (``IdleTimeout``). Noticed within :data:`WATCH_POLL_MS`;
- or ``heartbeat`` (written by the follower once a second while it runs) has not changed for
  :data:`STALE_SECONDS`, measured on the watchdog's own ``Stopwatch`` (a clock set forward or back
  must neither stop a run nor keep one alive): no round came after the last one (the controller was
  killed, or its network is gone), or the follower is stuck (a write to a stdout nobody reads).

So a controller that disappears without a word stops its native run within ``ROUND_SECONDS +
STALE_SECONDS`` (20 s) plus one poll; one that cancels, within a poll. The watchdog notes why in
``watchdog.log`` and exits; it also exits when the run ends by itself (node.log.rc) or was stopped
(`bootstrap stop`: no process of the run left). Why rounds and not one long follower: nothing else
tells the node that the controller is alive. WinRS has no input a running command could read as a
heartbeat without the transport writing it, a silent client's shell lives until ``IdleTimeout``
(2 hours by default), and the output of a command nobody receives is buffered by the WinRS host,
not refused. Each round costs one powershell.exe start on the node every 8 s.

Any other heavy job (an environment build's pip) can run the same way: ``run.ps1``
(:meth:`WindowsRuns.runner_script`) gives a PowerShell script ``job.ps1`` launch.ps1's contract, and
runs.start.run_outside_job starts and follows it like a foreground run.

Files of a foreground run in the run directory, beside launch.ps1's: ``follow.ps1``,
``watchdog.ps1``, ``follower``, ``heartbeat``, ``watchdog.log`` (why the watchdog stopped the run),
``stopped`` (`bootstrap stop`'s time, as on POSIX).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from orchestrator.platforms import PowerShell
from orchestrator.records import check_nonce
from orchestrator.runs import tail

#: how long one follower command runs before it ends with ``more`` and the controller starts the next
ROUND_SECONDS = 8.0
#: the watchdog stops the run when the follower's heartbeat is this old (rounds are 8 s apart, and a
#: new one needs a powershell.exe start on the node, slow on a loaded machine)
STALE_SECONDS = 12.0
#: how often the watchdog looks
WATCH_POLL_MS = 500
#: how often the follower looks at the log (a little less often than `logs --follow`: it runs for
#: the whole training on the training machine)
FOLLOW_INTERVAL = 0.1
#: files of a foreground run in the run directory, beside those launch.ps1 writes
FOLLOW_SCRIPT = "follow.ps1"
WATCHDOG_SCRIPT = "watchdog.ps1"
FOLLOWER = "follower"
HEARTBEAT = "heartbeat"
WATCHDOG_LOG = "watchdog.log"
#: a job run outside the WinRS job (runs.start.run_outside_job): the launcher in its directory,
#: and the PowerShell script it runs
RUNNER = "run.ps1"
JOB_SCRIPT = "job.ps1"


class ForegroundScripts(ABC):
    """The scripts of a foreground run and of a job run outside the WinRS job (see the module
    docstring), for WindowsRuns, which inherits them and provides what they build on."""

    platform: PowerShell
    #: a launcher writes its pid file within this long (runs.windows.START_SECONDS): the watchdog waits
    #: as long for one that is still starting before it stops the run
    start_seconds: ClassVar[int]

    @abstractmethod
    def functions(self, run_dir: str) -> str:
        """Variables and functions shared by the run's scripts (``$cbDir``, ``Read-CbText``,
        ``Get-CbLive``, ``Get-CbRoots``)."""

    @abstractmethod
    def start_launcher(
        self, run_dir: str, node_log: str, *, tick: str = "", launcher: str | None = None
    ) -> str:
        """The launcher started outside the WinRS job, the record ``started "PID TICKS"`` printed
        once it has written its pid file (after ``functions`` and ``Out-CbRecord``)."""

    @abstractmethod
    def stop_functions(self) -> str:
        """The PowerShell function ``Stop-CbRun`` (and what it needs): every process of the run
        stopped."""

    def runner_script(self) -> str:
        """``run.ps1``: the launcher of any other job run outside the WinRS shell's job (an
        environment build's pip), with launch.ps1's contract, so that start, the follower, the
        watchdog, `stop` and `status` treat it as a run: ``-Log FILE`` (its directory is the job's),
        ``pid`` written first, ``job.ps1`` beside it run by a child powershell.exe (recorded in
        ``ranks``: stopped with its tree even when the runner is gone), each line it prints on
        stdout or stderr appended to the log as it comes, its exit code in ``FILE.rc`` (to .part,
        then renamed) once the log is closed."""
        return (
            "param([string]$Log = '')\n" + self.platform.prelude() + "\n"
            "$cbUtf8 = New-Object -TypeName System.Text.UTF8Encoding -ArgumentList $false\n"
            "$cbLogPath = $ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath($Log)\n"
            "$cbDir = [System.IO.Path]::GetDirectoryName($cbLogPath)\n"
            "$cbLog = New-Object -TypeName System.IO.StreamWriter -ArgumentList $cbLogPath, $true, $cbUtf8\n"
            "$cbLog.AutoFlush = $true\n"
            "$cbSelf = [System.Diagnostics.Process]::GetCurrentProcess()\n"
            "$cbPidPart = Join-Path -Path $cbDir -ChildPath 'pid.part'\n"
            "[System.IO.File]::WriteAllText($cbPidPart,"
            " [string]$PID + ' ' + $cbSelf.StartTime.ToFileTimeUtc() + \"`n\")\n"
            "$cbPidFile = Join-Path -Path $cbDir -ChildPath 'pid'\n"
            "Move-Item -LiteralPath $cbPidPart -Destination $cbPidFile -Force\n"
            "$cbCode = 1\n"
            "$cbProc = $null\n"
            "try {\n"
            "  $cbInfo = New-Object -TypeName System.Diagnostics.ProcessStartInfo\n"
            "  $cbInfo.FileName = $cbSelf.MainModule.FileName\n"
            "  $cbInfo.Arguments = '-NoProfile -NonInteractive -ExecutionPolicy Bypass -File \"'"
            f" + (Join-Path -Path $cbDir -ChildPath '{JOB_SCRIPT}') + '\"'\n"
            "  $cbInfo.UseShellExecute = $false\n"
            "  $cbInfo.CreateNoWindow = $true\n"
            "  $cbInfo.RedirectStandardOutput = $true\n"
            "  $cbInfo.RedirectStandardError = $true\n"
            "  $cbInfo.StandardOutputEncoding = $cbUtf8\n"
            "  $cbInfo.StandardErrorEncoding = $cbUtf8\n"
            "  $cbInfo.WorkingDirectory = $cbDir\n"
            # Python (pip) writes UTF-8, as it prints, into our pipes
            "  $cbInfo.EnvironmentVariables['PYTHONIOENCODING'] = 'utf-8'\n"
            "  $cbInfo.EnvironmentVariables['PYTHONUNBUFFERED'] = '1'\n"
            "  $cbProc = [System.Diagnostics.Process]::Start($cbInfo)\n"
            "  [System.IO.File]::AppendAllText((Join-Path -Path $cbDir -ChildPath 'ranks'),"
            " [string]$cbProc.Id + ' ' + $cbProc.StartTime.ToFileTimeUtc() + \"`n\")\n"
            "  $cbOut = $cbProc.StandardOutput.ReadLineAsync()\n"
            "  $cbErr = $cbProc.StandardError.ReadLineAsync()\n"
            "  while ($null -ne $cbOut -or $null -ne $cbErr) {\n"
            "    $cbPending = @(@($cbOut, $cbErr) | Where-Object { $null -ne $_ })\n"
            "    $cbTasks = [System.Threading.Tasks.Task[]]$cbPending\n"
            "    $null = [System.Threading.Tasks.Task]::WaitAny($cbTasks, 200)\n"
            "    while ($null -ne $cbOut -and $cbOut.IsCompleted) {\n"
            "      if ($null -eq $cbOut.Result) { $cbOut = $null; break }\n"
            "      $cbLog.WriteLine($cbOut.Result)\n"
            "      $cbOut = $cbProc.StandardOutput.ReadLineAsync()\n"
            "    }\n"
            "    while ($null -ne $cbErr -and $cbErr.IsCompleted) {\n"
            "      if ($null -eq $cbErr.Result) { $cbErr = $null; break }\n"
            "      $cbLog.WriteLine($cbErr.Result)\n"
            "      $cbErr = $cbProc.StandardError.ReadLineAsync()\n"
            "    }\n"
            "  }\n"
            "  $cbProc.WaitForExit()\n"
            "  $cbCode = $cbProc.ExitCode\n"
            "} catch {\n"
            "  $cbLog.WriteLine('ERROR: ' + $_.Exception.Message)\n"
            "} finally {\n"
            "  if ($null -ne $cbProc -and -not $cbProc.HasExited) { $cbProc.Kill() }\n"
            "  $cbLog.Dispose()\n"
            "  [System.IO.File]::WriteAllText($cbLogPath + '.rc.part', [string]$cbCode + \"`n\")\n"
            "  Move-Item -LiteralPath ($cbLogPath + '.rc.part') -Destination ($cbLogPath + '.rc') -Force\n"
            "}\n"
            "exit $cbCode\n"
        )

    def foreground(self, run_dir: str, node_log: str, nonce: str, *, launcher: str | None = None) -> str:
        """The last action of a foreground plan: write ``follow.ps1`` and ``watchdog.ps1`` into the run
        directory (UTF-8 with BOM, as Windows PowerShell 5.1 needs), then run the follower's first
        round (its records with ``nonce``): it starts the watchdog and the launcher (both outside the
        WinRS job), says ``started "PID TICKS"`` and follows node.log from byte 0 (``more`` or
        ``end`` last)."""
        write = "[System.IO.File]::WriteAllText((Join-Path -Path $cbDir -ChildPath {name}), {text}, $cbBom)\n"
        quote = self.platform.quote
        return (
            f"$cbDir = {self.platform.full_path(run_dir)}\n"
            "$cbBom = New-Object -TypeName System.Text.UTF8Encoding -ArgumentList $true\n"
            + write.format(name=quote(WATCHDOG_SCRIPT), text=quote(self.watchdog_script(run_dir)))
            + write.format(
                name=quote(FOLLOW_SCRIPT),
                text=quote(self.follower_script(run_dir, node_log, launcher=launcher)),
            )
            + self.follow_round(run_dir, 0, nonce, start=True)
        )

    def follow_round(self, run_dir: str, offset: int, nonce: str, *, start: bool = False) -> str:
        """One round of the follower from byte ``offset``, its records with ``nonce`` (``start``: the
        first, which starts the run)."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"not a byte offset: {offset!r}")
        return (
            f"{self.platform.run_script(f'{run_dir}/{FOLLOW_SCRIPT}')} -Offset {offset}"
            f" -Nonce {self.platform.quote(check_nonce(nonce))}" + (" -Start" if start else "")
        )

    def follower_script(self, run_dir: str, node_log: str, *, launcher: str | None = None) -> str:
        """``follow.ps1``: one round of following (see the module docstring). It records its own
        identity in ``follower`` (to ``.part``, then renamed: the watchdog never reads half of it),
        touches ``heartbeat`` at least once a second, with ``-Start`` first starts the watchdog and
        then the launcher (both with ``Win32_Process`` Create, the watchdog first: a follower killed
        in between leaves no launcher unwatched), then reads node.log from ``-Offset`` in the tail
        protocol until the launcher has ended (``end``) or :data:`ROUND_SECONDS` have passed
        (``more``), its records with ``-Nonce``. A round that ends by itself (also with an error)
        deletes ``follower``: only a killed follower leaves the file naming a process that is gone."""
        return (
            "param([long]$Offset = 0, [string]$Nonce = '', [switch]$Start)\n"
            + self.platform.prelude()
            + "\n"
            + "$cbNonce = $Nonce\n"
            + self.platform.record_function()
            + "\n"
            + self.functions(run_dir)
            + f"$cbBeat = Join-Path -Path $cbDir -ChildPath '{HEARTBEAT}'\n"
            f"$cbFollower = Join-Path -Path $cbDir -ChildPath '{FOLLOWER}'\n"
            "$cbBeatWatch = $null\n"
            # the watchdog notices each change of its last-write time; written at most once a second
            # on a steady clock (a clock set back must not stop the beats); a write that fails (a
            # scanner holding the file) is left to the next second's
            "function Set-CbBeat {\n"
            "  $cbLast = $script:cbBeatWatch\n"
            "  if ($null -ne $cbLast -and $cbLast.Elapsed.TotalSeconds -lt 1) { return }\n"
            "  $script:cbBeatWatch = [System.Diagnostics.Stopwatch]::StartNew()\n"
            "  try {\n"
            "    [System.IO.File]::WriteAllText($cbBeat, [string][DateTime]::UtcNow.Ticks)\n"
            "  } catch { $null = $_ }\n"
            "}\n"
            "$cbSelf = [System.Diagnostics.Process]::GetCurrentProcess()\n"
            "[System.IO.File]::WriteAllText($cbFollower + '.part',"
            " [string]$cbSelf.Id + ' ' + $cbSelf.StartTime.ToFileTimeUtc() + \"`n\")\n"
            "[System.IO.File]::Delete($cbFollower)\n"
            "[System.IO.File]::Move($cbFollower + '.part', $cbFollower)\n"
            "Set-CbBeat\n"
            "try {\n"
            "if ($Start) {\n"
            "$cbWatchScript = Join-Path -Path $cbDir -ChildPath 'watchdog.ps1'\n"
            "$cbWatchExe = [System.Diagnostics.Process]::GetCurrentProcess().MainModule.FileName\n"
            "$cbWatchLine = '\"' + $cbWatchExe + '\" -NoProfile -NonInteractive -ExecutionPolicy Bypass"
            " -File \"' + $cbWatchScript + '\"'\n"
            "$cbWatchCreate = @{ CommandLine = $cbWatchLine; CurrentDirectory = $cbDir }\n"
            "$cbWatch = Invoke-CimMethod -ClassName Win32_Process -MethodName Create"
            " -Arguments $cbWatchCreate\n"
            "if ($cbWatch.ReturnValue -ne 0) {\n"
            "  [Console]::Error.WriteLine('the watchdog could not be started: Win32_Process Create failed"
            " with code ' + $cbWatch.ReturnValue)\n"
            "  exit 4\n"
            "}\n"
            + self.start_launcher(run_dir, node_log, tick="Set-CbBeat", launcher=launcher)
            + "\n}\n"
            + tail.powershell_tail(
                self.platform,
                "",
                node_log,
                0,
                nonce=None,
                follow=True,
                interval=FOLLOW_INTERVAL,
                offset_from="$Offset",
                beat="Set-CbBeat",
                round_seconds=ROUND_SECONDS,
            )
            + "\n} finally {\n"
            # a round that ends by itself: the watchdog now goes by the heartbeat until the next one
            "  [System.IO.File]::Delete($cbFollower)\n"
            "}\n"
        )

    def watchdog_script(self, run_dir: str) -> str:
        """``watchdog.ps1``: created outside the WinRS job with the run; stops the run when its
        follower was killed or its heartbeat is older than :data:`STALE_SECONDS`, notes why in
        ``watchdog.log``; exits when the run has ended or no process of it is left."""
        return (
            self.platform.prelude()
            + "\n"
            + self.functions(run_dir)
            + self.stop_functions()
            + "$cbRc = Join-Path -Path $cbDir -ChildPath 'node.log.rc'\n"
            "$cbPidFile = Join-Path -Path $cbDir -ChildPath 'pid'\n"
            f"$cbBeat = Join-Path -Path $cbDir -ChildPath '{HEARTBEAT}'\n"
            f"$cbFollower = Join-Path -Path $cbDir -ChildPath '{FOLLOWER}'\n"
            "$cbWhy = ''\n"
            # the heartbeat's age on a steady clock: since its last-write time last changed (a clock
            # set forward must not look like silence)
            "$cbSeen = [DateTime]::MinValue\n"
            "$cbQuiet = [System.Diagnostics.Stopwatch]::StartNew()\n"
            "while (-not $cbWhy) {\n"
            # a look that fails (a file being replaced, a process ending meanwhile) is tried again:
            # nothing may end the watchdog but the run's end
            "  try {\n"
            "    if ([System.IO.File]::Exists($cbRc)) { exit 0 }\n"
            # stopped by `bootstrap stop`, or ended without an exit code: nothing left to watch
            "    if ([System.IO.File]::Exists($cbPidFile) -and @(Get-CbRoots).Count -eq 0) { exit 0 }\n"
            "    $cbLine = Read-CbText $cbFollower\n"
            "    $cbAt = [System.IO.File]::GetLastWriteTimeUtc($cbBeat)\n"
            "    if ($cbAt -ne $cbSeen) { $cbSeen = $cbAt; $cbQuiet.Restart() }\n"
            "    $cbAge = $cbQuiet.Elapsed.TotalSeconds\n"
            # killed: gone while the file still names it (a round that ends deletes the file first)
            "    if ($cbLine.Trim() -and $null -eq (Get-CbLive $cbLine)"
            " -and (Read-CbText $cbFollower) -eq $cbLine) {\n"
            "      $cbWhy = 'its follower (the controller''s command in the WinRS shell) was stopped'\n"
            f"    }} elseif ($cbAge -gt {STALE_SECONDS:g}) {{\n"
            "      $cbWhy = 'no heartbeat from the controller''s follower for ' + [int]$cbAge + ' s'\n"
            "    }\n"
            "  } catch { $null = $_ }\n"
            f"  if (-not $cbWhy) {{ Start-Sleep -Milliseconds {WATCH_POLL_MS} }}\n"
            "}\n"
            "try {\n"
            "  [System.IO.File]::WriteAllText((Join-Path -Path $cbDir -ChildPath 'watchdog.log'),"
            " [DateTime]::UtcNow.ToString('o') + ' stopping the run: ' + $cbWhy + \"`n\")\n"
            "} catch { $null = $_ }\n"
            # the launcher may still be starting (created, its pid file not written yet)
            "$cbClock = [System.Diagnostics.Stopwatch]::StartNew()\n"
            "while (-not [System.IO.File]::Exists($cbPidFile) -and -not [System.IO.File]::Exists($cbRc)"
            f" -and $cbClock.Elapsed.TotalSeconds -lt {self.start_seconds}) {{\n"
            "  Start-Sleep -Milliseconds 200\n"
            "}\n"
            "$null = Stop-CbRun\n"
        )
