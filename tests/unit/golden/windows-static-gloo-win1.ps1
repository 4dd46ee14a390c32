# Launch script for node win1 (node rank 0), rendered by cluster-bootstrap.
# Cluster winlab: 2 node(s), world size 3, backend gloo.
# Native Windows: torchrun does not work here (pytorch#148283), so this script starts one Python
# process per local rank (1; global ranks 0-0) with torchrun's environment.
# Each rank's lines are prefixed [default<local rank>]: as torchrun --tee does. When a rank exits
# non-zero the others are stopped (each with its process tree) and the script exits with that code.
# Standalone: powershell.exe -NoProfile -ExecutionPolicy Bypass -File launch.ps1 [-Log FILE]
# With -Log, the log's directory is the run directory: the script writes its identity there (pid:
# process id and creation time, so a recycled id is never taken for it), each rank's (ranks), and
# FILE.rc with its exit code when it ends: what `bootstrap status/stop/logs --run` read.
param([string]$Log = '')
$ErrorActionPreference = 'Stop'
Set-StrictMode -Version Latest
$ProgressPreference = 'SilentlyContinue'
$cbUtf8 = New-Object -TypeName System.Text.UTF8Encoding -ArgumentList $false
try { [Console]::OutputEncoding = $cbUtf8 } catch { $null = $_ }
$cbLog = $null
$cbLogPath = ''
$cbRunDir = ''
if ($Log) {
  $cbLogPath = $ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath($Log)
  $cbLog = New-Object -TypeName System.IO.StreamWriter -ArgumentList $cbLogPath, $true, $cbUtf8
  $cbLog.AutoFlush = $true
  $cbRunDir = [System.IO.Path]::GetDirectoryName($cbLogPath)
  $cbSelf = [System.Diagnostics.Process]::GetCurrentProcess()
  $cbPidPart = Join-Path -Path $cbRunDir -ChildPath 'pid.part'
  [System.IO.File]::WriteAllText($cbPidPart, [string]$PID + ' ' + $cbSelf.StartTime.ToFileTimeUtc() + "`n")
  Move-Item -LiteralPath $cbPidPart -Destination (Join-Path -Path $cbRunDir -ChildPath 'pid') -Force
}

function Write-CbLine([string]$Text, [bool]$ToStderr) {
  if ($ToStderr) { [Console]::Error.WriteLine($Text) } else { [Console]::Out.WriteLine($Text) }
  if ($null -ne $cbLog) { $cbLog.WriteLine($Text) }
}

function Stop-CbTree([int]$Id) {
  # taskkill /T: the process and every descendant (DataLoader workers, compilers...)
  $cbKill = New-Object -TypeName System.Diagnostics.ProcessStartInfo
  $cbKill.FileName = Join-Path -Path ([Environment]::SystemDirectory) -ChildPath 'taskkill.exe'
  $cbKill.Arguments = '/PID ' + $Id + ' /T /F'
  $cbKill.UseShellExecute = $false
  $cbKill.CreateNoWindow = $true
  $cbKill.RedirectStandardOutput = $true
  $cbKill.RedirectStandardError = $true
  $cbKiller = [System.Diagnostics.Process]::Start($cbKill)
  $null = $cbKiller.StandardOutput.ReadToEnd()
  $null = $cbKiller.StandardError.ReadToEnd()
  $cbKiller.WaitForExit()
}

$cbRanks = New-Object -TypeName System.Collections.Generic.List[object]
$cbCode = 0
try {
  Set-Location -LiteralPath ($HOME + '\cluster-bootstrap\code')
  # the backend the cluster chose, for training scripts that read it (the shipped example does)
  $env:CLUSTER_BOOTSTRAP_BACKEND = 'gloo'
  # this run: its id, and its own directory on this node for checkpoints and outputs (out\ beside
  # this script; code sync never touches it, and `bootstrap fetch --run ID` looks there first)
  $env:CB_RUN_ID = 'winlab-20261202'
  $env:CB_RUN_DIR = Join-Path -Path $PSScriptRoot -ChildPath 'out'
  $null = New-Item -ItemType Directory -Force -Path $env:CB_RUN_DIR
  $env:GLOO_SOCKET_IFNAME = 'Ethernet'
  $env:OMP_NUM_THREADS = '8'
  $env:MY_FLAG = 'a b'
  $env:WANDB_API_KEY = '********'
  $env:MASTER_ADDR = '10.0.0.1'
  $env:MASTER_PORT = '29500'
  $env:WORLD_SIZE = '3'
  $env:LOCAL_WORLD_SIZE = '1'
  $env:GROUP_RANK = '0'
  $env:TORCHELASTIC_RUN_ID = 'winlab-20261202'
  # libuv TCPStore is not built on Windows (torch 2.4-2.6 default to it)
  $env:USE_LIBUV = '0'
  # lines reach the pipe as printed, in UTF-8 (not the ANSI code page)
  $env:PYTHONUNBUFFERED = '1'
  $env:PYTHONIOENCODING = 'utf-8'
  $cbPython = Get-Command -CommandType Application -Name 'C:\Python312\python.exe' -ErrorAction SilentlyContinue | Select-Object -First 1
  if ($null -eq $cbPython) {
    throw ('C:\Python312\python.exe' + ': command not found (set python: for this node)')
  }
  if ($cbPython.Path -match '\.(cmd|bat)$') {
    throw ($cbPython.Path + ': batch files cannot receive arguments safely; name python.exe itself')
  }
  $cbArguments = 'examples/train_ddp.py --epochs 3 --note "it''s \"$HOME\"; `x` 50% C:\dir\\"'

  function Start-CbRank([int]$LocalRank, [int]$GlobalRank) {
    $cbInfo = New-Object -TypeName System.Diagnostics.ProcessStartInfo
    $cbInfo.FileName = $cbPython.Path
    $cbInfo.Arguments = $cbArguments
    $cbInfo.UseShellExecute = $false
    $cbInfo.CreateNoWindow = $true
    $cbInfo.RedirectStandardOutput = $true
    $cbInfo.RedirectStandardError = $true
    $cbInfo.StandardOutputEncoding = $cbUtf8
    $cbInfo.StandardErrorEncoding = $cbUtf8
    $cbInfo.WorkingDirectory = (Get-Location -PSProvider FileSystem).ProviderPath
    $cbInfo.EnvironmentVariables['RANK'] = [string]$GlobalRank
    $cbInfo.EnvironmentVariables['LOCAL_RANK'] = [string]$LocalRank
    $cbProc = [System.Diagnostics.Process]::Start($cbInfo)
    if ($cbRunDir) {
      $cbEntry = [string]$cbProc.Id + ' ' + $cbProc.StartTime.ToFileTimeUtc() + "`n"
      [System.IO.File]::AppendAllText((Join-Path -Path $cbRunDir -ChildPath 'ranks'), $cbEntry)
    }
    $cbRanks.Add([pscustomobject]@{
      Local = $LocalRank
      Prefix = '[default' + $LocalRank + ']:'
      Process = $cbProc
      Out = $cbProc.StandardOutput.ReadLineAsync()
      Err = $cbProc.StandardError.ReadLineAsync()
      Done = $false
    })
  }

  Start-CbRank -LocalRank 0 -GlobalRank 0

  while ($true) {
    $cbPending = New-Object -TypeName System.Collections.Generic.List[System.Threading.Tasks.Task]
    foreach ($cbRank in $cbRanks) {
      if ($null -ne $cbRank.Out) { $cbPending.Add($cbRank.Out) }
      if ($null -ne $cbRank.Err) { $cbPending.Add($cbRank.Err) }
    }
    if ($cbPending.Count -gt 0) {
      $null = [System.Threading.Tasks.Task]::WaitAny($cbPending.ToArray(), 200)
    }
    $cbRunning = 0
    foreach ($cbRank in $cbRanks) {
      while ($null -ne $cbRank.Out -and $cbRank.Out.IsCompleted) {
        $cbLine = $cbRank.Out.Result
        if ($null -eq $cbLine) { $cbRank.Out = $null; break }
        Write-CbLine ($cbRank.Prefix + $cbLine) $false
        $cbRank.Out = $cbRank.Process.StandardOutput.ReadLineAsync()
      }
      while ($null -ne $cbRank.Err -and $cbRank.Err.IsCompleted) {
        $cbLine = $cbRank.Err.Result
        if ($null -eq $cbLine) { $cbRank.Err = $null; break }
        Write-CbLine ($cbRank.Prefix + $cbLine) $true
        $cbRank.Err = $cbRank.Process.StandardError.ReadLineAsync()
      }
      if (-not $cbRank.Done -and $cbRank.Process.HasExited) {
        $cbRank.Done = $true
        $cbExit = $cbRank.Process.ExitCode
        if ($cbExit -ne 0 -and $cbCode -eq 0) {
          $cbCode = $cbExit
          Write-CbLine ('local rank ' + $cbRank.Local + ' exited with code ' + $cbExit + ': stopping the other ranks') $true
          foreach ($cbOther in $cbRanks) {
            if (-not $cbOther.Process.HasExited) { Stop-CbTree $cbOther.Process.Id }
          }
        }
      }
      if (-not $cbRank.Done -or $null -ne $cbRank.Out -or $null -ne $cbRank.Err) { $cbRunning++ }
    }
    if ($cbRunning -eq 0) { break }
  }
} catch {
  Write-CbLine ('ERROR: ' + $_.Exception.Message) $true
  if ($cbCode -eq 0) { $cbCode = 1 }
} finally {
  # also on Ctrl-C: no rank outlives this script
  foreach ($cbRank in $cbRanks) {
    if (-not $cbRank.Process.HasExited) { Stop-CbTree $cbRank.Process.Id }
  }
  if ($null -ne $cbLog) {
    $cbLog.Dispose()
    [System.IO.File]::WriteAllText($cbLogPath + '.rc.part', [string]$cbCode + "`n")
    Move-Item -LiteralPath ($cbLogPath + '.rc.part') -Destination ($cbLogPath + '.rc') -Force
  }
}
exit $cbCode
