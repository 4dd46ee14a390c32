"""The SSH transport in-process against a real sshd (root's login shell is bash there).

The test thread enters the controller's network namespace only while it opens connections
(tests/netns.py); the sockets stay there afterwards.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.transports import SSHTransport
from tests import netns
from tests.cluster import NamespaceCluster
from tests.conftest import root_transport

arg_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=60)
env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: (
        n.upper() not in {"PWD", "OLDPWD", "SHLVL", "_", "IFS", "PS4", "HOME", "PATH", "LC_ALL", "LANG"}
        and not n.startswith("BASH")
    )
)
# The remote program reports what it received as hex bytes: no decoding can hide a difference.
ECHO = (
    "import json,os,sys; print(json.dumps({'argv': [os.fsencode(a).hex() for a in sys.argv[1:]],"
    " 'env': {k: os.fsencode(v).hex() for k, v in os.environ.items()}}))"
)


@pytest.fixture
def transport(cluster: NamespaceCluster, ctl_home: Path) -> Iterator[SSHTransport]:
    known = ctl_home / ".ssh" / "known_hosts"
    known.write_text(cluster.known_hosts_text())
    (ctl_home / ".ssh" / "config").write_text("")
    t = root_transport(cluster, cluster.hosts[0], known, ctl_home / ".ssh" / "config")
    with netns.inside(cluster.controller_ns):
        t.connect()
    yield t
    t.close()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(arg_text, max_size=5), env=st.dictionaries(env_names, arg_text, max_size=4))
def test_arguments_and_env_arrive_byte_for_byte(
    transport: SSHTransport, args: list[str], env: dict[str, str]
) -> None:
    shell = transport.platform
    result = transport.run(shell.join(["/usr/bin/python3", "-c", ECHO, *args]), env=env, timeout=30)
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["argv"] == [a.encode().hex() for a in args]
    for name, value in env.items():
        assert seen["env"][name] == value.encode().hex()


def test_one_connection_serves_every_command(transport: SSHTransport, cluster: NamespaceCluster) -> None:
    host = cluster.hosts[0]
    before = cluster.sshd_log(host).count("Accepted publickey")
    for i in range(5):
        assert transport.run(f"echo {i}").stdout == f"{i}\n"
    assert cluster.sshd_log(host).count("Accepted publickey") == before


def test_lines_arrive_while_the_command_runs(transport: SSHTransport) -> None:
    arrived: list[tuple[str, str, float]] = []
    start = time.monotonic()
    result = transport.run(
        "echo one; sleep 1; echo two >&2; echo three",
        on_line=lambda s, line: arrived.append((s, line, time.monotonic())),
    )
    # each stream keeps its order; stdout and stderr are separate SSH channels, so no order between them
    assert [line for s, line, _ in arrived if s == "stdout"] == ["one", "three"]
    assert [line for s, line, _ in arrived if s == "stderr"] == ["two"]
    assert arrived[0][2] - start < 0.9  # "one" came before the sleep ended
    assert result.ok and result.stdout == "one\nthree\n" and result.stderr == "two\n"


def _await_gone(cluster: NamespaceCluster, marker: str, timeout: float = 10) -> list[str]:
    """Processes on node1 whose command line holds ``marker``, once they are gone or time is up."""
    deadline = time.monotonic() + timeout
    while True:
        found = cluster.ns_run(cluster.hosts[0].ns, ["pgrep", "-af", marker]).stdout.splitlines()
        found = [line for line in found if "pgrep" not in line]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _sleeper(marker: str) -> str:
    # a child of a child, silent: only a process-group kill reaches it (no SIGPIPE, no SIGHUP)
    return f"echo started; sh -c 'sleep 300; : {marker}' & sh -c 'sleep 300; : {marker}'; wait"


def test_exit_code_and_timeout_kills_the_remote_command(
    transport: SSHTransport, cluster: NamespaceCluster
) -> None:
    assert transport.run("exit 42").exit_code == 42
    marker = f"cbt-timeout-{time.monotonic_ns()}"
    result = transport.run(_sleeper(marker), timeout=1)
    assert result.timed_out and result.exit_code is None and result.stdout == "started\n"
    assert _await_gone(cluster, marker) == []
    assert transport.run("echo still usable").ok  # the connection survives a timed-out command


def test_close_from_another_thread_stops_the_remote_command(
    transport: SSHTransport, cluster: NamespaceCluster
) -> None:
    marker = f"cbt-close-{time.monotonic_ns()}"
    started = threading.Event()
    threading.Thread(target=lambda: (started.wait(10), transport.close()), daemon=True).start()
    begin = time.monotonic()
    result = transport.run(_sleeper(marker), on_line=lambda s, line: started.set())
    assert time.monotonic() - begin < 10 and result.exit_code is None
    assert _await_gone(cluster, marker) == []


def test_commands_reading_stdin_see_end_of_file(transport: SSHTransport) -> None:
    assert transport.run("cat; echo done", timeout=10).stdout == "done\n"


def test_files_round_trip_over_sftp(transport: SSHTransport, tmp_path: Path) -> None:
    src = tmp_path / "payload.bin"
    src.write_bytes(bytes(range(256)) * 4096)  # 1 MiB, every byte value
    transport.put(src, "/tmp/cbt-sftp/deep/dir/payload.bin", mode=0o640)
    try:
        assert transport.run("stat -c %a /tmp/cbt-sftp/deep/dir/payload.bin").stdout.strip() == "640"
        transport.get("/tmp/cbt-sftp/deep/dir/payload.bin", tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    finally:
        transport.run("rm -rf /tmp/cbt-sftp")


def test_output_written_just_before_exit_is_never_lost(transport: SSHTransport) -> None:
    # sshd reports the exit status before it has drained the pipe: the tail must still arrive
    for _ in range(5):
        result = transport.run("seq 1 30000; exit 5")
        assert result.exit_code == 5
        assert result.stdout.splitlines()[-1] == "30000" and len(result.stdout.splitlines()) == 30000


def test_a_command_ignoring_sigterm_is_killed_after_the_grace(
    transport: SSHTransport, cluster: NamespaceCluster
) -> None:
    marker = f"cbt-stubborn-{time.monotonic_ns()}"
    result = transport.run(f"echo started; sh -c 'trap \"\" TERM; sleep 300; : {marker}'", timeout=1)
    assert result.timed_out
    assert _await_gone(cluster, marker, timeout=15) == []


def test_background_children_do_not_hold_the_command_open(
    transport: SSHTransport, cluster: NamespaceCluster
) -> None:
    marker = f"cbt-bg-{time.monotonic_ns()}"
    begin = time.monotonic()
    result = transport.run(f"sh -c 'sleep 300; : {marker}' & echo left a child")
    assert result.ok and result.stdout == "left a child\n"
    assert time.monotonic() - begin < 10
    assert _await_gone(cluster, marker) == []  # what a command leaves in its group is stopped
