"""The SSH transport in-process against a real sshd (root's login shell is bash there): what only SSH
has (the login shell between us and /bin/sh, one connection for every command, sshd's exit status
before its pipe is drained, the watcher's KILL after TERM). What every transport does (exit codes,
streaming, timeouts, cancellation, files) is in test_transport_contract.py; servers without SFTP in
test_ssh_no_sftp.py.

The test thread enters the controller's network namespace only while it opens connections
(tests/netns.py); the sockets stay there afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.transports import SSHTransport
from tests.cluster import NamespaceCluster
from tests.conftest import connected_root_transport

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
    with connected_root_transport(cluster, ctl_home) as t:
        yield t


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
    assert transport.run("echo 0").stdout == "0\n"
    link = transport.conn.client.get_transport()
    assert link is not None
    port = link.sock.getsockname()[1]  # this transport's connection, as sshd logs it
    # sshd logs every login on the host, other tests' too (the cluster is shared): count this one's
    ours = f"Accepted publickey for root from {link.sock.getsockname()[0]} port {port} "
    assert cluster.sshd_log(host).count(ours) == 1
    for i in range(1, 5):
        assert transport.run(f"echo {i}").stdout == f"{i}\n"
    assert transport.conn.client.get_transport() is link  # the same connection, no new login
    assert cluster.sshd_log(host).count(ours) == 1


def _await_gone(cluster: NamespaceCluster, marker: str, timeout: float = 10) -> list[str]:
    """Processes on node1 whose command line holds ``marker``, once they are gone or time is up."""
    deadline = time.monotonic() + timeout
    while True:
        found = cluster.ns_run(cluster.hosts[0].ns, ["pgrep", "-af", marker]).stdout.splitlines()
        found = [line for line in found if "pgrep" not in line]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_output_written_just_before_exit_is_never_lost(transport: SSHTransport) -> None:
    # sshd reports the exit status before it has drained the pipe: the tail must still arrive (a race,
    # so tried several times; the contract suite checks the property once for every transport)
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


def _session_sshd(cluster: NamespaceCluster, pid: int) -> int:
    """The ``sshd: USER@notty`` process above ``pid``: the one that speaks SSH for that connection."""
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        if cmdline.startswith("sshd:") and "@notty" in cmdline:
            return pid
        status = Path(f"/proc/{pid}/status").read_text()
        pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    raise AssertionError("no sshd session process above the command")


def test_a_frozen_sshd_is_named_within_the_silence_the_node_allows(
    transport: SSHTransport, cluster: NamespaceCluster
) -> None:
    """The node's sshd session stops (SIGSTOP; a node swapping itself to death looks the same): its
    kernel still takes our bytes, so no connection is lost, and its silence looked like a quiet rank
    while the node's watcher stopped the command. The transport asks for a reply with its heartbeats:
    unanswered for NODE_SILENCE seconds, the command fails as unreachable, naming why."""
    import os
    import signal
    import threading
    import uuid

    from orchestrator.errors import UnreachableError

    marker = f"cbt-frozen-{uuid.uuid4().hex}"
    started = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            transport.run(
                f"echo up; sleep 120; : {marker}", on_line=lambda s, line: started.set(), timeout=100
            )
        except BaseException as exc:
            failed.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    assert started.wait(30)
    (line,) = [
        x for x in cluster.ns_run(cluster.hosts[0].ns, ["pgrep", "-f", marker]).stdout.split() if x.strip()
    ][:1]
    session = _session_sshd(cluster, int(line))
    os.kill(session, signal.SIGSTOP)
    begin = time.monotonic()
    try:
        runner.join(SSHTransport.NODE_SILENCE + 20)
        took = time.monotonic() - begin
    finally:
        os.kill(session, signal.SIGCONT)
    assert not runner.is_alive() and len(failed) == 1, failed
    assert isinstance(failed[0], UnreachableError) and "stopped answering" in str(failed[0]), failed
    assert took < SSHTransport.NODE_SILENCE + SSHTransport.HEARTBEAT * 3, took
