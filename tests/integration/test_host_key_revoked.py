"""known_hosts ``@revoked`` lines against a real sshd (security review item 9).

Revocations used to be skipped, so ``--accept-new-host-keys`` accepted, and recorded, a key OpenSSH
refuses. Every case below is also put to OpenSSH's own client with the same known_hosts file: the
transport must agree with it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest

from orchestrator.errors import (
    ConnectError,
    ExitCode,
    HostKeyChangedError,
    HostKeyRevokedError,
    HostKeyUnknownError,
)
from orchestrator.platforms import PosixShell
from orchestrator.transports import SSHOptions
from orchestrator.transports.ssh import SSHTransport
from tests import netns
from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import CliRun, write_inventory

Bootstrap = Callable[..., CliRun]


def _openssh(
    cluster: NamespaceCluster, host: TestHost, known_hosts: Path
) -> subprocess.CompletedProcess[str]:
    """OpenSSH's verdict: with accept-new, it records unknown keys and refuses revoked ones."""
    argv = [
        "ssh",
        "-F", "/dev/null",
        "-i", str(cluster.client_key),
        "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=accept-new",
        "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=10",
        f"root@{host.addr}",
        "true",
    ]  # fmt: skip
    return subprocess.run(
        cluster.controller_argv(argv, env={"SSH_AUTH_SOCK": ""}),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _connect(cluster: NamespaceCluster, host: TestHost, known_hosts: Path, tmp_path: Path) -> None:
    """Connect in-process with --accept-new-host-keys, as `bootstrap keys` and every command can."""
    config = tmp_path / "ssh_config"
    config.write_text("")
    transport = SSHTransport(
        host.name,
        PosixShell(),
        host=host.addr,
        port=None,
        user="root",
        key_file=str(cluster.client_key),
        password=lambda: None,
        options=SSHOptions(known_hosts=known_hosts, ssh_config=config, accept_new_host_keys=True),
        identities_only=True,
    )
    try:
        with netns.inside(cluster.controller_ns):
            transport.connect()
        assert transport.run("true", timeout=30).ok
    finally:
        transport.close()


def _fresh_key(tmp_path: Path, kind: str = "ed25519") -> str:
    path = tmp_path / f"other_{kind}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


CASES = {
    # name: (known_hosts lines, refused)
    "plain": (["@revoked {addr} {key}"], True),
    "wildcard": (["@revoked {net}.* {key}"], True),
    "hashed": (["@revoked {hashed} {key}"], True),
    "also listed as trusted": (["{addr} {key}", "@revoked * {key}"], True),
    "negated for this host": (["{addr} {key}", "@revoked !{addr},* {key}"], False),
    "revoked for another host": (["{addr} {key}", "@revoked other.example.org {key}"], False),
    "another key revoked": (["{addr} {key}", "@revoked * {other}"], False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_revocations_are_honoured_as_openssh_does(
    case: str, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    host = cluster.hosts[0]
    lines, refused = CASES[case]
    values = {
        "addr": host.addr,
        "net": host.addr.rsplit(".", 1)[0],
        "key": host.host_key_line(),
        "hashed": paramiko.HostKeys.hash_host(host.addr),
        "other": _fresh_key(tmp_path),
    }
    text = "# cluster hosts\n" + "".join(line.format(**values) + "\n" for line in lines)
    ours, theirs = tmp_path / "ours_known_hosts", tmp_path / "openssh_known_hosts"
    ours.write_text(text)
    theirs.write_text(text)

    openssh = _openssh(cluster, host, theirs)
    assert (openssh.returncode != 0) == refused, openssh.stderr  # the cases mean what they say
    if refused:
        assert "REVOKED" in openssh.stderr, openssh.stderr
        with pytest.raises(HostKeyRevokedError) as caught:
            _connect(cluster, host, ours, tmp_path)
        error = caught.value
        assert error.exit_code == ExitCode.CONNECTION
        assert error.node == host.name and "ssh-ed25519" in error.message
        line = 1 + next(i for i, entry in enumerate(lines, 1) if entry.startswith("@revoked"))
        assert f"{ours}:{line}" in error.message
        assert ours.read_text() == text  # nothing recorded
    else:
        _connect(cluster, host, ours, tmp_path)
        assert ours.read_text() == text  # the host was known: nothing to record


def test_cli_refuses_a_revoked_key_with_accept_new_and_records_nothing(
    bootstrap: Bootstrap, ctl_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    host = cluster.hosts[1]
    known = ctl_home / ".ssh" / "known_hosts"
    text = f"# revoked after the laptop theft\n@revoked {host.addr} {host.host_key_line()}\n"
    known.write_text(text)
    nodes = [{"name": host.name, "host": host.addr, "user": "root"}]
    inv = write_inventory(tmp_path / "hosts.yaml", nodes)
    run = bootstrap("-i", str(inv), "--accept-new-host-keys", "run", "--", "true")
    assert run.returncode == 3, run
    assert f"node '{host.name}'" in run.stderr and "HOST KEY REVOKED" in run.stderr, run
    assert f"ssh-ed25519 key {host.fingerprint()}" in run.stderr and f"{known}:2" in run.stderr, run
    assert "recorded host key" not in run.stderr
    assert known.read_text() == text
    # OpenSSH refuses it too (the file is a valid revocation)
    assert "REVOKED" in _openssh(cluster, host, known).stderr


def test_changed_and_unknown_key_hints_name_the_key_type_offered(
    cluster: NamespaceCluster, tmp_path: Path
) -> None:
    host = cluster.hosts[0]
    # known_hosts holds an ECDSA key for the host; it offers its ed25519 key: paramiko calls that a
    # changed key, and the fix to check is the one for the key type really offered
    known = tmp_path / "known_hosts"
    known.write_text(f"{host.addr} {_fresh_key(tmp_path, 'ecdsa')}\n")
    with pytest.raises(HostKeyChangedError) as changed:
        _connect(cluster, host, known, tmp_path)
    hint = changed.value.hint or ""
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in hint and "ssh-ed25519" in hint, hint
    assert "ecdsa" not in hint, hint

    known.write_text("")
    config = tmp_path / "ssh_config"  # written by _connect above
    transport = SSHTransport(
        host.name,
        PosixShell(),
        host=host.addr,
        port=None,
        user="root",
        key_file=str(cluster.client_key),
        password=lambda: None,
        options=SSHOptions(known_hosts=known, ssh_config=config),
        identities_only=True,
    )
    try:
        with pytest.raises(HostKeyUnknownError) as unknown, netns.inside(cluster.controller_ns):
            transport.connect()
    finally:
        transport.close()
    assert unknown.value.key_type == "ssh-ed25519"
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in (unknown.value.hint or "")


def test_an_unknown_marker_is_an_error_naming_the_line(cluster: NamespaceCluster, tmp_path: Path) -> None:
    host = cluster.hosts[0]
    known = tmp_path / "known_hosts"
    known.write_text(f"{host.addr} {host.host_key_line()}\n@revokd * {host.host_key_line()}\n")
    with pytest.raises(ConnectError, match=rf"{known}:2: unknown known_hosts marker '@revokd'"):
        _connect(cluster, host, known, tmp_path)
