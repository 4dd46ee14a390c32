"""A foreground run on a native Windows node, through the real WinRM transport and the WS-Management
test server (in process), whose played node (tests/winrm_server/native.py) does what the product's
scripts say: the launcher and its watchdog created by ``Win32_Process`` Create (outside the WinRS
shell's job), ranks as real Python processes on this machine running the uploaded training script,
the follower's rounds serving node.log in the tail protocol, the watchdog's rules, the shell's job
with ``MaxProcessesPerShell``. The model reads the follower's round, the watchdog's heartbeat age and
poll, and every path from the scripts the product wrote.

What is checked: lines arrive live with their rank labels and the exit code is the rank's, across
several rounds, every line once; the run's processes are outside the job; fail fast, a cancel (what
Ctrl-C does) and `stop --run` leave no process of the run; a controller cut off mid-run has its run
stopped by the watchdog within ROUND_SECONDS + STALE_SECONDS; more ranks than MaxProcessesPerShell
start now, where launch.ps1 run in the shell (the way before issue 18) is refused by the quota.
What PowerShell does with the scripts on a real host is not proven here (docs/windows.md, "What the
tests prove").
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import records
from orchestrator.errors import (
    BootstrapError,
    CancelledError,
    CommandFailedError,
    ConnectError,
    RunStoppedError,
)
from orchestrator.inventory import PasswordResolver, WinRMSettings, load_inventory_text
from orchestrator.plans import apply
from orchestrator.platforms.powershell import PowerShell
from orchestrator.render import LaunchSpec, Renderer, plan_launch
from orchestrator.runs.control import stop_node
from orchestrator.runs.ranks import split_rank
from orchestrator.runs.start import run_outside_job, start_node
from orchestrator.runs.windows_follow import ROUND_SECONDS, STALE_SECONDS, WATCH_POLL_MS
from orchestrator.session import Session
from orchestrator.steps.launch import prepare_plan, run_node
from orchestrator.steps.train import train
from orchestrator.transports.options import SSHOptions
from orchestrator.transports.winrm import WinRMTransport
from tests import pwsh
from tests.integration.test_winrm_transport import HOME, assignments
from tests.unit.test_platform_powershell import invocations
from tests.winrm_server import PwshCall, WinRMServer
from tests.winrm_server.native import NativeNode, native_node, written_files
from tests.winrm_server.processes import MEMORY_MESSAGE, QUOTA_MESSAGE

INVENTORY = """\
cluster:
  name: winlab
  master: win1
  backend: gloo
  train: {{script: train.py, args: ["--epochs", 1]}}
nodes:
  - {{name: win1, host: 10.0.0.1, os: windows, user: bob, nproc: {nproc}, interface: Ethernet,
     windows: {{mode: native}}}}
"""
RUN_ID = "winlab-20261202-120000"
RUN_DIR = f"{HOME}\\cluster-bootstrap\\runs\\{RUN_ID}\\win1"

#: the training script each rank runs (a real Python process): what it prints and how it ends comes
#: from CB_RANK_PLAN (JSON, by global rank) in its environment; "allocate_mb": memory it holds from
#: the start; "gate": a file it waits for before
#: its second line (the controller creates it when the first has arrived: streaming, not at exit)
TRAIN = r"""
import json, os, sys, time
plan = json.loads(os.environ["CB_RANK_PLAN"])[os.environ["RANK"]]
block = b"x" * (plan.get("allocate_mb", 0) << 20)  # memory the rank holds while it runs
for i, line in enumerate(plan.get("lines", [])):
    if i == 1 and plan.get("gate"):
        while not os.path.exists(plan["gate"]):
            time.sleep(0.02)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    time.sleep(plan.get("every", 0))
if plan.get("stderr"):
    sys.stderr.write(plan["stderr"] + "\n")
    sys.stderr.flush()
if plan.get("hang"):
    time.sleep(600)
sys.exit(plan.get("exit", 0))
"""


@pytest.fixture
def server() -> Iterator[WinRMServer]:
    srv = WinRMServer(auth="ntlm", username="bob", password="pw")
    with srv:
        yield srv


@pytest.fixture
def node(server: WinRMServer) -> Iterator[NativeNode]:
    with native_node(server) as played:
        yield played
        assert played.errors == []


@pytest.fixture(autouse=True)
def training_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """train.py in the current directory: `launch` uploads a relative script from there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path / "train.py"


def plan_ranks(monkeypatch: pytest.MonkeyPatch, plans: dict[int, dict[str, Any]]) -> None:
    monkeypatch.setenv("CB_RANK_PLAN", json.dumps({str(rank): plan for rank, plan in plans.items()}))


def transport_to(server: WinRMServer, name: str = "win1") -> WinRMTransport:
    return WinRMTransport(
        name,
        PowerShell(),
        host=server.host,
        port=server.port,
        user="bob",
        settings=WinRMSettings(scheme="http", transport="ntlm"),
        allow_insecure=False,
        password=lambda: "pw",
        connect_timeout=5.0,
    )


def _spec(nproc: int = 2, run_id: str = RUN_ID) -> LaunchSpec:
    inventory = load_inventory_text(INVENTORY.format(nproc=nproc), "w.yaml")
    (spec,) = plan_launch(
        inventory,
        backend="gloo",
        master_addr="10.0.0.1",
        run_id=run_id,
        interfaces={"win1": ("Ethernet", None)},
        cpus={"win1": 8},
        pythons={"win1": "C:\\Python312\\python.exe"},
    )
    return spec


class Lines:
    """The controller's output handler for one node: every line, and an event per awaited line."""

    def __init__(self, on_line: Any = None) -> None:
        self.got: list[str] = []
        self.first = threading.Event()
        self.on_line = on_line

    def __call__(self, name: str, line: str) -> None:
        self.got.append(line)
        self.first.set()
        if self.on_line is not None:
            self.on_line(line)

    def output(self, stream: str, line: str) -> None:
        """As a node's output handler (``OnLine``)."""
        self("", line)


def _run(server: WinRMServer, lines: Lines, spec: LaunchSpec | None = None) -> BootstrapError | None:
    transport = transport_to(server)
    spec = spec or _spec()
    try:
        run_node(spec.node, transport, spec, renderer=Renderer(), on_line=lines)
    except BootstrapError as exc:
        return exc
    finally:
        transport.close()
    return None


def in_background(server: WinRMServer, lines: Lines) -> tuple[WinRMTransport, threading.Thread, list[Any]]:
    """run_node in a thread (the controller), on a transport the test can close or cut off."""
    transport = transport_to(server)
    spec = _spec()
    outcome: list[Any] = []

    def controller() -> None:
        try:
            run_node(spec.node, transport, spec, renderer=Renderer(), on_line=lines)
            outcome.append(None)
        except BootstrapError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=controller, daemon=True)
    thread.start()
    return transport, thread, outcome


def first_round(node: NativeNode) -> PwshCall:
    (call,) = [c for c in node.calls["round"] if written_files(c.tree)]
    return call


# -- lines, rank labels, exit codes ----------------------------------------------------------------------


def test_a_native_windows_node_streams_each_rank_from_outside_the_shells_job(
    server: WinRMServer,
    node: NativeNode,
    tmp_path: Path,
    training_script: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = tmp_path / "first line arrived"
    plan_ranks(
        monkeypatch,
        {
            0: {"lines": ["[rank 0/2] step 1", "done: 1 steps"], "gate": str(gate)},
            1: {"lines": ["[rank 1/2] step 1", "done: 1 steps"], "gate": str(gate)},
        },
    )

    def on_line(line: str) -> None:
        if line.endswith("step 1") and sum(1 for g in lines.got if g.endswith("step 1")) == 2:
            gate.touch()  # both first lines are here while their ranks still run: streamed

    lines = Lines(on_line)
    assert _run(server, lines) is None
    assert sorted(lines.got) == sorted(
        [
            "[default0]:[rank 0/2] step 1",
            "[default0]:done: 1 steps",
            "[default1]:[rank 1/2] step 1",
            "[default1]:done: 1 steps",
        ]
    )
    assert {split_rank(line)[0] for line in lines.got} == {0, 1}
    assert lines.got.index("[default0]:done: 1 steps") > 1  # after both first lines
    # launch.ps1 as rendered, UTF-8 with a BOM; the training script in the code directory
    uploaded = server.files[f"{RUN_DIR}\\launch.ps1"]
    assert uploaded.startswith(b"\xef\xbb\xbf")
    assert uploaded[3:].decode("utf-8") == Renderer().render(_spec(), PowerShell())
    assert server.files[f"{HOME}\\cluster-bootstrap\\code\\train.py"] == training_script.read_bytes()
    # the WinRS command is the follower only; the watchdog, the launcher and the ranks are outside
    # its job (Win32_Process Create), the watchdog created before the launcher
    run = node.run(RUN_DIR)
    assert run.launcher is not None and run.watchdog is not None and len(run.ranks) == 2
    assert [p.job for p in (run.watchdog, run.launcher, *run.ranks)] == [None] * 4
    assert run.watchdog.ticks < run.launcher.ticks
    assert all(p.parent == run.launcher.pid for p in run.ranks)
    call = first_round(node)
    assert call.process is not None and call.process.job is not None  # the follower: in the job
    files = dict(written_files(call.tree))
    follow, watchdog = (pwsh.assert_parses(files[name]) for name in ("follow.ps1", "watchdog.ps1"))
    create = [c for c in pwsh.commands(follow) if c.name == "Invoke-CimMethod"]
    assert [c.arguments[:2] for c in create] == [["Win32_Process", "Create"]] * 2
    assert [c.name for c in pwsh.commands(watchdog) if c.name == "Stop-CbRun"] == ["Stop-CbRun"]
    (invocation,) = [c for c in call.commands if c.name.endswith("follow.ps1')")]
    assert invocation.parameters == ["-offset", "-nonce", "-start"] and invocation.arguments[0] == "0"
    assert records.NONCE.fullmatch(invocation.arguments[1].strip("'"))  # the first round's records
    # the run ended by itself: its exit code, and its watchdog went too
    assert server.files[f"{RUN_DIR}\\node.log.rc"] == b"0\n"
    node.await_gone(RUN_DIR, 10)
    assert f"{RUN_DIR}\\watchdog.log" not in server.files  # it never had to stop anything


def test_a_failing_native_windows_node_reports_the_ranks_exit_code(
    server: WinRMServer, node: NativeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan_ranks(
        monkeypatch,
        {
            0: {"lines": ["[rank 0/2] step 1"], "hang": True},
            1: {"lines": ["Traceback (most recent call last):"], "stderr": "ValueError: boom", "exit": 3},
        },
    )
    lines = Lines()
    error = _run(server, lines)
    assert isinstance(error, CommandFailedError), error
    assert "training exited with code 3" in str(error) and error.node == "win1"
    assert error.result is not None and error.result.exit_code == 3
    tail = error.result.tail(3)
    # both among the last lines; in either order: the launcher reads a rank's pipes and notices its
    # exit in one loop (torchrun_windows.ps1), so a last stderr line can come just after the exit's
    assert "[default1]:ValueError: boom" in tail, tail
    assert "local rank 1 exited with code 3: stopping the other ranks" in tail, tail
    assert "node.log" in (error.hint or "")
    node.await_gone(RUN_DIR, 10)  # the launcher stopped rank 0, then ended


def test_a_busy_rendezvous_port_on_a_native_master_starts_nothing(
    server: WinRMServer, node: NativeNode
) -> None:
    """Something listens on the cluster's port on the native Windows master: refused before the run
    directory is made (as on a Linux master), instead of rank 0 failing to bind it."""
    spec = _spec()
    node.listening.add(spec.master_port)
    error = _run(server, Lines(), spec)
    assert isinstance(error, CommandFailedError), error
    assert f"port {spec.master_port} is in use on this node, the master: rank 0 needs it free" in str(error)
    assert "round" not in node.calls and "start" not in node.calls  # no launcher, no follower
    assert not any(RUN_DIR.lower() in path.lower() for path in node.files), sorted(node.files)


def test_lines_cross_rounds_each_exactly_once(
    server: WinRMServer, node: NativeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run longer than a round: the controller starts the next round at the byte offset the last
    one reached; no line is lost or repeated, lines that look like protocol markers included."""
    count = int(ROUND_SECONDS * 1.5 / 0.25)
    guessed = records.record("cb-000000000000", "more", "7").rstrip("\n")  # a record with a guessed nonce
    tricky = ["@@. 999999", "@@end 0 5", "@@more 7", guessed, "@@@three"]
    plan_ranks(
        monkeypatch,
        {
            0: {"lines": [f"tick {i}" for i in range(count)] + tricky, "every": 0.25},
            1: {"lines": ["quiet"]},
        },
    )
    lines = Lines()
    assert _run(server, lines) is None
    assert [g for g in lines.got if g.startswith("[default0]:")] == [
        f"[default0]:{text}" for text in [f"tick {i}" for i in range(count)] + tricky
    ]
    rounds = node.calls["round"]
    assert len(rounds) >= 2
    offsets = [int(c.commands[-1].arguments[0]) for c in rounds]
    log = server.files[f"{RUN_DIR}\\node.log"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] <= len(log)
    # each later round starts on a line boundary of node.log
    assert all(log[offset - 1 : offset] == b"\n" for offset in offsets[1:])
    assert all(not written_files(c.tree) for c in rounds[1:])  # short commands: the file is there


# -- the run never outlives the command that started it ---------------------------------------------------


def test_a_cancelled_foreground_run_is_stopped_on_the_node_by_its_watchdog(
    server: WinRMServer, node: NativeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What Ctrl-C and fail fast do to a node: the session closes its transport, which terminates the
    follower's command and deletes its shell (its job); the run, outside that job, is stopped by
    its watchdog within a poll."""
    plan_ranks(monkeypatch, {0: {"lines": ["step 1"], "hang": True}, 1: {"lines": ["step 1"], "hang": True}})
    lines = Lines()
    transport, thread, outcome = in_background(server, lines)
    assert lines.first.wait(60), "no line arrived"
    run = node.run(RUN_DIR)
    assert len(run.ranks) == 2 and all(p.alive for p in run.ranks)
    transport.close()  # the session's cancel
    thread.join(30)
    assert isinstance(outcome[0], CancelledError), outcome
    took = node.await_gone(RUN_DIR, WATCH_POLL_MS / 1000 + 5)
    assert "follower" in server.files[f"{RUN_DIR}\\watchdog.log"].decode()
    assert f"{RUN_DIR}\\stopped" not in server.files  # the watchdog, not an operator's stop
    assert all(p.linux is not None and p.linux.poll() is not None for p in run.ranks)
    print(f"cancel -> run gone in {took:.2f} s")


def test_a_controller_cut_off_mid_run_has_its_run_stopped_within_the_bound(
    server: WinRMServer, node: NativeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's network is gone (or it was killed): nothing reaches the node any more, not
    even the terminate of its command. The follower finishes its round, no next round comes, and the
    watchdog stops the run once the heartbeat is STALE_SECONDS old."""
    plan_ranks(monkeypatch, {0: {"lines": ["step 1"], "hang": True}, 1: {"lines": ["step 1"], "hang": True}})
    lines = Lines()
    transport, thread, outcome = in_background(server, lines)
    assert lines.first.wait(60), "no line arrived"
    server.cut_off_clients()
    cut = time.monotonic()
    thread.join(60)
    assert isinstance(outcome[0], ConnectError), outcome
    run = node.run(RUN_DIR)
    assert all(p.alive for p in run.ranks)  # the controller could not stop them itself
    # the bound: the round in progress ends, then the heartbeat ages; a poll, and some slack for
    # a loaded test machine
    bound = ROUND_SECONDS + STALE_SECONDS + WATCH_POLL_MS / 1000
    node.await_gone(RUN_DIR, bound + 5 - (time.monotonic() - cut))
    took = time.monotonic() - cut
    assert "no heartbeat" in server.files[f"{RUN_DIR}\\watchdog.log"].decode()
    print(f"controller cut off -> run gone in {took:.1f} s (bound {bound:g} s)")
    transport.close()


def test_stop_run_ends_a_foreground_native_run_as_stopped(
    server: WinRMServer, node: NativeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan_ranks(monkeypatch, {0: {"lines": ["step 1"], "hang": True}, 1: {"lines": ["step 1"], "hang": True}})
    lines = Lines()
    transport, thread, outcome = in_background(server, lines)
    assert lines.first.wait(60), "no line arrived"
    other = transport_to(server)
    try:
        stopped = stop_node(_spec().node, other, RUN_ID)
    finally:
        other.close()
    assert stopped.state == "stopped" and stopped.terminated == 3  # the launcher and two ranks
    thread.join(60)
    assert isinstance(outcome[0], RunStoppedError), outcome
    node.await_gone(RUN_DIR, 10)  # the watchdog saw nothing left to watch and went too
    transport.close()


def test_stop_takes_the_runs_processes_by_identity_never_a_reused_pid(
    server: WinRMServer, node: NativeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`launch --detach`, then `stop`: the played node runs the stop script's own Get-CbRoots and
    Get-CbLive, so the processes stopped are the ones the script selects. A process id recorded in
    ``ranks`` that Windows has since given to another program (same id, another creation time) is
    not the run's: that program keeps running."""
    plan_ranks(monkeypatch, {0: {"lines": ["step 1"], "hang": True}, 1: {"lines": ["step 1"], "hang": True}})
    spec = _spec()
    transport = transport_to(server)
    try:
        apply(prepare_plan(spec.node, transport.platform, spec, renderer=Renderer()), transport)
        started = start_node(spec.node, transport, spec.run_id)
        run = node.run(RUN_DIR)
        assert run.launcher is not None and started.pid == run.launcher.pid
        assert run.launcher.job is None  # created by Win32_Process Create, as the start script says
        deadline = time.monotonic() + 30
        while len(run.ranks) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # an old rank's identity whose id now belongs to someone else's program
        stranger = server.processes.create("notepad.exe", parent=None, job=None)
        server.files.append(f"{RUN_DIR}\\ranks", f"{stranger.pid} {stranger.ticks - 10_000_000}\n".encode())
        stopped = stop_node(spec.node, transport, spec.run_id)
    finally:
        transport.close()
    assert (stopped.state, stopped.terminated) == ("stopped", 3)  # the launcher and its two ranks
    assert stranger.alive
    node.await_gone(RUN_DIR, 10)
    assert f"{RUN_DIR}\\stopped" in server.files


def test_a_failing_node_stops_the_native_run_and_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail fast through the real pipeline (steps.train.train): win1's rank fails, the session closes
    win2's connection; win2's run (outside its shell's job) is stopped by its watchdog, and the sweep
    finds nothing or stops the rest: nothing of the run is left on win2."""
    plan_ranks(
        monkeypatch,
        {
            0: {"lines": ["step 1"], "exit": 3, "every": 0.5},
            1: {"lines": ["step 1"], "hang": True},
            2: {"lines": ["step 1"], "hang": True},
            3: {"lines": ["step 1"], "hang": True},
        },
    )
    with (
        WinRMServer(auth="ntlm", username="bob", password="pw") as one,
        WinRMServer(auth="ntlm", username="bob", password="pw") as two,
        native_node(one) as node1,
        native_node(two) as node2,
    ):
        inventory = load_inventory_text(
            "cluster: {name: winlab, master: win1, backend: gloo, train: {script: train.py}}\n"
            "defaults: {os: windows, user: bob, password_env: CBT_WIN_PASS, nproc: 2, interface: Ethernet,"
            " winrm: {scheme: http}, windows: {mode: native}}\n"
            "nodes:\n"
            f"  - {{name: win1, host: 127.0.0.1, port: {one.port}}}\n"
            f"  - {{name: win2, host: 127.0.0.1, port: {two.port}}}\n",
            "w.yaml",
        )
        monkeypatch.setenv("CBT_WIN_PASS", "pw")
        specs = plan_launch(
            inventory,
            backend="gloo",
            master_addr="127.0.0.1",
            run_id=RUN_ID,
            interfaces={n.name: ("Ethernet", None) for n in inventory.nodes},
            cpus={},
            pythons={n.name: "C:\\Python312\\python.exe" for n in inventory.nodes},
        )
        outputs = {n.name: Lines() for n in inventory.nodes}
        started: set[str] = set()
        session = Session(
            inventory, list(inventory.nodes), ssh=SSHOptions(), passwords=PasswordResolver(None)
        )
        with session:
            report = train(
                session,
                specs,
                Renderer(),
                {name: out.output for name, out in outputs.items()},
                started,
            )
        assert [o.node for o in report.failed] == ["win1"]
        assert isinstance(report.failed[0].error, CommandFailedError)
        assert "exited with code 3" in str(report.failed[0].error)
        assert [o.node for o in report.stopped] == ["win2"]
        win2_dir = f"{HOME}\\cluster-bootstrap\\runs\\{RUN_ID}\\win2"
        node2.await_gone(win2_dir, WATCH_POLL_MS / 1000 + 5)
        run2 = node2.run(win2_dir)
        assert len(run2.ranks) == 2 and all(
            p.linux is not None and p.linux.poll() is not None for p in run2.ranks
        )
        assert two.processes.live() == []  # not even a follower: its shell was deleted
        assert node1.errors == [] and node2.errors == []


# -- the WinRS quota ---------------------------------------------------------------------------------------


def test_more_ranks_than_max_processes_per_shell_start_outside_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MaxProcessesPerShell 3 (the default is 25): a launch of 4 ranks runs, since only the follower
    (cmd.exe and powershell.exe: WinRS runs every command through cmd.exe) is in the shell's job;
    launch.ps1 run inside the shell, as `launch` did before issue 18, has its second rank refused by
    the quota."""
    # each rank lives 3 s after its line: all four are alive at once, so the quota counts them all
    # (ranks that ended before the next one started would never reach it: a race, not a quota)
    plan_ranks(monkeypatch, {rank: {"lines": [f"rank {rank} ran"], "every": 3} for rank in range(4)})
    with WinRMServer(auth="ntlm", username="bob", password="pw", max_processes_per_shell=3) as server:
        with native_node(server) as node:
            lines = Lines()
            assert _run(server, lines, _spec(nproc=4)) is None
            assert sorted(lines.got) == [f"[default{r}]:rank {r} ran" for r in range(4)]
            assert server.processes.refused == []
            # the old way, on the same host: launch.ps1 in the WinRS PowerShell itself
            spec = _spec(nproc=4, run_id="winlab-20261202-130000")
            transport = transport_to(server)
            try:
                platform = transport.platform
                assert isinstance(platform, PowerShell)
                apply(prepare_plan(spec.node, platform, spec, renderer=Renderer()), transport)
                run_dir = f"~/cluster-bootstrap/runs/{spec.run_id}/win1"
                log = platform.path_word(f"{run_dir}/node.log")
                inside = transport.run(f"{platform.run_script(f'{run_dir}/launch.ps1')} -Log {log}")
            finally:
                transport.close()
            assert inside.exit_code == 1
            assert QUOTA_MESSAGE in inside.stderr
            # WinRS's cmd.exe, its powershell.exe and rank 0 were the job's 3: rank 1 was refused
            assert server.processes.refused == [f"{server.processes.refused[0].split(':')[0]}: python.exe"]
            assert len(node.run(f"{HOME}\\cluster-bootstrap\\runs\\{spec.run_id}\\win1").ranks) == 1
            assert node.errors == []


def test_ranks_over_max_memory_per_shell_mb_run_outside_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """MaxMemoryPerShellMB 64: two ranks holding 100 MB each run to the end, since they are outside the
    shell's job; launch.ps1 run inside the shell, as `launch` did before issue 18, is ended by the
    quota with Windows' message."""
    plans = {rank: {"allocate_mb": 100, "lines": [f"rank {rank} ran"], "every": 1} for rank in range(2)}
    plan_ranks(monkeypatch, plans)
    with WinRMServer(auth="ntlm", username="bob", password="pw", max_memory_per_shell_mb=64) as server:
        with native_node(server) as node:
            lines = Lines()
            assert _run(server, lines, _spec(nproc=2)) is None
            assert sorted(lines.got) == [f"[default{r}]:rank {r} ran" for r in range(2)]
            assert server.processes.over_memory == []
            spec = _spec(nproc=2, run_id="winlab-20261202-130000")
            transport = transport_to(server)
            try:
                platform = transport.platform
                assert isinstance(platform, PowerShell)
                apply(prepare_plan(spec.node, platform, spec, renderer=Renderer()), transport)
                run_dir = f"~/cluster-bootstrap/runs/{spec.run_id}/win1"
                log = platform.path_word(f"{run_dir}/node.log")
                inside = transport.run(f"{platform.run_script(f'{run_dir}/launch.ps1')} -Log {log}")
            finally:
                transport.close()
            assert inside.exit_code == 1 and MEMORY_MESSAGE in inside.stderr, inside.stderr
            assert len(server.processes.over_memory) == 1
            assert node.errors == []


def test_any_heavy_job_runs_outside_the_shells_job_and_reports_its_exit_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """runs.start.run_outside_job, what env sync's pip needs: the script runs in a powershell.exe
    that run.ps1 starts, both created outside the WinRS job, its lines followed in the tail
    protocol, its exit code returned."""
    program = (
        "import sys\n"
        "print('Collecting torch==2.7.0', flush=True)\n"
        "print('WARNING: a warning on stderr', file=sys.stderr, flush=True)\n"
        "print('Successfully installed torch-2.7.0', flush=True)\n"
        "sys.exit(7)\n"
    )
    with WinRMServer(auth="ntlm", username="bob", password="pw", max_processes_per_shell=2) as server:
        with native_node(server) as node:
            node.jobs = lambda job: [sys.executable, "-c", program]
            transport = transport_to(server)
            got: list[tuple[str, str]] = []
            script = "& {\n  python.exe -m pip install torch==2.7.0\n}"
            try:
                result = run_outside_job(
                    _spec().node,
                    transport,
                    "~/cluster-bootstrap/jobs/sync-1/win1",
                    script,
                    output=lambda stream, line: got.append((stream, line)),
                    timeout=120,
                )
            finally:
                transport.close()
            job_dir = f"{HOME}\\cluster-bootstrap\\jobs\\sync-1\\win1"
            assert result.exit_code == 7
            assert got == [
                ("stdout", "Collecting torch==2.7.0"),
                ("stdout", "WARNING: a warning on stderr"),
                ("stdout", "Successfully installed torch-2.7.0"),
            ]
            assert result.tail(1) == ["Successfully installed torch-2.7.0"]
            # what ran: the script wrapped as every script is, by run.ps1, both outside the job
            job = server.files[f"{job_dir}\\job.ps1"]
            assert job.startswith(b"\xef\xbb\xbf") and script in job.decode("utf-8-sig")
            pwsh.assert_parses(job.decode("utf-8-sig"))
            pwsh.assert_parses(server.files[f"{job_dir}\\run.ps1"].decode("utf-8-sig"))
            run = node.run(job_dir)
            assert run.launcher is not None and [p.job for p in (run.launcher, *run.ranks)] == [None, None]
            assert server.processes.refused == []
            node.await_gone(job_dir, 10)
            assert node.errors == []


# -- the run directory ---------------------------------------------------------------------------------------


def owner_only_directories(call: PwshCall) -> list[str]:
    """The directories a script gives an owner-only access list (read off its parse tree: a new
    descriptor, inheritance cut, one entry, written onto the directory it creates)."""
    calls = invocations(call.tree)
    on_acl = [(method, args) for target, method, args in calls if target == "$cbAcl"]
    if (
        ("$cbDir", "SetAccessControl", ["$cbAcl"]) not in calls
        or on_acl[:2] != [("SetOwner", ["$cbMe"]), ("SetAccessRuleProtection", ["$true", "$false"])]
        or [method for method, _ in on_acl[2:]] != ["AddAccessRule"]
    ):
        return []
    text, literals = assignments(call)["$cbdir"]
    assert "CreateDirectory(" in text and "[System.Security.AccessControl.FileSystemRights]::FullControl" in (
        call.script
    )
    return [HOME + literals[0] if "$HOME +" in text else literals[0]]


def test_the_run_directory_is_owner_only_before_launch_ps1_is_put_there(
    server: WinRMServer, node: NativeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """launch.ps1 may hold train.env secrets: the node is told to give the run directory an
    owner-only access list before the script is uploaded into it (the statement's every part is
    checked in tests/unit/test_platform_powershell.py). The server keeps files, not directories or
    access lists: what it received, and in which order, is checked. That Windows applies the list
    as written is proven only on a real host (docs/windows.md, "What the tests prove")."""
    plan_ranks(monkeypatch, {0: {"lines": ["done: 1 steps"]}, 1: {"lines": ["done: 1 steps"]}})
    assert _run(server, Lines()) is None
    calls = list(server.calls)
    made_private = [i for i, call in enumerate(calls) if RUN_DIR in owner_only_directories(call)]
    launch_put = [
        i
        for i, call in enumerate(calls)
        if "FromBase64String" in call.script
        and assignments(call).get("$target", ("", [""]))[1][0].endswith(f"{RUN_ID}\\win1\\launch.ps1")
    ]
    assert made_private and launch_put, [c.script for c in calls]
    assert made_private[0] < launch_put[0]
    assert f"{RUN_DIR}\\launch.ps1" in server.files
