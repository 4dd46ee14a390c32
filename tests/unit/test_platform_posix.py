"""POSIX quoting: arbitrary strings reach a real /bin/sh program unchanged (the SSH variant of this
property runs through real bash over real sshd in tests/integration/test_ssh_transport.py)."""

from __future__ import annotations

import json
import sys

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
