"""Run management on native Windows nodes: the PowerShell that starts a detached launcher, stops a run
by its identity, reports its status, tails its log from a byte offset and lists files to fetch; and
how runs/control.py picks it by platform.

No PowerShell runs here: every script is parsed with tree-sitter (tests/pwsh.py) and asserted on the
tree; every path is read back from its literal with PowerShell's own quoting rule, with run
directories holding spaces and quotes (plain and typographic).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator import records
from orchestrator.errors import CommandFailedError, UsageError
from orchestrator.inventory import load_inventory_text
from orchestrator.platforms import PosixShell, PowerShell, WslShell
from orchestrator.records import unnonced
from orchestrator.render import Renderer, plan_launch
from orchestrator.runs.control import (
    StopResult,
    fetch_candidates,
    fetch_node,
    fetch_script,
    follow_node,
    parse_status,
    run_ops,
    start_script,
    status_node,
    status_script,
    stop_node,
    stop_script,
    tail_script,
)
from orchestrator.runs.layout import STREAMING_ENV
from orchestrator.runs.posix import PosixRuns
from orchestrator.runs.start import start_node
from orchestrator.runs.windows import WindowsRuns
from orchestrator.transports.base import Result
from tests import pwsh
from tests.noderecords import NONCE, nonce_of, said, status_said
from tests.unit.test_platform_powershell import assignments, find, single_quoted_value, string_literals

ps = PowerShell()
runs = WindowsRuns(ps)
RUN_DIRS = [
    "~/cluster-bootstrap/runs/lab-20260101-120000/win1",
    "C:/Users/Jo O'Brien/runs/r-1/win 1",
    "D:\\data\\it\u2019s \u201cquoted\u201d\\runs\\r.2\\node_a",
]


def literal_paths(tree: Any) -> list[str]:
    """Every single-quoted literal of the script, as PowerShell reads it."""
    return [single_quoted_value(s) for s in string_literals(tree) if s[0] != '"']


def resolved(path: str) -> str:
    """What ``path_word`` leaves in a literal: ``~`` becomes ``$HOME +`` and the rest, with backslashes."""
    path = path.replace("/", "\\")
    return path[1:] if path.startswith("~") else path


def all_assignments(tree: Any) -> list[tuple[str, str]]:
    """Every ``target = value`` on the tree, in order (also ``+=``: its operator is kept)."""
    found = []
    for node in pwsh.walk(tree.root_node):
        if node.type == "assignment_expression":
            target, operator, value = node.children[0], node.children[1], node.children[-1]
            found.append(
                (
                    (target.text or b"").decode(),
                    (operator.text or b"").decode() + " " + (value.text or b"").decode(),
                )
            )
    return found


def full_path_args(tree: Any) -> list[str]:
    """The literal inside every GetUnresolvedProviderPathFromPSPath(...) call."""
    found = []
    for node in pwsh.walk(tree.root_node):
        if node.type == "invokation_expression" or node.type == "invocation_expression":
            text = (node.text or b"").decode()
            if text.startswith("$ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath"):
                inner = [
                    single_quoted_value((n.text or b"").decode())
                    for n in pwsh.walk(node)
                    if n.type == "string_literal" and (n.text or b"").startswith(b"'")
                ]
                found.extend(inner)
    return found


# -- detached start ------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_start_creates_the_launcher_outside_the_shell_and_waits_for_its_pid_file(run_dir: str) -> None:
    script = runs.start(run_dir, f"{run_dir}/node.log", "ignored", NONCE)
    tree = pwsh.assert_parses(ps.wrap(script))
    # every path reaches the node exactly (quotes doubled, slashes turned)
    paths = full_path_args(tree)
    assert paths == [resolved(run_dir), resolved(f"{run_dir}/launch.ps1"), resolved(f"{run_dir}/node.log")]
    # Win32_Process Create through CIM: outside the WinRS job object
    (create,) = find(tree, "Invoke-CimMethod")
    assert create.has("-ClassName") and "Win32_Process" in create.arguments
    assert create.has("-MethodName") and "Create" in create.arguments
    values = assignments(tree)
    assert values["$cbCreate"] == "@{ CommandLine = $cbLine; CurrentDirectory = $cbDir }"
    # the new powershell.exe runs launch.ps1 with -Log, both paths in double quotes (C runtime rules)
    line = values["$cbLine"]
    assert "-File \"' + $cbScript + '\" -Log \"' + $cbLogPath + '\"'" in line
    assert "-NoProfile -NonInteractive -ExecutionPolicy Bypass" in line
    # refuses a run that has a pid file already, before starting anything
    assert script.index("Out-CbRecord 'started-before'") < script.index("Invoke-CimMethod")
    assert "exit 3" in script
    # waits for the launcher's own pid file (pid + creation time), gives up when the process is gone
    assert script.index("Invoke-CimMethod") < script.index(
        "while (-not [System.IO.File]::Exists($cbPidFile))"
    )
    assert "Get-Process -Id $cbChild" in script
    assert script.rstrip().endswith("Out-CbRecord 'started' @((Read-CbText $cbPidFile).Trim())")


def test_the_launch_script_records_its_identity_and_each_ranks() -> None:
    inventory = load_inventory_text(
        "cluster: {name: w, master: win1, backend: gloo}\n"
        "nodes:\n  - {name: win1, host: 10.0.0.1, os: windows, user: bob, nproc: 2, interface: Ethernet,\n"
        "     windows: {mode: native}}\n",
        "w.yaml",
    )
    (spec,) = plan_launch(
        inventory,
        backend="gloo",
        master_addr="10.0.0.1",
        run_id="r1",
        interfaces={"win1": ("Ethernet", None)},
        cpus={"win1": 4},
        pythons={"win1": "C:\\Python312\\python.exe"},
    )
    text = Renderer().render(spec, ps)
    tree = pwsh.assert_parses(text)
    values = assignments(tree)
    # the run directory is the log's directory; pid: "PID FILETIME", written to .part, then renamed
    assert values["$cbRunDir"] == "[System.IO.Path]::GetDirectoryName($cbLogPath)"
    assert "[string]$PID + ' ' + $cbSelf.StartTime.ToFileTimeUtc()" in text
    (move_pid,) = [m for m in find(tree, "Move-Item") if "$cbPidPart" in m.arguments]
    assert move_pid.has("-LiteralPath") and move_pid.has("-Force")
    # each rank: appended once started; only when there is a run directory (-Log)
    assert values["$cbEntry"] == "[string]$cbProc.Id + ' ' + $cbProc.StartTime.ToFileTimeUtc() + \"`n\""
    start = text.index("$cbProc = [System.Diagnostics.Process]::Start($cbInfo)")
    assert (
        start
        < text.index("AppendAllText((Join-Path -Path $cbRunDir -ChildPath 'ranks')")
        < text.index("$cbRanks.Add(")
    )
    # the exit code still goes to .rc.part, then .rc (logs --follow ends only on a complete log)
    assert text.index("$cbLog.Dispose()") < text.index("'.rc.part'") < text.index("($cbLogPath + '.rc')")


# -- stop ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_stop_finds_the_run_by_identity_never_by_name(run_dir: str) -> None:
    script = runs.stop(run_dir, "ignored", grace=5)
    tree = pwsh.assert_parses(ps.wrap(script))
    assert full_path_args(tree) == [resolved(run_dir)]
    # the launcher and the ranks: pid + creation time from the run directory's files
    assert {"pid", "ranks"} <= set(literal_paths(tree))
    assert "[string]$cbProc.StartTime.ToFileTimeUtc() -ne $cbWords[1]" in script
    # descendants by parent id, created after their parent (a recycled id's old processes are not)
    assert "$cbP.CreationDate -ge $Known[$cbParent]" in script
    # nothing matched by name or command line: another run's processes cannot be hit
    for pattern in ("CommandLine", "-like", "-match", ".Name", "taskkill", "-Filter"):
        assert pattern not in script, pattern
    stops = find(tree, "Stop-Process")
    assert stops and all(s.has("-Id") and s.has("-Force") for s in stops)
    # stops the launcher first (its ranks ending must not make it write an exit code), then waits
    # until every stopped process is gone (10 s at most)
    assert script.index("$cbBatch.Add($cbRoot.Id)") < script.index("@(Find-CbTree $cbKnown)")
    assert "$cbClock.Elapsed.TotalSeconds -lt 10" in script
    said = [c.arguments[1] for c in find(tree, "Out-CbRecord") if c.arguments[0] == "'stop'"]
    for first in ("gone", "not-started", "no-run", "exited", "terminated"):
        assert any(a.startswith(f"@('{first}'") for a in said), first


def test_kill_tree_walks_the_same_tree() -> None:
    tree = pwsh.assert_parses(ps.kill_tree(4242))
    assert "'ProcessId = 4242'" in ps.kill_tree(4242)
    assert [f.name for f in find(tree, "Find-CbTree")] == ["Find-CbTree"]


class FakeTransport:
    """Answers every run with ``stdout``; keeps the scripts."""

    def __init__(self, platform: Any, stdout: str | tuple[str, ...], exit_code: int = 0) -> None:
        self.platform = platform
        self.stdout = stdout  # a record (kind, fields...) answers with the script's own nonce
        self.exit_code = exit_code
        self.scripts: list[str] = []

    def answer(self, command: str) -> str:
        return self.stdout if isinstance(self.stdout, str) else said(command, self.stdout)

    def run(self, command: str, **_: Any) -> Result:
        self.scripts.append(command)
        return Result(
            node="win1",
            command=command,
            exit_code=self.exit_code,
            stdout=self.answer(command),
            stderr="",
            duration=0.1,
        )


NODE = SimpleNamespace(name="win1", workdir="C:/train", os="windows")


def test_stop_reports_windows_terminations_plainly() -> None:
    result = stop_node(NODE, FakeTransport(ps, ("stop", "terminated", "5", "0")), "r1")  # type: ignore[arg-type]
    assert result == StopResult("stopped", 5, 0, forced=True)
    assert result.describe() == "terminated 5 process(es)"
    with pytest.raises(CommandFailedError, match="2 process"):
        stop_node(NODE, FakeTransport(ps, ("stop", "terminated", "5", "2")), "r1")  # type: ignore[arg-type]
    exited = stop_node(NODE, FakeTransport(ps, ("stop", "exited", "3")), "r1")  # type: ignore[arg-type]
    assert exited.state == "exited" and exited.exit_code == 3


# -- status ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_status_prints_what_parse_status_reads(run_dir: str) -> None:
    script = runs.status(run_dir, "ignored", f"{run_dir}/node.log", NONCE)
    tree = pwsh.assert_parses(ps.wrap(script))
    assert full_path_args(tree) == [resolved(run_dir), resolved(f"{run_dir}/node.log")]
    said = {c.arguments[0]: c.arguments[1] for c in find(tree, "Out-CbRecord")}
    for key in ("now", "started", "rc", "ended", "size", "last", "gpu", "alive"):
        assert f"'{key}'" in said, key
    assert said["'state'"] == "@('no-run')" and "$cbAlive = if ($null -ne (Get-CbLeader)) { '1' }" in script
    # the last line a rank printed, else the last line; 400 characters at most
    assert "'^\\[default[0-9]*\\]:'" in script and "Substring(0, 400)" in script
    # nvidia-smi: its query exactly, killed after 10 s (a wedged driver must not hang status)
    values = assignments(tree)
    assert single_quoted_value(values["$cbInfo.Arguments"]) == (
        "--query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits"
    )
    assert "$cbText.Wait(10000)" in script and "$cbSmiProc.Kill()" in script
    # the log is opened while the launcher writes it
    assert "[System.IO.FileShare]::ReadWrite -bor [System.IO.FileShare]::Delete" in script
    # an ended run: the lines under torchrun's last root cause, read from its own (untagged) lines
    assert said["'cause'"] == "@($cbC)"
    assert "$cbOwn = @($cbLines | Where-Object { -not $_.StartsWith('[default') })" in script
    assert "StartsWith('Root Cause (first observed failure):')" in script
    assert "if ([System.IO.File]::Exists($cbRc) -and $cbAt -ge 0) {" in script


def test_a_failed_windows_run_names_the_rank_torchruns_summary_names() -> None:
    stdout = (
        "now=1767268900\nstarted=1767268800\nalive=0\nrc=1\nended=1767268850\n"
        "cause=[0]:\ncause=  host      : gpu-pc\ncause=  rank      : 1 (local_rank: 1)\n"
        "cause=  exitcode  : 3 (pid: 9120)\n"
    )
    status = parse_status(status_said(stdout), NONCE)
    assert (status.exit_code, status.failed_rank, status.label) == (1, (1, 3), "exited (rank 1: exit 3)")


def test_a_windows_status_answer_parses() -> None:
    stdout = (
        "now=1767268900\r\nstarted=1767268800\r\nalive=1\r\nsize=2048\r\n"
        "last=[default1]:[rank 1/2] step 7 loss 0.42\r\ngpu=0, 87, 5120, 24576\r\n"
    )
    status = parse_status(status_said(stdout.replace("\r\n", "\n")), NONCE)
    assert status.state == "running" and status.runtime == 100
    assert status.last_line == "[rank 1/2] step 7 loss 0.42" and status.log_bytes == 2048
    assert status.gpus == [{"index": "0", "util_percent": 87, "mem_used_mib": 5120, "mem_total_mib": 24576}]


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_status_prints_the_logs_last_write_time_on_the_nodes_clock(run_dir: str) -> None:
    tree = pwsh.assert_parses(ps.wrap(runs.status(run_dir, "ignored", f"{run_dir}/node.log", NONCE)))
    (modified,) = [c for c in find(tree, "Out-CbRecord") if c.arguments[0] == "'modified'"]
    # the log's last write (UTC), in Unix seconds through the same function as now and started
    assert modified.arguments[1] == "@((Get-CbUnix ([System.IO.File]::GetLastWriteTimeUtc($cbLogPath))))"
    started = [c for c in find(tree, "Out-CbRecord") if c.arguments[0] == "'started'"]
    assert [c.arguments[1] for c in started] == [
        "@((Get-CbUnix ([System.IO.File]::GetLastWriteTimeUtc($cbPidFile))))"
    ]
    functions = [n for n in pwsh.walk(tree.root_node) if n.type == "function_statement"]
    assert any((n.text or b"").startswith(b"function Get-CbUnix([DateTime]$When)") for n in functions)
    # $cbLogPath is node.log (full path), and modified= is printed only when that file exists
    assert assignments(tree)["$cbLogPath"].startswith(
        "$ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath("
    )
    assert resolved(f"{run_dir}/node.log") in full_path_args(tree)
    node = next(
        n
        for n in pwsh.walk(tree.root_node)
        if n.type == "command" and (n.text or b"").startswith(b"Out-CbRecord 'modified'")
    )
    conditions = []
    while node.parent is not None:
        node = node.parent
        if node.type == "if_statement":
            conditions.append((node.text or b"").decode().split("{", 1)[0].strip())
    assert conditions == ["if ([System.IO.File]::Exists($cbLogPath))"]


def test_a_windows_run_ended_without_an_exit_code_shows_how_long_it_ran_until_its_last_output() -> None:
    """Its processes were ended (a job object closed, a reboot) and no stop was marked: not "stopped"
    (nobody stopped it), and a failure (training does not end that way)."""
    stdout = "now=1767269900\r\nstarted=1767268800\r\nalive=0\r\nsize=2048\r\nmodified=1767268842\r\n"
    status = parse_status(status_said(stdout.replace("\r\n", "\n")), NONCE)
    assert status.state == "no exit code" and status.exit_code is None and status.failed
    assert status.runtime == 42  # started -> last output; not until now (it was killed some time)
    assert status.public_dict()["runtime"] == 42
    # no log at all (killed before its first output): nothing to measure
    assert parse_status(status_said("now=1767269900\nstarted=1767268800\nalive=0\n"), NONCE).runtime is None
    # an exited run keeps its end time, whatever the log's
    exited = parse_status(
        status_said(stdout.replace("alive=0", "alive=0\nrc=0\nended=1767268850").replace("\r\n", "\n")), NONCE
    )
    assert (exited.state, exited.runtime) == ("exited", 50)


# -- logs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_dir", RUN_DIRS)
@pytest.mark.parametrize("follow", [True, False])
def test_tail_reads_bytes_from_the_offset_in_the_posix_protocol(run_dir: str, follow: bool) -> None:
    script = runs.tail(
        run_dir,
        "m",
        f"{run_dir}/node.log",
        123456789012,
        nonce=NONCE,
        follow=follow,
        python=None,
        interval=0.05,
    )
    tree = pwsh.assert_parses(ps.wrap(script))
    assert full_path_args(tree) == [resolved(run_dir), resolved(f"{run_dir}/node.log")]
    values = assignments(tree)
    # the offset starts where asked, and moves by whole batches only
    assert [v for t, v in all_assignments(tree) if t == "$cbOffset"] == ["= [long]123456789012", "+= $cbCut"]
    assert values["$cbFollow"] == ("$true" if follow else "$false")
    # raw bytes to stdout, read while the launcher writes (FileShare ReadWrite), one byte per char
    assert values["$cbOut"] == "[Console]::OpenStandardOutput()"
    assert values["$cbLatin"] == "[System.Text.Encoding]::GetEncoding(28591)"
    assert "[System.IO.FileShare]::ReadWrite -bor [System.IO.FileShare]::Delete" in script
    # protocol: the codec's stream form: lines escaped, then records of the command's nonce (the
    # batch's with the offset, end and missing)
    assert f"$cbNonce = '{NONCE}'" in script
    assert '.Replace("`n@@", "`n@@@")' in script
    assert "Send-Cb $cbText\n      Out-CbRecord $cbKind @([string]$cbOffset)\n" in script
    assert [v for t, v in all_assignments(tree) if t == "$cbKind"] == ["= 'batch'", "= 'piece'"]
    assert "Out-CbRecord 'end' @($cbCode, [string]$cbOffset, $cbStopped)" in script
    assert "Out-CbRecord 'missing' @()" in script
    assert "@@." not in script and "@@end" not in script
    # complete lines only; a last line without newline only once the launcher has ended
    assert "[Array]::LastIndexOf($cbBuf, [byte]10, $cbGot - 1) + 1" in script
    # a block read from the offset; a FileStream read may return less than asked: it reads on
    assert "$cbGot = Read-CbBlock $cbFile $cbOffset $cbWant" in script
    assert "$null = $Stream.Seek($At, [System.IO.SeekOrigin]::Begin)" in script
    assert "$n = $Stream.Read($cbBuf, $got, $Want - $got)" in script
    assert "while ($got -lt $Want)" in script
    assert "if ($cbFin -and $cbGot -eq $cbSize - $cbOffset)" in script
    # the end is taken before the size: whatever was written before it is read
    assert script.index("$cbFin = Test-CbEnded") < script.index("$cbSize = $cbFile.Length")
    sleeps = find(tree, "Start-Sleep")
    assert [s.arguments for s in sleeps] == [["50"]]


@pytest.mark.parametrize("run_dir", RUN_DIRS)
@pytest.mark.parametrize("lines", [0, 5, 123456])
def test_tail_of_the_last_lines_is_found_on_the_node_and_its_start_told_first(
    run_dir: str, lines: int
) -> None:
    script = runs.tail(
        run_dir,
        "m",
        f"{run_dir}/node.log",
        0,
        nonce=NONCE,
        follow=True,
        python=None,
        interval=0.05,
        lines=lines,
    )
    tree = pwsh.assert_parses(ps.wrap(script))
    assert full_path_args(tree) == [resolved(run_dir), resolved(f"{run_dir}/node.log")]
    values = all_assignments(tree)
    assert ("$cbTail", f"= [long]{lines}") in values
    # the start: 0 without a log yet; else read back from the size; then batches move it as always
    assert [v for t, v in values if t == "$cbOffset"] == [
        "= [long]0",  # the offset asked for (unused)
        "= [long]0",  # no log yet: everything the launcher writes is new
        "= $cbSize",  # no line wanted (0, or a last line without newline of an ended launcher)
        "= $cbLine",  # nothing after the last newline, or a line still being written: its start
        "= $cbLine",  # the start of a line counted (the N-th last, once they are all counted)
        "= [long]0",  # fewer lines than asked: the whole log
        "+= $cbCut",
    ]
    # going back line by line: a last line without newline counts only once the launcher has ended
    assert "if ($cbEnd -eq $cbSize -and -not ($cbFin -and $cbLine -lt $cbSize)) {" in script
    assert ("$cbTaken", "+= 1") in values and "if ($cbTaken -eq $cbTail) { break }" in script
    assert "Test-CbSample" not in script  # no samples named: every line counts
    # back a block at a time on the same stream, newlines found by LastIndexOf below the last one
    assert ("$cbPos", "-= $cbWant") in values
    assert "$cbAt = Read-CbBlock $cbFile $cbPos $cbWant" in script
    assert ("$cbAt", "= [Array]::LastIndexOf($cbBuf, [byte]10, $cbAt - 1)") in values
    # the order: the end checked, then the log opened (FileShare ReadWrite) and measured, the start
    # sent, and only then the reading loop (which keeps that stream)
    at = script.index
    assert (
        at("$cbFin = Test-CbEnded")
        < at("$cbFile = New-CbLogStream")
        < at("$cbSize = $cbFile.Length")
        < at("Out-CbRecord 'start' @([string]$cbOffset)")
        < at("if ($cbFin -or -not $cbFollow) { break }")
    )
    (opener,) = [c for c in find(tree, "New-Object") if "$cbLogPath" in " ".join(c.arguments)]
    assert opener.arguments[0] == "System.IO.FileStream" and opener.arguments[1].endswith(", $cbShare")
    assert "[System.IO.FileShare]::ReadWrite -bor [System.IO.FileShare]::Delete" in script
    assert script.count("Out-CbRecord 'start'") == 1


def test_without_tail_there_is_no_start_marker() -> None:
    script = runs.tail(
        "C:/r", "m", "C:/r/node.log", 42, nonce=NONCE, follow=False, python=None, interval=None
    )
    assert "Out-CbRecord 'start'" not in script and "$cbTail" not in script
    tree = pwsh.assert_parses(ps.wrap(script))
    assert [v for t, v in all_assignments(tree) if t == "$cbOffset"] == ["= [long]42", "+= $cbCut"]


def test_tail_offsets_must_be_integers() -> None:
    script = runs.tail("C:/r", "m", "C:/r/node.log", 7, nonce=NONCE, follow=False, python=None, interval=None)
    assert "$cbOffset = [long]7\n" in script


# -- fetch --------------------------------------------------------------------------------------------------


def test_list_files_prints_the_posix_listing() -> None:
    candidates = [["C:/Users/Jo O'Brien/runs/r1/win1/out dir", "C:/code/out dir"], ["D:/ckpt/model.pt"]]
    script = runs.list_files(candidates, NONCE)
    tree = pwsh.assert_parses(ps.wrap(script))
    assert full_path_args(tree) == [resolved(p) for group in candidates for p in group]
    said = [" ".join(c.arguments) for c in find(tree, "Out-CbRecord")]
    for index in (0, 1):
        assert f"'missing' @('{index}')" in said
        assert f"'dir' @('{index}', $cbFound, $cbList.ToString())" in said
        assert f"'file' @('{index}', [string]$cbSize, $cbFound)" in said
    assert "Append([char]0)" in script  # SIZE NUL RELPATH NUL: names cannot break the listing
    listing = [c for c in find(tree, "Get-ChildItem")]
    assert listing and all(c.has("-LiteralPath") and c.has("-Recurse") and c.has("-File") for c in listing)
    assert ".Replace('\\', '/')" in script  # relative paths with / as fetch_node splits them


# -- dispatch -------------------------------------------------------------------------------------------


def test_run_ops_by_platform() -> None:
    node = SimpleNamespace(name="n")
    assert isinstance(run_ops(PosixShell(), node), PosixRuns)  # type: ignore[arg-type]
    assert isinstance(run_ops(WslShell("Ubuntu"), node), PosixRuns)  # type: ignore[arg-type]
    windows = run_ops(ps, node)  # type: ignore[arg-type]
    assert isinstance(windows, WindowsRuns) and windows.launcher == "launch.ps1"
    assert not windows.uses_python
    other = SimpleNamespace(name="cmdline", as_posix=lambda: None, as_powershell=lambda: None)
    with pytest.raises(UsageError, match="cmdline"):
        run_ops(other, node)  # type: ignore[arg-type]


class Answering(FakeTransport):
    """A FakeTransport that also hands its answer to a tail's block handler, as transports do."""

    def run(self, command: str, **kwargs: Any) -> Result:
        handler = kwargs.get("on_line")
        if handler is not None:
            handler.block("stdout", self.answer(command))
        return super().run(command, **kwargs)


@pytest.mark.parametrize("platform", [PosixShell(), WslShell("Ubuntu"), ps], ids=lambda p: p.name)
def test_what_dry_run_prints_is_what_each_operation_sends(platform: Any) -> None:
    """`logs/status/stop/fetch --dry-run` and `launch --detach --dry-run` print runs.control's
    ``*_script`` texts: the operations send exactly those (shared workdirs: ``{node}`` replaced)."""
    node = SimpleNamespace(name="n1", workdir="/srv/{node}/cb")
    sent = Answering(platform, ("started", "42 42 7"))
    start_node(node, sent, "r1")  # type: ignore[arg-type]
    # each run chooses its own record nonce (orchestrator/records.py): compared without it
    assert unnonced(sent.scripts) == unnonced([start_script(platform, node, "r1")])  # type: ignore[arg-type]
    assert "/srv/n1/cb/runs/r1/n1" in sent.scripts[0].replace("\\", "/")
    sent = Answering(platform, ("state", "no-run"))
    status_node(node, sent, "r1")  # type: ignore[arg-type]
    assert unnonced(sent.scripts) == unnonced([status_script(platform, node, "r1")])  # type: ignore[arg-type]
    sent = Answering(platform, ("stop", "no-run"))
    stop_node(node, sent, "r1", grace=3)  # type: ignore[arg-type]
    assert unnonced(sent.scripts) == unnonced([stop_script(platform, node, "r1", 3)])  # type: ignore[arg-type]
    sent = Answering(platform, ("end", "0", "0"))
    follow_node(node, sent, "r1", follow=False, python="/usr/bin/python3", lines=4)  # type: ignore[arg-type]
    assert unnonced(sent.scripts) == unnonced(
        [tail_script(platform, node, "r1", follow=False, python="/usr/bin/python3", lines=4)]  # type: ignore[arg-type]
    )
    sent = Answering(platform, ("missing", "0"))
    fetch_node(node, sent, "r1", ["ckpt"], code_dir=None, dest=Path("unused"))  # type: ignore[arg-type]
    assert unnonced(sent.scripts) == unnonced([fetch_script(platform, node, "r1", ["ckpt"], None)])  # type: ignore[arg-type]


def test_the_start_runs_with_unbuffered_python() -> None:
    """`logs --follow` sees lines as they are printed: the detached launcher inherits it."""
    seen: dict[str, Any] = {}

    class Keeping(FakeTransport):
        def run(self, command: str, **kwargs: Any) -> Result:
            seen.update(kwargs)
            return super().run(command, **kwargs)

    start_node(SimpleNamespace(name="n1", workdir=None), Keeping(ps, ("started", "1 2")), "r1")  # type: ignore[arg-type]
    assert seen["env"] == STREAMING_ENV == {"PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize(
    ("path", "absolute", "local"),
    [
        ("C:\\ckpt\\model.pt", True, ["ckpt", "model.pt"]),
        ("D:/out", True, ["out"]),
        ("\\\\server\\share\\x", True, ["server", "share", "x"]),
        ("~/out", True, ["~", "out"]),
        ("out\\sub", False, ["out", "sub"]),
        ("..\\secret", False, None),
    ],
)
def test_windows_paths_for_fetch(path: str, absolute: bool, local: list[str] | None) -> None:
    ops = run_ops(ps, SimpleNamespace(name="n"))  # type: ignore[arg-type]
    assert ops.is_absolute(path) is absolute
    assert ops.local_parts(path) == local


def test_fetch_candidates_on_a_windows_node() -> None:
    ops = run_ops(ps, SimpleNamespace(name="n"))  # type: ignore[arg-type]
    node = SimpleNamespace(name="win1", workdir="C:/train")
    found = fetch_candidates(ops, node, "r1", ["ckpt", "C:\\x.txt"], None)  # type: ignore[arg-type]
    assert found == [
        ["C:/train/runs/r1/win1/out/ckpt", "C:/train/runs/r1/win1/ckpt", "C:/train/code/ckpt"],
        ["C:\\x.txt"],
    ]
    code_only = fetch_candidates(ops, node, "r1", ["ckpt"], None, from_code=True)  # type: ignore[arg-type]
    assert code_only == [["C:/train/code/ckpt"]]


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_a_run_directory_that_holds_a_log_is_reported_before_anything_is_made(run_dir: str) -> None:
    """launch refuses a run id that already ran on the node: the preparing script says so first."""
    line = ps.say_if_exists(f"{run_dir}/node.log", "@@ran-before")
    tree = pwsh.assert_parses(ps.wrap(line + "\n" + ps.mkdir(run_dir)))
    (test,) = find(tree, "Test-Path")
    assert test.has("-LiteralPath")  # no wildcard expansion of [ ] in the path
    assert test.arguments == [ps.path_word(f"{run_dir}/node.log")]  # one quoted word, as mkdir's
    assert line.endswith("{ Write-Output '@@ran-before'; exit 0 }")


# -- foreground runs: the follower, the watchdog, the runner (runs/windows.py) ------------------------------


def write_all_texts(tree: Any) -> list[tuple[str, str, str]]:
    """Every ``[System.IO.File]::WriteAllText(...)``: (its first argument's text, the value of the
    single-quoted literal written or the expression's text, the encoding argument or "")."""
    found = []
    for node in pwsh.walk(tree.root_node):
        text = (node.text or b"").decode()
        if node.type == "invocation_expression" and text.startswith("[System.IO.File]::WriteAllText("):
            (arguments,) = [n for n in pwsh.walk(node) if n.type == "argument_expression_list"][:1]
            parts = [c for c in arguments.children if c.type == "argument_expression"]
            texts = [(p.text or b"").decode() for p in parts] + [""]
            found.append(
                (texts[0], single_quoted_value(texts[1]) if texts[1][0] == "'" else texts[1], texts[2])
            )
    return found


def enclosing(node: Any, kind: str) -> list[Any]:
    """The ``kind`` nodes around ``node``, innermost first."""
    found = []
    while node.parent is not None:
        node = node.parent
        if node.type == kind:
            found.append(node)
    return found


def command_nodes(tree: Any, name: str) -> list[Any]:
    return [
        n
        for n in pwsh.walk(tree.root_node)
        if n.type == "command"
        and n.child_by_field_name("command_name") is not None
        and (n.child_by_field_name("command_name").text or b"").decode() == name
    ]


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_a_foreground_run_writes_its_follower_and_watchdog_then_starts_the_first_round(run_dir: str) -> None:
    log = f"{run_dir}/node.log"
    script = runs.foreground(run_dir, log, NONCE)
    tree = pwsh.assert_parses(ps.wrap(script))
    assert full_path_args(tree) == [resolved(run_dir)]
    # both files, UTF-8 with a BOM (Windows PowerShell 5.1 reads a BOM-less .ps1 as ANSI), exactly
    assert assignments(tree)["$cbBom"] == "New-Object -TypeName System.Text.UTF8Encoding -ArgumentList $true"
    assert write_all_texts(tree) == [
        ("(Join-Path -Path $cbDir -ChildPath 'watchdog.ps1')", runs.watchdog_script(run_dir), "$cbBom"),
        ("(Join-Path -Path $cbDir -ChildPath 'follow.ps1')", runs.follower_script(run_dir, log), "$cbBom"),
    ]
    # then the first round: the file just written, from byte 0, starting the run
    (invocation,) = [c for c in pwsh.commands(tree) if c.name == ps.path_word(f"{run_dir}/follow.ps1")]
    assert (invocation.parameters, invocation.arguments) == (
        ["-offset", "-nonce", "-start"],
        ["0", f"'{NONCE}'"],
    )
    assert script.rstrip().endswith(runs.follow_round(run_dir, 0, NONCE, start=True))


def test_later_rounds_are_short_commands_from_an_offset() -> None:
    run_dir = RUN_DIRS[1]
    line = runs.follow_round(run_dir, 123456789, NONCE)
    tree = pwsh.assert_parses(ps.wrap(line))
    (invocation,) = [c for c in pwsh.commands(tree) if c.name.endswith("follow.ps1'")]
    assert (invocation.parameters, invocation.arguments) == (
        ["-offset", "-nonce"],
        ["123456789", f"'{NONCE}'"],
    )
    assert len(ps.login_command(ps.wrap(line))) < 8191  # no upload of a temporary script each round
    for bad in (-1, True, "5"):
        with pytest.raises(ValueError):
            runs.follow_round(run_dir, bad, NONCE)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        runs.follow_round(run_dir, 5, "cb-x'; evil")


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_the_follower_records_itself_beats_and_starts_the_watchdog_before_the_launcher(run_dir: str) -> None:
    from orchestrator.runs.windows_follow import ROUND_SECONDS

    script = runs.follower_script(run_dir, f"{run_dir}/node.log")
    tree = pwsh.assert_parses(script)
    assert script.startswith("param([long]$Offset = 0, [string]$Nonce = '', [switch]$Start)\n")
    # its records carry the nonce each round is given
    assert "\n$cbNonce = $Nonce\nfunction Out-CbRecord(" in script
    assert full_path_args(tree) == [
        resolved(run_dir),
        resolved(f"{run_dir}/launch.ps1"),
        resolved(f"{run_dir}/node.log"),
        resolved(f"{run_dir}/node.log"),
    ]
    values = assignments(tree)
    assert values["$cbBeat"] == "Join-Path -Path $cbDir -ChildPath 'heartbeat'"
    assert values["$cbFollower"] == "Join-Path -Path $cbDir -ChildPath 'follower'"
    # its identity ("PID TICKS") to .part, then renamed into place: never read half-written
    at = script.index
    assert (
        at("[System.IO.File]::WriteAllText($cbFollower + '.part', [string]$cbSelf.Id + ' ' +")
        < at("[System.IO.File]::Delete($cbFollower)")
        < at("[System.IO.File]::Move($cbFollower + '.part', $cbFollower)")
        < at("try {\nif ($Start)")
    )
    # the heartbeat: on a steady clock, at most once a second, a failed write tolerated
    (beat,) = [n for n in pwsh.walk(tree.root_node) if (n.text or b"").startswith(b"function Set-CbBeat")]
    body = (beat.text or b"").decode()
    assert "Stopwatch" in body and "-lt 1) { return }" in body and "catch { $null = $_ }" in body
    assert "[DateTime]::UtcNow -" not in body  # no wall-clock arithmetic
    # beating while waiting for the launcher, and on every poll of the log
    beats = command_nodes(tree, "Set-CbBeat")
    loops = [enclosing(b, "while_statement") for b in beats]
    assert len(beats) == 3 and not loops[0]  # once at the start
    assert (loops[1][0].text or b"").startswith(b"while (-not [System.IO.File]::Exists($cbPidFile))")
    assert (loops[2][0].text or b"").startswith(b"while ($true)")
    # both created by the WMI service, outside the WinRS job: the watchdog first
    creates = find(tree, "Invoke-CimMethod")
    assert [c.arguments for c in creates] == [
        ["Win32_Process", "Create", "$cbWatchCreate"],
        ["Win32_Process", "Create", "$cbCreate"],
    ]
    assert "-File \"' + $cbWatchScript + '\"'" in values["$cbWatchLine"]
    assert values["$cbWatchScript"] == "Join-Path -Path $cbDir -ChildPath 'watchdog.ps1'"
    assert "-File \"' + $cbScript + '\" -Log \"' + $cbLogPath + '\"'" in values["$cbLine"]
    # the tail from the round's offset; a round ends with the record more after ROUND_SECONDS
    assert [v for t, v in all_assignments(tree) if t == "$cbOffset"] == ["= [long]$Offset", "+= $cbCut"]
    assert f"if ($cbRound.Elapsed.TotalSeconds -ge {ROUND_SECONDS:g}) {{ $cbMore = $true; break }}" in script
    assert "Out-CbRecord 'more' @([string]$cbOffset)" in script
    assert script.index("Out-CbRecord 'started' @(") < script.index("while ($true)")
    # whatever happens in the round, an end of its own deletes the identity (only a kill leaves it)
    (delete,) = [
        n
        for n in pwsh.walk(tree.root_node)
        if n.type == "invocation_expression"
        and (n.text or b"") == b"[System.IO.File]::Delete($cbFollower)"
        and enclosing(n, "finally_clause")
    ]
    (guarded,) = enclosing(delete, "try_statement")[:1]
    inside = (guarded.text or b"").decode()
    assert "Invoke-CimMethod" in inside and "while ($true)" in inside and "Out-CbRecord 'end'" in inside


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_the_watchdog_stops_the_run_when_its_follower_is_killed_or_silent(run_dir: str) -> None:
    from orchestrator.runs.windows import START_SECONDS, STOP_RUN
    from orchestrator.runs.windows_follow import STALE_SECONDS, WATCH_POLL_MS

    script = runs.watchdog_script(run_dir)
    tree = pwsh.assert_parses(script)
    assert full_path_args(tree) == [resolved(run_dir)]
    # the very Stop-CbRun `bootstrap stop` uses: by identity, never by name
    assert STOP_RUN in script and STOP_RUN in runs.stop(run_dir)
    for pattern in ("CommandLine", "-like", "-match", ".Name", "taskkill", "-Filter"):
        assert pattern not in script, pattern
    at = script.index
    loop = at("while (-not $cbWhy)")
    # each look: the run ended, or nothing of it is left: the watchdog goes, stopping nothing
    assert loop < at("if ([System.IO.File]::Exists($cbRc)) { exit 0 }")
    assert "if ([System.IO.File]::Exists($cbPidFile) -and @(Get-CbRoots).Count -eq 0) { exit 0 }" in script
    # killed: the follower file names a process that is gone, and still does when read again
    assert (
        "if ($cbLine.Trim() -and $null -eq (Get-CbLive $cbLine) -and (Read-CbText $cbFollower) -eq $cbLine)"
        in script
    )
    # silent: the heartbeat's write time unchanged for STALE_SECONDS on a steady clock
    assert "if ($cbAt -ne $cbSeen) { $cbSeen = $cbAt; $cbQuiet.Restart() }" in script
    assert f"}} elseif ($cbAge -gt {STALE_SECONDS:g}) {{" in script
    assert f"if (-not $cbWhy) {{ Start-Sleep -Milliseconds {WATCH_POLL_MS} }}" in script
    # a look that throws is tried again: the checks sit in a try inside the loop
    (check,) = [
        n
        for n in pwsh.walk(tree.root_node)
        if n.type == "if_statement" and b"$cbQuiet.Restart()" in (n.text or b"")
    ]
    assert enclosing(check, "try_statement") and enclosing(check, "while_statement")
    # then: why, in watchdog.log; a launcher still starting is waited for; the run stopped
    assert (
        loop
        < at("-ChildPath 'watchdog.log')")
        < at(f"$cbClock.Elapsed.TotalSeconds -lt {START_SECONDS}")
        < at("$null = Stop-CbRun")
    )


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_stop_says_stopped_before_it_stops_anything_and_status_reports_it(run_dir: str) -> None:
    script = runs.stop(run_dir, "ignored", nonce=NONCE)
    tree = pwsh.assert_parses(ps.wrap(script))
    (said,) = [w for w in write_all_texts(tree) if "'stopped'" in w[0]]
    assert said[1] == '[string]$cbNow + "`n"'  # Unix seconds on the node's clock, as on POSIX
    assert script.index("-ChildPath 'stopped'") < script.index("(Stop-CbRun)")
    # stopped twice: the second answer is "a stop before this one", not the code the first made
    assert script.index("'stop' @('earlier'") < script.index("'stop' @('exited'")
    status = runs.status(run_dir, "ignored", f"{run_dir}/node.log", NONCE)
    pwsh.assert_parses(ps.wrap(status))
    assert "Out-CbRecord 'stopped' @((Read-CbText $cbStopped).Trim())" in status
    parsed = parse_status(
        status_said("now=200\nstarted=100\nalive=0\nstopped=150\nsize=10\nmodified=140\n"), NONCE
    )
    assert (parsed.state, parsed.runtime) == ("stopped", 50)
    # a rank that handled TERM for 10 s, printing: it ran until its last output
    later = parse_status(
        status_said("now=200\nstarted=100\nalive=0\nstopped=150\nsize=10\nmodified=160\n"), NONCE
    )
    assert (later.state, later.runtime) == ("stopped", 60)


def test_the_runner_gives_any_job_the_launchers_contract() -> None:
    from orchestrator.runs.windows_follow import JOB_SCRIPT

    script = runs.runner_script()
    tree = pwsh.assert_parses(script)
    assert script.startswith("param([string]$Log = '')\n")
    values = assignments(tree)
    assert values["$cbDir"] == "[System.IO.Path]::GetDirectoryName($cbLogPath)"
    at = script.index
    # pid first (to .part, renamed), then the job started with its output piped, recorded in ranks
    assert at("$cbPidPart") < at("Move-Item -LiteralPath $cbPidPart -Destination $cbPidFile -Force")
    assert at("Move-Item -LiteralPath $cbPidPart") < at(
        "$cbProc = [System.Diagnostics.Process]::Start($cbInfo)"
    )
    assert f"-ChildPath '{JOB_SCRIPT}'" in values["$cbInfo.Arguments"]
    assert values["$cbInfo.RedirectStandardOutput"] == values["$cbInfo.RedirectStandardError"] == "$true"
    assert at("Process]::Start($cbInfo)") < at("-ChildPath 'ranks')")
    # every line to the log as it comes; the exit code once the log is closed
    assert script.count("$cbLog.WriteLine(") == 3
    assert at("$cbLog.Dispose()") < at("$cbLogPath + '.rc.part'") < at("($cbLogPath + '.rc') -Force")
    assert script.rstrip().endswith("exit $cbCode")


# -- the controller's side: rounds until the launcher ends -------------------------------------------------


OTHER = "cb-99887766ffee"


def rec(kind: str, *fields: str, nonce: str = NONCE) -> str:
    return records.record(nonce, kind, *fields)


def test_a_round_ends_with_more_and_the_parser_says_where_to_resume() -> None:
    from orchestrator.runs.tail import Batches

    got: list[str] = []
    batches = Batches("win1", got.append, NONCE)
    batches.block("stdout", rec("started", "4242 133") + "line 1\n" + rec("batch", "7") + rec("more", "7"))
    assert got == ["line 1\n"] and batches.offset == 7
    assert batches.more() == 7 and batches.end() is None and batches.exit_code() is None
    batches.restart(OTHER)  # the next round's nonce: the last round's records are lines of text now
    batches.block("stdout", rec("end", "0", "7") + "line 2\n" + rec("batch", "14", nonce=OTHER))
    batches.block("stdout", rec("end", "3", "14", nonce=OTHER))
    assert batches.more() is None and batches.exit_code() == 3
    assert got == ["line 1\n", rec("end", "0", "7") + "line 2\n"]


class Rounds:
    """A transport whose every run hands the next scripted answer (stdout, exit code) to on_line."""

    def __init__(self, answers: list[tuple[Callable[[str], str], int | None]]) -> None:
        self.platform = ps
        self.answers = answers
        self.scripts: list[str] = []
        self.closed = False

    def run(self, command: str, **kwargs: Any) -> Result:
        self.scripts.append(command)
        answer, code = self.answers.pop(0)
        stdout = answer(nonce_of(command))  # in the records of the round's own nonce
        if kwargs.get("on_line") is not None and stdout:
            kwargs["on_line"].block("stdout", stdout)
        return Result("win1", command, code, stdout, "", 0.5)


def test_the_controller_runs_rounds_from_each_offset_until_the_launcher_ends() -> None:
    from orchestrator.runs.start import Followed, follow_windows

    lines: list[tuple[str, str]] = []
    followed = Followed("win1", lambda stream, line: lines.append((stream, line)), NONCE)
    first = rec("started", "4242 133") + "[default0]:a\n" + rec("batch", "14") + rec("more", "14")
    followed.block("stdout", first)
    transport = Rounds(
        [
            (lambda n: "[default1]:b\n" + rec("batch", "28", nonce=n) + rec("more", "28", nonce=n), 0),
            (lambda n: rec("end", "3", "28", nonce=n), 0),
        ]
    )
    end = follow_windows(
        NODE,  # type: ignore[arg-type]
        transport,  # type: ignore[arg-type]
        "C:/train/runs/r1/win1",
        followed,
        Result("win1", "first", 0, first, "", 1.0),
    )
    # each round from the offset the last one reached, with a nonce of its own
    assert unnonced(transport.scripts) == unnonced(
        [
            runs.follow_round("C:/train/runs/r1/win1", 14, NONCE),
            runs.follow_round("C:/train/runs/r1/win1", 28, NONCE),
        ]
    )
    assert len({NONCE, *map(nonce_of, transport.scripts)}) == 3
    assert lines == [("stdout", "[default0]:a"), ("stdout", "[default1]:b")]
    assert (end.ended, end.rounds, end.result.exit_code) == (True, 3, 3)
    assert end.result.tail(2) == ["[default0]:a", "[default1]:b"] and end.result.duration == 2.0


def test_a_follower_that_ends_without_its_markers_is_an_error_and_a_cancel_ends_following() -> None:
    from orchestrator.runs.start import Followed, follow_windows

    followed = Followed("win1", lambda stream, line: None, NONCE)
    followed.block("stderr", "ERROR: the watchdog could not be started\n")
    with pytest.raises(CommandFailedError, match=r"following the run failed \(exit 4\): ERROR: the watchdog"):
        follow_windows(NODE, Rounds([]), "C:/r", followed, Result("win1", "x", 4, "", "", 1))  # type: ignore[arg-type]
    followed = Followed("win1", lambda stream, line: None, NONCE)
    followed.block("stdout", rec("more", "0"))
    cancelled = follow_windows(
        NODE,  # type: ignore[arg-type]
        Rounds([(lambda n: "", None)]),  # type: ignore[arg-type]
        "C:/r",
        followed,
        Result("win1", "x", 0, "", "", 1),
    )
    assert (cancelled.ended, cancelled.result.exit_code) == (False, None)


def test_a_native_foreground_plan_ends_with_the_follower_outside_the_job() -> None:
    from orchestrator.plans import Put, Run
    from orchestrator.runs.start import FIRST_ROUND_TIMEOUT
    from orchestrator.steps.launch import node_plan

    inventory = load_inventory_text(
        "cluster: {name: w, master: win1, backend: gloo}\n"
        "nodes:\n  - {name: win1, host: 10.0.0.1, os: windows, user: bob, nproc: 2, interface: Ethernet,\n"
        "     windows: {mode: native}}\n",
        "w.yaml",
    )
    (spec,) = plan_launch(
        inventory,
        backend="gloo",
        master_addr="10.0.0.1",
        run_id="r1",
        interfaces={"win1": ("Ethernet", None)},
        cpus={"win1": 4},
        pythons={"win1": "C:\\Python312\\python.exe"},
    )
    plan = node_plan(spec.node, ps, spec, renderer=Renderer(), nonce=NONCE)
    last = plan.actions[-1]
    run_dir = "~/cluster-bootstrap/runs/r1/win1"
    assert isinstance(last, Run) and last.script == runs.foreground(run_dir, f"{run_dir}/node.log", NONCE)
    assert last.stream and last.timeout == FIRST_ROUND_TIMEOUT and dict(last.env) == {}
    assert "outside the WinRS job" in last.what
    # the follower and the watchdog are written by that command, not uploaded: `--detach`'s dry
    # run, which replaces the last action, shows no upload it would not make
    assert [a.target for a in plan.actions if isinstance(a, Put)] == [
        f"{run_dir}/launch.ps1",
        "~/cluster-bootstrap/code/examples/train_ddp.py",
    ]
    # the code directory the script goes to, created by launch, is marked as bootstrap's (a later
    # code sync may replace what launch put there)
    prepare = plan.actions[0]
    assert isinstance(prepare, Run)
    pwsh.assert_parses(ps.wrap(prepare.script))
    assert prepare.script.count("[System.IO.Directory]::Exists(") == 1, prepare.script
    assert "($HOME + '\\cluster-bootstrap\\code\\.bootstrap-code.json')), '')" in prepare.script


def test_the_followed_lines_are_split_at_newlines_only() -> None:
    """A line holding a form feed or U+2028 (a progress bar, a pasted text) reaches the handler whole,
    as the transports split lines; a block handler gets the block as it came."""
    from orchestrator.runs.start import Followed
    from orchestrator.transports.base import BlockHandler

    lines: list[str] = []
    followed = Followed("win1", lambda stream, line: lines.append(line), NONCE)
    followed.block("stdout", "[default0]:a\x0cb\u2028c\n[default1]:d\n" + rec("batch", "19"))
    assert lines == ["[default0]:a\x0cb\u2028c", "[default1]:d"] == list(followed.kept)

    class Blocks(BlockHandler):
        def __init__(self) -> None:
            self.got: list[tuple[str, str]] = []

        def block(self, stream: str, text: str) -> None:
            self.got.append((stream, text))

    blocks = Blocks()
    followed = Followed("win1", blocks, NONCE)
    followed.block("stdout", "x\ny\n" + rec("batch", "4"))
    followed.block("stderr", "ERROR: boom\n")
    assert blocks.got == [("stdout", "x\ny\n"), ("stderr", "ERROR: boom\n")]


def _first(script: str, text: str) -> int:
    at = script.find(text)
    assert at >= 0, text
    return at


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_a_run_directory_is_checked_before_its_pid_file_is_believed(run_dir: str) -> None:
    """status, stop and the detached start end (exit 77, one line) unless the run directory is the
    connecting user's alone: owner and access list read back (Get-Acl), a reparse point refused;
    only then is Get-CbLeader or Get-CbRoots called, which read pid and ranks."""
    scripts = {
        "status": runs.status(run_dir, "", f"{run_dir}/node.log", NONCE),
        "stop": runs.stop(run_dir, nonce=NONCE),
        "start": runs.start(run_dir, f"{run_dir}/node.log", "", NONCE),
    }
    for name, script in scripts.items():
        tree = pwsh.assert_parses(ps.wrap(script))
        assert (
            assignments(tree)["$cbOwner"]
            == "$cbHeld.GetOwner([System.Security.Principal.SecurityIdentifier])"
        )
        check = _first(script, "Get-Acl -LiteralPath $cbDir")
        refuse = _first(script, "exit 77")
        uses = [script.find(f"({use})") for use in ("Get-CbLeader", "Get-CbRoots")]
        uses += [script.find("Read-CbText $cbPidFile")]
        first_use = min(u for u in uses if u >= 0)
        assert check < refuse < first_use, name
        for condition in (
            "$cbOwner -ne $cbMe",
            "$cbOthers.Count -gt 0",
            "[System.IO.FileAttributes]::ReparsePoint",
        ):
            assert condition in script, (name, condition)


def test_launch_refuses_a_windows_run_directory_that_exists_and_checks_what_it_created() -> None:
    script = ps.new_private_dir("~/cluster-bootstrap/runs/r1/win1")
    tree = pwsh.assert_parses(script)
    exists = _first(script, "if (Test-Path -LiteralPath $cbNew)")
    first_exit = _first(script, "exit 77")
    create = _first(script, "CreateDirectory(")
    acl_set = _first(script, "$cbDir.SetAccessControl($cbAcl)")
    read_back = _first(script, "Get-Acl -LiteralPath $cbNew\n")
    assert exists < first_exit < create < acl_set < read_back < script.rindex("exit 77")
    # nothing was put in it between its creation and its access list
    assert "Get-ChildItem -LiteralPath $cbNew -Force" in script
    assert assignments(tree)["$cbMe"] == "[System.Security.Principal.WindowsIdentity]::GetCurrent().User"


def test_a_native_windows_master_refuses_a_busy_rendezvous_port_before_anything_is_made() -> None:
    """On Linux the master's port was checked before the run directory was made; a native Windows
    master was not, and rank 0 then failed to bind it. The preparing script checks it there too
    (Get-NetTCPConnection) and launch says so, nothing started."""
    from orchestrator.plans import Run
    from orchestrator.steps.launch import PORT_BUSY, prepare_plan

    inventory = load_inventory_text(
        "cluster: {name: w, master: win1, backend: gloo, port: 29611}\n"
        "nodes:\n  - {name: win1, host: 10.0.0.1, os: windows, user: bob, nproc: 2, interface: Ethernet,\n"
        "     windows: {mode: native}}\n",
        "w.yaml",
    )
    (spec,) = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.1", run_id="r1",
        interfaces={"win1": ("Ethernet", None)}, cpus={"win1": 4},
        pythons={"win1": "C:\\Python312\\python.exe"},
    )  # fmt: skip
    prepare = prepare_plan(spec.node, ps, spec, renderer=Renderer()).actions[0]
    assert isinstance(prepare, Run) and prepare.check is not None
    tree = pwsh.assert_parses(ps.wrap(prepare.script))
    (listening,) = find(tree, "Get-NetTCPConnection")
    assert listening.has("-State") and listening.has("-LocalPort") and "29611" in listening.arguments
    # before the run directory is made: a refusal leaves nothing behind
    assert prepare.script.index("Get-NetTCPConnection") < prepare.script.index("CreateDirectory")
    nonce = records.NONCE.search(prepare.script)
    assert nonce is not None
    busy = records.record(nonce.group(0), PORT_BUSY, "")
    with pytest.raises(
        CommandFailedError, match="port 29611 is in use on this node, the master: rank 0 needs it"
    ):
        prepare.check(Result("win1", prepare.script, 0, busy, "", 0.1))
