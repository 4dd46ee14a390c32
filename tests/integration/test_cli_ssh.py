"""The real `bootstrap` CLI against the namespace cluster: real sshd, real host keys, real failures."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import BOOTSTRAP, CliRun, write_inventory

Bootstrap = Callable[..., CliRun]
#: the test venv's interpreter, with torch: readable by root on every namespace host (one filesystem)
PYTHON = sys.executable


@contextmanager
def password_only_user(cluster: NamespaceCluster, host: TestHost, name: str, password: str) -> Iterator[None]:
    """A user who can log in to ``host`` with ``password`` only (no authorised key), removed after."""
    cluster.add_user(name, password=password, authorized_key=False)
    cluster.set_password_auth(host, True)
    try:
        yield
    finally:
        cluster.set_password_auth(host, False)
        cluster.remove_user(name)


def _nodes(cluster: NamespaceCluster, **extra: object) -> list[dict[str, object]]:
    return [
        {"name": h.name, "host": h.addr, "user": "root", "python": PYTHON, **extra} for h in cluster.hosts
    ]


@pytest.fixture
def inventory(cluster: NamespaceCluster, tmp_path: Path) -> Path:
    return write_inventory(tmp_path / "hosts.yaml", _nodes(cluster), name="ns", master="node1")


def test_check_three_nodes_shows_each_node(
    bootstrap: Bootstrap, trusted_home: Path, inventory: Path, cluster: NamespaceCluster
) -> None:
    run = bootstrap("--inventory", str(inventory), "check", "--json")
    assert run.returncode == 0, run
    doc = json.loads(run.stdout)
    assert [n["name"] for n in doc["nodes"]] == ["node1", "node2", "node3"]
    for node, host in zip(doc["nodes"], cluster.hosts, strict=True):
        assert node["ok"] and node["error"] is None
        assert node["facts"]["hostname"] == host.hostname  # its own UTS namespace: really that host
        assert node["via"] == f"ssh root@{host.addr}"
        assert os.path.samefile(node["facts"]["python"]["path"], PYTHON)
        assert node["facts"]["cpus"] >= 1 and node["facts"]["memory"]["total_bytes"] > 0
        assert node["facts"]["gpus"] == {"gpus": [], "nvidia_smi": False, "error": None}
        assert node["facts"]["torch"]["installed"] and node["facts"]["torch"]["gloo_works"]
        assert {c["level"] for c in node["checks"].values()} <= {"ok", "warn"}, node["checks"]
    assert doc["backend"] == "gloo"


def test_facts_alone_checks_nothing(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    # Debian's python3 has no torch: check would fail the versions check, facts just reports it
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": "/usr/bin/python3"} for h in cluster.hosts
    ]
    run = bootstrap("-i", str(write_inventory(tmp_path / "h.yaml", nodes)), "--json", "facts")
    assert run.returncode == 0, run
    doc = json.loads(run.stdout)
    assert [n["facts"]["torch"]["installed"] for n in doc["nodes"]] == [False, False, False]
    assert all("checks" not in n for n in doc["nodes"])


def test_check_table_for_humans(bootstrap: Bootstrap, trusted_home: Path, inventory: Path) -> None:
    run = bootstrap("-i", str(inventory), "check")
    assert run.returncode == 0, run
    for name in ("node1 (master)", "node2", "node3"):
        assert name in run.stdout
    assert "(gloo)" in run.stdout  # torch column: version and usable backends
    assert "3/3 nodes reachable" in run.stderr
    assert "\x1b[" not in run.stdout  # piped: no colour codes


def test_run_streams_prefixed_lines_and_summarises_exit_codes(
    bootstrap: Bootstrap, trusted_home: Path, inventory: Path
) -> None:
    script = 'echo "hello from $(hostname)"; echo "to stderr" >&2; [ "$(hostname)" != node2 ] || exit 7'
    run = bootstrap("-i", str(inventory), "run", "--", script)
    assert run.returncode == 1, run  # node2 failed
    lines = run.stdout.splitlines()
    for name in ("node1", "node2", "node3"):
        assert re.search(rf"^\[{name}\] +hello from {name}$", run.stdout, re.M), run.stdout
        assert any(line.startswith(f"[{name}]") and line.endswith("to stderr") for line in lines)
    assert re.search(r"node2\W+exit 7", run.stderr), run.stderr
    assert re.search(r"node1\W+ok", run.stderr)
    # every node's output is also kept on the controller
    log_dir = Path(re.search(r"output kept in (\S+)", run.stderr).group(1))  # type: ignore[union-attr]
    assert (log_dir / "node2.log").read_text() == "hello from node2\nto stderr\n"


def test_run_json_has_exit_codes_and_output(
    bootstrap: Bootstrap, trusted_home: Path, inventory: Path
) -> None:
    run = bootstrap("-i", str(inventory), "--json", "run", "--nodes", "node1,node3", "--", "hostname")
    assert run.returncode == 0, run
    doc = json.loads(run.stdout)
    assert [(n["name"], n["exit_code"], n["stdout"]) for n in doc["nodes"]] == [
        ("node1", 0, "node1\n"),
        ("node3", 0, "node3\n"),
    ]


def test_unknown_host_key_is_refused_with_fingerprint_then_accepted_on_request(
    bootstrap: Bootstrap, ctl_home: Path, inventory: Path, cluster: NamespaceCluster
) -> None:
    run = bootstrap("-i", str(inventory), "check", "--nodes", "node1")
    assert run.returncode == 3, run
    host = cluster.hosts[0]
    # one line per node: name, address, key type and fingerprint; then what to do
    assert re.search(
        rf"^\s+node1\s+{re.escape(host.addr)}\s+ssh-ed25519 {re.escape(host.fingerprint())}$",
        run.stderr,
        re.M,
    ), run
    assert "--accept-new-host-keys" in run.stderr
    assert not (ctl_home / ".ssh" / "known_hosts").exists()

    run = bootstrap("-i", str(inventory), "check", "--nodes", "node1", "--accept-new-host-keys")
    assert run.returncode == 0, run
    assert f"recorded host key {host.addr} ssh-ed25519 {host.fingerprint()}" in run.stderr
    assert host.addr in (ctl_home / ".ssh" / "known_hosts").read_text()

    run = bootstrap("-i", str(inventory), "check", "--nodes", "node1")  # recorded: no flag needed now
    assert run.returncode == 0, run
    # marker lines paramiko cannot read (certificate authorities, revocations) do not break anything
    known = ctl_home / ".ssh" / "known_hosts"
    ca_key = host.host_key_line()
    known.write_text(
        f"@cert-authority *.example.org {ca_key}\n@revoked other.example.org {ca_key}\n" + known.read_text()
    )
    run = bootstrap("-i", str(inventory), "check", "--nodes", "node1")
    assert run.returncode == 0, run


def test_changed_host_key_is_refused_even_with_accept_new(
    bootstrap: Bootstrap, ctl_home: Path, inventory: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    host = cluster.hosts[2]
    old_line = f"{host.addr} {host.host_key_line()}\n"
    (ctl_home / ".ssh" / "known_hosts").write_text(old_line)
    old_fp = host.fingerprint()
    cluster.rotate_host_key(host)
    try:
        run = bootstrap("-i", str(inventory), "check", "--nodes", "node3", "--accept-new-host-keys")
        assert run.returncode == 3, run
        assert "HOST KEY CHANGED" in run.stderr
        assert old_fp in run.stderr and host.fingerprint() in run.stderr
        assert f"ssh-keygen -R {host.addr}" in run.stderr
        assert (ctl_home / ".ssh" / "known_hosts").read_text() == old_line  # nothing recorded
    finally:
        pass  # the rotated key is the host's key from now on; other tests read it from the cluster


def test_unreachable_node_is_named_and_others_still_report(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    nodes = [*_nodes(cluster)[:2], {"name": "ghost", "host": cluster.unused_addr, "user": "root"}]
    inv = write_inventory(tmp_path / "hosts.yaml", nodes)
    run = bootstrap("-i", str(inv), "--connect-timeout", "0.5", "--json", "check")
    assert run.returncode == 3, run
    doc = json.loads(run.stdout)
    by_name = {n["name"]: n for n in doc["nodes"]}
    assert by_name["node1"]["ok"] and by_name["node2"]["ok"]
    ghost = by_name["ghost"]
    assert not ghost["ok"] and ghost["error"]["type"] == "UnreachableError"
    assert "timed out after 0.5s" in ghost["error"]["message"]
    assert ghost["duration"] < 5  # fractional timeouts are honoured (not truncated to "none")
    assert cluster.unused_addr in ghost["error"]["message"]
    assert "node 'ghost'" in run.stderr
    # launch (foreground and detached), validate and render print their document too (nothing did)
    (tmp_path / "train.py").write_text("print('never')\n")
    for command in (["launch"], ["launch", "--detach"], ["validate"], ["render"]):
        said = bootstrap("-i", str(inv), "--connect-timeout", "0.5", "--json", *command, cwd=tmp_path)
        assert said.returncode == 3, said
        doc = json.loads(said.stdout)
        assert doc["command"] == command[0] and doc["exit_code"] == 3, doc
        assert [n["name"] for n in doc["nodes"] if not n["ok"]] == ["ghost"], doc


def test_refused_port_says_nothing_listens(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    nodes = [{"name": "wrongport", "host": cluster.hosts[0].addr, "port": 2222, "user": "root"}]
    run = bootstrap("-i", str(write_inventory(tmp_path / "h.yaml", nodes)), "check")
    assert run.returncode == 3, run
    assert "connection refused" in run.stderr and "2222" in run.stderr and "wrongport" in run.stderr


def test_wrong_user_is_an_authentication_error(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    nodes = [{"name": "n1", "host": cluster.hosts[0].addr, "user": "nosuchuser"}]
    inv = write_inventory(tmp_path / "h.yaml", nodes)
    run = bootstrap("-i", str(inv), "check")
    assert run.returncode == 3, run
    assert "authentication as 'nosuchuser'" in run.stderr and "node 'n1'" in run.stderr
    assert f"`bootstrap -i {inv} keys`" in run.stderr  # what to do next, on this inventory


def test_password_is_needed_only_when_keys_fail(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    host = cluster.hosts[0]
    with password_only_user(cluster, host, "cbtpwonly", "pw-only"):
        nodes = [
            # key login works: the unset password variable is never needed (cron, CI)
            {"name": "keyed", "host": host.addr, "user": "root", "password_env": "CB_TEST_NOPE"},
            # the same host under its /etc/hosts name (two nodes may not share an address)
            {"name": "pwonly", "host": host.hostname, "user": "cbtpwonly", "password_env": "CB_TEST_NOPE"},
        ]
        (trusted_home / ".ssh" / "known_hosts").write_text(
            cluster.known_hosts_text() + f"{host.hostname} {host.host_key_line()}\n"
        )
        inv = str(write_inventory(tmp_path / "h.yaml", nodes))
        run = bootstrap("-i", inv, "--json", "run", "--", "whoami", env={"CB_TEST_NOPE": ""})
        assert run.returncode == 3, run
        by_name = {n["name"]: n for n in json.loads(run.stdout)["nodes"]}
        assert by_name["keyed"]["ok"]
        assert by_name["pwonly"]["error"]["type"] == "SecretMissingError"
        assert "CB_TEST_NOPE" in by_name["pwonly"]["error"]["message"]
        run = bootstrap("-i", inv, "--json", "run", "--", "whoami", env={"CB_TEST_NOPE": "pw-only"})
        assert run.returncode == 0, run
        assert [n["stdout"] for n in json.loads(run.stdout)["nodes"]] == ["root\n", "cbtpwonly\n"]
        assert "pw-only" not in run.stdout + run.stderr


def test_ssh_config_alias_user_and_identity_are_honoured(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    ssh = trusted_home / ".ssh"
    key = ssh / "id_ed25519"
    key.rename(ssh / "cluster_key")  # only the ssh config knows where the key is now
    (ssh / "id_ed25519.pub").unlink()
    host = cluster.hosts[1]
    (ssh / "config").write_text(
        f"Host train-box\n  HostName {host.addr}\n  User root\n  IdentityFile {ssh / 'cluster_key'}\n"
    )
    inv = write_inventory(tmp_path / "h.yaml", [{"name": "box", "host": "train-box", "python": PYTHON}])
    run = bootstrap("-i", str(inv), "--json", "check")
    assert run.returncode == 0, run
    node = json.loads(run.stdout)["nodes"][0]
    assert node["facts"]["hostname"] == host.hostname and node["via"] == f"ssh root@{host.addr}"


def test_proxyjump_verifies_every_hop(
    bootstrap: Bootstrap, ctl_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    jump, target = cluster.hosts[0], cluster.hosts[2]
    ssh = ctl_home / ".ssh"
    (ssh / "config").write_text(
        f"Host inner\n  HostName {target.addr}\n  User root\n  ProxyJump root@{jump.addr}\n"
    )
    inv = write_inventory(tmp_path / "h.yaml", [{"name": "inner", "host": "inner", "python": PYTHON}])
    (ssh / "known_hosts").write_text(cluster.known_hosts_text([target]))  # the jump host is unknown
    run = bootstrap("-i", str(inv), "check")
    assert run.returncode == 3, run
    assert jump.fingerprint() in run.stderr  # the gateway's key was checked, not auto-added
    (ssh / "known_hosts").write_text(cluster.known_hosts_text([jump, target]))
    run = bootstrap("-i", str(inv), "--json", "check")
    assert run.returncode == 0, run
    assert json.loads(run.stdout)["nodes"][0]["facts"]["hostname"] == target.hostname


def test_dry_run_connects_nowhere_and_shows_commands(
    bootstrap: Bootstrap, ctl_home: Path, inventory: Path
) -> None:
    run = bootstrap("-i", str(inventory), "--dry-run", "run", "--become", "--", "systemctl restart foo")
    assert run.returncode == 0, run  # no known_hosts at all: nothing was contacted
    assert run.stdout.count("would run") == 3
    assert "sudo -n --" in run.stdout and "systemctl restart foo" in run.stdout


def test_become_without_passwordless_sudo_is_explained(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    cluster.add_user("cbtsudopw", sudo="password")
    cluster.add_user("cbtsudook", sudo="nopasswd")
    try:
        nodes = [
            {"name": "strict", "host": cluster.hosts[0].addr, "user": "cbtsudopw"},
            {"name": "easy", "host": cluster.hosts[1].addr, "user": "cbtsudook"},
        ]
        inv = write_inventory(tmp_path / "h.yaml", nodes)
        run = bootstrap("-i", str(inv), "run", "--become", "--", "id -u")
        assert run.returncode == 1, run
        assert re.search(r"^\[easy\] +0$", run.stdout, re.M)
        assert "node 'strict': sudo needs a password" in run.stderr and "NOPASSWD" in run.stderr
    finally:
        cluster.remove_user("cbtsudopw")
        cluster.remove_user("cbtsudook")


def test_keys_installs_and_verifies_on_password_only_node(
    bootstrap: Bootstrap, ctl_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    host = cluster.hosts[1]
    with password_only_user(cluster, host, "cbtkeys", "s3cret-Pw"):
        # a fresh controller: no key pair yet, no known hosts
        for name in ("id_ed25519", "id_ed25519.pub"):
            (ctl_home / ".ssh" / name).unlink()
        nodes = [{"name": "pw", "host": host.addr, "user": "cbtkeys", "password_env": "CB_PW"}]
        inv = write_inventory(tmp_path / "h.yaml", nodes)
        # unknown host: refused with its fingerprint before any password is sent
        sent_before = cluster.sshd_log(host).count("password for cbtkeys")
        run = bootstrap("-i", str(inv), "keys", env={"CB_PW": "s3cret-Pw"})
        assert run.returncode == 3, run
        assert host.fingerprint() in run.stderr and "--accept-new-host-keys" in run.stderr
        assert cluster.sshd_log(host).count("password for cbtkeys") == sent_before
        run = bootstrap("-i", str(inv), "keys", "--accept-new-host-keys", env={"CB_PW": "s3cret-Pw"})
        assert run.returncode == 0, run
        assert "Accepted password for cbtkeys" in cluster.sshd_log(host)
        assert "s3cret-Pw" not in run.stdout + run.stderr
        assert "added" in run.stdout and "verified" in run.stdout and host.fingerprint() in run.stdout
        assert (ctl_home / ".ssh" / "id_ed25519").stat().st_mode & 0o777 == 0o600
        pub = (ctl_home / ".ssh" / "id_ed25519.pub").read_text().strip()
        assert Path("/home/cbtkeys/.ssh/authorized_keys").read_text().splitlines().count(pub) == 1
        # a second run changes nothing (and logs in with the key: no password needed any more): as
        # ssh-copy-id, a key that logs in already is not written again (even where authorized_keys
        # does not hold it: an AuthorizedKeysFile elsewhere, LDAP)
        authorized = Path("/home/cbtkeys/.ssh/authorized_keys")
        before = authorized.stat().st_mtime_ns
        run = bootstrap("-i", str(inv), "keys")
        assert run.returncode == 0, run
        assert "logs in already" in run.stdout and "already known" in run.stdout, run.stdout
        assert authorized.read_text().splitlines().count(pub) == 1 and authorized.stat().st_mtime_ns == before
        # and now the node works with no password at all
        cluster.set_password_auth(host, False)
        nodes[0].pop("password_env")
        run = bootstrap("-i", str(write_inventory(tmp_path / "h2.yaml", nodes)), "run", "--", "whoami")
        assert run.returncode == 0, run
        assert re.search(r"^\[pw\] +cbtkeys$", run.stdout, re.M)


def test_wrong_password_for_keys_is_an_auth_error(
    bootstrap: Bootstrap, ctl_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    host = cluster.hosts[0]
    with password_only_user(cluster, host, "cbtbadpw", "right-one"):
        nodes = [{"name": "pw", "host": host.addr, "user": "cbtbadpw", "password_env": "CB_PW"}]
        inv = str(write_inventory(tmp_path / "h.yaml", nodes))
        run = bootstrap("-i", inv, "keys", "--accept-new-host-keys", env={"CB_PW": "wrong-one"})
        assert run.returncode == 3, run
        assert "authentication as 'cbtbadpw'" in run.stderr
        assert "wrong-one" not in run.stdout + run.stderr


def test_ctrl_c_stops_the_commands_on_every_node(
    cluster: NamespaceCluster, trusted_home: Path, inventory: Path
) -> None:
    marker = f"cbt-sigint-{time.monotonic_ns()}"
    env = {"HOME": str(trusted_home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = cluster.controller_argv(
        [BOOTSTRAP, "-i", str(inventory), "run", "--", f"echo started; sh -c 'sleep 300; : {marker}'"],
        env=env,
    )
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        # lines from a thread: select() on the pipe misses a line that arrived in the same read as
        # the one before it (it waits in the reader's buffer, and the nodes print nothing more)
        lines: queue.Queue[str] = queue.Queue()
        stdout = proc.stdout
        threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
        started: set[str] = set()
        deadline = time.monotonic() + 30
        while len(started) < 3 and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if line.rstrip().endswith("started"):
                started.add(line.split("]")[0])
        assert len(started) == 3, "not every node started"
        for host in cluster.hosts:  # really running on every node
            assert marker in cluster.ns_run(host.ns, ["pgrep", "-af", marker]).stdout
        begin = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 130
        assert time.monotonic() - begin < 10
        assert "interrupted" in proc.stderr.read()  # type: ignore[union-attr]
        for host in cluster.hosts:
            deadline = time.monotonic() + 10
            while marker in cluster.ns_run(host.ns, ["pgrep", "-af", marker]).stdout:
                assert time.monotonic() < deadline, f"{host.name} still runs the command"
                time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()


def test_keys_without_any_password_says_how_to_give_one(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    host = cluster.hosts[0]
    with password_only_user(cluster, host, "cbtnopw", "unused-pw"):
        nodes = [{"name": "nopw", "host": host.addr, "user": "cbtnopw"}]
        run = bootstrap("-i", str(write_inventory(tmp_path / "h.yaml", nodes)), "keys")
        assert run.returncode == 3, run
        assert "node 'nopw'" in run.stderr and "password_env" in run.stderr


def test_keys_that_fails_after_recording_a_host_key_says_it_recorded_it(
    bootstrap: Bootstrap, ctl_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    host = cluster.hosts[2]
    with password_only_user(cluster, host, "cbtnopw2", "unused-pw"):
        nodes = [{"name": "nopw", "host": host.addr, "user": "cbtnopw2"}]
        inv = str(write_inventory(tmp_path / "h.yaml", nodes))
        run = bootstrap("-i", inv, "keys", "--accept-new-host-keys")
        assert run.returncode == 3, run
        assert "password_env" in run.stderr
        # the host key was accepted before the password was asked for: the table says so
        row = next(line for line in run.stdout.splitlines() if "nopw" in line)
        assert "failed" in row and host.fingerprint() in run.stdout, run.stdout
        assert host.addr in (ctl_home / ".ssh" / "known_hosts").read_text()


@pytest.mark.parametrize("launch", [["launch"], ["launch", "--detach"]], ids=["foreground", "detach"])
def test_launch_with_a_node_not_verified_names_it_and_starts_nothing(
    bootstrap: Bootstrap,
    ctl_home: Path,
    inventory: Path,
    cluster: NamespaceCluster,
    tmp_path: Path,
    launch: list[str],
) -> None:
    """One node's host key is unknown (reinstalled, added later): `launch` crashed with an
    AssertionError and named nobody. It is refused as `check` refuses it: the fingerprint, the
    flag to accept it, nothing started anywhere, exit 3."""
    known, (host, *others) = ctl_home / ".ssh" / "known_hosts", reversed(cluster.hosts)
    known.write_text(cluster.known_hosts_text(list(reversed(others))))
    run = bootstrap("-i", str(inventory), *launch, cwd=tmp_path, timeout=300)
    assert run.returncode == 3, run
    assert "Traceback" not in run.stderr, run
    assert host.fingerprint() in run.stderr and "--accept-new-host-keys" in run.stderr, run
    assert "not launching" in run.stderr, run
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("*/run.json")), run
