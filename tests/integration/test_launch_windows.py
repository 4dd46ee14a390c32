"""`run_node` on a native Windows node through the real WinRM transport and the WS-Management test
server (in process). No PowerShell runs here, so the server plays the node: the transport's transfer
scripts are emulated on its in-memory files (tests.integration.test_winrm_transport.Emulator) and the
command that runs launch.ps1 is answered with rank lines streamed one by one, as the script prints
them on a real node. What is checked: what lands on the node (launch.ps1 as rendered, UTF-8 with BOM,
parsing cleanly; the training script in the code directory), how it is run (in the WinRS PowerShell,
with -Log and unbuffered Python), live streaming, and the exit code reaching the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from orchestrator.errors import CommandFailedError
from orchestrator.inventory import WinRMSettings, load_inventory_text
from orchestrator.platforms.powershell import PowerShell
from orchestrator.render import LaunchSpec, Renderer, plan_launch
from orchestrator.resources import packaged_example
from orchestrator.runs.ranks import split_rank
from orchestrator.steps.launch import run_node
from orchestrator.transports.winrm import WinRMTransport
from tests import pwsh
from tests.integration.test_winrm_transport import HOME, Emulator, assignments
from tests.unit.test_platform_powershell import invocations
from tests.winrm_server import Answer, PwshCall, WinRMServer

INVENTORY = """\
cluster:
  name: winlab
  master: win1
  backend: gloo
  train: {script: examples/train_ddp.py, args: ["--epochs", 1]}
nodes:
  - {name: win1, host: 10.0.0.1, os: windows, user: bob, nproc: 2, interface: Ethernet,
     windows: {mode: native}}
"""
RUN_ID = "winlab-20261202-120000"
RUN_DIR = f"{HOME}\\cluster-bootstrap\\runs\\{RUN_ID}\\win1"


class Node:
    """Plays the Windows node: transfers emulated, the launch answered with ``lines`` and ``code``."""

    def __init__(self, server: WinRMServer, lines: list[str], code: int) -> None:
        self.lines, self.code = lines, code
        self.seen: list[str] = []
        self.each_seen = threading.Event()
        self.launches: list[PwshCall] = []
        server.on_powershell = Emulator(server.files, self.answer)

    def answer(self, call: PwshCall) -> Answer | None:
        if "launch.ps1" not in call.script:
            return None  # mkdir and the like: exit 0
        self.launches.append(call)

        def chunks() -> Iterator[bytes]:
            for line in self.lines:
                self.each_seen.clear()
                yield (line + "\r\n").encode()
                # the next line only once the controller has the previous one: streaming, not at exit
                assert self.each_seen.wait(15), f"{line!r} did not reach the controller while running"

        return Answer(chunks=chunks(), exit_code=self.code)


@pytest.fixture
def server() -> Iterator[WinRMServer]:
    srv = WinRMServer(auth="ntlm", username="bob", password="pw")
    with srv:
        yield srv


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


def _run(server: WinRMServer, node: Node) -> tuple[list[str], CommandFailedError | None]:
    transport = WinRMTransport(
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
    got: list[str] = []

    def on_line(name: str, line: str) -> None:
        assert name == "win1"
        got.append(line)
        node.each_seen.set()

    spec = _spec()
    try:
        run_node(spec.node, transport, spec, renderer=Renderer(), on_line=on_line)
    except CommandFailedError as exc:
        return got, exc
    finally:
        transport.close()
    return got, None


def test_a_native_windows_node_gets_its_script_and_streams_each_rank(server: WinRMServer) -> None:
    lines = ["[default0]:[rank 0/2] step 1", "[default1]:[rank 1/2] step 1", "[default0]:done: 1 steps"]
    node = Node(server, lines, 0)
    got, error = _run(server, node)
    assert error is None and got == lines
    assert [split_rank(line)[0] for line in got] == [0, 1, 0]
    # launch.ps1 as rendered, UTF-8 with a BOM (Windows PowerShell 5.1 reads a BOM-less file as ANSI)
    uploaded = server.files[f"{RUN_DIR}\\launch.ps1"]
    assert uploaded.startswith(b"\xef\xbb\xbf")
    text = uploaded[3:].decode("utf-8")
    assert text == Renderer().render(_spec(), PowerShell())
    tree = pwsh.assert_parses(text)
    assert [c.arguments for c in pwsh.commands(tree) if c.name == "Start-CbRank"] == [["0", "0"], ["1", "1"]]
    example = packaged_example()
    assert example is not None
    code = server.files[f"{HOME}\\cluster-bootstrap\\code\\examples\\train_ddp.py"]
    assert code == example.read_bytes()
    # run in the WinRS PowerShell itself, logging on the node, Python unbuffered
    (launch,) = node.launches
    where = "($HOME + '\\cluster-bootstrap\\runs\\" + RUN_ID + "\\win1\\"
    (invocation,) = [c for c in launch.commands if c.name == where + "launch.ps1')"]  # & (path) ...
    assert invocation.parameters == ["-log"] and invocation.arguments == [where + "node.log')"]
    assert "$env:PYTHONUNBUFFERED = '1'" in launch.script


def test_a_failing_native_windows_node_reports_the_ranks_exit_code(server: WinRMServer) -> None:
    lines = ["[default1]:Traceback (most recent call last):", "local rank 1 exited with code 3: stopping"]
    node = Node(server, lines, 3)
    got, error = _run(server, node)
    assert got == lines
    assert error is not None and "training exited with code 3" in str(error) and error.node == "win1"
    assert error.result is not None and error.result.tail(2) == lines
    assert "node.log" in (error.hint or "")


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


def test_the_run_directory_is_owner_only_before_launch_ps1_is_put_there(server: WinRMServer) -> None:
    """launch.ps1 may hold train.env secrets: the node is told to give the run directory an
    owner-only access list before the script is uploaded into it (the statement's every part is
    checked in tests/unit/test_platform_powershell.py). The server keeps files, not directories or
    access lists: what it received, and in which order, is checked. That Windows applies the list
    as written is proven only on a real host (docs/windows.md, "What the tests prove")."""
    node = Node(server, ["[default0]:done: 1 steps"], 0)
    _, error = _run(server, node)
    assert error is None
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
