"""Shared fixtures: the namespace cluster (tests/cluster.py) and a test-local HOME for CLI runs."""

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import netns
from tests.cluster import NamespaceCluster, TestHost, cluster_support_problems
from tests.slurm import SlurmCluster, slurm_support_problems

_MARKERS = {
    "integration": "needs the namespace SSH cluster (root, ip netns, sshd)",
    "e2e": "end-to-end runs of the CLI against the namespace SSH cluster",
}
_support_problems: list[str] | None = None


def pytest_configure(config: pytest.Config) -> None:
    for name, help_text in _MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {help_text}")
    # A shell starts a background job (`cmd &` in a script, nohup) with SIGINT ignored, and every
    # process started from here would inherit that: the tests that press Ctrl-C on the CLI would see
    # it ignored (Python installs no KeyboardInterrupt handler then) and time out. The tests run as
    # from a terminal: a handled signal is reset to the default in every program started from here.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests under tests/integration and tests/e2e carry that marker automatically; files that
    mostly wait are spread among the others (:func:`_spread_waiting_files`)."""
    tests_dir = Path(__file__).parent
    for item in items:
        try:
            rel = item.path.relative_to(tests_dir)
        except ValueError:
            continue
        if rel.parts and rel.parts[0] in _MARKERS:
            item.add_marker(rel.parts[0])
    _spread_waiting_files(items, tests_dir)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Each phase's report on the test item (``item.failed_call``): fixtures that keep evidence of a
    failure (the Slurm daemons' logs) print it in their teardown, where the report shows it."""
    report = yield
    if report.when == "call" and report.failed:
        item.failed_call = True  # type: ignore[attr-defined]
    return report


#: the longest files (over a minute each in a full run): started first, so that none of them is the
#: run's tail
FIRST_FILES = ("e2e/test_bench.py", "e2e/test_newcomer.py")

#: files whose tests spend most of their time waiting (chronyd selecting a source, deadlines that
#: must pass, a WinRM server's receive rounds, a host throttled to a quarter CPU), not computing:
#: measured alone, their wall time is 2 to 12 times the CPU time they use. Longest first.
WAITING_FILES = (
    "integration/test_timesync.py",
    "integration/test_launch_windows.py",
    "e2e/test_faults.py",
    "e2e/test_bench_probe.py",
    "integration/test_winrm_server.py",
    "integration/test_winrm_transport.py",
    "integration/test_winrm_windows_defaults.py",
    "integration/test_transport_contract.py",
    "e2e/test_interrupt.py",
    "integration/test_runs_windows.py",
    "integration/test_ssh_transport.py",
    "integration/test_winrm_conformance.py",
    "integration/test_preflight_reachability.py",
)


def _spread_waiting_files(items: list[pytest.Item], tests_dir: Path) -> None:
    """tests/run.sh hands whole files to the workers in collection order (pytest-xdist, --dist
    loadfile), and the run is CPU-bound. A file that mostly waits costs the run nothing while the
    other workers compute beside it; several waiting at once leave a core idle (a full run once had
    test_bench's throttled host, test_timesync, test_launch_windows and test_faults together, and
    used 1.2 of the 2 cores for 40 s), and at the end, with nothing left to compute, a wait is the
    run's tail. So: the longest files first with the longest wait beside them, the second longest
    wait next, then three computing files to each waiting one."""
    by_file: dict[Path, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.path, []).append(item)
    first = [f for name in FIRST_FILES if (f := tests_dir / name) in by_file]
    waiting = [f for name in WAITING_FILES if (f := tests_dir / name) in by_file]
    others = [f for f in by_file if f not in first and f not in waiting]
    # each worker takes two files at the start (pytest-xdist): the first four, then the next four as
    # their second ones; the two longest waits are the 4th (beside the three longest files) and the
    # 5th (the second file of test_bench's worker: it starts when test_bench ends, about when the
    # first wait does; the waits stretch with the load, so this is a plan, not a guarantee)
    order: list[Path] = first + others[: 3 - len(first)] + waiting[:2]
    del others[: 3 - len(first)], waiting[:2]
    while waiting or others:
        order.extend(others[:3])
        del others[:3]
        if waiting:
            order.append(waiting.pop(0))
    items[:] = [item for path in order for item in by_file[path]]


def require_cluster_support() -> None:
    """Skip the calling test when no cluster can be built here; with CI=true fail instead."""
    global _support_problems
    if _support_problems is None:
        _support_problems = cluster_support_problems()
    if _support_problems:
        reason = "namespace cluster unavailable: " + "; ".join(_support_problems)
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


CHRONY_DIRS = ("/etc/chrony", "/run/chrony", "/var/lib/chrony")


@pytest.fixture(scope="session", autouse=True)
def private_node_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """root's ``~/cluster-bootstrap`` (every node's default workdir: the namespace hosts share this
    machine's disk) is a directory of this pytest process, seen by it and by everything it starts
    (namespace hosts and the CLI included) and by nothing else. Tests read it at its usual path.

    Concurrent pytest processes (pytest-xdist workers, another checkout's run) then never meet in
    it: their code directories, environments and run directories stay apart, as they would on
    separate machines (two launches of same-named clusters in the same second pick the same run id).
    What it cannot separate: processes, one PID space for every namespace host, and the CPU (see
    tests/e2e/bench_support.py: favoured).
    Returns the directory (None when not root: no namespace host can be started then either)."""
    if os.geteuid() != 0:
        return None
    source = tmp_path_factory.mktemp("root-cluster-bootstrap")
    source.chmod(0o755)
    try:
        netns.private_bind(os.path.join(pwd.getpwuid(0).pw_dir, "cluster-bootstrap"), str(source))
    except OSError as exc:  # no CAP_SYS_ADMIN: only a lone serial run is safe
        warnings.warn(f"~root/cluster-bootstrap is shared with other processes: {exc}", stacklevel=1)
        return None
    return source


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    """Three hosts (node1..node3) reachable over SSH from ``cluster.controller_ns``.

    Shared by the whole session: tests that change a host (rotate_host_key, stop_sshd, ...)
    should restore it or build their own NamespaceCluster. sshd logs stay in the pytest temp
    directory ("cluster0") for post-mortem reading.
    """
    require_cluster_support()
    # chrony's files per host: the main pipeline configures time sync on the nodes, and the hosts
    # otherwise share this machine's /etc/chrony
    ns_cluster = NamespaceCluster(3, workdir=tmp_path_factory.mktemp("cluster"), private_dirs=CHRONY_DIRS)
    try:
        ns_cluster.start()
        yield ns_cluster
    finally:
        ns_cluster.stop()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real Slurm (tests/slurm.py) on a cluster of its own: ``node1`` runs slurmctld and is the
    login host (its SSH sessions have ``SLURM_CONF``), ``node2``..``node4`` are compute nodes with 2
    CPUs each in partition ``debug``. One per test module: a test leaves the queue empty."""
    require_cluster_support()
    problems = slurm_support_problems()
    if problems:
        reason = "Slurm unavailable: " + "; ".join(problems)
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    ns_cluster = NamespaceCluster(4, workdir=tmp_path_factory.mktemp("slurm-cluster"))
    try:
        ns_cluster.start()
        with SlurmCluster(ns_cluster, ns_cluster.hosts[0], ns_cluster.hosts[1:]) as slurm_cluster:
            yield slurm_cluster
    finally:
        ns_cluster.stop()


@pytest.fixture
def ctl_home(cluster: NamespaceCluster, tmp_path: Path) -> Path:
    """A HOME with only test-local SSH material: .ssh/ (0700) holding the client key.

    Run the CLI as ``cluster.controller_argv(argv, env={"HOME": str(ctl_home)})``; add
    .ssh/known_hosts or .ssh/config (cluster.known_hosts_text(), ssh_config_text()) as needed.
    """
    home = tmp_path / "home"
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True)
    home.chmod(0o755)
    ssh_dir.chmod(0o700)
    key = ssh_dir / "id_ed25519"
    shutil.copyfile(cluster.client_key, key)
    key.chmod(0o600)
    pub = ssh_dir / "id_ed25519.pub"
    shutil.copyfile(cluster.client_key.with_suffix(".pub"), pub)
    pub.chmod(0o644)
    return home


# -- running the real CLI inside the controller namespace ------------------------------------------

BOOTSTRAP = str(Path(sys.executable).parent / "bootstrap")


@dataclass
class CliRun:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:  # shown by pytest when an assertion on a run fails
        command = " ".join(self.argv)
        return f"$ {command}\n[exit {self.returncode}]\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}"

    __repr__ = __str__  # pytest shows an assertion message's repr: the whole run, readable


def free_port() -> int:
    """A TCP port nothing listens on now, for a training master on this machine's own network (where
    other tests' trainings run meanwhile: the default 29500 is README command 1's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def other_local_user(cluster: NamespaceCluster, name: str) -> Iterator[str]:
    """Another local user of this machine, so of every namespace host (no key to log in with): the
    attacker of the hostile-user tests. ``name``: one no other test file uses (users are shared by
    every test process); removed on exit."""
    cluster.add_user(name, authorized_key=False)
    try:
        yield name
    finally:
        cluster.remove_user(name)


def write_inventory(path: Path, nodes: list[dict[str, object]], **cluster: object) -> Path:
    """A native-format inventory file (JSON is valid YAML)."""
    doc: dict[str, object] = {"nodes": nodes}
    if cluster:
        doc["cluster"] = cluster
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


@pytest.fixture
def bootstrap(cluster: NamespaceCluster, ctl_home: Path) -> Iterator[Callable[..., CliRun]]:
    """Run the installed ``bootstrap`` inside the controller namespace with HOME=ctl_home."""

    def run(
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        input: str | None = None,
        cwd: Path | None = None,
    ) -> CliRun:
        full_env = {"HOME": str(ctl_home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        full_env.update(env or {})
        argv = cluster.controller_argv([BOOTSTRAP, *args], env=full_env)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input, cwd=cwd)
        return CliRun([BOOTSTRAP, *args], proc.returncode, proc.stdout, proc.stderr)

    yield run
    # The cluster is the whole session's: a run this test left behind would hold the master port
    # (and the CPU) for the tests after it, which would fail for no reason of theirs
    left = cluster.end_run_processes()
    if left:
        runs = "; ".join(sorted(set(left.values())))
        pytest.fail(f"this test left {len(left)} process(es) of its runs running (killed now): {runs}")


@pytest.fixture
def trusted_home(cluster: NamespaceCluster, ctl_home: Path) -> Path:
    """ctl_home with every cluster host key already in ~/.ssh/known_hosts."""
    (ctl_home / ".ssh" / "known_hosts").write_text(cluster.known_hosts_text())
    return ctl_home


@contextlib.contextmanager
def connected_root_transport(cluster: NamespaceCluster, ctl_home: Path) -> Iterator[Any]:
    """``root_transport`` to the cluster's first host, its host keys in ``ctl_home``'s known_hosts and
    an empty ssh config there, connected from the controller namespace; closed on exit."""
    known = ctl_home / ".ssh" / "known_hosts"
    known.write_text(cluster.known_hosts_text())
    (ctl_home / ".ssh" / "config").write_text("")
    t = root_transport(cluster, cluster.hosts[0], known, ctl_home / ".ssh" / "config")
    with netns.inside(cluster.controller_ns):
        t.connect()
    try:
        yield t
    finally:
        t.close()


def root_transport(cluster: NamespaceCluster, host: TestHost, known_hosts: Path, ssh_config: Path) -> Any:
    """An unconnected SSHTransport to ``host`` as root with the cluster's key only (in-process tests
    connect it inside ``tests.netns.inside(cluster.controller_ns)``)."""
    from orchestrator.platforms import PosixShell
    from orchestrator.transports import SSHOptions
    from orchestrator.transports.ssh import SSHTransport

    return SSHTransport(
        host.name,
        PosixShell(),
        host=host.addr,
        port=None,
        user="root",
        key_file=str(cluster.client_key),
        password=lambda: None,
        options=SSHOptions(known_hosts=known_hosts, ssh_config=ssh_config),
        identities_only=True,
    )
