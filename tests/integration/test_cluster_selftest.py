"""Self-tests of the namespace cluster (tests/cluster.py), using the plain OpenSSH client.

Every client runs inside the controller namespace, exactly like the CLI under test will.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import RUN_NETNS, SUDOERS_DIR, NamespaceCluster, TestHost
from tests.conftest import require_cluster_support
from tests.integration.test_runs import await_

#: a self-test of the test harness (select with -m harness, leave out with -m 'not harness')
pytestmark = pytest.mark.harness

CLUSTER_PY = Path(__file__).resolve().parents[1] / "cluster.py"

# paramiko, run in the controller namespace: password logins (no sshpass here) and HOME lookups
PARAMIKO_SCRIPT = textwrap.dedent(
    """
    import sys, paramiko
    addr, user, password = sys.argv[1], sys.argv[2], sys.argv[3] or None
    client = paramiko.SSHClient()
    client.load_system_host_keys()  # ~/.ssh/known_hosts, i.e. $HOME
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(addr, username=user, password=password, timeout=10,
                       look_for_keys=password is None, allow_agent=False)
    except paramiko.AuthenticationException as exc:
        sys.exit(f"AUTH FAILED: {exc}")
    _, out, _ = client.exec_command("id -un; hostname")
    print(out.read().decode().strip())
    print("sftp", client.open_sftp().normalize("."))
    """
)


def ssh(
    cluster: NamespaceCluster,
    host: TestHost,
    known_hosts: Path,
    command: str = "hostname",
    user: str = "root",
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    argv = [
        "ssh",
        "-F", "/dev/null",
        "-i", str(cluster.client_key),
        "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=10",
        *extra,
        f"{user}@{host.addr}",
        command,
    ]  # fmt: skip
    return subprocess.run(
        cluster.controller_argv(argv, env={"SSH_AUTH_SOCK": ""}),
        capture_output=True,
        text=True,
        timeout=60,
    )


def write_known_hosts(cluster: NamespaceCluster, path: Path, hosts=None) -> Path:
    path.write_text(cluster.known_hosts_text(hosts))
    return path


def paramiko_login(
    cluster: NamespaceCluster, host: TestHost, user: str, password: str, home: Path
) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", PARAMIKO_SCRIPT, host.addr, user, password]
    return subprocess.run(
        cluster.controller_argv(argv, env={"HOME": str(home), "SSH_AUTH_SOCK": ""}),
        capture_output=True,
        text=True,
        timeout=60,
    )


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def pgrep(pattern: str) -> str:
    return subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout


def user_exists(name: str) -> bool:
    return subprocess.run(["getent", "passwd", name], capture_output=True).returncode == 0


def unique_user(tag: str) -> str:
    return f"cbt{os.getpid() % 10000}{tag}"


@pytest.fixture(scope="module")
def private_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    """Two hosts with password authentication, for tests that change hosts."""
    require_cluster_support()
    with NamespaceCluster(2, workdir=tmp_path_factory.mktemp("private"), password_auth=True) as ns_cluster:
        yield ns_cluster


# --------------------------------------------------------------------------- shared cluster


def test_each_host_answers_with_its_own_hostname(cluster: NamespaceCluster, tmp_path: Path):
    known_hosts = write_known_hosts(cluster, tmp_path / "known_hosts")
    assert [h.name for h in cluster.hosts] == ["node1", "node2", "node3"]
    assert len({h.addr for h in cluster.hosts}) == 3
    for host in cluster.hosts:
        res = ssh(cluster, host, known_hosts)
        assert res.returncode == 0, f"{host.name}: {res.stderr}\n{cluster.sshd_log(host)}"
        assert res.stdout.strip() == host.hostname == host.name
        assert host.addr.startswith("198.1") and host.ns in netns_names()


def test_known_hosts_and_fingerprint_formats(cluster: NamespaceCluster):
    lines = cluster.known_hosts_text().splitlines()
    assert len(lines) == 3
    for host, line in zip(cluster.hosts, lines, strict=True):
        addr, keytype, blob = line.split()
        assert (addr, keytype) == (host.addr, "ssh-ed25519") and blob.startswith("AAAA")
        printed = subprocess.run(
            ["ssh-keygen", "-lf", str(host.host_key_pub)], capture_output=True, text=True
        )
        assert printed.stdout.split()[1] == host.fingerprint()
        assert host.fingerprint().startswith("SHA256:")
    assert cluster.known_hosts_text([cluster.hosts[1]]) == lines[1] + "\n"


def test_hosts_reach_each_other_by_name(cluster: NamespaceCluster):
    node1, node2 = cluster.hosts[0], cluster.hosts[1]
    assert cluster.host_run(node1, ["hostname"]).stdout.strip() == "node1"
    resolved = cluster.ns_run(node1.ns, ["getent", "hosts", "node2"])
    assert resolved.stdout.split()[0] == node2.addr
    banner = cluster.ns_run(
        node1.ns,
        [
            "/usr/bin/python3",
            "-c",
            "import socket; s = socket.create_connection(('node2', 22), timeout=5); "
            "print(s.recv(64).decode().strip())",
        ],
    )
    assert banner.returncode == 0, banner.stderr
    assert banner.stdout.startswith("SSH-2.0-OpenSSH")


def test_unused_addr_is_silent_and_nothing_leaves_the_cluster(cluster: NamespaceCluster):
    probe = textwrap.dedent(
        """
        import socket, sys
        try:
            socket.create_connection((sys.argv[1], 22), timeout=float(sys.argv[2]))
        except OSError as exc:
            print(type(exc).__name__)
        else:
            print("connected")
        """
    )
    silent = cluster.ns_run(cluster.controller_ns, [sys.executable, "-c", probe, cluster.unused_addr, "0.5"])
    assert silent.stdout.strip() == "TimeoutError", silent.stderr
    # no default route anywhere: outside addresses fail at once, nothing is sent
    outside = cluster.ns_run(cluster.controller_ns, [sys.executable, "-c", probe, "192.0.2.1", "5"])
    assert outside.stdout.strip() == "OSError", outside.stderr
    routes = cluster.ns_run(cluster.hosts[0].ns, ["ip", "route", "show", "default"])
    assert routes.stdout.strip() == ""


def test_ssh_config_text_aliases(cluster: NamespaceCluster, tmp_path: Path):
    config = tmp_path / "config"
    config.write_text(cluster.ssh_config_text())
    known_hosts = write_known_hosts(cluster, tmp_path / "known_hosts")
    argv = [
        "ssh", "-F", str(config),
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes",
        "node3", "hostname",
    ]  # fmt: skip
    res = subprocess.run(cluster.controller_argv(argv), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "node3"


def test_ctl_home_is_used_by_python_clients(cluster: NamespaceCluster, ctl_home: Path):
    ssh_dir = ctl_home / ".ssh"
    assert ssh_dir.stat().st_mode & 0o777 == 0o700
    assert (ssh_dir / "id_ed25519").read_bytes() == cluster.client_key.read_bytes()
    assert (ssh_dir / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert (ssh_dir / "id_ed25519.pub").exists()
    echo = subprocess.run(
        cluster.controller_argv(["sh", "-c", "echo $HOME"], env={"HOME": str(ctl_home)}),
        capture_output=True,
        text=True,
    )
    assert echo.stdout.strip() == str(ctl_home)
    # paramiko finds the key and known_hosts through $HOME only
    node2 = cluster.hosts[1]
    res = paramiko_login(cluster, node2, "root", "", ctl_home)
    assert res.returncode != 0 and "not found in known_hosts" in res.stderr
    (ssh_dir / "known_hosts").write_text(cluster.known_hosts_text())
    res = paramiko_login(cluster, node2, "root", "", ctl_home)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["root", "node2", "sftp", "/root"]


# --------------------------------------------------------------------------- private cluster


def test_rotate_host_key_breaks_old_known_hosts(private_cluster: NamespaceCluster, tmp_path: Path):
    node1, node2 = private_cluster.hosts
    old_known_hosts = write_known_hosts(private_cluster, tmp_path / "old_known_hosts")
    old_fingerprint = node1.fingerprint()
    assert ssh(private_cluster, node1, old_known_hosts).returncode == 0

    private_cluster.rotate_host_key(node1)

    assert node1.fingerprint() != old_fingerprint
    res = ssh(private_cluster, node1, old_known_hosts)
    assert res.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr
    new_known_hosts = write_known_hosts(private_cluster, tmp_path / "new_known_hosts")
    res = ssh(private_cluster, node1, new_known_hosts)
    assert (res.returncode, res.stdout.strip()) == (0, "node1"), res.stderr
    assert ssh(private_cluster, node2, old_known_hosts).returncode == 0  # untouched


def test_stop_and_start_sshd(private_cluster: NamespaceCluster, tmp_path: Path):
    node2 = private_cluster.hosts[1]
    known_hosts = write_known_hosts(private_cluster, tmp_path / "known_hosts")
    private_cluster.stop_sshd(node2)
    private_cluster.stop_sshd(node2)  # idempotent
    res = ssh(private_cluster, node2, known_hosts)
    assert res.returncode == 255 and "Connection refused" in res.stderr
    private_cluster.start_sshd(node2)
    res = ssh(private_cluster, node2, known_hosts)
    assert (res.returncode, res.stdout.strip()) == (0, "node2"), res.stderr


def test_add_user_key_password_and_sudo(private_cluster: NamespaceCluster, tmp_path: Path):
    node1, node2 = private_cluster.hosts
    known_hosts = write_known_hosts(private_cluster, tmp_path / "known_hosts")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(private_cluster.known_hosts_text())

    admin, worker = unique_user("a"), unique_user("w")
    private_cluster.add_user(admin, password="Adm1n-pw", sudo="nopasswd")
    private_cluster.add_user(worker, password="W0rker-pw", sudo="password")
    try:
        assert user_exists(admin) and user_exists(worker)
        assert (SUDOERS_DIR / f"{private_cluster.prefix}-{admin}").exists()

        # key login and passwordless sudo
        res = ssh(private_cluster, node1, known_hosts, "id -un; hostname; sudo -n id -u", user=admin)
        assert res.stdout.split() == [admin, "node1", "0"], res.stderr + private_cluster.sshd_log(node1)
        # sudo with a password: -n fails, the password works
        res = ssh(private_cluster, node2, known_hosts, "sudo -n true", user=worker)
        assert res.returncode != 0
        res = ssh(private_cluster, node2, known_hosts, "echo W0rker-pw | sudo -S -p '' id -u", user=worker)
        assert res.stdout.strip() == "0", res.stderr

        # password login (hosts were built with password_auth=True)
        res = paramiko_login(private_cluster, node1, worker, "W0rker-pw", home)
        assert res.stdout.split()[:2] == [worker, "node1"], res.stderr
        res = paramiko_login(private_cluster, node1, worker, "wrong", home)
        assert "AUTH FAILED" in res.stderr
        private_cluster.set_password_auth(node2, False)
        try:
            res = paramiko_login(private_cluster, node2, worker, "W0rker-pw", home)
            assert "AUTH FAILED" in res.stderr
        finally:
            private_cluster.set_password_auth(node2, True)

        # no authorised key: key login refused
        nokey = unique_user("n")
        private_cluster.add_user(nokey, authorized_key=False)
        res = ssh(private_cluster, node1, known_hosts, user=nokey)
        assert res.returncode == 255 and "Permission denied" in res.stderr
    finally:
        for name in (admin, worker, unique_user("n")):
            private_cluster.remove_user(name)
    assert not user_exists(admin) and not user_exists(worker)
    assert not (SUDOERS_DIR / f"{private_cluster.prefix}-{admin}").exists()


# --------------------------------------------------------------------------- cleanup


def test_stop_removes_everything(tmp_path: Path):
    require_cluster_support()
    ns_cluster = NamespaceCluster(2).start()
    try:
        node1 = ns_cluster.hosts[0]
        known_hosts = write_known_hosts(ns_cluster, tmp_path / "known_hosts")
        user = unique_user("s")
        ns_cluster.add_user(user, sudo="nopasswd")
        marker = f"sleep {600000 + os.getpid()}"
        res = ssh(ns_cluster, node1, known_hosts, f"setsid {marker} </dev/null >/dev/null 2>&1 &")
        assert res.returncode == 0, res.stderr
        # started in the background: the ssh command may return before setsid has exec'd sleep
        await_(lambda: pgrep(marker), 10, f"{marker} running on node1")
        namespaces = {ns_cluster.hub_ns, ns_cluster.controller_ns, *(h.ns for h in ns_cluster.hosts)}
        assert namespaces <= netns_names()
        configs = [str(h.sshd_config) for h in ns_cluster.hosts]
        assert all(pgrep(c) for c in configs)
        etc_dirs = [Path("/etc/netns") / ns for ns in namespaces - {ns_cluster.hub_ns}]
        created = [ns_cluster.workdir, ns_cluster.sshd_dir, *etc_dirs]
        created.append(SUDOERS_DIR / f"{ns_cluster.prefix}-{user}")
        assert all(p.exists() for p in created)
    finally:
        ns_cluster.stop()

    assert not namespaces & netns_names()
    assert not any((RUN_NETNS / ns).exists() for ns in namespaces)
    for config in configs:
        assert pgrep(config) == ""
    assert pgrep(marker) == ""
    assert [p for p in created if p.exists()] == []
    assert not user_exists(user)
    ns_cluster.stop()  # idempotent, no error


@pytest.mark.parametrize("ending", ["exit-without-stop", "sigterm"])
def test_cleanup_at_exit_and_on_sigterm(ending: str):
    """A process that never calls stop() still cleans up (atexit / SIGTERM handler).

    The child loads tests/cluster.py by path, as benchmarks do.
    """
    require_cluster_support()
    child = textwrap.dedent(
        f"""
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("cbt_cluster", {str(CLUSTER_PY)!r})
        mod = importlib.util.module_from_spec(spec)
        sys.modules["cbt_cluster"] = mod
        spec.loader.exec_module(mod)
        c = mod.NamespaceCluster(2).start()
        print(json.dumps({{"ns": [c.hub_ns, c.controller_ns] + [h.ns for h in c.hosts],
                          "configs": [str(h.sshd_config) for h in c.hosts],
                          "dirs": [str(c.workdir), str(c.sshd_dir)]}}), flush=True)
        if {ending!r} == "sigterm":
            sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        state = json.loads(proc.stdout.readline())
        if ending == "sigterm":
            assert set(state["ns"]) <= netns_names()
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == (-signal.SIGTERM if ending == "sigterm" else 0)
    assert not set(state["ns"]) & netns_names()
    assert all(pgrep(c) == "" for c in state["configs"])
    assert not any(Path(d).exists() for d in state["dirs"])
    assert not any((Path("/etc/netns") / ns).exists() for ns in state["ns"])


def test_failed_start_cleans_up(monkeypatch: pytest.MonkeyPatch):
    require_cluster_support()
    import tests.cluster as cluster_module

    monkeypatch.setattr(cluster_module, "SSHD", "/bin/false")  # "sshd" exits at once
    ns_cluster = NamespaceCluster(2)
    ns_cluster.stop()  # stop() before start() is a no-op
    with pytest.raises(cluster_module.ClusterError, match=r"sshd of node1 .* exited"):
        ns_cluster.start()
    # its own (the support probe's too): other clusters (pytest-xdist workers, other runs) come and go
    left = {
        n for n in netns_names() if n.startswith(f"{ns_cluster.prefix}-") or n == f"cbtprobe{os.getpid()}"
    }
    assert ns_cluster.prefix and left == set()
    assert not ns_cluster.sshd_dir.exists() and not ns_cluster.workdir.exists()
    assert not (Path("/etc/netns") / ns_cluster.controller_ns).exists()
