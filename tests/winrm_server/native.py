"""A native Windows node's side of runs, played on the test server: no PowerShell runs here, so what
the product's run scripts would do on Windows is done by this model, on the server's files
(:class:`~tests.winrm_server.server.FakeFiles`, with their write times) and its played processes
(:mod:`tests.winrm_server.processes`: jobs, ``MaxProcessesPerShell``, ``Win32_Process`` Create).

Each script is recognised on its parse tree, and the model takes its values from there: paths,
offsets, the files the follower and the watchdog use and their timings are read from the scripts
the product wrote (``follow.ps1``, ``watchdog.ps1``, ``launch.ps1``), not from the product's
Python constants. Played:

- ``launch.ps1`` (the rendered launch script): its ``$env:`` values, ``Set-Location``,
  ``$cbArguments`` and ``Start-CbRank`` calls. Each rank is a real Python process on this machine
  (the uploaded training script, with RANK and LOCAL_RANK), created as a child of the launcher, so
  in the launcher's job when there is one: over the shell's quota, ``Process.Start`` fails as on
  Windows and the script's catch ends the run with exit code 1. Rank lines go to node.log with
  ``[defaultN]:`` (CRLF, as StreamWriter writes them) and to the console when run in the shell.
  A rank exiting non-zero stops the others (taskkill /T /F); ``pid``, ``ranks``, ``node.log.rc``
  as the script writes them. A launcher terminated writes nothing more; its ranks run on.
- a foreground run's first round (``follow.ps1`` and ``watchdog.ps1`` written, then ``& follow.ps1
  -Offset 0 -Start``) and later rounds: the follower records its identity and touches the
  heartbeat, creates the watchdog and then the launcher outside the job, and serves node.log in the
  tail protocol until the launcher ends or its round is over. Killed (its shell deleted, the
  command terminated), it does nothing more: its ``follower`` file stays.
- the watchdog (a thread per run, a played process outside the job): the rules of
  ``watchdog.ps1``; when it stops a run it does what ``Stop-CbRun`` does, and writes
  ``watchdog.log``.
- `bootstrap stop` (the stop script) and `launch --detach`'s start.

Where the node decides an outcome, the decision is the script's own, run by
:mod:`tests.winrm_server.interpret`: how the watchdog and the launcher are created (``Invoke-CimMethod
Win32_Process Create``: outside every job; ``Start-Process``: the creator's child, in its job),
``watchdog.ps1`` as a whole (its rules and waits), `stop`'s script as a whole (which processes its
``Get-CbRoots`` and ``Get-CbLive`` take for the run's). The model stands in only for the machine:
files, played processes, clocks, and Stop-CbRun's terminating of the selected trees.

What this proves is the controller's side against a node that behaves as the scripts say, and that
the scripts say what the model reads; that Windows runs them so is for a real host
(docs/windows.md, "What the tests prove").
"""

from __future__ import annotations

import base64
import contextlib
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import records
from tests import pwsh
from tests.noderecords import said
from tests.winrm_server import cmdline
from tests.winrm_server.interpret import Interpreter, PwshError, ScriptExit, Unsupported
from tests.winrm_server.processes import QUOTA_MESSAGE, ProcessTable, QuotaExceeded, WinProcess
from tests.winrm_server.server import Answer, FakeFiles, PwshCall, WinRMServer

HOME = "C:\\Users\\bob"
#: a block the follower reads at once (the PowerShell producer's)
BLOCK = 1 << 20


def unquote(literal: str) -> str:
    """A single-quoted PowerShell literal's value (every kind of quote written twice is one)."""
    assert literal[:1] in "'\u2018\u2019\u201a\u201b", literal
    return re.sub(r"(['\u2018\u2019\u201a\u201b])\1", r"\1", literal[1:-1])


def path_of(word: str) -> str:
    """A path word of ``PowerShell.path_word`` as the node resolves it (``$HOME``: the profile)."""
    word = word.strip()
    if word == "$HOME":
        return HOME
    match = re.fullmatch(r"\(\$HOME \+ (.+)\)", word, re.S)
    if match:
        return HOME + unquote(match.group(1))
    return unquote(word)


def full_path_of(expression: str) -> str:
    """``$ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath(WORD)``'s path."""
    prefix = "$ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath("
    assert expression.startswith(prefix) and expression.endswith(")"), expression
    return path_of(expression[len(prefix) : -1])


def assigned(tree: Any) -> dict[str, str]:
    """``$name = value`` on the tree: the first value of each variable (lower-cased name)."""
    found: dict[str, str] = {}
    for node in pwsh.walk(tree.root_node):
        if node.type == "assignment_expression":
            left = (node.children[0].text or b"").decode().lower()
            found.setdefault(left, (node.children[-1].text or b"").decode())
    return found


def written_files(tree: Any) -> list[tuple[str, str]]:
    """``[System.IO.File]::WriteAllText((Join-Path -Path $cbDir -ChildPath NAME), TEXT, ...)``: (NAME,
    TEXT) for each, from their literals."""
    found = []
    for node in pwsh.walk(tree.root_node):
        text = node.text or b""
        if node.type == "invocation_expression" and text.startswith(b"[System.IO.File]::WriteAllText("):
            literals = [
                unquote((n.text or b"").decode())
                for n in pwsh.walk(node)
                if n.type == "verbatim_string_characters"
            ]
            if len(literals) == 2:
                found.append((literals[0], literals[1]))
    return found


def number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} is not in the script"
    return float(match.group(1))


def creations(root: Any) -> list[tuple[str, str]]:
    """The processes a script creates, in order: (how, what). How: ``wmi`` (``Invoke-CimMethod
    -ClassName Win32_Process -MethodName Create``: outside every job) or ``child`` (``Start-Process``,
    ``[System.Diagnostics.Process]::Start``: a child of the script's process, in its job). What:
    ``watchdog`` or ``launcher``, from the script the command line names (``$cbScript``: the
    launcher), followed through the variables it is built from."""
    values: dict[str, str] = {}
    for node in pwsh.walk(root):
        if node.type == "assignment_expression":
            values[(node.children[0].text or b"").decode().strip().lower()] = (
                node.children[-1].text or b""
            ).decode()

    def expanded(source: str, depth: int = 0) -> str:
        if depth > 4:
            return source
        words = set(re.findall(r"\$[A-Za-z_][A-Za-z0-9_]*", source))
        return source + "".join(expanded(values[w.lower()], depth + 1) for w in words if w.lower() in values)

    found: list[tuple[str, str]] = []
    for node in pwsh.walk(root):
        source = (node.text or b"").decode()
        how = ""
        if node.type == "command":
            command = pwsh.commands_of(node)
            if command.name == "Invoke-CimMethod":
                words = [a.strip("'\"").lower() for a in command.arguments]
                if "win32_process" in words and "create" in words:
                    how = "wmi"
            elif command.name.lower() in ("start-process", "saps", "start"):
                how = "child"
        elif node.type == "invocation_expression" and source.lower().startswith(
            "[system.diagnostics.process]::start("
        ):
            how = "child"
        if not how:
            continue
        everything = expanded(source).lower()
        what = "watchdog" if "watchdog.ps1" in everything else "launcher" if "$cbscript" in everything else ""
        if what:
            found.append((how, what))
    return found


class StringBuilder:
    """[System.Text.StringBuilder]: Append returns the builder, as .NET's does."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def Append(self, value: Any) -> StringBuilder:
        self.parts.append(str(value))
        return self

    def ToString(self) -> str:
        return "".join(self.parts)


class _Utf8:
    """[System.Text.Encoding]::UTF8."""

    def GetBytes(self, value: Any) -> bytes:
        return str(value).encode("utf-8")


def console_writer(lines: list[str]) -> Any:
    """[Console]::Out: WriteLine adds a line; Write adds text, complete lines to ``lines``."""
    pending: list[str] = []

    def write(value: Any) -> None:
        pending.append(str(value))
        *done, rest = "".join(pending).split("\n")
        lines.extend(done)
        pending[:] = [rest] if rest else []

    return type(
        "Writer",
        (),
        {"WriteLine": staticmethod(lambda value: lines.append(str(value))), "Write": staticmethod(write)},
    )()


#: the .NET members Out-CbRecord (PowerShell.record_functions) uses: the product's encoder runs
ENCODER_STATICS: dict[str, Any] = {
    "[System.Text.Encoding]::UTF8": _Utf8(),
    "[System.Convert]::ToBase64String": lambda data: base64.b64encode(bytes(data)).decode(),
}


class _Stopwatch:
    """[System.Diagnostics.Stopwatch], on the monotonic clock."""

    def __init__(self) -> None:
        self.began = time.monotonic()

    def Restart(self) -> None:
        self.began = time.monotonic()

    @property
    def Elapsed(self) -> Any:
        seconds = time.monotonic() - self.began
        return type("TimeSpan", (), {"TotalSeconds": seconds, "TotalMilliseconds": seconds * 1000})()


class _Process:
    """A played process as [System.Diagnostics.Process] shows it."""

    def __init__(self, proc: WinProcess) -> None:
        self.proc = proc
        self.Id = proc.pid
        ticks = proc.ticks
        self.StartTime = type("DateTime", (), {"ToFileTimeUtc": staticmethod(lambda: ticks)})()

    @property
    def HasExited(self) -> bool:
        return not self.proc.alive


class Killed(Exception):
    """The played process running the script was terminated: it does nothing more."""


@dataclass
class Run:
    """What the node holds of one run directory."""

    run_dir: str
    launcher: WinProcess | None = None
    ranks: list[WinProcess] = field(default_factory=list)
    watchdog: WinProcess | None = None
    code: int | None = None


class NativeNode:
    """Plays a native Windows node on ``server`` (see the module docstring); the transport's file
    transfers are emulated (tests.integration.test_winrm_transport.Emulator). ``disk``: a real
    directory standing for the node's disk where rank programs run from."""

    def __init__(self, server: WinRMServer, disk: Path, python: str = sys.executable) -> None:
        from tests.integration.test_winrm_transport import Emulator

        self.server = server
        self.files: FakeFiles = server.files
        self.table: ProcessTable = server.processes
        self.disk = disk
        self.python = python
        self.runs: dict[str, Run] = {}
        self.calls: dict[str, list[PwshCall]] = {}
        self.errors: list[str] = []  # what the model found wrong in a script (fails the test)
        #: run.ps1's job (runs.start.run_outside_job): job.ps1's text -> the argv of the real
        #: process standing for ``powershell.exe -File job.ps1`` (PowerShell cannot run here)
        self.jobs: Callable[[str], list[str]] | None = None
        #: the TCP ports something listens on (``Get-NetTCPConnection -State Listen -LocalPort P``)
        self.listening: set[int] = set()
        self._lock = threading.Lock()
        server.on_powershell = Emulator(server.files, self.answer)

    # -- dispatch -----------------------------------------------------------------------------------

    def kind(self, call: PwshCall) -> str:
        names = [c.name for c in call.commands]
        if any(n.endswith("follow.ps1')") for n in names):
            return "round"
        if any(n.endswith("launch.ps1')") for n in names):
            return "launch-in-shell"
        if "Stop-CbRun" in names and "Out-CbRecord 'stop' @('terminated'" in call.script:
            return "stop"
        if "Out-CbRecord 'started'" in call.script and creations(call.tree.root_node):
            return "start"
        if "Test-Path" in names and "Write-Output" in names:
            return "say-if-exists"
        return "other"

    def answer(self, call: PwshCall) -> Answer | None:
        kind = self.kind(call)
        with self._lock:
            self.calls.setdefault(kind, []).append(call)
        if kind == "round":
            return self._round(call)
        if kind == "launch-in-shell":
            return self._launch_in_shell(call)
        if kind == "stop":
            return self._stop(call)
        if kind == "start":
            return self._start(call)
        if kind == "say-if-exists":
            return self._say_if_exists(call)
        return None

    def _guard(self, body: Callable[..., None]) -> Callable[..., None]:
        """A played process's thread: what goes wrong in the model is kept for the test to fail on."""

        def guarded(*args: Any) -> None:
            try:
                body(*args)
            except Exception as exc:
                self.errors.append(f"{body.__name__}: {exc!r}")
                raise

        return guarded

    def run(self, run_dir: str) -> Run:
        with self._lock:
            return self.runs.setdefault(run_dir.lower(), Run(run_dir))

    def path(self, run_dir: str, name: str) -> str:
        return f"{run_dir}\\{name}"

    def read(self, path: str) -> str:
        try:
            return self.files[path].decode("utf-8-sig")
        except KeyError:
            return ""

    def _say_if_exists(self, call: PwshCall) -> Answer | None:
        """``if (Test-Path -LiteralPath PATH) { Write-Output 'WORD'; exit 0 }`` (PowerShell.say_if_exists):
        the word when the file is there; then, on the master, ``if (Get-NetTCPConnection ... -LocalPort
        P ...) { Write-Output 'RECORD'; exit 0 }`` (PowerShell.say_if_listening): the record when
        something listens on P (``listening``); else the rest of the script (directories are not
        played)."""
        # the one on a path written out (new_private_dir and check_own_dir test a variable's path:
        # directories are not played, so those checks pass here)
        (test,) = [c for c in call.commands if c.name == "Test-Path" and not c.arguments[0].startswith("$")]
        says = [c for c in call.commands if c.name == "Write-Output"]
        assert test.parameters == ["-literalpath"], test
        if path_of(test.arguments[0]) in self.files:
            return Answer(stdout=unquote(says[0].arguments[0]) + "\n")
        ports = [c for c in call.commands if c.name == "Get-NetTCPConnection"]
        for port in ports:
            assert port.has("-State") and "Listen" in port.arguments and port.has("-LocalPort"), port
            if any(a.isdigit() and int(a) in self.listening for a in port.arguments):
                return Answer(stdout=unquote(says[1].arguments[0]) + "\n")
        return None

    # -- running the product's own decisions --------------------------------------------------------

    def interpreter(self, me: WinProcess | None, out: list[str] | None = None) -> Interpreter:
        """An interpreter of a run script executed by the played process ``me``: the script's own
        functions decide (Get-CbLive, Get-CbRoots: which processes are the run's), the model stands
        in for the machine (files, processes, clocks; Read-CbText reads a file; Stop-CbRun stops the
        trees of the roots the script's Get-CbRoots selects). ``out``: [Console]::Out's lines."""
        table, files = self.table, self.files
        lines = out if out is not None else []

        def alive() -> None:
            if me is not None and not me.alive:
                raise Killed()

        def write_all(path: str, text: str, *rest: Any) -> None:
            with table.lock:
                alive()
                files[str(path)] = str(text).encode("utf-8")

        def get_process(pid: int) -> _Process:
            found = table.find(int(pid))
            if found is None:
                raise PwshError(f"Cannot find a process with the process identifier {pid}.")
            return _Process(found)

        def sleep(positional: list[Any], named: dict[str, Any]) -> None:
            alive()
            time.sleep(float(named.get("milliseconds", 0)) / 1000 or float(named.get("seconds", 0)))
            alive()

        def new_object(positional: list[Any], named: dict[str, Any]) -> Any:
            type_name = str(named.get("typename", positional[0] if positional else "")).lower()
            if type_name.startswith("system.collections.generic.list["):
                return []
            if type_name == "system.text.utf8encoding":
                return object()
            if type_name == "system.text.stringbuilder":
                return StringBuilder()
            raise Unsupported(f"New-Object {type_name}")

        interpreter: Interpreter

        def stop_run(positional: list[Any], named: dict[str, Any]) -> str:
            alive()
            roots = interpreter.invoke("Get-CbRoots", [], {})
            stopped = 0
            for root in roots if isinstance(roots, list) else [roots]:
                if isinstance(root, _Process):
                    stopped += len(table.terminate_tree(root.proc))
            return f"{stopped} 0"

        writer = console_writer(lines)
        resolver = type(
            "Path",
            (),
            {"GetUnresolvedProviderPathFromPSPath": staticmethod(lambda word: self._resolve(str(word)))},
        )
        context = type("Context", (), {"SessionState": type("State", (), {"Path": resolver()})()})()
        now = type(
            "Now",
            (),
            {
                "ToString": staticmethod(lambda *a: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
                "Ticks": int(time.time() * 10_000_000) + 621355968000000000,
            },
        )()
        interpreter = Interpreter(
            {"$home": HOME, "$executioncontext": context, "$erroractionpreference": "Stop"},
            {
                "Set-StrictMode": lambda p, n: None,
                "Read-CbText": lambda p, n: self.read(str(p[0])),
                "Join-Path": lambda p, n: f"{n['path']}\\{n['childpath']}",
                "New-Object": new_object,
                "Start-Sleep": sleep,
                "Stop-CbRun": stop_run,
                # Test-Path only guards the run directory's owner and access-list check
                # (PowerShell.check_own_dir_in), which the played node cannot model (no access
                # lists): that check is script text only (tests/unit/test_runs_windows.py)
                "Test-Path": lambda p, n: False,
            },
            {
                "[System.IO.File]::Exists": lambda path: str(path) in files,
                "[System.IO.Directory]::Exists": lambda path: any(
                    k.lower().startswith(str(path).lower() + "\\") for k in list(files)
                ),
                "[System.IO.File]::GetLastWriteTimeUtc": lambda path: files.mtime(str(path)) or 0.0,
                "[System.IO.File]::WriteAllText": write_all,
                "[DateTime]::MinValue": -1.0,
                "[DateTime]::UtcNow": now,
                "[Math]::Floor": lambda x: float(int(x // 1)),
                "[System.Diagnostics.Stopwatch]::StartNew": _Stopwatch,
                "[System.Diagnostics.Process]::GetProcessById": get_process,
                "[Console]::Out": writer,
                "[Console]::Error": writer,
                **ENCODER_STATICS,
            },
        )
        return interpreter

    def _resolve(self, word: str) -> str:
        return word if re.match(r"^([A-Za-z]:\\|\\\\)", word) else f"{HOME}\\{word}"

    def run_script(self, script: str, me: WinProcess | None) -> tuple[int, list[str]]:
        """The whole script, interpreted (see :meth:`interpreter`): its exit code and output lines."""
        tree = pwsh.assert_parses(script)
        out: list[str] = []
        interpreter = self.interpreter(me, out)
        interpreter.define(tree)
        try:
            interpreter.block(tree.root_node)
        except ScriptExit as done:
            return done.code, out
        return 0, out

    # -- the launcher (launch.ps1) --------------------------------------------------------------------

    def start_launcher(
        self, run: Run, proc: WinProcess, console: Callable[[str, str], None] | None = None
    ) -> threading.Thread:
        """launch.ps1 -Log node.log, played in ``proc`` (a process created outside the job by
        Win32_Process Create, or the WinRS command's own powershell.exe)."""
        run.launcher = proc
        thread = threading.Thread(
            target=self._guard(self._launcher),
            args=(run, proc, console),
            name=f"launcher-{proc.pid}",
            daemon=True,
        )
        thread.start()
        return thread

    def _launcher(self, run: Run, proc: WinProcess, console: Callable[[str, str], None] | None) -> None:
        table, files = self.table, self.files
        log = self.path(run.run_dir, "node.log")
        script = self.read(self.path(run.run_dir, "launch.ps1"))
        tree = pwsh.assert_parses(script)
        values = assigned(tree)
        env = {}
        for node in pwsh.walk(tree.root_node):
            if node.type == "assignment_expression":
                left = (node.children[0].text or b"").decode()
                right = (node.children[-1].text or b"").decode()
                if left.startswith("$env:") and right[:1] == "'":
                    env[left[5:]] = unquote(right)
        (cd,) = [c for c in pwsh.commands(tree) if c.name == "Set-Location"]
        code_dir = path_of(cd.arguments[0])
        argv = cmdline.split("python.exe " + unquote(values["$cbarguments"]))[1:]
        ranks = [
            (int(c.arguments[0]), int(c.arguments[1]))
            for c in pwsh.commands(tree)
            if c.name == "Start-CbRank"
        ]
        here = self.disk / f"p{proc.pid}"
        here.mkdir(parents=True, exist_ok=True)
        program = here / Path(argv[0].replace("\\", "/")).name
        program.write_bytes(self.files[f"{code_dir}\\{argv[0]}"])

        def write(text: str, stderr: bool = False) -> bool:
            """Write-CbLine: to the console and node.log, only while the launcher lives."""
            with table.lock:
                if not proc.alive:
                    return False
                files.append(log, (text + "\r\n").encode("utf-8"))
            if console is not None:
                console("stderr" if stderr else "stdout", text)
            return True

        with table.lock:
            if not proc.alive:
                return
            files[self.path(run.run_dir, "pid")] = (proc.identity + "\n").encode()
        code = 0
        started: list[tuple[int, WinProcess]] = []
        pumps: list[threading.Thread] = []

        def pump(stream: Any, prefix: str, stderr: bool) -> None:
            for raw in iter(stream.readline, b""):
                if not write(prefix + raw.decode("utf-8", "replace").rstrip("\r\n"), stderr):
                    break  # the launcher is gone: nobody reads this pipe any more
            stream.close()

        try:
            for local, global_rank in ranks:
                rank_env = {**os.environ, **env, "RANK": str(global_rank), "LOCAL_RANK": str(local)}
                try:
                    child = table.create(
                        "python.exe",
                        f"python.exe {' '.join(argv)}",
                        parent=proc,
                        argv=[self.python, str(program), *argv[1:]],
                        env=rank_env,
                        cwd=here,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                    )
                except QuotaExceeded:
                    raise RuntimeError(
                        f'Exception calling "Start" with "1" argument(s): "{QUOTA_MESSAGE}"'
                    ) from None
                run.ranks.append(child)
                started.append((local, child))
                with table.lock:
                    if proc.alive:
                        files.append(self.path(run.run_dir, "ranks"), (child.identity + "\n").encode())
                assert child.linux is not None and child.linux.stdout and child.linux.stderr
                for stream, stderr in ((child.linux.stdout, False), (child.linux.stderr, True)):
                    t = threading.Thread(
                        target=pump, args=(stream, f"[default{local}]:", stderr), daemon=True
                    )
                    t.start()
                    pumps.append(t)
            done: set[int] = set()
            while proc.alive and len(done) < len(started):
                for local, child in started:
                    if child.pid in done or child.alive:
                        continue
                    done.add(child.pid)
                    exit_code = child.exit_code or 0
                    if exit_code != 0 and code == 0:
                        code = exit_code
                        write(
                            f"local rank {local} exited with code {exit_code}: stopping the other ranks", True
                        )
                        for _, other in started:
                            if other.alive:
                                table.terminate_tree(other)
                time.sleep(0.02)
            for t in pumps:
                t.join(10)
        except Exception as exc:  # the script's catch
            write(f"ERROR: {exc}", True)
            code = code or 1
        finally:
            for _, child in started:  # also on Ctrl-C: no rank outlives the script (when it runs)
                if child.alive and proc.alive:
                    table.terminate_tree(child)
        with table.lock:
            if not proc.alive:
                return  # terminated: no exit code written
            files[log + ".rc"] = f"{code}\n".encode()
            run.code = code
        table.exited(proc, code)

    # -- run.ps1: any job run outside the shell's job ---------------------------------------------------

    def start_runner(self, run: Run, proc: WinProcess) -> None:
        run.launcher = proc
        threading.Thread(target=self._guard(self._runner), args=(run, proc), daemon=True).start()

    def _runner(self, run: Run, proc: WinProcess) -> None:
        table, files = self.table, self.files
        log = self.path(run.run_dir, "node.log")
        runner = pwsh.assert_parses(self.read(self.path(run.run_dir, "run.ps1")))
        assert "job.ps1" in (runner.root_node.text or b"").decode()
        job = self.read(self.path(run.run_dir, "job.ps1"))
        pwsh.assert_parses(job)
        assert self.jobs is not None, "a job ran, and the test gave no program for it"
        with table.lock:
            if not proc.alive:
                return
            files[self.path(run.run_dir, "pid")] = (proc.identity + "\n").encode()
        child = table.create(
            "powershell.exe",
            "powershell.exe -File job.ps1",
            parent=proc,
            argv=self.jobs(job),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # both streams into the log, in order
        )
        run.ranks.append(child)
        with table.lock:
            if proc.alive:
                files.append(self.path(run.run_dir, "ranks"), (child.identity + "\n").encode())
        assert child.linux is not None and child.linux.stdout is not None
        for raw in iter(child.linux.stdout.readline, b""):
            with table.lock:
                if not proc.alive:
                    break
                files.append(log, raw.rstrip(b"\r\n") + b"\r\n")
        child.linux.stdout.close()
        child.ended.wait()
        with table.lock:
            if not proc.alive:
                return
            run.code = child.exit_code or 0
            files[log + ".rc"] = f"{run.code}\n".encode()
        table.exited(proc, run.code)

    # -- Win32_Process Create -------------------------------------------------------------------------

    def create_outside_job(self, command_line: str) -> WinProcess:
        """``Invoke-CimMethod Win32_Process Create``: the WMI service creates it, in no WinRS job."""
        return self.table.create("powershell.exe", command_line, parent=None, job=None)

    def _start(self, call: PwshCall) -> Answer:
        """`launch --detach`'s start: the launcher created as the script creates it; its pid reported."""
        run = self.run(full_path_of(assigned(call.tree)["$cbdir"]))
        (how,) = [how for how, what in creations(call.tree.root_node) if what == "launcher"]
        assert call.process is not None
        proc = self.create(how, call.process, "powershell.exe -File launch.ps1 -Log node.log")
        self.start_launcher(run, proc)
        pid = self.path(run.run_dir, "pid")
        while not self.read(pid) and proc.alive:
            time.sleep(0.02)
        return Answer(stdout=said(call.script, ("started", self.read(pid).strip())))

    def create(self, how: str, creator: WinProcess, command_line: str) -> WinProcess:
        """A process the script creates: by WMI outside every job, or as the creator's child, in its
        job (QuotaExceeded when that job is full)."""
        if how == "wmi":
            return self.create_outside_job(command_line)
        return self.table.create("powershell.exe", command_line, parent=creator)

    # -- the old way: launch.ps1 inside the WinRS shell's job -----------------------------------------

    def _launch_in_shell(self, call: PwshCall) -> Answer:
        (invocation,) = [c for c in call.commands if c.name.endswith("launch.ps1')")]
        assert invocation.parameters == ["-log"], invocation
        run = self.run(path_of(invocation.name).rsplit("\\", 1)[0])
        assert call.process is not None
        lines: queue.Queue[tuple[str, str] | None] = queue.Queue()
        answer = Answer()
        thread = self.start_launcher(run, call.process, lambda stream, text: lines.put((stream, text)))

        def chunks() -> Iterator[bytes]:
            finished = threading.Thread(target=lambda: (thread.join(), lines.put(None)), daemon=True)
            finished.start()
            while (item := lines.get()) is not None:
                if item[0] == "stdout":
                    yield (item[1] + "\r\n").encode()
                else:
                    answer.console_stderr = str(answer.console_stderr) + item[1] + "\n"
            answer.exit_code = run.code if run.code is not None else 1

        answer.chunks = chunks()
        return answer

    # -- the follower's rounds ------------------------------------------------------------------------

    def _round(self, call: PwshCall) -> Answer:
        for path, text in written_files(call.tree):  # the first round writes follow.ps1, watchdog.ps1
            run_dir = full_path_of(assigned(call.tree)["$cbdir"])
            self.files[self.path(run_dir, path)] = b"\xef\xbb\xbf" + text.encode("utf-8")
        (invocation,) = [c for c in call.commands if c.name.endswith("follow.ps1')")]
        script_path = path_of(invocation.name)
        run = self.run(script_path.rsplit("\\", 1)[0])
        offset = int(invocation.arguments[0])
        assert invocation.parameters[:2] == ["-offset", "-nonce"], invocation
        nonce = unquote(invocation.arguments[1])
        start = "-start" in invocation.parameters
        assert call.process is not None
        answer = Answer()
        answer.chunks = self._follower(run, call.process, offset, nonce, start, answer)
        return answer

    def _follower(
        self, run: Run, me: WinProcess, offset: int, nonce: str, start: bool, answer: Answer
    ) -> Iterator[bytes]:
        table, files, run_dir = self.table, self.files, run.run_dir
        script = self.read(self.path(run_dir, "follow.ps1"))
        tree = pwsh.assert_parses(script)
        values = assigned(tree)
        beat_file = self.path(run_dir, unquote(re.findall(r"'[^']*'", values["$cbbeat"])[-1]))
        follower_file = self.path(run_dir, unquote(re.findall(r"'[^']*'", values["$cbfollower"])[-1]))
        round_seconds = number(
            r"\$cbRound\.Elapsed\.TotalSeconds -ge ([0-9.]+)\) \{ \$cbMore = \$true", script
        )
        interval = number(r"Start-Sleep -Milliseconds ([0-9]+)\n  \}\n\} finally", script) / 1000
        log, rc, pid_file = (self.path(run_dir, n) for n in ("node.log", "node.log.rc", "pid"))
        last_beat = 0.0

        def alive_write(path: str, data: bytes) -> bool:
            with table.lock:
                if not me.alive:
                    return False
                files[path] = data
                return True

        def beat() -> bool:
            nonlocal last_beat
            if time.monotonic() - last_beat < 1:
                return me.alive
            last_beat = time.monotonic()
            return alive_write(beat_file, str(time.time_ns() // 100).encode())

        if not alive_write(follower_file, (me.identity + "\n").encode()) or not beat():
            return
        if start:
            # what the -Start block creates, how and in which order: as the script says
            (block,) = [
                n
                for n in pwsh.walk(tree.root_node)
                if n.type == "if_statement" and (n.text or b"").startswith(b"if ($Start)")
            ]
            made = creations(block)
            assert [what for _, what in made] == ["watchdog", "launcher"], made
            script_name = full_path_of(values["$cbscript"]).rsplit("\\", 1)[-1]
            try:
                run.watchdog = self.create(made[0][0], me, "powershell.exe -File watchdog.ps1")
                threading.Thread(
                    target=self._guard(self._watchdog), args=(run, run.watchdog), daemon=True
                ).start()
                launcher = self.create(made[1][0], me, f"powershell.exe -File {script_name} -Log node.log")
            except QuotaExceeded as exc:
                answer.console_stderr = f"{exc}\n"
                answer.exit_code = 1
                return
            if script_name == "run.ps1":
                self.start_runner(run, launcher)
            else:
                assert script_name == "launch.ps1", script_name
                self.start_launcher(run, launcher)
            began = time.monotonic()
            while not self.read(pid_file):
                if not me.alive:
                    return
                if not launcher.alive or time.monotonic() - began > 60:
                    answer.console_stderr = f"the launcher (process {launcher.pid}) did not start\n"
                    answer.exit_code = 5
                    with table.lock:  # the script's finally
                        if me.alive:
                            files.pop(follower_file, None)
                    return
                beat()
                time.sleep(0.05)
            yield records.record(nonce, "started", self.read(pid_file).strip()).encode()
        began = time.monotonic()
        more = False
        while True:
            if not beat():
                return  # killed: nothing more, the follower file stays
            launcher_line = self.read(pid_file)
            fin = self.read(rc) != "" or (launcher_line != "" and table.by_identity(launcher_line) is None)
            data = files.get(log, b"")
            while len(data) > offset:
                chunk = data[offset : offset + BLOCK]
                cut = chunk.rfind(b"\n") + 1
                if fin and len(chunk) == len(data) - offset:
                    cut = len(chunk)
                elif cut == 0:
                    if len(chunk) < BLOCK:
                        break
                    cut = len(chunk)
                text = chunk[:cut]
                offset += cut
                if not text.endswith(b"\n"):
                    text += b"\n"
                if not me.alive:
                    return
                yield records.escape(text) + records.record(nonce, "batch", str(offset)).encode()
            if fin:
                break
            if time.monotonic() - began >= round_seconds:
                more = True
                break
            time.sleep(interval)
        if not me.alive:
            return
        if more:
            yield records.record(nonce, "more", str(offset)).encode()
        else:
            code = self.read(rc).strip() or "none"
            yield records.record(nonce, "end", code, str(offset)).encode()
        with table.lock:  # a round that ends by itself: its identity goes
            if me.alive:
                files.pop(follower_file, None)

    # -- the watchdog ---------------------------------------------------------------------------------

    def _watchdog(self, run: Run, me: WinProcess) -> None:
        """watchdog.ps1 as written, interpreted: its rules, its waits, its Stop-CbRun (the model's,
        on the roots the script's Get-CbRoots selects)."""
        try:
            self.run_script(self.read(self.path(run.run_dir, "watchdog.ps1")), me)
        except Killed:
            return
        self.table.exited(me, 0)

    # -- stopping -------------------------------------------------------------------------------------

    def _stop(self, call: PwshCall) -> Answer:
        """`bootstrap stop`'s script, interpreted: which processes are the run's is what its
        Get-CbRoots and Get-CbLive select; Stop-CbRun ends their trees; its answers are the records
        its own Out-CbRecord prints."""
        code, out = self.run_script(call.script, None)
        return Answer(stdout="".join(line + "\n" for line in out), exit_code=code)

    # -- what a test asks ----------------------------------------------------------------------------

    def processes_of(self, run_dir: str) -> list[WinProcess]:
        """Every live played process of the run: launcher, ranks (and their real processes), watchdog."""
        run = self.run(run_dir)
        mine = [p for p in [run.launcher, run.watchdog, *run.ranks] if p is not None]
        return [p for p in mine if p.alive or (p.linux is not None and p.linux.poll() is None)]

    def await_gone(self, run_dir: str, seconds: float) -> float:
        """Wait until no process of the run is left; how long it took (AssertionError past ``seconds``)."""
        began = time.monotonic()
        while self.processes_of(run_dir):
            if time.monotonic() - began > seconds:
                left = [f"{p.image} {p.pid}" for p in self.processes_of(run_dir)]
                raise AssertionError(f"still running after {seconds:.0f} s: {left}")
            time.sleep(0.05)
        return time.monotonic() - began


@contextlib.contextmanager
def native_node(server: WinRMServer) -> Iterator[NativeNode]:
    """A NativeNode on ``server`` with a temporary disk."""
    with tempfile.TemporaryDirectory(prefix="native-node-") as disk:
        yield NativeNode(server, Path(disk))
