"""The WS-Management test server against the unmodified pywinrm client: what it must get right for the
product's WinRM transport tests to mean anything (the server itself is tests/winrm_server).

Most tests speak Basic over plain HTTP, so they opt out of Windows' default (``allow_unencrypted=True``,
what ``AllowUnencrypted=true`` is on a lab host); the defaults themselves (clear text refused, the
envelope limits) are tested in their own section."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import winrm
import xmltodict
from winrm.exceptions import (
    InvalidCredentialsError,
    WinRMOperationTimeoutError,
    WinRMTransportError,
    WSManFaultError,
)

from tests.cluster import NamespaceCluster, _wait_pids_gone
from tests.conftest import require_cluster_support
from tests.netns import inside
from tests.winrm_server import Answer, Distro, PwshCall, WinRMServer, start_in_host
from tests.winrm_server.cmdline import quote
from tests.winrm_server.processes import MEMORY_MESSAGE, QUOTA_MESSAGE, WinProcess, resident_mb
from tests.winrm_server.server import CMD_LINE_LIMIT, WINRS_WRAPPING

#: a self-test of the test harness (select with -m harness, leave out with -m 'not harness')
pytestmark = pytest.mark.harness


def _protocol(
    server: WinRMServer, transport: str = "basic", password: str = "pw", **kw: object
) -> winrm.Protocol:
    return winrm.Protocol(
        server.endpoint,
        transport=transport,  # type: ignore[arg-type]
        username="bob",
        password=password,
        ca_trust_path=str(server.ca_file) if server.ca_file else None,
        **kw,  # type: ignore[arg-type]
    )


def _session(
    server: WinRMServer, transport: str = "basic", password: str = "pw", **kw: object
) -> winrm.Session:
    ca = str(server.ca_file) if server.ca_file else None
    return winrm.Session(server.endpoint, auth=("bob", password), transport=transport, ca_trust_path=ca, **kw)


def _ps_command(script: str) -> str:
    return (
        "powershell.exe -NoProfile -NonInteractive -EncodedCommand "
        + base64.b64encode(script.encode("utf-16-le")).decode()
    )


def _group_pids(pgid: int) -> set[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.add(int(entry))
    return found


def _receive_until(proto: winrm.Protocol, shell: str, cmd: str, want: bytes) -> tuple[bytes, bool]:
    """Poll Receive (as the product's transport does) until ``want`` appeared in stdout."""
    seen = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            out, _err, _rc, done = proto.get_command_output_raw(shell, cmd)
        except WinRMOperationTimeoutError:
            continue
        seen += out
        if want in seen or done:
            return seen, done
    raise AssertionError(f"{want!r} never arrived; got {seen!r}")


# -- basic operation -------------------------------------------------------------------------------------


def test_run_cmd_over_basic_runs_the_command_for_real() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        r = _session(server).run_cmd("echo out; echo err >&2; exit 4")
        assert (r.status_code, r.std_out, r.std_err) == (4, b"out\n", b"err\n")
        assert server.commands == ["echo out; echo err >&2; exit 4"]
        assert server.requests == ["Create", "Command", "Receive", "Signal", "Delete"]
        assert server.open_shells() == []


def test_run_ps_is_decoded_parsed_recorded_and_answered() -> None:
    def handler(call: PwshCall) -> Answer:
        return Answer(stdout=f"user={call.command('Get-LocalUser').arguments[0]}\n", exit_code=7)

    with WinRMServer(allow_unencrypted=True, on_powershell=handler) as server:
        r = _session(server).run_ps("Get-LocalUser 'bob' | Select-Object -ExpandProperty Name")
        assert r.status_code == 7
        assert r.std_out == b"user='bob'\r\n"  # PowerShell writes CRLF
        (call,) = server.calls
        assert call.script == "Get-LocalUser 'bob' | Select-Object -ExpandProperty Name"
        assert call.command("select-object").has("-ExpandProperty")
        assert server.parse_errors == []


def test_canned_answers_match_the_script() -> None:
    answers = [{"match": r"\$PSVersionTable", "stdout": "5.1.22621.4391\n"}]
    with WinRMServer(allow_unencrypted=True, answers=answers) as server:
        assert (
            _session(server).run_ps("$PSVersionTable.PSVersion.ToString()").std_out == b"5.1.22621.4391\r\n"
        )
        assert _session(server).run_ps("Get-Date").std_out == b""


def test_ntlm_with_message_encryption() -> None:
    with WinRMServer(auth="ntlm", on_powershell=lambda call: Answer(stdout="sealed\n")) as server:
        sess = _session(server, transport="ntlm")
        r = sess.run_cmd("echo through-ntlm")
        assert (r.status_code, r.std_out) == (0, b"through-ntlm\n")
        assert sess.run_ps("Write-Output 1").std_out == b"sealed\r\n"
        # every SOAP message crossed the wire sealed (pywinrm encrypts over HTTP with NTLM)
        assert sess.protocol.transport.encryption is not None
        assert server.encrypted_requests == len(server.requests) == 10


@pytest.mark.parametrize("transport", ["basic", "ntlm"])
def test_wrong_password_is_invalid_credentials(transport: str) -> None:
    with WinRMServer(allow_unencrypted=True, auth=transport) as server:
        with pytest.raises(InvalidCredentialsError):
            _session(server, transport=transport, password="wrong").run_cmd("echo never")
        assert server.commands == []


def test_missing_credentials_get_401_with_the_offered_schemes() -> None:
    with WinRMServer(auth="basic,ntlm") as server:
        resp = requests.post(server.endpoint, data=b"<x/>", timeout=10)
        assert resp.status_code == 401
        offered = resp.headers["WWW-Authenticate"]
        assert "Negotiate" in offered and 'Basic realm="WSMAN"' in offered


@pytest.mark.parametrize("transport", ["ssl", "ntlm"])
def test_tls_with_the_ca_file_works_and_without_it_is_refused(transport: str) -> None:
    with WinRMServer(auth="ntlm" if transport == "ntlm" else "basic", tls=True) as server:
        assert server.endpoint.startswith("https://") and server.ca_file is not None
        r = winrm.Session(
            server.endpoint, auth=("bob", "pw"), transport=transport, ca_trust_path=str(server.ca_file)
        ).run_cmd("echo over-tls")
        assert r.std_out == b"over-tls\n"
        with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
            winrm.Session(
                server.endpoint, auth=("bob", "pw"), transport=transport, ca_trust_path=None
            ).run_cmd("echo never")


# -- streaming, stdin, timeouts, signals -----------------------------------------------------------------


def test_output_streams_while_the_command_runs_and_stdin_reaches_it() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        proto = _protocol(server)
        shell = proto.open_shell()
        cmd = proto.run_command(shell, "echo first; read line; echo got $line")
        seen, done = _receive_until(proto, shell, cmd, b"first\n")
        assert not done  # the line arrived while the command was still waiting for stdin
        proto.send_command_input(shell, cmd, b"typed\n", end=True)
        out, _err, rc = proto.get_command_output(shell, cmd)
        assert (seen + out, rc) == (b"first\ngot typed\n", 0)
        proto.cleanup_command(shell, cmd)
        proto.close_shell(shell)


def test_handler_chunks_stream_before_the_handler_finishes() -> None:
    release = threading.Event()

    def handler(call: PwshCall) -> Answer:
        def pieces() -> Iterator[bytes]:
            yield b"step 1\r\n"
            release.wait(30)
            yield b"step 2\r\n"

        return Answer(chunks=pieces())

    with WinRMServer(allow_unencrypted=True, on_powershell=handler) as server:
        proto = _protocol(server)
        shell = proto.open_shell()
        cmd = proto.run_command(shell, _ps_command("Start-Job { 1 }"))
        seen, done = _receive_until(proto, shell, cmd, b"step 1\r\n")
        assert not done
        release.set()
        out, _err, rc = proto.get_command_output(shell, cmd)
        assert seen + out == b"step 1\r\nstep 2\r\n" and rc == 0
        proto.close_shell(shell)


def test_receive_without_output_answers_the_operation_timeout_fault() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        proto = _protocol(server, operation_timeout_sec=1, read_timeout_sec=5)
        shell = proto.open_shell()
        cmd = proto.run_command(shell, "read never")
        with pytest.raises(WinRMOperationTimeoutError):
            proto.get_command_output_raw(shell, cmd)
        proto.cleanup_command(shell, cmd)
        proto.close_shell(shell)


def _signal(proto: winrm.Protocol, shell: str, cmd: str, code: str) -> None:
    req = {
        "env:Envelope": proto.build_wsman_header(
            resource_uri="http://schemas.microsoft.com/wbem/wsman/1/windows/shell/cmd",
            action="http://schemas.microsoft.com/wbem/wsman/1/windows/shell/Signal",
            shell_id=shell,
        )
    }
    req["env:Envelope"].setdefault("env:Body", {})["rsp:Signal"] = {
        "@CommandId": cmd,
        "rsp:Code": f"http://schemas.microsoft.com/wbem/wsman/1/windows/shell/signal/{code}",
    }
    proto.send_message(xmltodict.unparse(req))


@pytest.mark.parametrize("how", ["terminate", "ctrl_c", "delete_shell"])
def test_signal_and_shell_delete_kill_the_whole_process_group(how: str) -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        proto = _protocol(server)
        shell = proto.open_shell()
        cmd = proto.run_command(shell, "sleep 300 & sleep 300 & echo started; wait")
        _receive_until(proto, shell, cmd, b"started")
        (leader,) = server.running_pids()
        group = _group_pids(leader)
        assert len(group) == 3  # sh and both sleeps
        if how == "terminate":
            proto.cleanup_command(shell, cmd)
        elif how == "ctrl_c":
            _signal(proto, shell, cmd, "ctrl_c")
        else:
            proto.close_shell(shell)
        assert _wait_pids_gone(group, 10) == set()
        if how == "ctrl_c":
            _out, _err, rc, done = proto.get_command_output_raw(shell, cmd)
            assert done and rc == 3221225786  # STATUS_CONTROL_C_EXIT
        if how != "delete_shell":
            proto.close_shell(shell)


# -- faults ----------------------------------------------------------------------------------------------


def test_unknown_shell_id_is_the_real_invalid_selectors_fault() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        proto = _protocol(server)
        bogus = str(uuid.uuid4()).upper()
        with pytest.raises(WSManFaultError) as err:
            proto.run_command(bogus, "echo never")
        assert err.value.code == 500
        assert err.value.fault_subcode == "w:InvalidSelectors"
        assert err.value.wsman_fault_code == 2150858843
        assert f"ShellId {bogus} failed because the shell was not found" in str(err.value.response)


def test_unknown_command_id_is_invalid_selectors_too() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        proto = _protocol(server)
        shell = proto.open_shell()
        with pytest.raises(WSManFaultError) as err:
            proto.get_command_output_raw(shell, str(uuid.uuid4()).upper())
        assert err.value.wsman_fault_code == 2150858843
        assert "command identifier that does not exist" in str(err.value.response)
        proto.close_shell(shell)


def test_not_soap_is_a_bad_request() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        resp = requests.post(server.endpoint, data=b"this is not xml", auth=("bob", "pw"), timeout=10)
        assert resp.status_code == 400
        assert ET.fromstring(resp.content).tag == "{http://www.w3.org/2003/05/soap-envelope}Envelope"


#: the longest line the server's cmd.exe runs: its limit, counted on ``cmd.exe /c LINE`` as WinRS hands
#: the line over
CMD_LINE_ROOM = CMD_LINE_LIMIT - len(WINRS_WRAPPING)


@pytest.mark.parametrize("under", [0, 1, 3])
def test_cmd_exe_runs_lines_at_and_under_its_documented_limit(under: int) -> None:
    """8191 characters (the server's own CMD_LINE_LIMIT: Microsoft's documented cmd.exe limit), counted
    with WinRS's ``cmd.exe /c ``: a line of 8180 characters and a few under run."""
    assert CMD_LINE_LIMIT == 8191 and WINRS_WRAPPING == "cmd.exe /c " and CMD_LINE_ROOM == 8180
    with WinRMServer(allow_unencrypted=True) as server:
        word = "x" * (CMD_LINE_ROOM - under - len("echo "))
        r = _session(server).run_cmd("echo " + word)
        assert (r.status_code, r.std_out, r.std_err) == (0, word.encode() + b"\n", b"")
        assert [len(line) for line in server.commands] == [CMD_LINE_ROOM - under]


def test_cmd_exe_refuses_a_line_one_over_its_limit_as_windows_does() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        sess = _session(server)
        over = "echo " + "x" * (CMD_LINE_ROOM + 1 - len("echo "))
        r = sess.run_cmd(over)
        # cmd.exe's own message, exit code 1; the WinRS Command itself succeeded
        assert (r.status_code, r.std_out, r.std_err) == (1, b"", b"The command line is too long.\r\n")
        # the line is Command plus space-joined Arguments; pywinrm's run_ps hits the same wall
        r = sess.run_cmd("echo", ["x" * (CMD_LINE_ROOM - len("echo "))])
        assert r.status_code == 0
        assert (
            sess.run_ps("Write-Output '" + "y" * 3100 + "'").std_err == b"The command line is too long.\r\n"
        )
        assert server.calls == []


def test_cmd_exe_measures_its_limit_after_expanding_variables() -> None:
    """A line that fits as sent but not once cmd.exe has expanded ``%LOCALAPPDATA%`` (14 characters
    becoming 25) is refused; the same line with a variable cmd.exe does not know stays as written."""
    with WinRMServer(allow_unencrypted=True) as server:
        sess = _session(server)
        for name, refused in (("%LOCALAPPDATA%", True), ("%NO_SUCH_NAME%", False)):
            line = f"echo {name}"
            line += "x" * (CMD_LINE_ROOM - len(line))
            r = sess.run_cmd(line)
            assert (r.status_code, r.std_err == b"The command line is too long.\r\n") == (
                (1, True) if refused else (0, False)
            ), name
        assert [len(line) for line in server.commands] == [CMD_LINE_ROOM, CMD_LINE_ROOM]


def test_every_command_through_cmd_exe_is_two_processes_of_the_shells_job() -> None:
    """WinRS runs ``cmd.exe /c LINE``: MaxProcessesPerShell counts that cmd.exe and the powershell.exe
    it starts. With a quota of 1 a PowerShell command is refused (cmd.exe took the place); with 2 it
    runs as cmd.exe's child; with WINRS_SKIP_CMD_SHELL (no cmd.exe) 1 is enough."""
    seen: list[list[tuple[str, str]]] = []

    def handler(call: PwshCall) -> Answer:
        assert call.process is not None and call.process.job is not None
        members = server.processes.in_job(call.process.job)
        by_pid = {p.pid: p.image for p in members}
        seen.append([(p.image, by_pid.get(p.parent, "-")) for p in members])
        return Answer(stdout="ran\n")

    full_path = "C:\\Windows\\System32\\WindowsPowerShell\\v1.0\\powershell.exe"
    script = _ps_command("Write-Output 'ran'")
    for quota, skip, ran in ((1, False, False), (2, False, True), (1, True, True)):
        server = WinRMServer(allow_unencrypted=True, on_powershell=handler, max_processes_per_shell=quota)
        with server:
            proto = _protocol(server)
            shell = proto.open_shell()
            line = script.replace("powershell.exe", full_path, 1) if skip else script
            command = proto.run_command(shell, line, skip_cmd_shell=skip)
            out, err, code = proto.get_command_output(shell, command)
            proto.close_shell(shell)
            if ran:
                assert (code, out) == (0, b"ran\r\n"), err
            else:
                assert code == 1816 and QUOTA_MESSAGE.encode() in err and server.calls == []
                assert server.processes.refused == [f"{shell}: powershell.exe"]
            assert server.processes.live() == []  # both end with the command
    assert seen == [[("cmd.exe", "-"), ("powershell.exe", "cmd.exe")], [("powershell.exe", "-")]]


def test_a_shell_over_max_memory_per_shell_mb_has_its_command_ended() -> None:
    """MaxMemoryPerShellMB 64: a program the command starts (a real Python process, in the shell's job)
    that takes 200 MB ends with the whole command (its cmd.exe and powershell.exe), the allocation's
    Windows error on stderr, exit code 1; the same program created by WMI, outside every job, runs on."""
    hog = "import time\nblock = b'x' * (200 << 20)\ntime.sleep(30)\n"
    made: list[WinProcess] = []

    def handler(call: PwshCall) -> Answer:
        outside = "outside" in call.script
        child = server.processes.create(
            "python.exe",
            "python.exe hog.py",
            parent=None if outside else call.process,
            argv=[sys.executable, "-c", hog],
            stdout=subprocess.DEVNULL,
        )
        made.append(child)
        if not outside:
            child.ended.wait(30)
        return Answer(stdout="started\n")

    server = WinRMServer(allow_unencrypted=True, on_powershell=handler, max_memory_per_shell_mb=64)
    with server:
        proto = _protocol(server)
        shell = proto.open_shell()
        command = proto.run_command(shell, _ps_command("Write-Output 'outside'"))
        assert proto.get_command_output(shell, command)[2] == 0
        (outside,) = made
        assert outside.linux is not None
        deadline = time.monotonic() + 30
        while resident_mb([outside.linux.pid]) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert resident_mb([outside.linux.pid]) >= 200
        command = proto.run_command(shell, _ps_command("Write-Output 'inside'"))
        out, err, code = proto.get_command_output(shell, command)
        assert (code, out) == (1, b"") and err == (MEMORY_MESSAGE + "\r\n").encode(), err
        inside = made[1]
        assert inside.terminated and server.processes.in_job(shell) == []
        assert [entry.split(":")[0] for entry in server.processes.over_memory] == [shell]
        assert outside.alive and not outside.terminated
        proto.close_shell(shell)


def test_max_shells_per_user_quota_fault() -> None:
    with WinRMServer(allow_unencrypted=True, max_shells_per_user=2) as server:
        proto = _protocol(server)
        shells = [proto.open_shell(), proto.open_shell()]
        with pytest.raises(WSManFaultError) as err:
            proto.open_shell()
        assert err.value.wsman_fault_code == 2150859173
        assert err.value.fault_subcode == "w:QuotaLimit"
        assert "This user is allowed a maximum number of 2 concurrent shells" in err.value.reason
        proto.close_shell(shells.pop(), close_session=False)
        shells.append(proto.open_shell())  # a closed shell frees its slot
        for s in shells:
            proto.close_shell(s, close_session=False)


# -- PowerShell specifics --------------------------------------------------------------------------------


def test_stderr_is_powershell_clixml() -> None:
    def handler(call: PwshCall) -> Answer:
        return Answer(stderr="Access is denied <C:\\x_y>\nsecond line", exit_code=1)

    with WinRMServer(allow_unencrypted=True, on_powershell=handler) as server:
        proto = _protocol(server)
        shell = proto.open_shell()
        cmd = proto.run_command(shell, _ps_command("Stop-Service WinRM"))
        _out, err, rc = proto.get_command_output(shell, cmd)
        proto.close_shell(shell)
        assert rc == 1
        assert err.startswith(b'#< CLIXML\r\n<Objs Version="1.1.0.1" ')
        root = ET.fromstring(err[len(b"#< CLIXML\r\n") :])
        ns = "{http://schemas.microsoft.com/powershell/2004/04}"
        assert root.find(f"{ns}Obj").get("S") == "progress"  # the "Preparing modules" record comes first
        errors = [s.text for s in root.findall(f"{ns}S") if s.get("S") == "Error"]
        assert errors == ["Access is denied <C:\\x_y>_x000D__x000A_", "second line_x000D__x000A_"]
        # and pywinrm's own cleaner turns it into text
        assert (
            _session(server).run_ps("Stop-Service WinRM").std_err
            == b"Access is denied <C:\\x_y>\nsecond line"
        )


def test_script_that_does_not_parse_fails_and_is_reported() -> None:
    server = WinRMServer(allow_unencrypted=True, strict=False)
    with server:
        r = _session(server).run_ps("if ($x -eq {")
        assert r.status_code == 1 and b"ParserError" in r.std_err
    assert len(server.parse_errors) == 1 and "if ($x -eq {" in server.parse_errors[0]
    with pytest.raises(AssertionError, match="does not parse"):
        with WinRMServer(allow_unencrypted=True) as strict:
            _session(strict).run_ps("function {")


def test_file_scripts_come_from_the_fake_filesystem() -> None:
    with WinRMServer(allow_unencrypted=True, on_powershell=lambda call: Answer(stdout=call.script)) as server:
        server.files["C:\\ProgramData\\cb\\Run.ps1"] = b"\xef\xbb\xbfWrite-Output 'caf\xc3\xa9'"
        r = _session(server).run_cmd("powershell.exe -NoProfile -File c:/programdata/CB/run.ps1 -Mode x")
        assert r.std_out == "Write-Output 'café'".encode("cp437")
        assert server.calls[0].file == "c:/programdata/CB/run.ps1" and server.calls[0].file_args == [
            "-Mode",
            "x",
        ]
        missing = _session(server).run_cmd("powershell.exe -File C:\\nope.ps1")
        assert missing.status_code == -196608 and b"does not exist" in missing.std_err


def test_stdin_sent_before_receive_reaches_the_handler() -> None:
    with WinRMServer(
        allow_unencrypted=True, on_powershell=lambda call: Answer(stdout=call.stdin.decode().upper())
    ) as server:
        proto = _protocol(server)
        shell = proto.open_shell()
        cmd = proto.run_command(shell, _ps_command("$input | ForEach-Object { $_ }"))
        proto.send_command_input(shell, cmd, b"abc", end=True)
        assert proto.get_command_output(shell, cmd)[0] == b"ABC"
        proto.close_shell(shell)


# -- wsl.exe ---------------------------------------------------------------------------------------------


def test_wsl_exec_runs_linux_argv_split_by_windows_rules() -> None:
    tricky = ["a b", 'say "hi"', "C:\\dir\\", 'back\\\\slash\\"q', "", "$HOME;`x`"]
    with WinRMServer(allow_unencrypted=True) as server:
        sess = _session(server)
        line = " ".join(quote(a) for a in tricky)
        r = sess.run_cmd("wsl.exe", ["-d", "Ubuntu-22.04", "-e", "printf", "[%s]", line])
        assert r.status_code == 0, r.std_err
        assert r.std_out.decode() == "".join(f"[{a}]" for a in tricky)
        r = sess.run_cmd('wsl.exe -d ubuntu-22.04 --cd / -- echo "$WSL_DISTRO_NAME" $(pwd)')
        assert r.std_out == b"Ubuntu-22.04 /\n"


def test_wsl_user_and_directory_options() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        r = _session(server).run_cmd('wsl.exe -d Ubuntu-22.04 -u nobody --cd / -e sh -c "id -un; pwd"')
        assert (r.status_code, r.std_out) == (0, b"nobody\n/\n")
        r = _session(server).run_cmd("wsl.exe -u no-such-user -e true")
        assert r.status_code == 1 and b"getpwnam(no-such-user) failed" in r.std_err


def test_cmd_exe_operators_outside_quotes_are_refused_and_variables_expand() -> None:
    server = WinRMServer(
        allow_unencrypted=True, strict=False, on_powershell=lambda call: Answer(stdout=call.file or "")
    )
    with server:
        sess = _session(server)
        assert sess.run_cmd('wsl.exe -e echo "a|b" ^& c').std_out == b"a|b & c\n"
        broken = sess.run_cmd("wsl.exe -e echo a|b")
        assert broken.status_code == 1 and b"unquoted '|'" in broken.std_err
        server.files["C:\\Users\\bob\\x.ps1"] = b"Get-Date"
        assert sess.run_cmd("powershell.exe -File %UserProfile%\\x.ps1").std_out == b"C:\\Users\\bob\\x.ps1"
    assert len(server.parse_errors) == 1 and "cmd.exe would treat the unquoted '|'" in server.parse_errors[0]


def test_wsl_management_commands_answer_utf16le_without_bom() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        server.wsl.distros = [Distro("Ubuntu-24.04", default=True), Distro("Debian", state="Stopped")]
        sess = _session(server)
        raw = sess.run_cmd("wsl.exe --list --verbose").std_out
        assert not raw.startswith(b"\xff\xfe")
        text = raw.decode("utf-16-le")
        assert text.splitlines()[1].split() == ["*", "Ubuntu-24.04", "Running", "2"]
        assert text.splitlines()[2].split() == ["Debian", "Stopped", "2"]
        assert "Default Distribution: Ubuntu-24.04" in sess.run_cmd("wsl.exe --status").std_out.decode(
            "utf-16-le"
        )
        assert sess.run_cmd("wsl.exe --version").std_out.decode("utf-16-le").startswith("WSL version: ")
        bad = sess.run_cmd("wsl.exe -d Nope -e true")
        assert bad.status_code == 4294967295
        assert "WSL_E_DISTRO_NOT_FOUND" in bad.std_out.decode("utf-16-le")


def test_wsl_exe_writes_its_messages_in_utf8_when_the_shell_has_wsl_utf8() -> None:
    """WSL_UTF8=1 in wsl.exe's environment (here: the WinRS shell's, from the Create request) makes
    wsl.exe 0.64+ write its own messages in UTF-8; an older wsl.exe ignores it."""
    with WinRMServer(allow_unencrypted=True) as server:
        proto = _protocol(server)
        for honours, encoding in ((True, "utf-8"), (False, "utf-16-le")):
            server.wsl.honours_utf8 = honours
            shell = proto.open_shell(env_vars={"wsl_utf8": "1"})  # Windows: names without case
            command = proto.run_command(shell, "wsl.exe", ["-d", "Nope", "-e", "true"])
            out, _err, code = proto.get_command_output(shell, command)
            proto.cleanup_command(shell, command)
            proto.close_shell(shell)
            assert code == 4294967295
            assert out.decode(encoding).startswith("There is no distribution with the supplied name.\r\n")
        server.wsl.honours_utf8 = True
        shell = proto.open_shell(env_vars={"WSL_UTF8": "0"})
        command = proto.run_command(shell, "wsl.exe", ["--status"])
        out, _err, _code = proto.get_command_output(shell, command)
        proto.close_shell(shell)
        assert out.decode("utf-16-le").startswith("Default Distribution: ")  # only 1 means UTF-8
    assert server.wsl.written == ["utf-8", "utf-16-le", "utf-16-le"]


def _start_wsl(proto: winrm.Protocol, script: str, want: bytes = b"started") -> tuple[str, str]:
    shell = proto.open_shell()
    cmd = proto.run_command(shell, "wsl.exe", ["-d", "Ubuntu-22.04", "-e", "sh", "-c", quote(script)])
    _receive_until(proto, shell, cmd, want)
    return shell, cmd


@pytest.mark.parametrize("how", ["terminate", "delete_shell"])
def test_stopping_a_wsl_command_ends_wsl_exe_only(how: str) -> None:
    """Windows ends what is in the shell's job: wsl.exe. The Linux processes it started are not
    Windows processes; they keep running (their stdin still open), whatever happens to wsl.exe."""
    with WinRMServer(allow_unencrypted=True) as server:
        proto = _protocol(server)
        shell, cmd = _start_wsl(proto, "sleep 300 & echo started; wait")
        (leader,) = server.running_pids()
        group = _group_pids(leader)
        assert len(group) == 2  # sh and the sleep
        if how == "terminate":
            proto.cleanup_command(shell, cmd)
            with pytest.raises(WSManFaultError):  # the command is gone for WinRS
                proto.get_command_output_raw(shell, cmd)
            proto.close_shell(shell)
        else:
            proto.close_shell(shell)
        assert server.running_pids() == [] and server.open_shells() == []
        assert _wait_pids_gone(group, 1.5) == group  # nothing stopped them
        assert set(server.orphaned_pids()) == group
    assert _wait_pids_gone(group, 10) == set()  # the server's own clean-up when it stops


def test_closing_a_wsl_commands_stdin_is_an_end_of_file_in_the_distribution() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        proto = _protocol(server)
        shell, cmd = _start_wsl(proto, "echo started; cat >/dev/null; echo saw-eof; exit 4")
        proto.send_command_input(shell, cmd, b"ignored\n", end=True)
        out, _err, rc = proto.get_command_output(shell, cmd)
        proto.close_shell(shell)
        assert (out, rc) == (b"saw-eof\n", 4)
        assert server.orphaned_pids() == []


def test_ctrl_c_reaches_the_linux_process_as_sigint() -> None:
    with WinRMServer(allow_unencrypted=True) as server:
        proto = _protocol(server)
        script = "trap 'echo interrupted; exit 3' INT; echo started; while :; do sleep 0.1; done"
        shell, cmd = _start_wsl(proto, script)
        _signal(proto, shell, cmd, "ctrl_c")
        out, _err, rc = proto.get_command_output(shell, cmd)
        proto.close_shell(shell)
        assert (out, rc) == (b"interrupted\n", 3)  # the Linux exit code, not STATUS_CONTROL_C_EXIT


# -- stderr: CLIXML only for PowerShell's own records --------------------------------------------------


def _raw_stderr(server: WinRMServer, command: str) -> bytes:
    proto = _protocol(server)
    shell = proto.open_shell()
    cmd = proto.run_command(shell, command)
    _out, err, _rc = proto.get_command_output(shell, cmd)
    proto.close_shell(shell)
    return bytes(err)


def test_console_and_native_stderr_is_plain_text_and_error_records_are_clixml() -> None:
    def handler(call: PwshCall) -> Answer:
        return Answer(
            console_stderr="python.exe: warning\n",
            stderr="Write-Error : broken",
            console_stderr_inside="inside" in call.script,
            exit_code=1,
        )

    with WinRMServer(allow_unencrypted=True, on_powershell=handler, progress_record=True) as server:
        before = _raw_stderr(server, _ps_command("[Console]::Error.WriteLine('x'); Write-Error broken"))
        inside = _raw_stderr(server, _ps_command("'inside'; Write-Error broken"))
        native = _raw_stderr(server, "echo from-sh >&2")
        wsl = _raw_stderr(server, "wsl.exe -e sh -c " + quote("echo from-linux >&2"))
    assert before.startswith(b"python.exe: warning\r\n#< CLIXML\r\n<Objs ")
    assert before.endswith(b'<S S="Error">Write-Error : broken_x000D__x000A_</S></Objs>')
    head, tail = inside.split(b"python.exe: warning\r\n")
    assert head.startswith(b"#< CLIXML\r\n<Objs ") and head.endswith(b"</Obj>")  # after the progress record
    assert tail == b'<S S="Error">Write-Error : broken_x000D__x000A_</S></Objs>'
    assert (native, wsl) == (b"from-sh\n", b"from-linux\n")  # programs write their own bytes


# -- Windows' defaults: AllowUnencrypted=false, MaxEnvelopeSizekb=500 -----------------------------------


def test_basic_over_http_is_refused_by_default_whatever_the_password() -> None:
    with WinRMServer(auth="basic") as server:  # Windows' default: AllowUnencrypted=false
        with pytest.raises(InvalidCredentialsError):
            _session(server).run_cmd("echo never")
        assert server.commands == [] and server.requests == []
        assert server.refusals == ["401 Basic over HTTP while AllowUnencrypted is false"]
    with WinRMServer(auth="basic", tls=True) as tls:  # over HTTPS Basic is fine
        assert _session(tls).run_cmd("echo over-https").std_out == b"over-https\n"
        assert tls.refusals == []
    with WinRMServer(auth="basic", allow_unencrypted=True) as lab:  # AllowUnencrypted=true
        assert _session(lab).run_cmd("echo clear").std_out == b"clear\n"


def test_ntlm_over_http_must_seal_its_messages_by_default() -> None:
    with WinRMServer(auth="ntlm") as server:
        assert _session(server, transport="ntlm").run_cmd("echo sealed").std_out == b"sealed\n"
        with pytest.raises(InvalidCredentialsError):
            _session(server, transport="ntlm", message_encryption="never").run_cmd("echo never")
        assert server.commands == ["echo sealed"]
        assert server.refusals == ["401 an unencrypted message over HTTP while AllowUnencrypted is false"]


def test_a_request_over_max_envelope_size_gets_http_413() -> None:
    with WinRMServer(allow_unencrypted=True, max_envelope_kb=150) as server:
        proto = _protocol(server)
        shell = proto.open_shell()
        cmd = proto.run_command(shell, "wc -c")
        proto.send_command_input(shell, cmd, b"a" * 100_000)  # base64: 133 KB, under 150 KiB
        with pytest.raises(WinRMTransportError) as err:
            proto.send_command_input(shell, cmd, b"b" * 120_000, end=True)  # 160 KB of base64
        assert err.value.code == 413
        assert server.refusals and server.refusals[-1].startswith("413 a request of ")
        assert server.largest_request > 150 * 1024
        proto.send_command_input(shell, cmd, b"", end=True)
        out, _err, _rc = proto.get_command_output(shell, cmd)
        proto.close_shell(shell)
        assert out.strip() == b"100000"  # the refused Send never reached the command
    with WinRMServer(allow_unencrypted=True) as default:  # 500 KiB: the same Send passes
        assert default.max_envelope_bytes == 512_000
        proto = _protocol(default)
        shell = proto.open_shell()
        cmd = proto.run_command(shell, "wc -c")
        proto.send_command_input(shell, cmd, b"b" * 120_000, end=True)
        assert proto.get_command_output(shell, cmd)[0].strip() == b"120000"
        proto.close_shell(shell)


@pytest.mark.parametrize("max_envelope_kb", [32, 500])
def test_receive_responses_fit_the_smaller_of_both_envelope_sizes(max_envelope_kb: int) -> None:
    """pywinrm asks for responses of at most 153600 bytes (its MaxEnvelopeSize header); a host's
    MaxEnvelopeSizekb below that caps them further (MS-WSMV 3.1.4.1.7)."""
    with WinRMServer(allow_unencrypted=True, max_envelope_kb=max_envelope_kb) as server:
        r = _session(server).run_cmd("head -c 1000000 /dev/zero | tr '\\0' x")
        assert r.std_out == b"x" * 1_000_000
        assert server.largest_response <= min(153_600, max_envelope_kb * 1024)
        assert server.largest_response > min(153_600, max_envelope_kb * 1024) // 2  # not needlessly small


# -- as a process inside a namespace host -----------------------------------------------------------------


@pytest.fixture(scope="module")
def winrm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    require_cluster_support()
    with NamespaceCluster(2, workdir=tmp_path_factory.mktemp("winrm-cluster")) as c:
        yield c


def test_server_in_a_namespace_host_runs_wsl_commands_in_that_host(
    winrm_cluster: NamespaceCluster, tmp_path: Path
) -> None:
    win, linux = winrm_cluster.hosts
    answers = [{"match": "Get-CimInstance", "stdout": "10.0.22631\n"}]
    with start_in_host(
        winrm_cluster, win, auth="ntlm", tls=True, answers=answers, workdir=tmp_path
    ) as handle:
        assert handle.endpoint == f"https://{win.addr}:5986/wsman"
        with inside(winrm_cluster.controller_ns):
            sess = winrm.Session(
                handle.endpoint, auth=("bob", "pw"), transport="ntlm", ca_trust_path=str(handle.ca_file)
            )
            ver = sess.run_ps("(Get-CimInstance Win32_OperatingSystem).Version")
            addr = sess.run_cmd(
                "wsl.exe", ["-d", "Ubuntu-22.04", "-e", "ip", "-4", "-o", "addr", "show", "eth0"]
            )
            name = sess.run_cmd("wsl.exe", ["-e", "hostname"])
            banner = sess.run_cmd(
                "wsl.exe", ["-e", "bash", "-c", quote(f"exec 3<>/dev/tcp/{linux.addr}/22; head -c 8 <&3")]
            )
        assert ver.std_out == b"10.0.22631\r\n"
        assert f"inet {win.addr}/" in addr.std_out.decode()  # the Linux side is on that host's network
        assert name.std_out == f"{win.hostname}\n".encode()
        assert banner.std_out == b"SSH-2.0-"  # and reaches the other hosts of the cluster
        assert [c.script for c in handle.calls()] == ["(Get-CimInstance Win32_OperatingSystem).Version"]
        assert handle.commands()[1].startswith("wsl.exe -d Ubuntu-22.04 -e ip")
        assert handle.parse_errors() == []
