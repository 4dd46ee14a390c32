"""Run management on a native Windows node through the real WinRM transport and the WS-Management test
server (in process). No PowerShell runs here, so the server plays the node: the transport's transfer
scripts are emulated on its in-memory files (tests.integration.test_winrm_transport.Emulator) and the
run scripts (start, status, stop, tail, listing) are recognised on their parse trees and answered as
the node would print them (CRLF line ends, UTF-8).

What is checked: the controller side (runs/control.py, runs/start.py) reads those answers correctly through
the transport: a detached start uploads launch.ps1 and ``start_node`` reads the launcher's pid,
``status_node`` and ``stop_node`` parse the node's report, ``follow_node`` delivers a log whose
lines look like protocol markers exactly once across a connection dropped in the middle of a batch
(resuming at the byte offset the node sent), and ``fetch_node`` copies what the listing names. What
the scripts do on a real Windows host is not proven here (docs/windows.md, "What the tests prove").
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.errors import CommandFailedError
from orchestrator.inventory import WinRMSettings, load_inventory_text
from orchestrator.plans import apply
from orchestrator.platforms.powershell import PowerShell
from orchestrator.render import LaunchSpec, Renderer, plan_launch
from orchestrator.runs.control import fetch_node, follow_node, status_node, stop_node
from orchestrator.runs.start import Started, start_node
from orchestrator.steps.launch import prepare_plan
from orchestrator.transports.winrm import WinRMTransport
from tests.integration.test_winrm_transport import HOME, Emulator, assignments
from tests.noderecords import nonce_of, said, status_said, tail_batch, tail_said
from tests.winrm_server import Answer, PwshCall, WinRMServer

INVENTORY = """\
cluster:
  name: winlab
  master: win1
  backend: gloo
  train: {script: examples/train_ddp.py}
nodes:
  - {name: win1, host: 10.0.0.1, os: windows, user: bob, nproc: 2, interface: Ethernet,
     windows: {mode: native}}
"""
RUN_ID = "winlab-20261202-120000"
RUN_DIR = f"{HOME}\\cluster-bootstrap\\runs\\{RUN_ID}\\win1"
RUN_DIR_WORD = "($HOME + '\\cluster-bootstrap\\runs\\" + RUN_ID + "\\win1')"

Handler = Callable[[PwshCall], "Answer | None"]


def kind(call: PwshCall) -> str:
    """Which run script the node received (by what its tree calls)."""
    names = {c.name for c in call.commands}
    if "Invoke-CimMethod" in names:
        return "start"
    if "Find-CbTree" in names and "Stop-Process" in names:
        return "stop"
    if "$cbout" in assignments(call):
        return "tail"
    if "Get-CbUnix" in names:
        return "status"
    if "Get-ChildItem" in names:
        return "list"
    return "other"


class Node:
    """The played node: transfers emulated, run scripts answered by ``answers[kind]``."""

    def __init__(self, server: WinRMServer) -> None:
        self.server = server
        self.answers: dict[str, Handler] = {}
        self.calls: dict[str, list[PwshCall]] = {}
        server.on_powershell = Emulator(server.files, self.answer)

    def answer(self, call: PwshCall) -> Answer | None:
        what = kind(call)
        self.calls.setdefault(what, []).append(call)
        # every run script names the run directory of this run and node, as a quoted literal
        if what != "other":
            assert f"GetUnresolvedProviderPathFromPSPath({RUN_DIR_WORD})" in call.script or what == "list"
        handler = self.answers.get(what)
        return handler(call) if handler else None

    def cut_connections(self) -> None:
        """What a network drop does to the controller: every connection to the node is gone."""
        with self.server._lock:
            conns = list(self.server._connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def server() -> Iterator[WinRMServer]:
    srv = WinRMServer(auth="ntlm", username="bob", password="pw")
    with srv:
        yield srv


@pytest.fixture
def transport(server: WinRMServer) -> Iterator[WinRMTransport]:
    t = WinRMTransport(
        "win1",
        PowerShell(),
        host=server.host,
        port=server.port,
        user="bob",
        settings=WinRMSettings(scheme="http", transport="ntlm"),
        allow_insecure=False,
        password=lambda: "pw",
        connect_timeout=5.0,
    )
    yield t
    t.close()


def _spec() -> LaunchSpec:
    inventory = load_inventory_text(INVENTORY, "w.yaml")
    (spec,) = plan_launch(
        inventory,
        backend="gloo",
        master_addr="10.0.0.1",
        run_id=RUN_ID,
        interfaces={"win1": ("Ethernet", None)},
        cpus={"win1": 8},
        pythons={"win1": "C:\\Python312\\python.exe"},
    )
    return spec


# -- start ---------------------------------------------------------------------------------------------


def _start(spec: LaunchSpec, transport: WinRMTransport) -> Started:
    """What `launch --detach` does on the node (steps.launch.start_detached): prepare, then start."""
    apply(prepare_plan(spec.node, transport.platform, spec, renderer=Renderer()), transport)
    return start_node(spec.node, transport, spec.run_id)


def test_start_uploads_launch_ps1_and_reads_the_launchers_identity(
    server: WinRMServer, transport: WinRMTransport
) -> None:
    node = Node(server)
    identity = "4242 134093952000000000"
    node.answers["start"] = lambda call: Answer(stdout=said(call.script, ("started", identity)))
    spec = _spec()
    started = _start(spec, transport)
    assert started.pid == 4242
    assert started.node_log.endswith("/node.log") and started.run_dir.endswith(f"runs/{RUN_ID}/win1")
    uploaded = server.files[f"{RUN_DIR}\\launch.ps1"]
    assert uploaded[3:].decode("utf-8") == Renderer().render(spec, PowerShell())
    (call,) = node.calls["start"]
    create = call.command("Invoke-CimMethod")
    assert "Win32_Process" in create.arguments and "Create" in create.arguments
    assert "($HOME + '\\cluster-bootstrap\\runs\\" + RUN_ID + "\\win1\\launch.ps1')" in call.script

    node.answers["start"] = lambda call: Answer(
        stdout=said(call.script, ("started-before", identity)), exit_code=3
    )
    with pytest.raises(CommandFailedError, match="already started") as caught:
        _start(spec, transport)
    assert caught.value.node == "win1"


def test_a_launcher_that_does_not_start_is_an_error_naming_the_node(
    server: WinRMServer, transport: WinRMTransport
) -> None:
    node = Node(server)
    node.answers["start"] = lambda call: Answer(
        stderr="Win32_Process Create failed with code 2 (2 access denied, ...)", exit_code=4
    )
    spec = _spec()
    with pytest.raises(CommandFailedError, match="Win32_Process Create failed with code 2") as caught:
        _start(spec, transport)
    assert caught.value.node == "win1"


# -- status and stop ----------------------------------------------------------------------------------------


def test_status_of_a_running_native_node(server: WinRMServer, transport: WinRMTransport) -> None:
    node = Node(server)
    node.answers["status"] = lambda call: Answer(
        stdout=status_said(
            "now=1767268900\nstarted=1767268780\nalive=1\nsize=4096\n"
            "last=[default1]:[rank 1/2] epoch 2 step 40 loss 0.31 \u2713\ngpu=0, 93, 10240, 24576\n",
            nonce_of(call.script),
        )
    )
    status = status_node(_spec().node, transport, RUN_ID)
    assert status.state == "running" and status.runtime == 120 and status.exit_code is None
    assert status.last_line == "[rank 1/2] epoch 2 step 40 loss 0.31 \u2713"
    assert status.gpus == [{"index": "0", "util_percent": 93, "mem_used_mib": 10240, "mem_total_mib": 24576}]


def test_status_of_an_exited_and_of_a_missing_run(server: WinRMServer, transport: WinRMTransport) -> None:
    node = Node(server)
    node.answers["status"] = lambda call: Answer(
        stdout=status_said(
            "now=1767269000\nstarted=1767268780\nalive=0\nrc=3\nended=1767268900\nsize=10\nlast=boom\n",
            nonce_of(call.script),
        )
    )
    status = status_node(_spec().node, transport, RUN_ID)
    assert (status.state, status.exit_code, status.runtime, status.last_line) == ("exited", 3, 120, "boom")
    node.answers["status"] = lambda call: Answer(
        stdout=status_said("now=1767269000\nstate=no-run\n", nonce_of(call.script))
    )
    assert status_node(_spec().node, transport, RUN_ID).state == "no run"


def test_stop_on_a_native_node(server: WinRMServer, transport: WinRMTransport) -> None:
    node = Node(server)
    node.answers["stop"] = lambda call: Answer(stdout=said(call.script, ("stop", "terminated", "4", "0")))
    result = stop_node(_spec().node, transport, RUN_ID)
    assert (result.state, result.terminated, result.forced) == ("stopped", 4, True)
    node.answers["stop"] = lambda call: Answer(stdout=said(call.script, ("stop", "exited", "0")))
    assert stop_node(_spec().node, transport, RUN_ID).describe() == "nothing to stop: exited with code 0"
    node.answers["stop"] = lambda call: Answer(stdout=said(call.script, ("stop", "earlier", "1767269000")))
    assert stop_node(_spec().node, transport, RUN_ID).state == "stopped earlier"


# -- logs ----------------------------------------------------------------------------------------------

# a log as launch.ps1 writes it (StreamWriter.WriteLine: CRLF), with lines that look like the old
# protocol's markers and a record of the tail's shape with a guessed nonce
LOG_LINES = [
    "[default0]:[rank 0/2] step 1",
    "@@. 999999",
    "@@cb-000000000000 end :MA== :NQ==",
    "[default1]:\u00fcn\u00efcode \u2713 step 1",
    "@@end 0 5",
    "@@@already three",
    "[default0]:@@ not at the start",
    "@@missing",
    "[default1]:done",
]
LOG = "".join(line + "\r\n" for line in LOG_LINES).encode("utf-8")


def offset_asked(call: PwshCall) -> int:
    return int(assignments(call)["$cboffset"][0].removeprefix("[long]"))


def test_follow_resumes_at_the_byte_offset_after_a_dropped_connection(
    server: WinRMServer, transport: WinRMTransport
) -> None:
    node = Node(server)
    first_end = LOG.index(b"@@end")  # batch 1: the first four lines
    delivered = threading.Event()
    offsets: list[int] = []

    def tail(call: PwshCall) -> Answer:
        offset, nonce = offset_asked(call), nonce_of(call.script)
        offsets.append(offset)
        assert assignments(call)["$cbfollow"][0] == "$true"
        if len(offsets) == 1:

            def cut_mid_batch() -> Iterator[bytes]:
                # batch 1 whole, then half of batch 2 without its record, in one piece
                yield tail_batch(nonce, LOG, 0, first_end) + LOG[first_end : first_end + 20]
                assert delivered.wait(15), "batch 1 did not reach the controller"
                node.cut_connections()

            return Answer(chunks=cut_mid_batch())
        end = tail_said(nonce, ("end", "0", str(len(LOG))))
        return Answer(chunks=iter([tail_batch(nonce, LOG, offset, len(LOG)) + end]))

    node.answers["tail"] = tail
    got: list[str] = []
    notes: list[str] = []

    def on_line(name: str, line: str) -> None:
        got.append(line)
        if len(got) == 3:
            delivered.set()

    result = follow_node(
        _spec().node,
        transport,
        RUN_ID,
        follow=True,
        on_line=on_line,
        on_note=lambda n, message: notes.append(message),
        python="C:\\Python312\\python.exe",  # not used on Windows nodes: the PowerShell tail reads
        reconnect_for=30,
    )
    assert got == LOG_LINES  # every line once, "@@"-lines as they are in the log
    assert offsets == [0, first_end]  # resumed just past the last batch delivered
    assert (result.exit_code, result.ended, result.offset, result.lines, result.reconnects) == (
        0,
        True,
        len(LOG),
        len(LOG_LINES),
        1,
    )
    assert notes == [
        f"connection lost after byte {first_end}; reconnecting",
        f"reconnected; resuming at byte {first_end}",
    ]


def test_tail_starts_where_the_node_says_and_a_reconnect_resumes_from_offsets(
    server: WinRMServer, transport: WinRMTransport
) -> None:
    node = Node(server)
    start = LOG.index(b"@@end")  # where the node found the last 5 lines
    mid = LOG.index(b"@@missing")  # batch 1: three of them
    delivered = threading.Event()
    asked: list[tuple[str | None, int]] = []

    def tail(call: PwshCall) -> Answer:
        values = assignments(call)
        lines = values["$cbtail"][0] if "$cbtail" in values else None
        offset, nonce = offset_asked(call), nonce_of(call.script)
        asked.append((lines, offset))
        if len(asked) == 1:

            def cut_mid_batch() -> Iterator[bytes]:
                yield (
                    tail_said(nonce, ("start", str(start)))
                    + tail_batch(nonce, LOG, start, mid)
                    + LOG[mid : mid + 5]
                )
                assert delivered.wait(15), "batch 1 did not reach the controller"
                node.cut_connections()

            return Answer(chunks=cut_mid_batch())
        end = tail_said(nonce, ("end", "0", str(len(LOG))))
        return Answer(chunks=iter([tail_batch(nonce, LOG, offset, len(LOG)) + end]))

    node.answers["tail"] = tail
    got: list[str] = []

    def on_line(name: str, line: str) -> None:
        got.append(line)
        if len(got) == 3:
            delivered.set()

    result = follow_node(
        _spec().node, transport, RUN_ID, follow=True, on_line=on_line, reconnect_for=30, lines=5
    )
    assert got == LOG_LINES[-5:]  # each once, "@@"-lines as in the log
    # asked for the last 5 lines once; the retry resumed from the byte offset, the tail not redone
    assert asked == [("[long]5", 0), (None, mid)]
    assert (result.start, result.offset, result.lines, result.reconnects) == (start, len(LOG), 5, 1)


def test_logs_of_a_run_that_is_not_there(server: WinRMServer, transport: WinRMTransport) -> None:
    node = Node(server)
    node.answers["tail"] = lambda call: Answer(chunks=iter([tail_said(nonce_of(call.script), ("missing",))]))
    with pytest.raises(CommandFailedError, match=f"no run {RUN_ID} on this node"):
        follow_node(_spec().node, transport, RUN_ID, follow=False)


# -- fetch ---------------------------------------------------------------------------------------------


def test_fetch_copies_what_the_listing_names(
    server: WinRMServer, transport: WinRMTransport, tmp_path: Path
) -> None:
    node = Node(server)
    server.files[f"{RUN_DIR}\\metrics.json"] = b'{"loss": 0.3}'
    server.files["D:\\ckpt dir\\epoch 1\\model.pt"] = b"\x00weights"
    node.answers["list"] = lambda call: Answer(
        stdout=said(
            call.script,
            ("file", "0", "13", f"{RUN_DIR}\\metrics.json"),
            ("dir", "1", "D:\\ckpt dir", "8\0epoch 1/model.pt\0"),
            ("missing", "2"),
        )
    )
    fetched = fetch_node(
        _spec().node,
        transport,
        RUN_ID,
        ["metrics.json", "D:\\ckpt dir", "nothing.txt"],
        code_dir=None,
        dest=tmp_path,
    )
    assert [(f.path, f.files, f.bytes) for f in fetched] == [
        ("metrics.json", 1, 13),
        ("D:\\ckpt dir", 1, 8),
        ("nothing.txt", 0, 0),
    ]
    assert fetched[2].source is None
    assert (tmp_path / "metrics.json").read_bytes() == b'{"loss": 0.3}'
    assert (tmp_path / "ckpt dir" / "epoch 1" / "model.pt").read_bytes() == b"\x00weights"
    (call,) = node.calls["list"]
    # relative paths: the run directory, then the code directory; absolute ones as they are
    assert f"GetUnresolvedProviderPathFromPSPath({RUN_DIR_WORD[:-2]}\\metrics.json')" in call.script
    assert "GetUnresolvedProviderPathFromPSPath('D:\\ckpt dir')" in call.script
