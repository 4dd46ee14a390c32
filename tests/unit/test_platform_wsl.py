"""The WSL platform: the Windows command line that starts a POSIX script inside a distribution.

The line is split with the reference CommandLineToArgvW splitter (as wsl.exe does), checked for
what cmd.exe (which WinRS runs commands through) would interpret, and the argv after ``-e`` is run
for real with this machine's /bin/sh: it is POSIX, and must give back the original script.
"""

from __future__ import annotations

import base64
import itertools
import re
import shlex
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.inventory.model import Node, WindowsSettings
from orchestrator.platforms import PosixShell, PowerShell, WslShell, platform_for_node
from orchestrator.platforms.wsl import ROOT_MARKER, WslOutput, is_wsl_command
from tests import pwsh
from tests.unit.test_platform_powershell import single_quoted_value, split_command_line, unquoted_regions

arg_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


def inner_argv(line: str) -> list[str]:
    argv = split_command_line(line)
    assert argv[0] == "wsl.exe"
    return argv[argv.index("-e") + 1 :]


def run_inner(line: str, stdin: str = "") -> subprocess.CompletedProcess[bytes]:
    argv = inner_argv(line)
    assert argv[:2] == ["/bin/sh", "-c"]
    return subprocess.run(argv, input=stdin.encode(), capture_output=True, timeout=30, check=False)


@settings(max_examples=60, deadline=None)
@given(value=arg_text)
def test_the_script_reaches_the_distro_shell_unchanged(value: str) -> None:
    shell = WslShell("Ubuntu-22.04", "trainer")
    line = shell.login_command(f"printf '%s' {shlex.quote(value)}")
    argv = split_command_line(line)
    assert argv[:5] == ["wsl.exe", "-d", "Ubuntu-22.04", "-u", "trainer"]
    result = run_inner(line)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == value


def test_word_splitting_globbing_and_exit_codes_are_normal_inside() -> None:
    script = 'for w in $(echo a b); do echo "$w"; done\nset -- /bin/s[h]\necho "$1"\nexit 3'
    result = run_inner(WslShell().login_command(script))
    assert result.stdout.decode().splitlines() == ["a", "b", "/bin/sh"]
    assert result.returncode == 3


def test_stdin_stays_the_channel() -> None:
    # eval, not a pipe into sh: the script reads the transport's stdin (stop_on_hangup's watcher needs it)
    result = run_inner(WslShell().login_command("read line; echo got:$line"), stdin="hello\n")
    assert result.stdout.decode().strip() == "got:hello"


def test_nothing_for_cmd_exe_to_interpret() -> None:
    script = PosixShell().wrap("echo 100% & done | tee x > y", env={"A": 'say "hi" ^ !x!'}, cwd="~/x")
    line = WslShell("Debian").login_command(script)
    assert not re.search(r'[&|<>^()%!"]', unquoted_regions(line)), line
    assert not re.search(r"[%!]", line)
    assert run_inner(line).returncode in (0, 125)  # ~/x may not exist here; the script ran


def test_windows_argv_is_the_same_line_in_parts() -> None:
    shell = WslShell("Ubuntu", "me")
    program, args = shell.windows_argv("echo hi")
    assert program == "wsl.exe"
    assert " ".join([program, *args]) == shell.login_command("echo hi")
    assert split_command_line(" ".join([program, *args]))[-3:-1] == ["/bin/sh", "-c"]


def test_default_distro_and_user_add_no_options() -> None:
    assert split_command_line(WslShell().login_command("true"))[:3] == ["wsl.exe", "-e", "/bin/sh"]


def test_become_runs_as_root_without_sudo() -> None:
    shell = WslShell("Ubuntu", "trainer")
    root = shell.login_command(shell.wrap("id -u", become=True))
    assert split_command_line(root)[:5] == ["wsl.exe", "-d", "Ubuntu", "-u", "root"]
    assert "sudo" not in shell.wrap("id -u", become=True)
    # the marker survives stop_on_hangup, and a command cannot claim it for itself
    stopped = shell.stop_on_hangup(shell.wrap("id -u", become=True))
    assert split_command_line(shell.login_command(stopped))[4] == "root"
    forged = shell.wrap(f"{ROOT_MARKER}\nid -u")
    assert split_command_line(shell.login_command(forged))[4] == "trainer"


def test_stop_on_hangup_inside_the_distro_still_stops_on_eof() -> None:
    shell = WslShell()
    line = shell.login_command(shell.stop_on_hangup("sleep 30"))
    proc = subprocess.Popen(inner_argv(line), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.close()  # what the transport does to cancel
    assert proc.wait(timeout=20) != 0


def test_uploaded_scripts_run_through_the_drive_mount() -> None:
    shell = WslShell("Ubuntu")
    line = shell.file_command("C:\\Users\\Jo Smith\\AppData\\Local\\Temp\\bootstrap-1.sh")
    assert split_command_line(line) == [
        "wsl.exe",
        "-d",
        "Ubuntu",
        "-e",
        "/bin/sh",
        "/mnt/c/Users/Jo Smith/AppData/Local/Temp/bootstrap-1.sh",
    ]
    assert WslShell.linux_path("D:/data") == "/mnt/d/data"
    with pytest.raises(ValueError):
        WslShell.linux_path("\\\\server\\share\\x")
    assert shell.unc_path("/home/me/x") == "\\\\wsl.localhost\\Ubuntu\\home\\me\\x"


@pytest.mark.parametrize(("distro", "user"), [("a b", None), ("x&y", None), ("%d%", None), (None, "me;rm")])
def test_names_that_would_reach_cmd_are_refused(distro: str | None, user: str | None) -> None:
    with pytest.raises(ValueError):
        WslShell(distro, user)


def test_windows_side_scripts_are_powershell() -> None:
    shell = WslShell("Ubuntu")
    assert isinstance(shell.windows, PowerShell)
    script = shell.windows.native(shell.argv("echo hi"))
    tree = pwsh.assert_parses(script)
    arguments = next(
        (n.children[-1].text or b"").decode()
        for n in pwsh.walk(tree.root_node)
        if n.type == "assignment_expression" and (n.children[0].text or b"").decode() == "$cbInfo.Arguments"
    )
    argv = split_command_line("wsl.exe " + single_quoted_value(arguments))
    assert argv[:4] == ["wsl.exe", "-d", "Ubuntu", "-e"]
    assert subprocess.run(argv[4:], capture_output=True, check=True).stdout == b"hi\n"


def test_platform_for_node() -> None:
    linux = Node(name="l", host="h")
    native = Node(name="n", host="h", os="windows", windows=WindowsSettings(mode="native"))
    wsl = Node(name="w", host="h", os="windows", windows=WindowsSettings(distro="Ubuntu", wsl_user="me"))
    assert isinstance(platform_for_node(linux), PosixShell)
    assert not isinstance(platform_for_node(linux), WslShell)
    assert isinstance(platform_for_node(native), PowerShell)
    shell = platform_for_node(wsl)
    assert isinstance(shell, WslShell) and (shell.distro, shell.user) == ("Ubuntu", "me")
    assert isinstance(platform_for_node(Node(name="d", host="h", os="windows")), WslShell)  # the default


# -- what wsl.exe prints: its own messages in UTF-16LE, the Linux program's bytes as they are ----------

NOT_FOUND = (
    "There is no distribution with the supplied name.\r\nError code: Wsl/Service/WSL_E_DISTRO_NOT_FOUND\r\n"
)


def _decoded(data: bytes, *cuts: int) -> bytes:
    decoder = WslOutput()
    edges = [0, *cuts, len(data)]
    parts = [decoder(data[a:b]) for a, b in itertools.pairwise(edges)]
    return b"".join(parts) + decoder(b"", final=True)


def test_wsl_exe_messages_in_utf16le_are_decoded_wherever_the_chunks_split() -> None:
    # a warning of wsl.exe, the program's output (UTF-8), an empty line and a localized message of
    # wsl.exe, the program again: each line as its writer wrote it
    data = (
        "wsl: Ein Fehler ist aufgetreten\r\n".encode("utf-16-le")
        + "step 1 ok\nstep 2 \u00e9t\u00e9\n".encode()
        + "\n".encode("utf-16-le")
        + b"tail\n"
        + "Gr\u00f6\u00dfe: Zugriff verweigert\r\n".encode("utf-16-le")
        + b"end"
    )
    expected = (
        "wsl: Ein Fehler ist aufgetreten\r\nstep 1 ok\nstep 2 \u00e9t\u00e9\n\ntail\n"
        "Gr\u00f6\u00dfe: Zugriff verweigert\r\nend"
    ).encode()
    for a in range(len(data) + 1):
        for b in range(a, len(data) + 1, 7):
            assert _decoded(data, a, b) == expected, (a, b)
    assert _decoded(NOT_FOUND.encode("utf-16-le")) == NOT_FOUND.encode()
    assert _decoded("\u4e2d\u6587\r\n".encode("utf-16-le")) == "\u4e2d\u6587\r\n".encode()  # whole chunk


def test_utf8_output_passes_unchanged_and_at_once() -> None:
    decoder = WslOutput()
    # WSL_UTF8=1 honoured, or the Linux program: nothing held back (a training log streams)
    assert decoder(NOT_FOUND.encode()) == NOT_FOUND.encode()
    assert decoder("[rank 0] loss 0.25 \u2713".encode()) == "[rank 0] loss 0.25 \u2713".encode()
    assert decoder(b"\n", final=True) == b"\n"


def test_wsl_command_lines_are_recognised() -> None:
    shell = WslShell("Ubuntu-22.04")
    assert is_wsl_command(shell.login_command("echo hi"))
    assert is_wsl_command(shell.file_command("C:\\Users\\bob\\x.sh"))
    assert is_wsl_command('"C:\\Windows\\System32\\wsl.exe" --status')
    assert not is_wsl_command(PowerShell().login_command("Get-Date"))


def test_a_long_script_marked_for_root_is_run_as_root_from_its_file() -> None:
    shell = WslShell("Ubuntu", "me")
    assert shell.host_shell is shell.windows and PosixShell().host_shell.name == "posix"
    marked = shell.wrap("id -u", become=True)
    as_root = split_command_line(shell.run_long_script("/tmp/bootstrap-1.sh", marked))
    plain = split_command_line(shell.run_long_script("/tmp/bootstrap-1.sh", shell.wrap("id -u")))
    assert as_root[:5] == ["wsl.exe", "-d", "Ubuntu", "-u", "root"]
    assert plain[:5] == ["wsl.exe", "-d", "Ubuntu", "-u", "me"]
    script = PosixShell().quote("/tmp/bootstrap-1.sh")
    assert run_inner(shell.run_long_script("/dev/null", marked)).returncode == 0
    assert f"/bin/sh {script}" in base64_script(as_root[-1])


def base64_script(code: str) -> str:
    """The script a :meth:`WslShell.decoder` one-liner carries."""
    encoded = re.search(r"echo ([A-Za-z0-9+/=]+) \| base64 -d", code)
    assert encoded is not None
    return base64.b64decode(encoded.group(1)).decode()
