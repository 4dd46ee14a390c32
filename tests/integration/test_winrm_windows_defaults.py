"""The WinRM transport against the test server where it plays what a default Windows host does, and
the test would pass only if the PRODUCT handles it (not the server):

- a stopped ``wsl.exe`` command leaves its Linux processes running (Windows ends wsl.exe only): what
  stops them is the product closing the command's stdin first (``stop_on_hangup`` in the script,
  end-of-file sent by the transport), also for a transfer cancelled while its data is being sent, and
  for what still reads the stdin of a command that ended on its own;
- stderr is CLIXML only for PowerShell's own error records; ``[Console]::Error`` and native programs
  write plain text, before or inside the CLIXML document;
- ``AllowUnencrypted=false``: Basic over HTTP is refused (the product must say what to do), NTLM over
  HTTP must seal every message;
- ``MaxEnvelopeSizekb``: every request the product sends fits the smallest Windows value (150 KiB); a
  host set lower answers HTTP 413, and the product names the setting to raise;
- the SHA-256 check of transfers, with the SERVER corrupting the bytes in either direction;
- cmd.exe's 8191-character limit, as the server's cmd.exe counts it (with WinRS's ``cmd.exe /c ``): a
  command line exactly at the product's limit (which keeps a margin under it) and just under it runs
  inline, one character over goes through the product's upload fallback (native: ``-File``);
- certificate authentication: a TLS client certificate of the host's CA, mapped to an account.

Native (PowerShell) transfers are played by ``tests.integration.test_winrm_transport.Emulator``
(no PowerShell runs here); WSL ones run the product's real sh scripts as Linux processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import AuthenticationError, CancelledError, ConnectError, TransferError
from orchestrator.inventory import WinRMSettings
from orchestrator.platforms import Platform
from orchestrator.platforms.powershell import PowerShell
from orchestrator.platforms.wsl import WslShell
from orchestrator.transports.winrm import WinRMTransport
from orchestrator.transports.winrm_shell import line_limit
from tests.integration.test_winrm_transport import Emulator, uploaded_scripts
from tests.integration.test_winrm_transport import _transport as with_password
from tests.winrm_server import Answer, Distro, PwshCall, WinRMServer
from tests.winrm_server.server import CMD_LINE_LIMIT, WINRS_WRAPPING

DISTRO = "Ubuntu-22.04"


def _transport(
    server: WinRMServer, platform: Platform | None = None, *, allow_insecure: bool = False, **settings: Any
) -> WinRMTransport:
    settings.setdefault("transport", "ntlm" if "ntlm" in server.auth_methods else "basic")
    return WinRMTransport(
        "win1",
        platform or PowerShell(),
        host=server.host,
        port=server.port,
        user="bob",
        settings=WinRMSettings(scheme="https" if server.tls else "http", **settings),
        allow_insecure=allow_insecure,
        password=lambda: "pw",
        connect_timeout=5.0,
    )


@pytest.fixture
def server() -> Iterator[WinRMServer]:
    """A default Windows host: NTLM over HTTP (sealed), AllowUnencrypted=false, MaxEnvelopeSizekb 500."""
    srv = WinRMServer(auth="ntlm", username="bob", password="pw")
    srv.on_powershell = Emulator(srv.files)
    with srv:
        yield srv


def _until(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout.split()


# -- WSL: what stops the Linux processes is the product's end-of-file ----------------------------------


def test_a_timed_out_wsl_command_is_stopped_by_the_products_end_of_file(server: WinRMServer) -> None:
    """Windows (and this server) ends only wsl.exe on terminate and shell Delete. The Linux processes
    are gone because the transport closed the command's stdin before terminating it."""
    marker = f"cbt-eof-timeout-{time.monotonic_ns()}"
    transport = _transport(server, WslShell(DISTRO))
    try:
        result = transport.run(f"echo started; sleep 300; : {marker}", timeout=1.5)
    finally:
        transport.close()
    assert result.timed_out and result.stdout == "started\n"
    assert server.requests.count("Send") == 1  # the end-of-file: the command had no other input
    assert _until(lambda: not _alive(marker)), _alive(marker)
    assert _until(lambda: not server.orphaned_pids()), server.orphaned_pids()


def test_a_cancelled_wsl_command_is_stopped_by_the_products_end_of_file(server: WinRMServer) -> None:
    marker = f"cbt-eof-cancel-{time.monotonic_ns()}"
    transport = _transport(server, WslShell(DISTRO))
    started = threading.Event()

    def cancel() -> None:
        started.wait(10)
        transport.close()

    threading.Thread(target=cancel, daemon=True).start()
    result = transport.run(f"echo started; sleep 300; : {marker}", on_line=lambda s, line: started.set())
    assert result.exit_code is None and not result.timed_out
    assert server.requests.count("Send") == 1
    assert _until(lambda: not _alive(marker)), _alive(marker)
    assert _until(lambda: not server.orphaned_pids()), server.orphaned_pids()


def _cancel_while_sending(transport: WinRMTransport, after_bytes: int) -> Callable[[int, int], None]:
    """A progress callback that closes ``transport`` from another thread (as fail-fast and Ctrl-C do)
    once ``after_bytes`` were handed to the sender, and holds the sender until the close is done: the
    transfer is cancelled while its data is still being sent, never after its last chunk."""
    reached, closed = threading.Event(), threading.Event()

    def close() -> None:
        if reached.wait(60):
            transport.close()
        closed.set()

    threading.Thread(target=close, daemon=True).start()

    def progress(done: int, total: int) -> None:
        if done >= after_bytes and not reached.is_set():
            assert done < total, "the cancel must come while data is still being sent"
            reached.set()
            closed.wait(30)

    return progress


def test_a_wsl_put_cancelled_while_sending_leaves_no_process_and_no_part_file(
    server: WinRMServer, tmp_path: Path
) -> None:
    """A 30 MB put into the distribution, cancelled after its first Sends. Windows (and this server)
    ends only wsl.exe: the receiving ``sh``, ``tr`` and ``base64 -d`` would wait for more input for
    ever, beside a half-written ``NAME.bootstrap-part.PID``. The transport closes the command's stdin
    before terminating it: the script then fails its hash check, removes its part file and exits."""
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(30 * 1024 * 1024))
    target = tmp_path / "wsl" / "big.bin"
    transport = _transport(server, WslShell(DISTRO))
    try:
        with pytest.raises(CancelledError) as caught:
            transport.put(src, str(target), progress=_cancel_while_sending(transport, 300_000))
    finally:
        transport.close()
    assert "node 'win1'" in str(caught.value) and "cancelled while copying" in str(caught.value)
    assert 2 < server.requests.count("Send") < 100  # some of the 30 MB went, most did not
    assert _until(lambda: not server.orphaned_pids()), server.orphaned_pids()
    assert sorted(p.name for p in target.parent.iterdir()) == []  # no part file, no target
    assert not target.exists()


def test_a_wsl_get_cancelled_while_receiving_stops_in_the_distribution(
    server: WinRMServer, tmp_path: Path
) -> None:
    """A get from the distribution cancelled after its first data lines: its sending script stops
    on the transport's end-of-file (the one Send of the transfer) instead of reading and encoding
    the rest of the 30 MB behind an ended wsl.exe; nothing is written locally."""
    source = tmp_path / "checkpoint.bin"
    source.write_bytes(os.urandom(30 * 1024 * 1024))
    local = tmp_path / "out" / "checkpoint.bin"
    transport = _transport(server, WslShell(DISTRO))
    try:
        with pytest.raises(CancelledError) as caught:
            transport.get(str(source), local, progress=_cancel_while_sending(transport, 300_000))
    finally:
        transport.close()
    assert "node 'win1'" in str(caught.value) and "cancelled while copying" in str(caught.value)
    assert server.requests.count("Send") == 1  # the end-of-file: a get sends nothing else
    assert _until(lambda: not server.orphaned_pids()), server.orphaned_pids()
    assert not local.exists() and not local.with_name("checkpoint.bin.part").exists()


def test_wsl_commands_that_end_on_their_own_leave_nothing_in_the_distribution(
    server: WinRMServer, tmp_path: Path
) -> None:
    """A finished command's script has a watcher still reading its stdin (it stops the job on an
    end-of-file). Whether wsl.exe ending closes that stdin is not documented (this server: it does
    not), so the transport closes it itself once the command has ended: commands, a put and a get
    leave no process behind."""
    (tmp_path / "src.bin").write_bytes(b"x" * 1000)
    transport = _transport(server, WslShell(DISTRO))
    try:
        assert transport.run("echo one").stdout == "one\n"
        assert transport.run("exit 3").exit_code == 3
        transport.put(tmp_path / "src.bin", str(tmp_path / "wsl" / "dst.bin"))
        transport.get(str(tmp_path / "wsl" / "dst.bin"), tmp_path / "back.bin")
        assert _until(lambda: not server.orphaned_pids()), server.orphaned_pids()
    finally:
        transport.close()
    assert (tmp_path / "back.bin").read_bytes() == b"x" * 1000


# -- stderr: plain text and CLIXML, as Windows mixes them ---------------------------------------------


@pytest.mark.parametrize("inside", [False, True], ids=["plain-before-clixml", "plain-inside-clixml"])
def test_plain_and_clixml_stderr_both_read_as_text(server: WinRMServer, inside: bool) -> None:
    """A script whose native program (or [Console]::Error.WriteLine) writes plain text and which also
    fails a cmdlet (an error record, CLIXML): the user reads both as lines, in order, nothing of
    the XML left."""

    def answer(call: PwshCall) -> Answer:
        return Answer(
            stdout="out\n",
            console_stderr="python.exe: naïve warning ✓\nsecond plain line\n",
            stderr="Get-Item : Cannot find path 'C:\\nope_x' because it does not exist.\n"
            "    + CategoryInfo          : ObjectNotFound: (C:\\nope_x:String) [Get-Item]",
            console_stderr_inside=inside,
            exit_code=1,
        )

    server.on_powershell = Emulator(server.files, answer)
    lines: list[tuple[str, str]] = []
    transport = _transport(server)
    try:
        result = transport.run(
            "python.exe -c 'x'; Get-Item C:\\nope_x", on_line=lambda s, x: lines.append((s, x))
        )
    finally:
        transport.close()
    expected = [
        "python.exe: naïve warning ✓",
        "second plain line",
        "Get-Item : Cannot find path 'C:\\nope_x' because it does not exist.",
        "    + CategoryInfo          : ObjectNotFound: (C:\\nope_x:String) [Get-Item]",
    ]
    assert result.exit_code == 1 and result.stdout == "out\n"
    assert result.stderr.splitlines() == expected
    assert [x for s, x in lines if s == "stderr"] == expected
    assert not any(t in result.stderr for t in ("CLIXML", "<Objs", "<S ", "_x000D_", "Preparing modules"))


def test_native_programs_stderr_passes_unchanged(server: WinRMServer) -> None:
    """A WSL command's stderr is the Linux program's own bytes (no CLIXML at all); one that merely
    looks like markup stays as it is."""
    transport = _transport(server, WslShell(DISTRO))
    try:
        result = transport.run("echo 'plain <S S=\"Error\">x</S> _x000D_' >&2; echo 'ünïcode' >&2; exit 2")
    finally:
        transport.close()
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ['plain <S S="Error">x</S> _x000D_', "ünïcode"]


# -- AllowUnencrypted=false ------------------------------------------------------------------------------


def test_basic_over_http_refused_by_a_default_host_says_to_use_https() -> None:
    """The inventory allowed Basic over HTTP (allow_insecure: true); a default Windows host still
    refuses it. The user is told why and what to do, not only that the password was rejected."""
    with WinRMServer(auth="basic", username="bob", password="pw") as srv:
        transport = _transport(srv, transport="basic", allow_insecure=True)
        with pytest.raises(AuthenticationError) as caught:
            transport.connect()
        assert srv.commands == [] and srv.refusals[0].startswith("401 Basic over HTTP")
    text = str(caught.value)
    assert "node 'win1'" in text and "rejected" in text and "over unencrypted HTTP" in text
    assert 'AllowUnencrypted="true"' in text and "HTTPS" in text
    hint = caught.value.hint or ""
    # the way out first (HTTPS, or NTLM's encryption), the lab-only opt-out next, the password last
    assert hint.startswith("set winrm.scheme: https")
    assert hint.index("winrm.transport: ntlm") < hint.index("AllowUnencrypted") < hint.index("check user:")


def test_the_cli_shows_the_https_advice_with_exit_3(tmp_path: Path) -> None:
    from tests.conftest import BOOTSTRAP, write_inventory

    with WinRMServer(auth="basic", username="bob", password="pw") as srv:
        node = {"name": "win1", "host": srv.host, "port": srv.port, "os": "windows", "user": "bob"}
        node.update(password_env="CBT_WIN_PASS", windows={"mode": "native"}, allow_insecure=True)
        node["winrm"] = {"transport": "basic", "scheme": "http"}
        inventory = write_inventory(tmp_path / "hosts.yaml", [node])
        run = subprocess.run(
            [BOOTSTRAP, "-i", str(inventory), "run", "--", "Write-Output", "ok"],
            capture_output=True,
            text=True,
            timeout=120,
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(tmp_path),
                "NO_COLOR": "1",
                "CBT_WIN_PASS": "pw",
            },
            stdin=subprocess.DEVNULL,
        )
        assert srv.commands == []
    assert run.returncode == 3, run.stderr
    assert "win1" in run.stderr and 'AllowUnencrypted="true"' in run.stderr and "HTTPS" in run.stderr


def test_a_command_over_max_memory_per_shell_mb_says_which_setting_and_what_to_do(tmp_path: Path) -> None:
    """`bootstrap run` on a native node whose command starts a program (a real Python process here, in
    the shell's job) that takes 200 MB with MaxMemoryPerShellMB 64: the server ends the command as
    Windows ends a remote operation over its memory quota, and the CLI names the setting, how to raise
    it and the way around it, exit code 1."""
    from tests.conftest import BOOTSTRAP, write_inventory

    hog = "import time\nblock = b'x' * (200 << 20)\ntime.sleep(30)\n"

    def handler(call: PwshCall) -> Answer:
        if "hog.py" not in call.script:
            return Answer()
        child = srv.processes.create(
            "python.exe",
            "python.exe hog.py",
            parent=call.process,
            argv=[sys.executable, "-c", hog],
            stdout=subprocess.DEVNULL,
        )
        child.ended.wait(30)
        return Answer(exit_code=child.exit_code or 0)

    srv = WinRMServer(auth="ntlm", username="bob", password="pw", max_memory_per_shell_mb=64)
    srv.on_powershell = handler
    with srv:
        node = {"name": "win1", "host": srv.host, "port": srv.port, "os": "windows", "user": "bob"}
        node.update(password_env="CBT_WIN_PASS", windows={"mode": "native"})
        node["winrm"] = {"transport": "ntlm", "scheme": "http"}
        inventory = write_inventory(tmp_path / "hosts.yaml", [node])
        run = subprocess.run(
            [BOOTSTRAP, "-i", str(inventory), "run", "--", "python.exe", "hog.py"],
            capture_output=True,
            text=True,
            timeout=120,
            env={
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": str(tmp_path),
                "NO_COLOR": "1",
                "CBT_WIN_PASS": "pw",
            },
            stdin=subprocess.DEVNULL,
        )
        assert len(srv.processes.over_memory) == 1
    assert run.returncode == 1, run.stderr
    text = " ".join(run.stderr.split())
    assert "win1" in text and "MaxMemoryPerShellMB quota" in text, run.stderr
    assert "winrm set winrm/config/winrs '@{MaxMemoryPerShellMB=\"8192\"}'" in text, run.stderr
    assert f"bootstrap -i {inventory} launch" in text  # on this inventory: pasted, it acts on it


def test_ntlm_over_http_passes_a_default_host_because_every_message_is_sealed(server: WinRMServer) -> None:
    server.on_powershell = Emulator(server.files, lambda call: Answer(stdout="ok\n"))
    transport = _transport(server)
    try:
        assert transport.run("Write-Output ok").stdout == "ok\n"
    finally:
        transport.close()
    assert server.refusals == [] and server.encrypted_requests == len(server.requests) > 0


def test_a_host_that_refuses_sealed_messages_is_told_apart_from_a_wrong_password(server: WinRMServer) -> None:
    """The NTLM login succeeds, then every sealed message gets 401: the message names the
    encryption and HTTPS, never the password; a wrong password on the same host still names it."""
    server.on_powershell = Emulator(server.files, lambda call: Answer(stdout="ok\n"))
    server.refuse_sealing = True
    transport = _transport(server)
    try:
        with pytest.raises(ConnectError) as caught:
            transport.run("Write-Output ok")
    finally:
        transport.close()
    assert (
        server.refusals
        and server.refusals[0] == "401 an NTLM-sealed message refused after a successful login"
    )
    text = str(caught.value)
    assert "node 'win1'" in text and "encrypted messages" in text and "winrm.scheme: https" in text
    assert "password" not in text.replace("password are not the problem", "")
    assert not isinstance(caught.value, AuthenticationError)
    wrong = with_password(server, password="wrong")
    try:
        with pytest.raises(AuthenticationError) as rejected:
            wrong.run("Write-Output ok")
    finally:
        wrong.close()
    assert "password" in str(rejected.value)


# -- MaxEnvelopeSizekb -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["native", "wsl"])
def test_transfers_fit_the_smallest_windows_envelope(mode: str, tmp_path: Path) -> None:
    """150 KiB, Windows' MaxEnvelopeSizekb before Windows 8 / Server 2012 (500 since): a 1 MB
    round trip, and no request the product sends is refused (HTTP 413) or larger."""
    payload = os.urandom(1_000_000)
    (tmp_path / "src.bin").write_bytes(payload)
    remote = "C:\\data\\big.bin" if mode == "native" else str(tmp_path / "wsl" / "big.bin")
    with WinRMServer(auth="ntlm", username="bob", password="pw", max_envelope_kb=150) as srv:
        srv.on_powershell = Emulator(srv.files)
        transport = _transport(srv, PowerShell() if mode == "native" else WslShell(DISTRO))
        try:
            transport.put(tmp_path / "src.bin", remote)
            transport.get(remote, tmp_path / "back.bin")
        finally:
            transport.close()
        assert srv.refusals == []
        assert 100 * 1024 < srv.largest_request <= 150 * 1024  # big Sends, yet under the limit
    assert (tmp_path / "back.bin").read_bytes() == payload


@pytest.mark.parametrize("mode", ["native", "wsl"])
def test_a_host_with_a_smaller_envelope_limit_gets_the_setting_to_raise(mode: str, tmp_path: Path) -> None:
    """A host whose MaxEnvelopeSizekb was lowered below what the product's Sends take answers HTTP 413.
    The put fails at once (its command would otherwise wait for that input for ever) with the setting,
    the value the product needs and where its own chunk size is set; nothing is left on the node."""
    (tmp_path / "src.bin").write_bytes(os.urandom(1_000_000))
    remote = "C:\\data\\big.bin" if mode == "native" else str(tmp_path / "wsl" / "big.bin")
    with WinRMServer(auth="ntlm", username="bob", password="pw", max_envelope_kb=100) as srv:
        srv.on_powershell = Emulator(srv.files)
        transport = _transport(srv, PowerShell() if mode == "native" else WslShell(DISTRO))
        try:
            with pytest.raises(ConnectError) as caught:
                transport.put(tmp_path / "src.bin", remote)
        finally:
            transport.close()
        assert srv.refusals and srv.refusals[0].startswith("413")
        assert _until(lambda: not srv.orphaned_pids()), srv.orphaned_pids()
        leftovers = list(srv.files) if mode == "native" else list(Path(remote).parent.iterdir())
    text = str(caught.value)
    assert "node 'win1'" in text and "HTTP 413" in text and "MaxEnvelopeSizekb" in text
    assert "winrm set winrm/config '@{MaxEnvelopeSizekb=\"150\"}'" in text  # what the product needs
    assert "MAX_ENVELOPE in orchestrator/transports/winrm_shell.py" in text
    assert leftovers == []


# -- SHA-256: the server corrupts the bytes --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["native", "wsl"])
def test_a_put_corrupted_on_the_way_fails_the_check_and_replaces_nothing(
    server: WinRMServer, mode: str, tmp_path: Path
) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(200_000))
    if mode == "native":
        target = "C:\\data\\model.bin"
        server.files[target] = b"old contents"
    else:
        target = str(tmp_path / "wsl" / "model.bin")
        Path(target).parent.mkdir()
        Path(target).write_bytes(b"old contents")
    corruption = server.corrupt("stdin", at=5000)
    transport = _transport(server, PowerShell() if mode == "native" else WslShell(DISTRO))
    try:
        with pytest.raises(TransferError) as caught:
            transport.put(src, target)
    finally:
        transport.close()
    assert corruption.fired and corruption.offset is not None and corruption.offset >= 5000
    text = str(caught.value)
    assert (
        "node 'win1'" in text and "model.bin" in text and "SHA-256" in text and "nothing was replaced" in text
    )
    if mode == "native":
        assert server.files[target] == b"old contents" and list(server.files) == [target]
    else:
        assert Path(target).read_bytes() == b"old contents"
        assert sorted(p.name for p in Path(target).parent.iterdir()) == ["model.bin"]


@pytest.mark.parametrize("mode", ["native", "wsl"])
def test_a_get_corrupted_on_the_way_fails_the_check_and_writes_nothing(
    server: WinRMServer, mode: str, tmp_path: Path
) -> None:
    data = os.urandom(200_000)
    if mode == "native":
        source = "C:\\data\\result.bin"
        server.files[source] = data
    else:
        source = str(tmp_path / "result.bin")
        Path(source).write_bytes(data)
    local = tmp_path / "out" / "result.bin"
    corruption = server.corrupt("stdout", at=5000)
    transport = _transport(server, PowerShell() if mode == "native" else WslShell(DISTRO))
    try:
        with pytest.raises(TransferError) as caught:
            transport.get(source, local)
        # the same file, not corrupted this time, arrives whole: the check itself is not what failed
        transport.get(source, tmp_path / "out" / "again.bin")
    finally:
        transport.close()
    assert corruption.fired and corruption.offset is not None and corruption.offset >= 5000
    text = str(caught.value)
    assert "node 'win1'" in text and "result.bin" in text and "failed the SHA-256 check" in text
    assert not local.exists() and not local.with_name("result.bin.part").exists()
    assert (tmp_path / "out" / "again.bin").read_bytes() == data


# -- cmd.exe's 8191 characters ---------------------------------------------------------------------------


def _script_of_line_length(length: int) -> tuple[str, str]:
    """(distribution, script) whose command line, as the transport builds it for a WSL node, is
    exactly ``length`` characters (the base64 in it grows 4 at a time: the distribution's name
    shifts it)."""
    for distro in ("D", "Dx", "Dxx", "Dxxx"):
        platform = WslShell(distro)

        def line(pad: int, platform: WslShell = platform) -> int:
            return len(platform.login_command(platform.stop_on_hangup("echo " + "y" * pad)))

        low, high = 0, length
        while low < high:  # the smallest pad whose line is at least `length`
            mid = (low + high) // 2
            low, high = (mid + 1, high) if line(mid) < length else (low, mid)
        if line(low) == length:
            return distro, "echo " + "y" * low
    raise AssertionError(f"no script makes a {length}-character line")


def _fits_the_servers_cmd_exe(line: str) -> bool:
    """What the server's cmd.exe measures: WinRS's ``cmd.exe /c `` and the line (no variables in ours)."""
    return "%" not in line and len(WINRS_WRAPPING + line) <= CMD_LINE_LIMIT


def test_the_products_limit_keeps_a_margin_under_the_servers_cmd_exe() -> None:
    """The product's own limit stays at least 128 characters under the longest line the server's
    cmd.exe runs (8191 with WinRS's ``cmd.exe /c ``): room for a longer wrapping than the one played."""
    room = CMD_LINE_LIMIT - len(WINRS_WRAPPING)
    for platform in (PowerShell(), WslShell("D")):
        assert room - line_limit(platform) >= 128, platform.name


@pytest.mark.parametrize(
    "over", [0, -1, -3, 1], ids=["exactly-the-limit", "one-under", "three-under", "one-over"]
)
def test_command_lines_at_the_limit_run_inline_and_one_over_is_uploaded(
    server: WinRMServer, over: int
) -> None:
    """A WSL node: a command line exactly at the product's limit and just under it is sent as it is
    and the server's cmd.exe runs it; one character over goes through the upload fallback."""
    length = line_limit(WslShell("D")) + over
    distro, script = _script_of_line_length(length)
    server.wsl.distros = [Distro(distro, default=True)]
    transport = _transport(server, WslShell(distro))
    try:
        planned = transport.plan(script)
        result = transport.run_raw(script)
    finally:
        transport.close()
    assert result.ok and result.stdout == script[len("echo ") :] + "\n", result.stderr
    assert "too long" not in result.stderr
    assert all(_fits_the_servers_cmd_exe(line) for line in server.commands)
    if over <= 0:
        assert [len(line) for line in server.commands] == [length]  # sent as it is
        assert "uploaded to a temporary file" not in planned
    else:
        # the product's fallback: upload the script into the distribution, run it, delete it
        assert len(server.commands) == 3 and length not in [len(line) for line in server.commands]
        assert "uploaded to a temporary file" in planned
        scripts = uploaded_scripts(server.commands)
        assert scripts and not [p for p in scripts if p.exists()]


def _native_scripts_around_the_limit(platform: PowerShell) -> tuple[str, str]:
    """(just under, just over): the longest script whose ``-EncodedCommand`` line is within the
    product's limit, and the same with one more character (its base64 grows 4 at a time)."""
    limit = line_limit(platform)

    def script(pad: int) -> str:
        return f"Write-Output '{'y' * pad}'"

    def length(pad: int) -> int:
        return len(platform.login_command(platform.stop_on_hangup(script(pad))))

    low, high = 0, limit
    while low < high:  # the largest pad whose line fits
        mid = (low + high + 1) // 2
        low, high = (mid, high) if length(mid) <= limit else (low, mid - 1)
    assert length(low) <= limit < length(low + 1)
    return script(low), script(low + 1)


@pytest.mark.parametrize("over", [False, True], ids=["just-under", "just-over"])
def test_a_native_script_just_under_the_limit_runs_inline_and_one_just_over_from_a_file(
    server: WinRMServer, over: bool
) -> None:
    """A native node: the longest script the product sends as ``-EncodedCommand`` runs (the server's
    cmd.exe counts WinRS's ``cmd.exe /c `` too); one character more is uploaded as a .ps1 and run with
    ``-File`` (``file_command``), then deleted."""
    platform = PowerShell()
    under, longer = _native_scripts_around_the_limit(platform)
    script = longer if over else under
    ran: list[PwshCall] = []

    def other(call: PwshCall) -> Answer:
        ran.append(call)
        return Answer(stdout="from a file\n" if call.file else "inline\n")

    server.on_powershell = Emulator(server.files, other)
    transport = _transport(server, platform)
    try:
        result = transport.run_raw(script)
    finally:
        transport.close()
    assert result.ok and "too long" not in result.stderr, result.stderr
    assert all(_fits_the_servers_cmd_exe(line) for line in server.commands)
    (call,) = ran
    assert call.script.lstrip("\ufeff") == script
    if not over:
        assert result.stdout == "inline\n" and call.file is None
        assert [len(line) for line in server.commands] == [len(platform.login_command(script))]
    else:
        assert result.stdout == "from a file\n" and call.file is not None and call.file.endswith(".ps1")
        assert call.command_line.split()[-2:] == ["-File", call.file]
        assert list(server.files) == []  # deleted after the run


# -- winrm.transport: certificate --------------------------------------------------------------------


def _certificate_transport(server: WinRMServer, key_file: Path) -> WinRMTransport:
    return WinRMTransport(
        "win1",
        PowerShell(),
        host=server.host,
        port=server.port,
        user=None,
        settings=WinRMSettings(scheme="https", transport="certificate", ca_bundle=str(server.ca_file)),
        key_file=str(key_file),
        password=lambda: None,
        connect_timeout=5.0,
    )


def test_the_certificate_transport_logs_in_with_the_client_certificate() -> None:
    """The TLS client certificate (one PEM with its key, the node's key_file:) is the login: no
    password, no user name; a certificate the host maps to no account is refused."""
    with WinRMServer(auth="certificate", username="bob", tls=True) as srv:
        srv.on_powershell = lambda call: Answer(stdout="as bob\n")
        transport = _certificate_transport(srv, srv.client_certificate())
        try:
            assert transport.run("Write-Output whoami").stdout == "as bob\n"
        finally:
            transport.close()
        assert srv.refusals == [] and len(srv.calls) == 1
        stranger = _certificate_transport(srv, srv.client_certificate("mallory"))
        with pytest.raises(AuthenticationError) as caught:
            stranger.connect()
        assert srv.refusals == ["401 no client certificate mapped to a user"] and len(srv.calls) == 1
    text = str(caught.value)
    assert "node 'win1'" in text and "client certificate" in text and "rejected" in text
    # no password is involved: the fix is the host's certificate-to-account mapping
    assert "winrm create winrm/config/service/certmapping?Issuer=" in text and "URI=*" in text
    assert '@{Certificate="true"}' in text and "password_env" not in text
