"""WinRMTransport against the WS-Management test server (tests/winrm_server), in process: what only
WinRM has (shells reused and deleted, PowerShell's transfer scripts, CLIXML, authentication, TLS,
quotas, WSL distributions, native Windows stopping through the WinRS Signal). What every transport
does is in test_transport_contract.py, where the WinRM case runs a WSL node for real.

The server speaks the real WinRS protocol to the unmodified pywinrm client, but cannot run PowerShell:
the transport's own transfer scripts (put/get, the upload of long scripts, the clean-up) are EMULATED
below by reading their values off the parse tree (the target path, the expected SHA-256, the chunk
size) and updating ``server.files``, which also proves every script the transport sends parses.
Commands that are not PowerShell (the ``_CmdLine`` platform below) run for real through /bin/sh, so
timeouts and cancellation are checked on real processes.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import (
    AuthenticationError,
    CommandFailedError,
    ConnectError,
    TransferError,
    UnreachableError,
    UsageError,
)
from orchestrator.inventory import WinRMSettings
from orchestrator.platforms import Platform, PosixShell
from orchestrator.platforms.powershell import NOT_ELEVATED_MESSAGE, PowerShell
from orchestrator.transports.winrm import WinRMTransport
from tests import pwsh
from tests.winrm_server import Answer, PwshCall, WinRMServer
from tests.winrm_server.interpret import Interpreter, ScriptExit, statements_after

HOME = "C:\\Users\\bob"
TEMP = HOME + "\\AppData\\Local\\Temp\\"


# -- emulation of the transport's own PowerShell ------------------------------------------------------


def _literal(node: Any) -> str:
    text = (node.text or b"").decode()
    return text[1:-1].replace("''", "'")


def assignments(call: PwshCall) -> dict[str, tuple[str, list[str]]]:
    """``$name = ...`` on the tree: variable -> (right-hand text, its single-quoted literals)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for node in pwsh.walk(call.tree.root_node):
        if node.type != "assignment_expression":
            continue
        left, right = node.children[0], node.children[-1]
        literals = [_literal(n) for n in pwsh.walk(right) if n.type == "verbatim_string_characters"]
        found.setdefault((left.text or b"").decode().lower(), ((right.text or b"").decode(), literals))
    return found


def _resolve(path: str) -> str:
    path = path.replace("/", "\\")
    return path if (len(path) > 1 and path[1] == ":") or path.startswith("\\\\") else f"{HOME}\\{path}"


class Emulator:
    """Plays the transport's put/get/remove scripts on ``server.files``; other calls go to ``other``."""

    def __init__(self, server_files: Any, other: Callable[[PwshCall], Answer | None] | None = None) -> None:
        self.files = server_files
        self.other = other
        self.transfers: list[str] = []

    def __call__(self, call: PwshCall) -> Answer | None:
        values = assignments(call)
        if "$target" in values and "FromBase64String" in call.script:
            return self.put(call, values)
        if "$target" in values and "ToBase64String" in call.script:
            return self.get(call, values)
        removes = [c for c in call.commands if c.name.lower() == "remove-item" and c.has("-LiteralPath")]
        if removes and len(call.commands) == 1:
            for arg in removes[0].arguments:
                self.files.pop(_resolve(arg[1:-1].replace("''", "'")), None)
            return Answer()
        return self.other(call) if self.other else None

    def _target(self, values: dict[str, tuple[str, list[str]]]) -> str:
        text, literals = values["$target"]
        if "GetTempPath" in text:
            assert "Join-Path" in text
            return TEMP + literals[0]
        assert "GetUnresolvedProviderPathFromPSPath" in text, text
        return _resolve(literals[0])

    def put(self, call: PwshCall, values: dict[str, tuple[str, list[str]]]) -> Answer:
        assert any(n.type == "variable" and n.text == b"$input" for n in pwsh.walk(call.tree.root_node))
        target = self._target(values)
        expected = values["$expected"][1][0]
        part = target + values["$part"][1][0]
        self.transfers.append(f"put {target}")
        data = bytearray()
        for line in call.stdin.splitlines():
            if line:
                data += base64.b64decode(line, validate=True)
        self.files[part] = bytes(data)
        return self._after_the_hash(call, target, part, expected, hashlib.sha256(data).hexdigest())

    def _after_the_hash(self, call: PwshCall, target: str, part: str, expected: str, actual: str) -> Answer:
        """What the script does once the hash is known (its comparison, its branch, the rename) is run
        from the script itself: a put that renames corrupted bytes into place does so here too."""
        out: list[str] = []
        err: list[str] = []

        def writer(lines: list[str]) -> Any:
            return type("Writer", (), {"WriteLine": staticmethod(lambda value: lines.append(str(value)))})()

        def remove(positional: list[Any], named: dict[str, Any]) -> None:
            self.files.pop(str(named["literalpath"]), None)

        def move(positional: list[Any], named: dict[str, Any]) -> None:
            self.files[str(named["destination"])] = self.files.pop(str(named["literalpath"]))

        interpreter = Interpreter(
            {"$target": target, "$part": part, "$expected": expected, "$actual": actual},
            {"Remove-Item": remove, "Move-Item": move},
            {"[Console]::Out": writer(out), "[Console]::Error": writer(err)},
        )
        statements = statements_after(call.tree, "$actual")
        code = 0
        try:
            interpreter.run(statements)
        except ScriptExit as done:
            code = done.code
        return Answer(stdout="".join(line + "\n" for line in out), stderr="\n".join(err), exit_code=code)

    def get(self, call: PwshCall, values: dict[str, tuple[str, list[str]]]) -> Answer:
        source = self._target(values)
        self.transfers.append(f"get {source}")
        new_object = call.command("New-Object")
        chunk = int(new_object.arguments[-1])
        try:
            data = self.files[source]
        except KeyError:
            return Answer(
                stderr=f'Exception calling "OpenRead" with "1" argument(s): "Could not find file '
                f"'{source}'.\"",
                exit_code=1,
            )
        lines = [f"size {len(data)}"]
        for offset in range(0, len(data), chunk):
            piece = data[offset : offset + chunk]
            lines.append("data " + base64.b64encode(piece).decode())
        lines.append("sha256 " + hashlib.sha256(data).hexdigest())
        return Answer(stdout="\n".join(lines) + "\n")


class _CmdLine(PosixShell):
    """Sends the script as the command line itself: the server runs it with /bin/sh, for real, the way
    it runs anything that is not PowerShell or wsl.exe. With nothing watching stdin (as for native
    PowerShell), a timeout or a cancel is the WinRS Signal and the shell's deletion, checked on a real
    process."""

    name = "cmdline"
    stops_on_stdin_eof = False

    def wrap(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        become: bool = False,
    ) -> str:
        return command

    def stop_on_hangup(self, script: str, *, heartbeat: float | None = None) -> str:
        return script

    def login_command(self, script: str) -> str:
        return script


def _transport(
    server: WinRMServer,
    *,
    platform: Platform | None = None,
    password: str = "pw",
    user: str = "bob",
    **settings: Any,
) -> WinRMTransport:
    scheme = "https" if server.tls else "http"
    settings.setdefault("transport", "ntlm" if "ntlm" in server.auth_methods else "basic")
    allow_insecure = bool(settings.pop("allow_insecure", False))
    return WinRMTransport(
        "win1",
        platform or PowerShell(),
        host=server.host,
        port=server.port,
        user=user,
        settings=WinRMSettings(scheme=scheme, **settings),
        allow_insecure=allow_insecure,
        password=lambda: password,
        connect_timeout=5.0,
    )


@pytest.fixture
def server() -> Iterator[WinRMServer]:
    srv = WinRMServer(auth="ntlm", username="bob", password="pw")
    srv.on_powershell = Emulator(srv.files)
    with srv:
        yield srv


def _alive(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout
    return out.split()


def _await_gone(marker: str, seconds: float = 10.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := _alive(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# -- commands ---------------------------------------------------------------------------------------


def test_exit_codes_and_one_shell_for_every_command(server: WinRMServer) -> None:
    server.on_powershell = Emulator(
        server.files, lambda call: Answer(exit_code=int(call.command("Write-Output").arguments[0]))
    )
    transport = _transport(server)
    try:
        codes = [transport.run(f"Write-Output {n}").exit_code for n in (0, 1, 42, 255)]
    finally:
        transport.close()
    assert codes == [0, 1, 42, 255]
    assert server.requests.count("Create") == 1  # the shell is reused
    assert server.requests[-1] == "Delete"  # and deleted on close
    wrapped = server.calls[0].script
    assert "Set-StrictMode" in wrapped and "exit $global:LASTEXITCODE" in wrapped


def test_two_commands_at_once_run_in_two_shells(server: WinRMServer) -> None:
    both_running = threading.Barrier(2, timeout=15)

    def chunks() -> Iterator[bytes]:
        yield b"started\r\n"
        both_running.wait()  # only two commands running at the same time get past this
        yield b"done\r\n"

    def answer(call: PwshCall) -> Answer:
        together = any(c.arguments == ["together"] for c in call.commands)
        return Answer(chunks=chunks()) if together else Answer(stdout="alone\n")

    server.on_powershell = Emulator(server.files, answer)
    transport = _transport(server)
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(transport.run("Write-Output together")))
        for _ in range(2)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert transport.run("Write-Output alone").stdout == "alone\n"  # an idle shell is reused
    finally:
        transport.close()
    assert [r.stdout for r in results] == ["started\ndone\n"] * 2
    assert server.requests.count("Create") == 2 and server.open_shells() == []


def test_a_shell_windows_deleted_while_idle_is_replaced(server: WinRMServer) -> None:
    server.on_powershell = Emulator(server.files, lambda call: Answer(stdout="ok\n"))
    transport = _transport(server)
    try:
        assert transport.run("Write-Output ok").ok
        with server._lock:  # what Windows does after the shell's IdleTimeout
            server._shells.clear()
        assert transport.run("Write-Output ok").stdout == "ok\n"
    finally:
        transport.close()
    assert server.requests.count("Create") == 2


def test_powershell_errors_arrive_as_readable_text(server: WinRMServer) -> None:
    message = (
        "Get-Item : Cannot find path 'C:\\nope' because it does not exist.\n"
        "At line:1 char:1\n"
        "+ Get-Item C:\\nope\n"
        "+ ~~~~~~~~~~~~~~~~\n"
        "    + CategoryInfo          : ObjectNotFound: (C:\\nope:String) [Get-Item], ItemNotFoundException\n"
        "    + FullyQualifiedErrorId : PathNotFound,Microsoft.PowerShell.Commands.GetItemCommand"
    )
    server.on_powershell = Emulator(server.files, lambda call: Answer(stderr=message, exit_code=1))
    lines: list[str] = []
    transport = _transport(server)
    try:
        result = transport.run("Get-Item C:\\nope", on_line=lambda s, line: lines.append(line))
    finally:
        transport.close()
    assert result.exit_code == 1
    assert result.stderr.splitlines() == message.splitlines()
    assert "CLIXML" not in result.stderr and "_x000D_" not in result.stderr and "<S" not in result.stderr
    assert lines == message.splitlines()


def test_timeout_stops_the_remote_process_and_the_transport_goes_on(server: WinRMServer) -> None:
    marker = f"cbt-winrm-timeout-{time.monotonic_ns()}"
    transport = _transport(server, platform=_CmdLine())
    try:
        result = transport.run_raw(f"echo started; exec sleep 300 # {marker}", timeout=1.5)
        assert result.timed_out and result.exit_code is None and result.stdout == "started\n"
        assert _await_gone(marker) == []
        assert transport.run_raw("echo still usable").stdout == "still usable\n"
    finally:
        transport.close()
    assert "Signal" in server.requests and server.open_shells() == []


def test_close_from_another_thread_stops_a_running_command(server: WinRMServer) -> None:
    marker = f"cbt-winrm-close-{time.monotonic_ns()}"
    transport = _transport(server, platform=_CmdLine())
    started = threading.Event()
    threading.Thread(target=lambda: (started.wait(10), transport.close()), daemon=True).start()
    begin = time.monotonic()
    result = transport.run_raw(
        f"echo started; exec sleep 300 # {marker}", on_line=lambda s, line: started.set()
    )
    assert time.monotonic() - begin < 10 and result.exit_code is None and not result.timed_out
    assert _await_gone(marker) == []
    assert server.open_shells() == []
    with pytest.raises(Exception, match="cancelled"):
        transport.run_raw("echo again")  # closing is for good


def test_a_script_too_long_for_cmd_runs_from_an_uploaded_file(server: WinRMServer) -> None:
    body = "\n".join(f"Write-Output 'line {n} {'x' * 60}'" for n in range(120))
    ran: list[PwshCall] = []

    def other(call: PwshCall) -> Answer:
        ran.append(call)
        assert call.file is not None
        assert call.file in server.files  # it is there while it runs
        return Answer(stdout="ran from a file\n", exit_code=7)

    server.on_powershell = Emulator(server.files, other)
    transport = _transport(server)
    try:
        script = transport.platform.wrap(body)
        assert len(transport.platform.login_command(script)) > 8191
        result = transport.run(body)
        assert "uploaded to a temporary file" in transport.plan(script)
    finally:
        transport.close()
    assert result.exit_code == 7 and result.stdout == "ran from a file\n"
    assert len(ran) == 1 and ran[0].script.lstrip("\ufeff") == script
    assert ran[0].file and ran[0].file.lower().startswith(TEMP.lower()) and ran[0].file.endswith(".ps1")
    assert all(len(line) <= 8191 for line in server.commands)
    assert list(server.files) == []  # deleted after the run


# -- files ----------------------------------------------------------------------------------------


def test_files_round_trip_with_sha256_and_progress(server: WinRMServer, tmp_path: Path) -> None:
    src = tmp_path / "payload.bin"
    payload = os.urandom(300_000) + bytes(range(256))  # several Sends, every byte value
    src.write_bytes(payload)
    progress: list[tuple[int, int]] = []
    transport = _transport(server)
    try:
        transport.put(
            src, "C:/data/deep/payload.bin", progress=lambda done, total: progress.append((done, total))
        )
        assert server.files["C:\\data\\deep\\payload.bin"] == payload
        assert not [f for f in server.files if f.endswith(".bootstrap-part")]
        back: list[tuple[int, int]] = []
        transport.get(
            "C:\\data\\deep\\payload.bin",
            tmp_path / "out" / "back.bin",
            progress=lambda d, t: back.append((d, t)),
        )
        transport.put(tmp_path / "payload.bin", "~/relative.bin")
        (tmp_path / "empty").write_bytes(b"")
        transport.put(tmp_path / "empty", "C:\\empty.txt")
    finally:
        transport.close()
    assert (tmp_path / "out" / "back.bin").read_bytes() == payload
    assert len(progress) >= 4 and progress[-1] == (len(payload), len(payload))
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)
    assert back[-1] == (len(payload), len(payload))
    assert server.files[HOME + "\\relative.bin"] == payload
    assert server.files["C:\\empty.txt"] == b""


def test_get_of_a_missing_file_names_it(server: WinRMServer, tmp_path: Path) -> None:
    transport = _transport(server)
    try:
        with pytest.raises(
            TransferError, match=r"node 'win1': cannot copy C:\\nope.txt .*Could not find file"
        ):
            transport.get("C:\\nope.txt", tmp_path / "x")
    finally:
        transport.close()
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.part").exists()


# -- security and errors ----------------------------------------------------------------------------


def test_ntlm_over_http_encrypts_every_message(server: WinRMServer) -> None:
    server.on_powershell = Emulator(server.files, lambda call: Answer(stdout="ok\n"))
    transport = _transport(server)
    try:
        assert transport.run("Write-Output ok").stdout == "ok\n"
        lane = transport._idle[0]
        assert lane.protocol.transport.encryption is not None  # pywinrm wraps each message
    finally:
        transport.close()


def test_wrong_password_is_an_authentication_error_without_the_password(
    server: WinRMServer, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "Zq7!distinctive-PASSWORD-93"
    caplog.set_level(logging.DEBUG)
    transport = _transport(server, password=secret)
    with pytest.raises(AuthenticationError) as caught:
        transport.connect()
    text = str(caught.value)
    assert "node 'win1'" in text and "'bob'" in text and "rejected" in text
    assert secret not in text and secret not in caplog.text and secret not in transport.describe()


def test_a_correct_password_never_reaches_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    secret = "Zq7!distinctive-PASSWORD-93"
    caplog.set_level(logging.DEBUG)
    with WinRMServer(auth="basic", username="bob", password=secret, tls=True) as srv:
        srv.on_powershell = lambda call: Answer(stdout="hello\n")
        transport = _transport(srv, password=secret, ca_bundle=str(srv.ca_file))
        try:
            result = transport.run("Write-Output hello", on_line=lambda s, line: logging.info("%s", line))
        finally:
            transport.close()
    assert result.stdout == "hello\n"
    assert secret not in caplog.text and secret not in repr(result)


def test_nothing_listening_names_the_fix() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    transport = WinRMTransport(
        "win1",
        PowerShell(),
        host="127.0.0.1",
        port=port,
        user="bob",
        settings=WinRMSettings(),
        password=lambda: "pw",
        connect_timeout=5.0,
    )
    with pytest.raises(UnreachableError) as caught:
        transport.connect()
    text = str(caught.value)
    assert f"WinRM is not listening on 127.0.0.1:{port}" in text
    assert (
        "New-Item -Path WSMan:\\localhost\\Listener -Transport HTTPS" in text and "winrm quickconfig" in text
    )


def test_tls_with_an_unknown_ca_says_ca_bundle_and_a_given_bundle_works() -> None:
    with WinRMServer(auth="ntlm", username="bob", password="pw", tls=True) as srv:
        srv.on_powershell = lambda call: Answer(stdout="tls ok\n")
        with pytest.raises(ConnectError) as caught:
            _transport(srv).connect()
        transport = _transport(srv, ca_bundle=str(srv.ca_file))
        try:
            assert transport.run("Write-Output ok").stdout == "tls ok\n"
            assert transport._idle[0].protocol.transport.encryption is None  # TLS protects it already
        finally:
            transport.close()
    text = str(caught.value)
    assert "node 'win1'" in text and "not trusted" in text and "winrm.ca_bundle" in text
    assert "cert_validation" in text


def test_https_against_an_http_listener_says_so() -> None:
    with WinRMServer(auth="ntlm", username="bob", password="pw", tls=False) as srv:
        transport = WinRMTransport(
            "win1",
            PowerShell(),
            host=srv.host,
            port=srv.port,
            user="bob",
            settings=WinRMSettings(scheme="https"),
            password=lambda: "pw",
            connect_timeout=5.0,
        )
        with pytest.raises(ConnectError) as caught:
            transport.connect()
    assert "does not speak TLS" in str(caught.value) and "winrm.scheme: http" in str(caught.value)


def test_cert_validation_off_with_allow_insecure_works_and_warns_every_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with WinRMServer(auth="ntlm", username="bob", password="pw", tls=True) as srv:
        srv.on_powershell = lambda call: Answer(stdout="ok\n")
        for _ in range(2):
            transport = _transport(srv, cert_validation=False, allow_insecure=True)
            try:
                assert transport.run("Write-Output ok").ok
            finally:
                transport.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cert_validation" in r.message]
    assert len(warnings) == 2 and "win1" in warnings[0].message


def test_basic_over_http_is_refused_unless_allowed_and_then_warns(caplog: pytest.LogCaptureFixture) -> None:
    with WinRMServer(auth="basic", username="bob", password="pw", allow_unencrypted=True) as srv:
        srv.on_powershell = lambda call: Answer(stdout="ok\n")
        with pytest.raises(UsageError) as caught:
            _transport(srv, transport="basic")
        assert srv.requests == []  # refused before anything was sent
        transport = _transport(srv, transport="basic", allow_insecure=True)
        try:
            assert transport.run("Write-Output ok").stdout == "ok\n"
        finally:
            transport.close()
    text = str(caught.value)
    assert "node 'win1'" in text and "winrm.transport: basic" in text and "allow_insecure" in text
    assert any("allow_insecure" in r.message and r.levelno == logging.WARNING for r in caplog.records)


@pytest.mark.parametrize(
    "winrm",
    [
        {"transport": "basic", "scheme": "http"},
        {"transport": "basic", "scheme": "https", "cert_validation": False},
    ],
    ids=["basic-over-http", "unchecked-certificate"],
)
def test_the_cli_refuses_insecure_settings_with_exit_2_before_connecting(
    tmp_path: Path, winrm: dict[str, object]
) -> None:
    """A configuration error found when the inventory is loaded: exit 2 (not 1, a node failing),
    the file, line, node and field named, and not one request reaches the WinRM listener."""
    from tests.conftest import BOOTSTRAP, write_inventory

    tls = winrm["scheme"] == "https"
    with WinRMServer(auth="basic", username="bob", password="pw", tls=tls) as srv:
        srv.on_powershell = lambda call: Answer(stdout="ok\n")
        node = {"name": "win1", "host": srv.host, "port": srv.port, "os": "windows", "user": "bob"}
        node.update({"password_env": "CBT_WIN_PASS", "windows": {"mode": "native"}, "winrm": winrm})
        inventory = write_inventory(tmp_path / "hosts.yaml", [node])
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "NO_COLOR": "1"}
        run = subprocess.run(
            [BOOTSTRAP, "-i", str(inventory), "run", "--", "Write-Output", "ok"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "CBT_WIN_PASS": "pw"},
            stdin=subprocess.DEVNULL,
        )
        assert srv.requests == []  # nothing was sent: not even the password
    assert run.returncode == 2, run.stderr
    field = "winrm.transport" if winrm["scheme"] == "http" else "winrm.cert_validation"
    assert f"error: {inventory}:" in run.stderr and "node 'win1'" in run.stderr, run.stderr
    assert f"field '{field}'" in run.stderr and "allow_insecure: true" in run.stderr, run.stderr
    # allowed on the node: it connects, and every run warns
    node["allow_insecure"] = True
    with WinRMServer(auth="basic", username="bob", password="pw", tls=tls, allow_unencrypted=True) as srv:
        srv.on_powershell = lambda call: Answer(stdout="ok\n")
        node.update(host=srv.host, port=srv.port)
        write_inventory(inventory, [node])
        allowed = subprocess.run(
            [BOOTSTRAP, "-i", str(inventory), "run", "--", "Write-Output", "ok"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "CBT_WIN_PASS": "pw"},
            stdin=subprocess.DEVNULL,
        )
    assert allowed.returncode == 0, allowed.stderr
    assert "allow_insecure" in allowed.stderr, allowed.stderr


def test_basic_disabled_on_the_server_says_how_to_enable_it() -> None:
    with WinRMServer(auth="ntlm", username="bob", password="pw") as srv:
        with pytest.raises(AuthenticationError) as caught:
            _transport(srv, transport="basic", allow_insecure=True).connect()
    text = str(caught.value)
    assert "basic authentication is disabled" in text and "Negotiate" in text
    assert "winrm set winrm/config/service/auth '@{Basic=\"true\"}'" in text


def test_shell_quota_exceeded_names_the_setting() -> None:
    with WinRMServer(auth="ntlm", username="bob", password="pw", max_shells_per_user=1) as srv:
        first = _transport(srv)
        first.connect()
        try:
            with pytest.raises(ConnectError) as caught:
                _transport(srv).connect()
        finally:
            first.close()
    text = str(caught.value)
    assert "quota" in text and "winrm set winrm/config/winrs '@{MaxShellsPerUser=\"50\"}'" in text


# -- WSL mode: commands inside the distribution (the server runs them for real, as Linux processes) ---


def _wsl(server: WinRMServer) -> WinRMTransport:
    from orchestrator.platforms.wsl import WslShell

    return _transport(server, platform=WslShell("Ubuntu-22.04"))


def test_wsl_commands_run_in_the_distribution_with_exit_codes_and_streaming(server: WinRMServer) -> None:
    lines: list[str] = []
    transport = _wsl(server)
    try:
        result = transport.run(
            'echo "in $WSL_DISTRO_NAME"; uname -s; echo oops >&2; exit 5',
            env={"CBT_VALUE": "it's $HOME; `x`"},
            on_line=lambda s, line: lines.append(f"{s}:{line}"),
        )
        env = transport.run('printf "%s\\n" "$CBT_VALUE"', env={"CBT_VALUE": "it's $HOME; `x` 100%"})
    finally:
        transport.close()
    assert result.exit_code == 5 and result.stdout == "in Ubuntu-22.04\nLinux\n" and result.stderr == "oops\n"
    assert lines == ["stdout:in Ubuntu-22.04", "stdout:Linux", "stderr:oops"] or sorted(lines) == sorted(
        ["stdout:in Ubuntu-22.04", "stdout:Linux", "stderr:oops"]
    )
    assert env.stdout == "it's $HOME; `x` 100%\n"
    assert all(line.lower().startswith("wsl.exe -d ubuntu-22.04") for line in server.commands)


def uploaded_scripts(commands: list[str]) -> set[Path]:
    """The temporary scripts these wsl.exe commands (each a base64 script for the distribution's sh)
    ran: in this machine's /tmp, which other tests' nodes share, only this test's own files are its
    to look for."""
    scripts = [base64.b64decode(b).decode() for c in commands for b in re.findall(r"echo (\S+) \| base64", c)]
    return {Path(m) for text in scripts for m in re.findall(r"/tmp/bootstrap-[0-9a-f]{32}\.sh", text)}


def test_wsl_long_scripts_and_files_go_through_the_distribution(server: WinRMServer, tmp_path: Path) -> None:
    transport = _wsl(server)
    body = "\n".join(f"v{n}='{'y' * 70}'" for n in range(150)) + '\necho "total ${#v149}"'
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(250_000))
    target = tmp_path / "in-wsl" / "deep" / "payload.bin"
    try:
        assert len(transport.platform.login_command(transport.platform.wrap(body))) > 8191
        result = transport.run(body)
        as_root = transport.run(body, become=True)
        transport.put(src, str(target), mode=0o640)
        transport.get(str(target), tmp_path / "back.bin")
    finally:
        transport.close()
    assert result.ok and result.stdout == "total 70\n" and as_root.stdout == "total 70\n"
    assert all(len(line) <= 8191 for line in server.commands)
    runners = [c for c in server.commands if "-u root" in c]  # the run-as-root mark reached the runner
    assert len(runners) == 1 and len(runners[0]) < 1000
    scripts = uploaded_scripts(server.commands)
    assert scripts and not [p for p in scripts if p.exists()]  # the uploaded script was deleted
    assert target.read_bytes() == src.read_bytes() and (target.stat().st_mode & 0o777) == 0o640
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()


def test_run_windows_on_a_wsl_node_runs_powershell(server: WinRMServer) -> None:
    server.on_powershell = Emulator(server.files, lambda call: Answer(stdout="NetworkingMode mirrored\n"))
    transport = _wsl(server)
    try:
        result = transport.run_windows("Get-Content -LiteralPath $env:USERPROFILE\\.wslconfig")
    finally:
        transport.close()
    assert result.stdout == "NetworkingMode mirrored\n"
    assert server.calls[-1].command("Get-Content").has("-LiteralPath")


@pytest.mark.parametrize("honours_utf8", [True, False], ids=["wsl-0.64-or-newer", "older-wsl"])
def test_a_wrong_distribution_is_named_in_readable_text(tmp_path: Path, honours_utf8: bool) -> None:
    """wsl.exe writes its own messages in UTF-16LE unless WSL_UTF8=1 is in its environment. Every
    shell of the transport has it (wsl.exe 0.64 and newer then write UTF-8), and the UTF-16LE of an
    older wsl.exe, which ignores it, is decoded: `bootstrap run` on a node whose windows.distro does
    not exist shows wsl.exe's message as text, not as letters with a NUL between each."""
    from tests.conftest import BOOTSTRAP, write_inventory

    with WinRMServer(auth="ntlm", username="bob", password="pw") as srv:
        srv.wsl.honours_utf8 = honours_utf8
        node: dict[str, object] = {"name": "win1", "host": srv.host, "port": srv.port, "os": "windows"}
        node.update(user="bob", password_env="CBT_WIN_PASS", winrm={"scheme": "http"})
        node["windows"] = {"mode": "wsl", "distro": "Ubuntu-2204"}  # installed: Ubuntu-22.04
        inventory = write_inventory(tmp_path / "hosts.yaml", [node])
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "NO_COLOR": "1"}
        run = subprocess.run(
            [BOOTSTRAP, "-i", str(inventory), "run", "--", "echo", "hi"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "CBT_WIN_PASS": "pw"},
            stdin=subprocess.DEVNULL,
        )
        written = list(srv.wsl.written)
    assert run.returncode == 1, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("[win1]")]
    assert [line.split(None, 1)[1] for line in lines] == [
        "There is no distribution with the supplied name.",
        "Error code: Wsl/Service/WSL_E_DISTRO_NOT_FOUND",
    ], run.stdout
    assert "\x00" not in run.stdout + run.stderr
    assert re.search(r"win1\W+exit 4294967295", run.stderr), run.stderr
    # the message left wsl.exe in UTF-8 when it knows WSL_UTF8=1 (so the shell had it), else in UTF-16LE
    assert written == (["utf-8"] if honours_utf8 else ["utf-16-le"])


# -- the real CLI: a WSL-mode Windows node beside Linux nodes in the namespace cluster --------------


def test_cli_run_reaches_a_wsl_node_beside_linux_nodes(
    cluster: Any, bootstrap: Callable[..., Any], trusted_home: Path, tmp_path: Path
) -> None:
    from tests.conftest import write_inventory
    from tests.winrm_server import start_in_host

    secret = "Wq9!distinctive-cli-PASSWORD"
    win_host = cluster.hosts[2]
    hosted = start_in_host(cluster, win_host, auth="ntlm", username="bob", password=secret, tls=True)
    try:
        nodes: list[dict[str, object]] = [
            {"name": h.name, "host": h.addr, "user": "root"} for h in cluster.hosts[:2]
        ]
        nodes.append(
            {
                "name": "win3",
                "host": win_host.addr,
                "os": "windows",
                "user": "bob",
                "password_env": "CBT_WIN_PASSWORD",
                "winrm": {"ca_bundle": str(hosted.ca_file)},
                "windows": {"mode": "wsl", "distro": "Ubuntu-22.04"},
            }
        )
        inventory = write_inventory(tmp_path / "hosts.yaml", nodes, name="mixed", master="node1")
        script = 'echo "hello from $(hostname) $(uname -s)"; [ "$(hostname)" != node3 ] || exit 7'
        run = bootstrap("-vv", "-i", str(inventory), "run", "--", script, env={"CBT_WIN_PASSWORD": secret})
        plain = bootstrap(
            "-i",
            str(inventory),
            "run",
            "--nodes",
            "win3",
            "--",
            "uname",
            "-a",
            env={"CBT_WIN_PASSWORD": secret},
        )
        commands, parse_errors = hosted.commands(), hosted.parse_errors()  # gone once it stops
    finally:
        hosted.stop()
    assert run.returncode == 1, run  # win3 exited 7
    for name, hostname in (("node1", "node1"), ("node2", "node2"), ("win3", "node3")):
        assert re.search(rf"^\[{name}\] +hello from {hostname} Linux$", run.stdout, re.M), run
    assert re.search(r"win3\W+exit 7", run.stderr), run
    assert plain.returncode == 0 and re.search(r"^\[win3\] +Linux node3 ", plain.stdout, re.M), plain
    assert secret not in run.stdout + run.stderr + plain.stdout + plain.stderr
    assert parse_errors == []
    assert commands and all(c.lower().startswith("wsl.exe -d ubuntu-22.04") for c in commands)


def test_wsl_node_firewall_rules_run_on_the_windows_host(tmp_path: Path) -> None:
    """A WSL node's firewall lives on the Windows host under the distribution: the Hyper-V rules
    script goes through the host's PowerShell (run_windows), not through wsl.exe."""
    from orchestrator.inventory import load_inventory_text
    from orchestrator.platforms.wsl import WslShell
    from orchestrator.runner import converge
    from orchestrator.steps.firewall import Firewall, FirewallContext

    inv = load_inventory_text(
        "cluster: {name: lab, master: c}\n"
        "nodes:\n"
        "  - {name: c, host: 10.0.0.1}\n"
        "  - {name: w, host: 10.0.0.2, os: windows, windows: {mode: wsl}}\n",
        "hosts.yaml",
    )
    step, context = Firewall(inv), FirewallContext({}, {"w": "10.0.0.2", "c": "10.0.0.1"})
    planned = step.plan(inv.node("w"), {}, context)

    def answer(call: PwshCall) -> Answer:
        assert any(c.name == "New-NetFirewallHyperVRule" for c in call.commands)
        return Answer(stdout='{"added": 1, "updated": 0, "removed": 0, "unchanged": 0}\n')

    with WinRMServer(auth="ntlm", username="bob", password="pw", on_powershell=answer) as srv:
        transport = _transport(srv, platform=WslShell("Ubuntu"))
        try:
            result = converge(step, inv.node("w"), transport, planned, context)
        finally:
            transport.close()
        assert result.applied and result.added == 1
        assert not any("wsl.exe" in line for line in srv.commands)  # never through the distribution


@pytest.mark.parametrize("mode", ["native", "wsl"])
def test_w32time_is_configured_measured_and_restored_on_the_windows_host(mode: str) -> None:
    """Time on a Windows node is w32time on the host (a WSL2 distribution follows the host clock):
    configured, its offset from the master read with w32tm /stripchart, restored by teardown."""
    from orchestrator.plans import apply
    from orchestrator.platforms.wsl import WslShell
    from orchestrator.runner import converge
    from orchestrator.steps.timesync import NodeTime, RestoreTime
    from orchestrator.steps.timesync.steps import w32time_plan, w32time_verdict

    seen: list[str] = []

    def answer(call: PwshCall) -> Answer:
        names = [c.name.lower() for c in call.commands]
        seen.append(call.script)
        if "$cbBefore = Get-Content" in call.script:
            return Answer(stdout="restored\n")
        if "/stripchart" in call.script:
            return Answer(stdout="10:15:01, +00.0012000s\n10:15:03, +00.0010000s\n10:15:05, -00.0004000s\n")
        assert "restart-service" in names and "set-service" in names
        return Answer(stdout="configured\n")

    platform = PowerShell() if mode == "native" else WslShell("Ubuntu")
    with WinRMServer(auth="ntlm", username="bob", password="pw") as srv:
        srv.on_powershell = Emulator(srv.files, answer)  # long scripts arrive as uploaded files
        transport = _transport(srv, platform=platform)
        try:
            value = NodeTime("w", role="client", daemon="w32time", sources=["10.0.0.1"])
            done = w32time_verdict(value, apply(w32time_plan(win_node(mode), value), transport))
            restore = RestoreTime()
            restored = converge(
                restore, win_node(mode), transport, restore.plan(win_node(mode), {}, None), None
            )
        finally:
            transport.close()
        assert done.state == "changed" and done.chrony_offset_ms == 1.0 and done.selected == "10.0.0.1"
        assert restored.state == "restored"
        assert any("/manualpeerlist:10.0.0.1,0x8" in s for s in seen), seen[0]
        assert not any("wsl.exe" in line for line in srv.commands)


def win_node(mode: str) -> Any:
    from orchestrator.inventory import load_inventory_text

    inv = load_inventory_text(
        "cluster: {name: lab, master: c}\n"
        "nodes:\n"
        "  - {name: c, host: 10.0.0.1}\n"
        f"  - {{name: w, host: 10.0.0.2, os: windows, windows: {{mode: {mode}}}}}\n",
        "hosts.yaml",
    )
    return inv.node("w")


# -- steps that need an administrator: a WinRM session that is not elevated ----------------------------


def _not_elevated(seen: list[PwshCall]) -> Callable[[PwshCall], Answer]:
    """A session that is not elevated, as Windows plays it: the product's elevation check
    (``IsInRole``) finds no administrator and exits 740 with its message; a script without that check
    fails at its first cmdlet that needs one, with the access-denied error record."""

    def answer(call: PwshCall) -> Answer:
        seen.append(call)
        if "IsInRole(" in call.script:
            return Answer(console_stderr=NOT_ELEVATED_MESSAGE + "\n", exit_code=740)
        return Answer(stderr="Access is denied.\n    + CategoryInfo : PermissionDenied", exit_code=1)

    return answer


@pytest.mark.parametrize("mode", ["native", "wsl"])
def test_firewall_and_w32time_in_a_session_that_is_not_elevated_say_what_to_do(mode: str) -> None:
    """The firewall rules and w32time need an administrator's (elevated) session. A session that is
    not one gets the product's own error, naming the node, the work and the fix (an account of the
    Administrators group; UAC remote restrictions of local accounts, LocalAccountTokenFilterPolicy),
    before any rule or setting is touched: on a WSL node too, where the scripts run on the Windows
    host beside the distribution."""
    from orchestrator.inventory import load_inventory_text
    from orchestrator.plans import apply
    from orchestrator.platforms.wsl import WslShell
    from orchestrator.runner import converge
    from orchestrator.steps.firewall import Firewall, FirewallContext
    from orchestrator.steps.timesync import NodeTime, RestoreTime
    from orchestrator.steps.timesync.steps import w32time_plan, w32time_verdict

    inv = load_inventory_text(
        "cluster: {name: lab, master: c}\n"
        "nodes:\n"
        "  - {name: c, host: 10.0.0.1}\n"
        f"  - {{name: w, host: 10.0.0.2, os: windows, user: '.\\bob', windows: {{mode: {mode}}}}}\n",
        "hosts.yaml",
    )
    node = inv.node("w")
    seen: list[PwshCall] = []
    errors: list[str] = []
    with WinRMServer(auth="ntlm", username="bob", password="pw") as srv:
        srv.on_powershell = Emulator(srv.files, _not_elevated(seen))  # long scripts arrive as files
        transport = _transport(srv, platform=PowerShell() if mode == "native" else WslShell("Ubuntu"))
        try:
            firewall, context = Firewall(inv), FirewallContext({}, {"w": "10.0.0.2", "c": "10.0.0.1"})
            planned = firewall.plan(node, {}, context)
            restore = RestoreTime()
            value = NodeTime("w", role="client", daemon="w32time", sources=["10.0.0.1"])
            for step in (
                lambda: converge(firewall, node, transport, planned, context),
                lambda: w32time_verdict(value, apply(w32time_plan(node, value), transport)),
                lambda: converge(restore, node, transport, restore.plan(node, {}, None), None),
            ):
                with pytest.raises(CommandFailedError) as caught:
                    step()
                errors.append(str(caught.value))
        finally:
            transport.close()
        assert not any("wsl.exe" in line for line in srv.commands)
    assert len(seen) == 3 and all("IsInRole(" in call.script for call in seen)  # checked before anything
    for error, work in zip(
        errors, ["setting the firewall rules", "configuring w32time", "restoring w32time"], strict=True
    ):
        assert error.startswith(f"node 'w': {work} needs an elevated (administrator) session"), error
        assert "'.\\bob'" in error and "exit code 740" in error
        assert "Add-LocalGroupMember -Group Administrators -Member 'bob'" in error
        assert "LocalAccountTokenFilterPolicy 1" in error and "UAC remote restrictions" in error
        assert NOT_ELEVATED_MESSAGE not in error  # the product's own words, not the script's
