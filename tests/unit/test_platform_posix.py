"""POSIX quoting: arbitrary strings reach a real /bin/sh program unchanged (the SSH variant of this
property runs through real bash over real sshd in tests/integration/test_ssh_transport.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.platforms import PosixShell, check_env_name
from orchestrator.transports import LocalTransport

# Anything a process can receive: no NUL (C strings), no lone surrogates (not encodable).
arg_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: n not in {"PWD", "OLDPWD", "SHLVL", "_", "IFS", "PS4", "HOME", "PATH", "LC_ALL", "LANG"}
)
ECHO = "import json,os,sys; print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))"


@settings(max_examples=60, deadline=None)
@given(args=st.lists(arg_text, max_size=4), env=st.dictionaries(env_names, arg_text, max_size=3))
def test_arguments_and_env_reach_the_process_unchanged(args: list[str], env: dict[str, str]) -> None:
    shell = PosixShell()
    transport = LocalTransport("local", shell)
    result = transport.run(shell.join([sys.executable, "-c", ECHO, *args]), env=env)
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["argv"] == args
    for name, value in env.items():
        assert seen["env"][name] == value


def test_cwd_with_spaces_and_quotes(tmp_path: object) -> None:
    from pathlib import Path

    target = Path(str(tmp_path)) / 'it\'s a "dir" $HOME'
    target.mkdir()
    result = LocalTransport("local", PosixShell()).run("pwd", cwd=str(target))
    assert result.stdout.strip() == str(target)


def test_missing_cwd_exits_125_naming_the_directory() -> None:
    result = LocalTransport("local", PosixShell()).run("true", cwd="/nonexistent/dir")
    assert result.exit_code == 125
    assert "/nonexistent/dir" in result.stderr


def test_home_relative_cwd_expands_on_the_node() -> None:
    import os

    result = LocalTransport("local", PosixShell()).run("pwd", cwd="~")
    assert result.stdout.strip() == os.path.expanduser("~")


@pytest.mark.parametrize("name", ["1X", "A-B", "", "A B", "X;rm"])
def test_bad_env_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="invalid environment variable name"):
        check_env_name(name)


def test_become_uses_sudo_non_interactively_for_non_root() -> None:
    text = PosixShell().wrap("id -u", become=True)
    assert "sudo -n --" in text and '"$(id -u)" = 0' in text


def test_sudo_refusal_is_recognised() -> None:
    assert PosixShell.sudo_refused("sudo: a password is required\n")
    assert not PosixShell.sudo_refused("permission denied")


def test_transfer_paths_are_home_relative() -> None:
    shell = PosixShell()
    assert shell.transfer_path("~/x/y") == "x/y"
    assert shell.transfer_path("/abs") == "/abs"


# -- files through a command (platforms/transfer.py), run by a real /bin/sh --------------------------------


def _sh(script: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["/bin/sh", "-c", script], input=stdin, capture_output=True, check=False)


def _lines(data: bytes, chunk: int = 1000) -> bytes:
    return b"".join(base64.b64encode(data[i : i + chunk]) + b"\n" for i in range(0, len(data), chunk))


def test_upload_renames_into_place_with_the_mode_and_prints_the_hash(tmp_path: Path) -> None:
    data = os.urandom(5000) + b"\r\n"
    target = tmp_path / "it's a dir" / "deep" / "f $x.bin"
    digest = hashlib.sha256(data).hexdigest()
    done = _sh(PosixShell().upload_script(str(target), digest, mode=0o640), _lines(data))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines() == [f"sha256 {digest}", f"path {target}"]
    assert target.read_bytes() == data and target.stat().st_mode & 0o777 == 0o640
    assert os.listdir(target.parent) == [target.name]


def test_upload_with_a_wrong_hash_exits_3_and_replaces_nothing(tmp_path: Path) -> None:
    target = tmp_path / "model.bin"
    target.write_bytes(b"old contents")
    done = _sh(PosixShell().upload_script(str(target), "0" * 64), _lines(b"new contents"))
    assert done.returncode == 3 and b"sha256 mismatch" in done.stderr
    assert target.read_bytes() == b"old contents" and os.listdir(tmp_path) == ["model.bin"]


def test_upload_without_a_mode_keeps_an_existing_files_mode(tmp_path: Path) -> None:
    target = tmp_path / "run.sh"
    target.write_bytes(b"old")
    target.chmod(0o751)
    done = _sh(PosixShell().upload_script(str(target), hashlib.sha256(b"new").hexdigest()), _lines(b"new"))
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o751


def test_upload_of_an_empty_file_and_to_a_new_temporary_file(tmp_path: Path) -> None:
    done = _sh(PosixShell().upload_script(None, hashlib.sha256(b"").hexdigest(), suffix=".sh"))
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.decode().splitlines()[1].removeprefix("path "))
    try:
        assert path.parent == Path("/tmp") and path.name.endswith(".sh") and path.read_bytes() == b""
        _sh(PosixShell().remove_file(str(path)))
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)


def test_download_prints_size_chunks_and_hash_and_names_a_missing_file(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    (tmp_path / "f").write_bytes(data)
    # relative paths are relative to the home directory, as over SFTP: run it with HOME there
    done = subprocess.run(
        ["/bin/sh", "-c", PosixShell().download_script("f", chunk=3000)],
        capture_output=True,
        env={**os.environ, "HOME": str(tmp_path)},
        check=False,
    )
    lines = done.stdout.decode().splitlines()
    assert lines[0] == "size 10000" and lines[-1] == f"sha256 {hashlib.sha256(data).hexdigest()}"
    pieces = [base64.b64decode(line.removeprefix("data ")) for line in lines[1:-1]]
    assert [len(p) for p in pieces] == [3000, 3000, 3000, 1000] and b"".join(pieces) == data
    missing = _sh(PosixShell().download_script(str(tmp_path / "nope")))
    assert missing.returncode == 1 and b"cannot read" in missing.stderr and b"nope" in missing.stderr


def test_long_scripts_are_private_files_run_by_sh() -> None:
    shell = PosixShell()
    file = shell.long_script("echo hi")
    assert file.data == b"echo hi" and file.mode == 0o600
    assert _sh(shell.run_long_script("/dev/null", "echo hi")).returncode == 0


def test_directories_an_upload_creates_follow_the_umask_not_the_files_mode(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "secret.txt"
    digest = hashlib.sha256(b"s").hexdigest()
    done = _sh(f"umask 022\n{PosixShell().upload_script(str(target), digest, mode=0o600)}", _lines(b"s"))
    assert done.returncode == 0, done.stderr
    assert target.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o755  # as sftp mkdir under umask 022


def test_a_script_of_60_kb_runs_through_the_wrappers_of_one_command_line() -> None:
    """The main pipeline's first command is about 50 KB of shell. What the SSH transport sends
    (``login_command`` of ``stop_on_hangup``) is one argument of the login shell, which Linux caps at
    128 KiB (MAX_ARG_STRLEN): the wrappers carry the script once, and it runs."""
    shell = PosixShell()
    script = "\n".join(f": 'line {i}: \"quoted\" $text'" for i in range(2200)) + "\necho ran to the end"
    assert len(script) > 60_000
    line = shell.login_command(shell.stop_on_hangup(script, silence=15))
    assert len(line.encode()) < 131072
    proc = subprocess.Popen(["bash", "-c", line], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        out = proc.stdout.read()  # the channel's stdin stays open while the command runs, as over SSH
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
    assert out.strip() == "ran to the end" and proc.returncode == 0, (out, proc.returncode)


def test_a_relative_path_that_starts_with_a_dash_is_never_an_option(tmp_path: Path) -> None:
    """`train.code_dir: -P` or `run --cwd -P`: dash's `cd -P` without an operand goes home."""
    sh = PosixShell()
    assert sh.path_word("-P") == "./-P"
    out = subprocess.run(
        ["sh", "-c", f"mkdir ./-P && cd {sh.path_word('-P')} && pwd"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(tmp_path / "-P")
    assert "cd ./-P" in sh.wrap("pwd", cwd="-P")


def test_a_sections_own_answers_carry_any_bytes_as_one_record_each() -> None:
    """``section_answer`` inside a sectioned script: what a tool printed (lines shaped like records or
    like the old markers, separators, NUL, no final newline) is one field of one record of the
    reader's nonce, inside the section's own record."""
    from orchestrator import records
    from orchestrator.facts.base import split_sections

    sh, token, nonce = PosixShell(), "cb-0123456789ab", "cb-a0a1a2a3a4a5"
    hostile = (
        "rule one\n@@added\n" + records.record(nonce, "description", "cb-lab", "mine") + "x\u2028y\x1c\0end"
    ).encode()
    command = (
        f"printf '%s' {sh.quote(base64.b64encode(hostile).decode())} | base64 -d | "
        f"{sh.section_answer(nonce, 'runtime', 'cb-lab')}\n"
        f"echo plain | {sh.section_answer(nonce, 'description', 'cb-lab')}"
    )
    ran = _sh(sh.sectioned([("firewalld", command)], token))
    text, code = split_sections(ran.stdout.decode(), token)["firewalld"]
    assert code == 0
    said = records.decode(text, nonce)
    assert [(r.kind, r.fields) for r in said] == [
        ("runtime", (b"cb-lab", hostile)),
        ("description", (b"cb-lab", b"plain\n")),
    ]


def test_a_line_into_a_fifo_is_plain_when_it_can_be_and_quoted_when_not() -> None:
    sh = PosixShell()
    plain = sh.line_into_fifo(
        "/tmp/cbt-reach-0a/inbox", ["connect", "10.0.0.1", "2", "ab12", "10.0.0.2:41000"]
    )
    assert plain == "echo connect 10.0.0.1 2 ab12 10.0.0.2:41000 1<>/tmp/cbt-reach-0a/inbox"
    assert sh.login_command(plain) == f"/bin/sh -c '{plain}'"  # no base64 process for it
    other = sh.line_into_fifo("/tmp/a b/inbox", ["connect", "-", "2", "ab12", "[fd00::1]:41000"])
    assert other == "printf '%s\\n' 'connect - 2 ab12 [fd00::1]:41000' 1<>'/tmp/a b/inbox'"
    assert "base64 -d" in sh.login_command(other)
    assert "base64 -d" in sh.login_command("-x")  # a leading dash would be an option of sh -c


def test_trying_to_write_says_the_nodes_own_reason_and_leaves_nothing(tmp_path: Path) -> None:
    """SFTP answers a refused write with "Failure" alone: the transport asks the node's shell, whose
    words are the errno's (here a directory that is not there; on a node: "Read-only file system",
    "No space left on device")."""
    platform = PosixShell()
    fine = subprocess.run(
        ["/bin/sh", "-c", platform.try_writing_in(str(tmp_path))], capture_output=True, text=True
    )
    assert fine.returncode == 0 and fine.stdout == "" and list(tmp_path.iterdir()) == []
    gone = tmp_path / "no such dir"  # a name that cannot be written
    said = subprocess.run(
        ["/bin/sh", "-c", platform.try_writing_in(str(gone))], capture_output=True, text=True
    )
    # (dash's words for ENOENT; bash says "No such file or directory")
    assert said.returncode != 0 and said.stdout.strip().endswith(
        ("Directory nonexistent", "No such file or directory")
    )


def test_trying_to_write_on_a_full_disk_says_so_with_what_is_free(tmp_path: Path) -> None:
    """A launch's upload to a full disk said "launch.sh holds 0 bytes after sending 2205" (SFTP's
    short write): the node's shell now names the cause and the space left. (A tmpfs of 64 KiB,
    filled, in a mount namespace of its own: nothing of this machine's changes.)"""
    full = tmp_path / "full"
    full.mkdir()
    script = PosixShell().try_writing_in(str(full))
    said = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs '{full}' &&"
         f" (head -c 1048576 /dev/zero > '{full}/fill' 2>/dev/null; true) && {{ {script}\n}}"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert said.returncode == 1, said
    assert said.stdout.strip() == "No space left on device (0 KiB free there)", said
