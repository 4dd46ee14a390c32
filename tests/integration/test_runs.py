"""Run management against real sshd: detached launchers, logs from byte offsets across a dropped
connection, status, stop by run identity (and only that run), fetch.

The launchers here are small shell/Python scripts, not torchrun: these tests are about what happens
around a run (tests/e2e/test_detach.py does the same through the CLI with real torchrun runs).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator import records
from orchestrator.logs import RunLog
from orchestrator.runs.control import fetch_node, follow_node, status_node, stop_node
from orchestrator.runs.layout import RUN_MARKER_ENV, run_dir_for, run_marker
from orchestrator.runs.start import start_node
from orchestrator.transports.base import BlockHandler, Stream
from orchestrator.transports.ssh import SSHTransport
from tests import netns
from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import BOOTSTRAP, CliRun, connected_root_transport, root_transport, write_inventory
from tests.noderecords import nonce_of

MARKER_ENV = RUN_MARKER_ENV.encode()
Bootstrap = Callable[..., CliRun]


def await_(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until it returns something truthy (no fixed sleeps in tests)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


def run_pids(marker: str) -> set[int]:
    """Live (non-zombie) processes on this machine carrying the run marker, of any launch (the value
    ends in its launcher's token: every namespace host shares this machine's process table)."""
    wanted = MARKER_ENV + b"=" + marker.encode() + b"/"
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if state != b"Z" and any(e.startswith(wanted) and e.count(b"/") == wanted.count(b"/") for e in env):
            found.add(int(entry))
    return found


def namespace_run_pids(cluster: NamespaceCluster, host: TestHost, run_id: str) -> set[int]:
    """Live processes in ``host``'s namespace that belong to ``run_id`` (any node's part of it): the
    marker in their environment, or the run id in their command line."""
    listed = subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True, check=True)
    prefix = MARKER_ENV + b"=" + run_id.encode() + b"/"
    found = set()
    for pid in map(int, listed.stdout.split()):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except (OSError, IndexError):
            continue
        if state != b"Z" and (any(e.startswith(prefix) for e in env) or run_id.encode() in cmdline):
            found.add(pid)
    return found


def cut_ssh_sessions(cluster: NamespaceCluster, host: TestHost) -> int:
    """Kill every sshd session process on ``host`` (not its listener): each connection drops as if
    the network had failed. Returns how many were killed."""
    listener = cluster._sshd[host.name].proc.pid  # the listener itself
    pids = subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True, check=True)
    killed = 0
    for pid in map(int, pids.stdout.split()):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if pid != listener and comm in ("sshd", "sshd-session"):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


@pytest.fixture
def node1(cluster: NamespaceCluster, ctl_home: Path) -> Iterator[SSHTransport]:
    with connected_root_transport(cluster, ctl_home) as t:
        yield t


def _node(tmp_path: Path, name: str = "node1") -> Any:
    # what run_dir_for and the steps read from an inventory node
    return SimpleNamespace(name=name, workdir=str(tmp_path / "wd"), nproc=1)


def _start(ns: str, t: SSHTransport, node: Any, run_id: str, script: str) -> Path:
    run_dir = run_dir_for(node, run_id)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    Path(run_dir, "launch.sh").write_text(script)
    with netns.inside(ns):
        started = start_node(node, t, run_id)
    assert started.run_dir == run_dir and started.pid > 0
    return Path(run_dir)


#: the node side of `logs`: one Python process (what the CLI uses), or the shell loop with tail + awk
READERS = [sys.executable, None]


def _follow(
    ns: str,
    t: SSHTransport | Watched,
    node: Any,
    run_id: str,
    follow: bool,
    lines: list[str],
    notes: list[str],
    python: str | None,
    tail: int | None = None,
) -> Any:
    with netns.inside(ns):  # a reconnect opens its socket from this thread: in the namespace
        return follow_node(
            node,
            t,  # type: ignore[arg-type]
            run_id,
            follow=follow,
            python=python,
            on_line=lambda _n, line: lines.append(line),
            on_note=lambda _n, note: notes.append(note),
            lines=tail,
        )


@pytest.mark.parametrize("python", READERS, ids=["python", "shell"])
def test_detached_run_survives_our_connection_and_reports_status(
    cluster: NamespaceCluster, node1: SSHTransport, tmp_path: Path, python: str | None
) -> None:
    node = _node(tmp_path)
    flag = tmp_path / "go"
    run_dir = _start(
        cluster.controller_ns,
        node1,
        node,
        "r-status",
        f"echo first\nprintf 'part'\nwhile [ ! -e {flag} ]; do sleep 0.05; done\n"
        "echo ial\necho last\nexit 3\n",
    )
    node1.close()  # the controller goes away: the launcher must not notice
    t = root_transport(cluster, cluster.hosts[0], node1.options.known_hosts, node1.options.ssh_config)
    with netns.inside(cluster.controller_ns):
        t.connect()
        await_(
            lambda: (run_dir / "node.log").exists() and b"part" in (run_dir / "node.log").read_bytes(),
            10,
            "output",
        )
        running = status_node(node, t, "r-status")
    assert running.state == "running" and running.exit_code is None
    assert running.runtime is not None and running.runtime >= 0
    # without --follow: what is there now; the line without its newline yet is held back
    lines: list[str] = []
    result = _follow(cluster.controller_ns, t, node, "r-status", False, lines, [], python)
    assert lines == ["first"] and result.offset == len("first\n") and not result.ended
    # with --follow: a complete line arrives while the run is still going (not held until more comes)
    lines.clear()
    box: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: box.setdefault(
            "r", _follow(cluster.controller_ns, t, node, "r-status", True, lines, [], python)
        )
    )
    thread.start()
    await_(lambda: lines == ["first"], 10, "the first line while the run waits")
    flag.touch()
    thread.join(30)
    assert lines == ["first", "partial", "last"]
    result = box["r"]
    assert result.exit_code == 3 and result.ended
    with netns.inside(cluster.controller_ns):
        # the launcher writes the exit code last, then exits: on a busy machine a moment later
        done = await_(
            lambda: (s := status_node(node, t, "r-status")).state != "running" and s, 10, "the launcher's end"
        )
    assert (done.state, done.exit_code, done.last_line) == ("exited", 3, "last")
    t.close()


@pytest.mark.parametrize("python", READERS, ids=["python", "shell"])
def test_follow_passes_log_lines_that_look_like_protocol_markers_through_unchanged(
    cluster: NamespaceCluster, node1: SSHTransport, tmp_path: Path, python: str | None
) -> None:
    # the tail's records start with "@@": a training log that prints such lines (the old protocol's
    # markers, a record of the right shape with a guessed nonce, or a line of nothing but "@") must
    # reach the user as printed, and must not end the tail early
    node = _node(tmp_path)
    guessed = records.record("cb-000000000000", "end", "0", "5").rstrip("\n")
    printed = ["@@end 0 5", "@@.", "@@. 3", "@@missing", guessed, "@@@triple", "@", "", "last \u00e9"]
    script = "".join(f"printf '%s\\n' '{line}'\n" for line in printed)
    _start(cluster.controller_ns, node1, node, "r-at", script)
    lines: list[str] = []
    result = _follow(cluster.controller_ns, node1, node, "r-at", True, lines, [], python)
    assert lines == printed
    assert result.exit_code == 0 and result.lines == len(printed)
    assert result.offset == len(("\n".join(printed) + "\n").encode())


@pytest.mark.parametrize("python", READERS, ids=["python", "shell"])
def test_follow_resumes_at_the_byte_after_the_last_line_when_the_connection_drops(
    cluster: NamespaceCluster, node1: SSHTransport, tmp_path: Path, python: str | None
) -> None:
    node = _node(tmp_path)
    total = 60_000
    printer = (
        "import sys, time\n"
        f"for i in range({total}):\n"
        "    sys.stdout.write(f'{i:06d} ' + 'x' * 90 + '\\n')\n"
        "    if i % 500 == 499:\n"
        "        sys.stdout.flush(); time.sleep(0.01)\n"
    )
    (tmp_path / "printer.py").write_text(printer)
    _start(cluster.controller_ns, node1, node, "r-drop", f"exec {sys.executable} {tmp_path / 'printer.py'}\n")
    lines: list[str] = []
    notes: list[str] = []
    box: dict[str, Any] = {}

    def follow() -> None:
        try:
            box["result"] = _follow(cluster.controller_ns, node1, node, "r-drop", True, lines, notes, python)
        except BaseException as exc:  # reported by the main thread
            import traceback

            box["error"] = "".join(traceback.format_exception(exc))

    thread = threading.Thread(target=follow)
    thread.start()
    await_(lambda: len(lines) > 3000 or "result" in box or "error" in box, 60, "the first lines")
    assert "result" not in box, "the run ended before the connection could be cut: make it longer"
    assert cut_ssh_sessions(cluster, cluster.hosts[0]) >= 1
    thread.join(120)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.reconnects >= 1 and any("reconnect" in n for n in notes), notes
    expected = [f"{i:06d} " + "x" * 90 for i in range(total)]
    assert len(lines) == total and lines == expected  # every line, once, in order
    assert result.exit_code == 0


class Watched:
    """The transport as follow_node uses it, also keeping every script sent and telling when the
    node has said where a tail starts (its ``start OFFSET`` record)."""

    def __init__(self, transport: SSHTransport) -> None:
        self.transport = transport
        self.scripts: list[str] = []
        self.started = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)

    def run(self, script: str, *, on_line: Any = None, **kwargs: Any) -> Any:
        self.scripts.append(script)
        watched = self
        nonce = nonce_of(script)

        class Spy(BlockHandler):
            def block(self, stream: Stream, text: str) -> None:
                if stream == "stdout" and records.find(text, nonce, "start") is not None:
                    watched.started.set()
                on_line.block(stream, text)

        return self.transport.run(script, on_line=Spy(), **kwargs)


#: a finished run's log for --tail: multi-byte UTF-8, lines that look like the protocol's markers
#: (the last five among them), and a last line without its newline
TAIL_LOG = [f"{i:04d} \u00fcn\u00efc\u00f6d\u00e9 \u2713 " + "x" * (i % 50) for i in range(995)] + [
    "@@end 0 5",
    "@@. 12",
    "@@start 3",
    "@@@three",
    "the end \u2713",
]
TAIL_LOG[500] = "@@missing"


@pytest.mark.parametrize("python", READERS, ids=["python", "shell"])
def test_tail_sends_only_the_last_lines_found_on_the_node(
    cluster: NamespaceCluster, node1: SSHTransport, tmp_path: Path, python: str | None
) -> None:
    node = _node(tmp_path)
    data = "\n".join(TAIL_LOG).encode()  # no newline after the last line
    source = tmp_path / "source.log"
    source.write_bytes(data)
    run_dir = _start(cluster.controller_ns, node1, node, "r-tail", f"cat {source}\n")
    await_(lambda: (run_dir / "node.log.rc").exists(), 10, "the launcher's end")
    assert (run_dir / "node.log").read_bytes() == data

    def tail(count: int, follow: bool = False) -> tuple[list[str], Any]:
        got: list[str] = []
        result = _follow(cluster.controller_ns, node1, node, "r-tail", follow, got, [], python, tail=count)
        return got, result

    got, result = tail(5)
    assert got == TAIL_LOG[-5:]  # the markers as printed; the last line counts though it has no newline
    start = len("\n".join(TAIL_LOG[:-5]).encode()) + 1
    assert (result.start, result.offset, result.lines, result.exit_code) == (start, len(data), 5, 0)
    got, result = tail(1, follow=True)
    assert got == ["the end \u2713"] and result.start == len(data) - len("the end \u2713".encode())
    got, result = tail(0)
    assert got == [] and (result.start, result.offset, result.lines) == (len(data), len(data), 0)
    got, result = tail(5000)
    assert got == TAIL_LOG and (result.start, result.offset) == (0, len(data))
    got, result = tail(len(TAIL_LOG))
    assert got == TAIL_LOG and result.start == 0


@pytest.mark.parametrize("python", READERS, ids=["python", "shell"])
def test_tail_zero_with_follow_shows_only_what_comes_after(
    cluster: NamespaceCluster, node1: SSHTransport, tmp_path: Path, python: str | None
) -> None:
    node = _node(tmp_path)
    flag = tmp_path / "go"
    run_dir = _start(
        cluster.controller_ns,
        node1,
        node,
        "r-tail0",
        "echo old 1\necho old 2\necho old 3\nprintf 'part'\n"
        f"while [ ! -e {flag} ]; do sleep 0.05; done\necho ial\necho new\n",
    )
    log = run_dir / "node.log"
    await_(lambda: log.exists() and log.read_bytes().endswith(b"part"), 10, "the old lines")
    # still running: the line being written is no line yet (a tail never starts inside it)
    old: list[str] = []
    result = _follow(cluster.controller_ns, node1, node, "r-tail0", False, old, [], python, tail=2)
    assert old == ["old 2", "old 3"] and result.start == len("old 1\n")
    watched = Watched(node1)
    got: list[str] = []
    box: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: box.setdefault(
            "r", _follow(cluster.controller_ns, watched, node, "r-tail0", True, got, [], python, tail=0)
        )
    )
    thread.start()
    assert watched.started.wait(10), "the node did not say where the tail starts"
    flag.touch()
    thread.join(30)
    assert not thread.is_alive()
    assert got == ["partial", "new"]  # only what came after, the line being written whole
    assert box["r"].start == len(b"old 1\nold 2\nold 3\n") and box["r"].exit_code == 0


@pytest.mark.parametrize("python", READERS, ids=["python", "shell"])
def test_tail_is_not_counted_again_after_a_dropped_connection(
    cluster: NamespaceCluster, node1: SSHTransport, tmp_path: Path, python: str | None
) -> None:
    node = _node(tmp_path)
    flag = tmp_path / "more"
    total, half = 4000, 2000
    printer = (
        "import os, sys, time\n"
        "out = sys.stdout.buffer\n"
        f"for i in range({total}):\n"
        f"    if i == {half}:\n"
        "        out.flush()\n"
        f"        while not os.path.exists({str(flag)!r}):\n"
        "            time.sleep(0.05)\n"
        "    out.write(b'%06d \\xc3\\xa9' % i + b'x' * 90 + b'\\n')\n"
    )
    (tmp_path / "printer.py").write_text(printer)
    run_dir = _start(
        cluster.controller_ns,
        node1,
        node,
        "r-tail-drop",
        f"exec {sys.executable} {tmp_path / 'printer.py'}\n",
    )
    expected = [f"{i:06d} \u00e9" + "x" * 90 for i in range(total)]
    width = len(expected[0].encode()) + 1
    log = run_dir / "node.log"
    await_(lambda: log.exists() and log.stat().st_size == half * width, 10, "the first half")
    watched = Watched(node1)
    lines: list[str] = []
    notes: list[str] = []
    box: dict[str, Any] = {}

    def follow() -> None:
        try:
            box["result"] = _follow(
                cluster.controller_ns, watched, node, "r-tail-drop", True, lines, notes, python, tail=50
            )
        except BaseException as exc:  # reported by the main thread
            import traceback

            box["error"] = "".join(traceback.format_exception(exc))

    thread = threading.Thread(target=follow)
    thread.start()
    await_(lambda: len(lines) == 50 or "error" in box, 20, "the last 50 lines of the first half")
    assert cut_ssh_sessions(cluster, cluster.hosts[0]) >= 1  # while the tail waits for more
    await_(lambda: notes or "error" in box, 20, "the connection loss")
    flag.touch()
    thread.join(60)
    assert not thread.is_alive()
    assert "error" not in box, box.get("error")
    result = box["result"]
    assert result.reconnects >= 1 and any("reconnect" in n for n in notes), notes
    assert lines == expected[half - 50 :]  # the 50 asked for, then all the rest: each once
    assert result.start == (half - 50) * width and result.offset == total * width
    # the node was asked for the last 50 lines once; every retry resumed from a byte offset
    assert len(watched.scripts) >= 2
    asked = [
        '_cb_rec start "$off"' in s or bool(re.search(r" 50 cb-[0-9a-f]{12} ", s)) for s in watched.scripts
    ]
    assert asked == [True] + [False] * (len(watched.scripts) - 1), watched.scripts


def test_stop_ends_every_process_of_the_run_and_nothing_else(
    cluster: NamespaceCluster, node1: SSHTransport, tmp_path: Path
) -> None:
    node = _node(tmp_path)
    # one child leaves the launcher's session (setsid): still the run's, by its marker
    script = "sleep 300 &\nsetsid sleep 301 &\ntrap '' TERM\nsleep 302\n"
    _start(cluster.controller_ns, node1, node, "r-stop", script)
    other = _start(cluster.controller_ns, node1, node, "r-other", "sleep 303\n")
    mine = await_(
        lambda: len(run_pids(run_marker("r-stop", "node1"))) >= 4 and run_pids(run_marker("r-stop", "node1")),
        10,
        "the run's processes",
    )
    others = await_(lambda: run_pids(run_marker("r-other", "node1")), 10, "the other run")
    # a stranger under the pid of a launcher that has ended: the start time does not match
    stranger = subprocess.Popen(["sleep", "304"], start_new_session=True)
    fake = tmp_path / "wd" / "runs" / "r-fake" / "node1"
    fake.mkdir(parents=True)
    (fake / "pid").write_text(f"{stranger.pid} {stranger.pid} 1\n")
    try:
        with netns.inside(cluster.controller_ns):
            begin = time.monotonic()
            stopped = stop_node(node, node1, "r-stop", grace=2.0)
            took = time.monotonic() - begin
            again = stop_node(node, node1, "r-stop", grace=2.0)
            fake_stop = stop_node(node, node1, "r-fake", grace=2.0)
            missing = stop_node(node, node1, "r-never", grace=2.0)
        assert stopped.state == "stopped" and stopped.terminated >= 4
        assert stopped.killed >= 1  # the launcher shell ignores TERM: KILL after the grace period
        assert took < 10
        assert not run_pids(run_marker("r-stop", "node1"))
        assert all(
            not Path(f"/proc/{p}").exists() or Path(f"/proc/{p}/stat").read_text().split(") ")[1][0] == "Z"
            for p in mine
        )
        assert run_pids(run_marker("r-other", "node1")) == others  # the other run is untouched
        # stopped twice: the second says the first did it (not the code the TERM made it exit with)
        assert again.state == "stopped earlier"
        assert again.describe() == "nothing to stop: a stop before this one stopped it"
        assert fake_stop.state == "gone" and stranger.poll() is None  # a recycled pid is never hit
        assert missing.state == "no run"
    finally:
        stranger.kill()
        stranger.wait()
        with netns.inside(cluster.controller_ns):
            stop_node(node, node1, "r-other", grace=1.0)
    assert not run_pids(run_marker("r-other", "node1")) and (other / "pid").exists()


def test_stop_leaves_another_launch_of_the_same_run_id_alone(
    cluster: NamespaceCluster, node1: SSHTransport, tmp_path: Path
) -> None:
    """Two controllers (two directories, two workdirs) that launched the same run id on one node, as
    same-named clusters started in the same second do: stopping one, its end-of-run sweep included,
    leaves the other's processes running."""
    mine, theirs = _node(tmp_path / "a"), _node(tmp_path / "b")
    _start(cluster.controller_ns, node1, mine, "r-twin", "sleep 305 &\nsleep 306\n")
    _start(cluster.controller_ns, node1, theirs, "r-twin", "sleep 307 &\nsleep 308\n")

    def sleeps(pids: set[int]) -> set[str]:
        said = (Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode() for p in pids)
        return {c.split()[1] for c in said if c.startswith("sleep ")}

    both = await_(
        lambda: sleeps(p := run_pids(run_marker("r-twin", "node1"))) == {"305", "306", "307", "308"} and p,
        10,
        "both launches' processes",
    )
    try:
        with netns.inside(cluster.controller_ns):
            stopped = stop_node(mine, node1, "r-twin", grace=2.0)
        left = run_pids(run_marker("r-twin", "node1"))
        assert sleeps(left) == {"307", "308"} and left < both, (left, both)
        # its processes with the marker, and the launcher's shell (its session's leader: the marker is
        # exported by it, so not in its own /proc environ)
        assert stopped.state == "stopped" and stopped.terminated == len(both - left) + 1, stopped
        # a third launch under the id, whose launcher never started (its directory, no pid file):
        # its stop has nothing of its own to end, and takes nothing of the other's
        never = _node(tmp_path / "c")
        Path(run_dir_for(never, "r-twin")).mkdir(parents=True)
        with netns.inside(cluster.controller_ns):
            assert stop_node(never, node1, "r-twin", grace=1.0).state == "not started"
        assert run_pids(run_marker("r-twin", "node1")) == left
    finally:
        with netns.inside(cluster.controller_ns):
            stop_node(theirs, node1, "r-twin", grace=1.0)
    assert not run_pids(run_marker("r-twin", "node1"))


def test_fetch_copies_files_and_directories_from_run_and_code_dirs(
    cluster: NamespaceCluster, node1: SSHTransport, tmp_path: Path
) -> None:
    node = _node(tmp_path)
    run_dir = Path(run_dir_for(node, "r-fetch"))
    code = tmp_path / "code"
    (run_dir / "traces" / "rank0").mkdir(parents=True)
    (run_dir / "traces" / "rank0" / "a trace.json").write_text("{}" * 100)
    (run_dir / "traces" / "top.txt").write_text("top\n")
    (code / "checkpoints").mkdir(parents=True)
    (code / "checkpoints" / "last.pt").write_bytes(b"\0" * 5000)
    absolute = tmp_path / "elsewhere.txt"
    absolute.write_text("abs\n")
    dest = tmp_path / "controller" / "runs" / "r-fetch" / "node1"
    with netns.inside(cluster.controller_ns):
        got = fetch_node(
            node,
            node1,
            "r-fetch",
            ["traces", "checkpoints/last.pt", str(absolute), "nope"],
            code_dir=str(code),
            dest=dest,
        )
    by_path = {f.path: f for f in got}
    assert (by_path["traces"].files, by_path["traces"].bytes) == (2, 204)
    assert (dest / "traces" / "rank0" / "a trace.json").read_text() == "{}" * 100
    assert (dest / "traces" / "top.txt").read_text() == "top\n"
    assert by_path["checkpoints/last.pt"].bytes == 5000
    assert (dest / "checkpoints" / "last.pt").read_bytes() == b"\0" * 5000
    assert (dest / str(absolute).lstrip("/")).read_text() == "abs\n"
    assert by_path["nope"].source is None


def test_fetch_takes_a_runs_own_outputs_first_and_the_code_directory_when_asked(
    cluster: NamespaceCluster, node1: SSHTransport, tmp_path: Path
) -> None:
    """The run's checkpoint in its $CB_RUN_DIR (<run dir>/out) is the one fetched, not the code
    directory's file of the same name (what the newest run left there); `--code` asks for that one."""
    node = _node(tmp_path)
    out = Path(run_dir_for(node, "r-old")) / "out"
    code = tmp_path / "code"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "last.pt").write_bytes(b"this run's")
    (code / "checkpoints").mkdir(parents=True)
    (code / "checkpoints" / "last.pt").write_bytes(b"a later run's")
    with netns.inside(cluster.controller_ns):
        run = fetch_node(
            node, node1, "r-old", ["checkpoints/last.pt"], code_dir=str(code), dest=tmp_path / "a"
        )
        from_code = fetch_node(
            node,
            node1,
            "r-old",
            ["checkpoints/last.pt"],
            code_dir=str(code),
            dest=tmp_path / "b",
            from_code=True,
        )
    assert run[0].source == str(out / "checkpoints" / "last.pt")
    assert (tmp_path / "a" / "checkpoints" / "last.pt").read_bytes() == b"this run's"
    assert from_code[0].source == str(code / "checkpoints" / "last.pt")
    assert (tmp_path / "b" / "checkpoints" / "last.pt").read_bytes() == b"a later run's"


# -- the CLI's `logs` and `status` on a run started here ---------------------------------------------


def _cli_inventory(cluster: NamespaceCluster, tmp_path: Path) -> Path:
    node = {
        "name": "node1",
        "host": cluster.hosts[0].addr,
        "user": "root",
        "python": sys.executable,
        "workdir": str(tmp_path / "wd"),  # as _node(tmp_path): the run directories _start makes
    }
    return write_inventory(tmp_path / "hosts.yaml", [node], name="ns", master="node1")


def test_logs_replaces_the_copy_here_only_when_the_node_was_read(
    cluster: NamespaceCluster, node1: SSHTransport, bootstrap: Bootstrap, tmp_path: Path
) -> None:
    inv = _cli_inventory(cluster, tmp_path)
    node = _node(tmp_path)
    run_dir = _start(cluster.controller_ns, node1, node, "r-copy", "echo one\necho two\nprintf 'three'\n")
    await_(lambda: (run_dir / "node.log.rc").exists(), 10, "the launcher's end")
    copy = tmp_path / "runs" / "r-copy" / "node1.log"
    copy.parent.mkdir(parents=True)
    copy.write_text("an older, shorter read\n")
    read = bootstrap("-i", str(inv), "logs", "--run", "r-copy", cwd=tmp_path)
    assert read.returncode == 0, read
    assert read.stdout.splitlines() == ["[node1] one", "[node1] two", "[node1] three"]
    assert copy.read_bytes() == b"one\ntwo\nthree\n"  # what was read replaced it
    assert sorted(p.name for p in copy.parent.iterdir()) == ["node1.log"]  # no part left behind
    copy.write_text("one\n")
    tail = bootstrap("-i", str(inv), "logs", "--run", "r-copy", "--tail", "1", cwd=tmp_path)
    assert tail.returncode == 0 and tail.stdout.splitlines() == ["[node1] three"], tail
    assert copy.read_bytes() == b"one\n"  # --tail prints only: neither a part nor a new copy
    assert sorted(p.name for p in copy.parent.iterdir()) == ["node1.log"]

    # the node's run directory is gone (node reinstalled, moved): the copy here is all that is left
    kept = b"one\ntwo\nthree\n\xc3\xa9 and a line the node never had, without newline"
    copy.write_bytes(kept)
    run_dir.rename(tmp_path / "moved")
    for extra in ([], ["--follow"]):
        gone = bootstrap("-i", str(inv), "logs", "--run", "r-copy", *extra, cwd=tmp_path)
        assert gone.returncode == 1, gone
        assert "node 'node1': no run r-copy on this node" in gone.stderr, gone
        assert f"node1: the previous copy {Path('runs') / 'r-copy' / 'node1.log'} was kept as it was" in (
            gone.stderr
        ), gone
        assert copy.read_bytes() == kept
        assert sorted(p.name for p in copy.parent.iterdir()) == ["node1.log"]
    doc = json.loads(bootstrap("-i", str(inv), "logs", "--run", "r-copy", "--json", cwd=tmp_path).stdout)
    assert (doc["exit_code"], doc["nodes"][0]["ok"], doc["nodes"][0]["copy"]) == (1, False, "kept")
    assert copy.read_bytes() == kept
    # no copy yet and nothing read: none is made, and nothing is said of it beyond the node's error
    fresh = bootstrap("-i", str(inv), "logs", "--run", "r-never", cwd=tmp_path)
    assert fresh.returncode == 1 and "node 'node1': no run r-never" in fresh.stderr, fresh
    assert "no copy written" not in fresh.stderr and len(fresh.stderr.splitlines()) == 1, fresh
    assert not (tmp_path / "runs" / "r-never" / "node1.log").exists()

    # back in place: a successful read replaces the copy again
    (tmp_path / "moved").rename(run_dir)
    doc = json.loads(bootstrap("-i", str(inv), "logs", "--run", "r-copy", "--json", cwd=tmp_path).stdout)
    assert (doc["exit_code"], doc["nodes"][0]["copy"]) == (0, "written")
    assert copy.read_bytes() == b"one\ntwo\nthree\n"


def test_logs_leaves_the_copy_a_running_launch_writes(
    cluster: NamespaceCluster, node1: SSHTransport, bootstrap: Bootstrap, tmp_path: Path
) -> None:
    inv = _cli_inventory(cluster, tmp_path)
    node = _node(tmp_path)
    run_dir = _start(cluster.controller_ns, node1, node, "r-busy", "echo one\necho two\n")
    await_(lambda: (run_dir / "node.log.rc").exists(), 10, "the launcher's end")
    launch = RunLog(tmp_path / "runs" / "r-busy")  # what a foreground `launch` holds open
    launch.write_block("node1", "one\n")
    try:
        read = bootstrap("-i", str(inv), "logs", "--run", "r-busy", cwd=tmp_path)
        assert read.returncode == 0 and read.stdout.splitlines() == ["[node1] one", "[node1] two"], read
        assert "node1: runs/r-busy/node1.log left as it is: a launch running from here" in read.stderr, read
        doc = json.loads(bootstrap("-i", str(inv), "logs", "--run", "r-busy", "--json", cwd=tmp_path).stdout)
        assert (doc["exit_code"], doc["nodes"][0]["copy"]) == (0, "busy"), doc
        launch.write_block("node1", "two\n")  # the launch's lines still land in the copy
        assert launch.path("node1").read_text() == "one\ntwo\n"
        assert not launch.part_path("node1").exists()
    finally:
        launch.close()


def test_logs_follow_interrupted_keeps_what_was_read_when_it_is_more(
    cluster: NamespaceCluster, node1: SSHTransport, ctl_home: Path, tmp_path: Path
) -> None:
    inv = _cli_inventory(cluster, tmp_path)
    node = _node(tmp_path)
    flag = tmp_path / "go"
    _start(
        cluster.controller_ns,
        node1,
        node,
        "r-int",
        f"echo one\necho two\nwhile [ ! -e {flag} ]; do sleep 0.05; done\necho three\n",
    )
    copy = tmp_path / "runs" / "r-int" / "node1.log"

    def interrupted_follow() -> str:
        env = {"HOME": str(ctl_home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        argv = cluster.controller_argv([BOOTSTRAP, "-i", str(inv), "logs", "--run", "r-int", "-f"], env=env)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        try:
            await_(lambda: len(out) >= 2 or proc.poll() is not None, 30, "the first two lines")
            assert proc.poll() is None, out
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(5)
        assert out == ["[node1] one\n", "[node1] two\n"]
        assert proc.stderr is not None
        return proc.stderr.read()

    # no copy yet: what was read until Ctrl-C becomes it
    interrupted_follow()
    assert copy.read_text() == "one\ntwo\n"
    # a longer copy (from an earlier full read, a foreground launch): it stays
    copy.write_text("one\ntwo\nthree\n")
    err = interrupted_follow()
    assert copy.read_text() == "one\ntwo\nthree\n", err
    assert "node1: the previous copy" in err and "was kept as it was" in err
    assert sorted(p.name for p in copy.parent.iterdir()) == ["node1.log"]
    flag.touch()


def test_status_of_an_unknown_run_fails_naming_the_node(
    cluster: NamespaceCluster, node1: SSHTransport, bootstrap: Bootstrap, tmp_path: Path
) -> None:
    inv = _cli_inventory(cluster, tmp_path)
    node = _node(tmp_path)
    run_dir = _start(cluster.controller_ns, node1, node, "r-known", "echo done\n")
    await_(lambda: (run_dir / "node.log.rc").exists(), 10, "the launcher's end")
    known = bootstrap("-i", str(inv), "status", "--run", "r-known", cwd=tmp_path)
    assert known.returncode == 0 and "exited (0)" in known.stdout, known
    unknown = bootstrap("-i", str(inv), "status", "--run", "nosuch", cwd=tmp_path)
    assert unknown.returncode == 1, unknown
    assert "no run" in unknown.stdout, unknown  # the table still shows the node's state
    assert f"node 'node1': no run nosuch on this node ({tmp_path}/wd/runs/nosuch/node1 does not exist)" in (
        unknown.stderr
    ), unknown
    doc = json.loads(bootstrap("-i", str(inv), "status", "--run", "nosuch", "--json", cwd=tmp_path).stdout)
    (entry,) = doc["nodes"]
    assert (doc["exit_code"], entry["ok"], entry["state"]) == (1, False, "no run"), doc
    assert entry["error"]["message"].startswith("no run nosuch on this node"), doc


def test_a_stopped_run_shows_how_long_it_ran_until_its_last_output(
    cluster: NamespaceCluster, node1: SSHTransport, bootstrap: Bootstrap, tmp_path: Path
) -> None:
    inv = _cli_inventory(cluster, tmp_path)
    node = _node(tmp_path)
    flag = tmp_path / "never"  # the run waits for it: only `stop` ends it
    script = f"echo step 1\nwhile [ ! -e {flag} ]; do sleep 0.05; done\n"
    run_dir = _start(cluster.controller_ns, node1, node, "r-killed", script)
    log = run_dir / "node.log"
    await_(lambda: log.exists() and b"step 1\n" in log.read_bytes(), 10, "the run's output")
    with netns.inside(cluster.controller_ns):
        assert stop_node(node, node1, "r-killed", grace=2.0).state == "stopped"
        status = status_node(node, node1, "r-killed")
    # the launcher outlived the stop's TERM until its script had ended, then wrote the exit code
    rc = run_dir / "node.log.rc"
    assert rc.read_text().strip() == "143"  # sh ended by TERM
    # the log's last line: the script's, or its shell saying the TERM ended its `sleep`
    assert (status.state, status.exit_code) == ("stopped", 143)
    assert status.last_line in ("step 1", "Terminated"), status.last_line
    # from the launcher's start (its pid file) to its end (the exit code file), node clock
    assert status.runtime == int(rc.stat().st_mtime) - int((run_dir / "pid").stat().st_mtime)

    # a run that ran for 2 min 5 s before it was stopped: the table and --json say so
    start = int(time.time()) - 3600
    os.utime(run_dir / "pid", (start, start))
    os.utime(rc, (start + 125, start + 125))
    shown = bootstrap("-i", str(inv), "status", "--run", "r-killed", cwd=tmp_path)
    assert shown.returncode == 0, shown
    (row,) = [line for line in shown.stdout.splitlines() if "node1" in line]
    assert [cell.strip() for cell in row.split("│")[1:-1]] == [
        "node1",
        "stopped",
        "2:05",
        "-",
        status.last_line,
    ], row
    doc = json.loads(bootstrap("-i", str(inv), "status", "--run", "r-killed", "--json", cwd=tmp_path).stdout)
    (entry,) = doc["nodes"]
    assert (entry["state"], entry["exit_code"], entry["runtime"]) == ("stopped", 143, 125), doc
