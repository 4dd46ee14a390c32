"""The reachability probe on a native Windows node, through the real WinRM transport and the
WS-Management test server (tests/winrm_server), beside Linux nodes on loopback addresses.

No PowerShell runs here, so the server plays the node: the probe's script (uploaded as a .ps1, it is
longer than cmd.exe's limit) is read off its parse tree, and the Python command line it would start
through ``ProcessStartInfo`` (split with the C runtime's rules) runs for real as a process of this
machine, its output streamed back through WinRS. A stop script is answered as Windows would: the
process named by its ``ProcessId`` filter is terminated outright (no SIGTERM handler runs, as with
``Stop-Process -Force``), and ``stopped <pid>`` printed. Anything else gets an empty answer (exit 0):
a POSIX ``kill`` sent there would stop nothing, as on a real Windows machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from orchestrator.platforms import PosixShell, PowerShell
from orchestrator.steps.preflight.reachability import ReachNode, check_reachability
from orchestrator.transports.local import LocalTransport
from tests import pwsh
from tests.integration.test_winrm_transport import Emulator, _transport, assignments
from tests.unit.test_reachability import free_port
from tests.winrm_server import Answer, PwshCall, WinRMServer, cmdline

#: Stop-Process (TerminateProcess) gives the process this exit code, as WinRS reports it
TERMINATED_EXIT = 4294967295


class PlayedProbes:
    """Answers the probe scripts and the stop scripts a native node gets (see the module doc)."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stops: list[PwshCall] = []
        self.stopped: list[int] = []
        self.listeners: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, call: PwshCall) -> Answer | None:
        if "cbt-reach" in call.script:
            return self.probe(call)
        if "Stop-Process" in call.script:
            return self.stop(call)
        return None

    def probe(self, call: PwshCall) -> Answer:
        arguments = assignments(call)["$cbinfo.arguments"][1][0]
        argv = cmdline.split("python.exe " + arguments)[1:]  # what python.exe would receive
        proc = subprocess.Popen(
            [sys.executable, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with self.lock:
            self.procs[proc.pid] = proc
            if argv[4:6] == ["cbt-reach", "listen"]:  # -I -S -c SOURCE cbt-reach listen|connect ...
                self.listeners.append(proc.pid)
        answer = Answer()

        def output() -> Iterator[bytes]:
            assert proc.stdout is not None
            while data := os.read(proc.stdout.fileno(), 65536):
                yield data
            code = proc.wait()
            answer.exit_code = TERMINATED_EXIT if code < 0 else code

        answer.chunks = output()
        return answer

    def stop(self, call: PwshCall) -> Answer:
        self.stops.append(call)
        match = re.search(r"'ProcessId = (\d+)'", call.script)
        assert match, call.script
        pid = int(match.group(1))
        with self.lock:
            proc = self.procs.get(pid)
        if proc is None or proc.poll() is not None:
            return Answer()  # gone already: the script prints nothing
        os.killpg(proc.pid, signal.SIGKILL)  # TerminateProcess on the tree: no handler runs
        proc.wait()
        self.stopped.append(pid)
        return Answer(stdout=f"stopped {pid}\n")

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_native_nodes_listener_is_stopped_with_powershell_not_kill() -> None:
    """win (native Windows, the master) and n2 (Linux) listen; n3's probe cannot run (no Python), so
    neither listener gets every peer it waits for and both must be stopped. win's stop is the
    PowerShell platform's process-tree stop, which parses and ends the listener at once; no POSIX
    `kill` reaches win; its verdict rests on what it measured (n3 untested), not on how it ended."""
    played = PlayedProbes()
    server = WinRMServer(auth="ntlm", username="bob", password="pw")
    server.on_powershell = Emulator(server.files, played)
    try:
        with server:
            win = _transport(server, platform=PowerShell())
            nodes = [
                ReachNode("win", win, "python", "127.0.0.1"),
                ReachNode("n2", LocalTransport("n2", PosixShell()), sys.executable, "127.0.0.2"),
                ReachNode("n3", LocalTransport("n3", PosixShell()), "/nonexistent/python3", "127.0.0.3"),
            ]
            started = time.monotonic()
            try:
                verdicts = check_reachability(nodes, "win", free_port())
            finally:
                win.close()
            elapsed = time.monotonic() - started
            calls = list(server.calls)
    finally:
        played.kill_all()

    listeners = played.listeners
    assert len(listeners) == 1 and len(played.procs) == 2, played.procs  # win's listener, connector
    # the listener was stopped by the stop script, not by its own deadline (35 s)
    assert played.stopped == listeners, (played.stopped, listeners)
    assert elapsed < 25, elapsed
    (stop,) = played.stops
    pwsh.assert_parses(stop.script)
    assert f"'ProcessId = {listeners[0]}'" in stop.script
    assert stop.command("Stop-Process").has("-Force")
    for call in calls:  # no POSIX kill was sent to the Windows node, in any form
        assert not any(c.name.lower() == "kill" for c in call.commands), call.script
        assert "'kill'" not in call.script and "-TERM" not in call.script, call.script

    assert verdicts["n3"].level == "fail" and "/nonexistent/python3" in verdicts["n3"].reason
    for name in ("win", "n2"):  # measured, and ended as asked: only n3 is missing
        assert verdicts[name].level == "warn", verdicts[name]
        assert verdicts[name].reason.endswith("n3 not tested (probe failed)"), verdicts[name]
    pairs: list[dict[str, Any]] = verdicts["win"].data["pairs"]
    assert {(p["from"], p["to"], p["result"]) for p in pairs} == {
        ("win", "win", "ok"),
        ("n2", "win", "ok"),
        ("win", "n2", "ok"),
    }
