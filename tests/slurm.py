"""A real Slurm (Debian's slurm-wlm) on the namespace cluster of tests/cluster.py.

One host is the controller and login host (slurmctld, and the sshd users reach, whose sessions find
the configuration through ``SLURM_CONF``); the others are compute hosts, each with one slurmd under
its own node name, in its host's network and UTS namespace (``hostname`` in a job prints the node).
One munged, started for the cluster with its own key and socket, serves them all: the hosts share
this machine's file system, so the socket is reachable from every namespace.

Nothing of this machine's own Slurm or munge is used or touched: configuration, key, spool, state,
pid and log files all live in ``<cluster workdir>/slurm``. Processes run in the cluster's namespaces,
so :meth:`NamespaceCluster.stop` ends them as well; :meth:`SlurmCluster.stop` does it first.

Settings that make it run without systemd and cgroups (docs/testing.md: "Slurm"):
``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``, ``JobAcctGatherType=jobacct_gather/none``,
``SlurmdSpoolDir=.../spool/%n`` and ``SlurmdPidFile=.../slurmd-%n.pid`` (several slurmd on one disk).
"""

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.cluster import ClusterError, NamespaceCluster, TestHost

#: a second partition over the same nodes that only this account may use: without accounting
#: (slurmdbd) Slurm checks an account against a partition's AllowAccounts, and refuses any other
#: with its own "Invalid account or account/partition combination specified"
ACCOUNT_PARTITION = "proj"
ACCOUNT = "proj42"
#: Slurm's client commands: a login host's PATH without them is one without Slurm
CLIENT_COMMANDS = frozenset(
    (
        *("sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "scrontab"),
        *("sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger", "sview"),
    )
)
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch")
START_TIMEOUT = 30.0


def slurm_support_problems() -> list[str]:
    """Why a Slurm cluster cannot be started here (empty: it can)."""
    return [
        f"{path} not found (install slurmctld, slurmd, slurm-client, munge)"
        for path in DAEMONS
        if not os.access(path, os.X_OK)
    ]


class SlurmCluster:
    """slurmctld on ``controller``, one slurmd per host of ``computes``, all in partition ``debug``
    (the default) with ``cpus`` CPUs each; ``extra_conf`` lines are appended to slurm.conf."""

    def __init__(
        self,
        cluster: NamespaceCluster,
        controller: TestHost,
        computes: list[TestHost],
        cpus: int = 2,
        extra_conf: str = "",
    ) -> None:
        self.cluster = cluster
        self.controller = controller
        self.computes = list(computes)
        self.cpus = cpus
        self.extra_conf = extra_conf
        self.dir = cluster.workdir / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge" / "munge.socket"
        self._procs: dict[str, subprocess.Popen] = {}

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "SlurmCluster":
        problems = slurm_support_problems()
        if problems:
            raise ClusterError("cannot start Slurm: " + "; ".join(problems))
        try:
            self._write_files()
            self._start_munged()
            self._spawn("slurmctld", self.controller, ["/usr/sbin/slurmctld", "-D", "-f", str(self.conf)])
            for host in self.computes:
                argv = ["/usr/sbin/slurmd", "-D", "-N", host.name, "-f", str(self.conf)]
                self._spawn(f"slurmd-{host.name}", host, argv)
            self._await_idle()
            # the login host's sessions (the product's SSH commands) find this configuration
            self.cluster.set_session_env(self.controller, {"SLURM_CONF": str(self.conf)})
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Cancel every job, stop the daemons. Idempotent; never raises."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run(["scancel", "--full", "--user", "root"], timeout=10)
        for name in reversed(list(self._procs)):
            proc = self._procs.pop(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    # ----------------------------------------------------------------- using it

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def run(self, argv: list[str], timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sinfo, squeue, sbatch...) on the controller host."""
        env = {**os.environ, **self.env()}
        return self.cluster.host_run(
            self.controller, argv, env=env, timeout=timeout, capture_output=True, text=True, **kwargs
        )

    def squeue(self) -> list[str]:
        """``JOBID STATE NODES`` of every job Slurm still knows as pending or running."""
        res = self.run(["squeue", "-h", "-o", "%i %T %N"])
        if res.returncode != 0:
            raise ClusterError(f"squeue failed: {res.stderr.strip()}")
        return [line for line in res.stdout.splitlines() if line.strip()]

    def squeue_all(self) -> list[str]:
        """``JOBID STATE`` of every job Slurm still knows, ended ones included (MinJobAge)."""
        res = self.run(["squeue", "-h", "-t", "all", "-o", "%i %T"])
        if res.returncode != 0:
            raise ClusterError(f"squeue failed: {res.stderr.strip()}")
        return [line for line in res.stdout.splitlines() if line.strip()]

    def wait_queue_empty(self, timeout: float = 30) -> list[str]:
        """Await an empty queue; return what is left at the deadline (empty list: emptied)."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.squeue()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def cancel_every_job(self) -> None:
        """After a test: cancel whatever it left queued or running (a test that failed before its own
        `stop` would otherwise hold every node for the tests after it) and await their end."""
        self.run(["scancel", "--full", "--user", "root"], timeout=10)
        self.wait_no_job_active()

    def wait_no_job_active(self, timeout: float = 30) -> list[str]:
        """Await the end of every job (none pending, running or completing: its processes are gone on
        every node); return the jobs still active at the deadline (empty list: none)."""
        deadline = time.monotonic() + timeout
        active = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")
        while True:
            left = [line for line in self.squeue_all() if line.split()[1] in active]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    @contextlib.contextmanager
    def login_path_without_slurm(self) -> Iterator[None]:
        """The login host's SSH sessions get a PATH holding every command of /usr/bin and /bin but
        Slurm's (a login host where Slurm is not installed); restored on exit."""
        bin_dir = self.dir / "bin-without-slurm"
        bin_dir.mkdir(exist_ok=True)
        for directory in (Path("/usr/bin"), Path("/bin")):
            for entry in directory.iterdir():
                link = bin_dir / entry.name
                if entry.name not in CLIENT_COMMANDS and not link.exists():
                    link.symlink_to(entry)
        self.cluster.set_session_env(self.controller, {"SLURM_CONF": str(self.conf), "PATH": str(bin_dir)})
        try:
            yield
        finally:
            self.cluster.set_session_env(self.controller, {"SLURM_CONF": str(self.conf)})

    def log(self, name: str) -> str:
        try:
            return (self.dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ----------------------------------------------------------------- internals

    def _write_files(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "munge").mkdir(parents=True, mode=0o700)
        (self.dir / "state").mkdir()
        for host in self.computes:
            (self.dir / "spool" / host.name).mkdir(parents=True)
        (self.dir / "cgroup").mkdir()
        # slurmd loads a cgroup plugin whatever ProctrackType and TaskPlugin say, and `ip netns exec`
        # hides this machine's /sys/fs/cgroup behind a fresh sysfs: cgroup/v1 over an empty
        # directory loads without touching any cgroup (nothing here asks it for one)
        (self.dir / "cgroup.conf").write_text(
            f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={self.dir / 'cgroup'}\nCgroupAutomount=no\n"
        )
        key = self.dir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        ctl = self.controller
        names = ",".join(h.name for h in self.computes)
        nodes = "".join(
            f"NodeName={h.name} NodeAddr={h.addr} NodeHostname={h.name} CPUs={self.cpus} State=UNKNOWN\n"
            for h in self.computes
        )
        d = self.dir
        self.conf.write_text(
            f"""\
# generated by tests/slurm.py
ClusterName=cbt
SlurmctldHost={ctl.name}({ctl.addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
# an ended job's state stays readable a minute (Slurm's default: 300 s); with 5 s a loaded machine
# purged a job bootstrap had just cancelled before it read the state ("cancelled (gone)")
MinJobAge=60
{nodes}PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
PartitionName={ACCOUNT_PARTITION} Nodes={names} AllowAccounts={ACCOUNT} MaxTime=INFINITE State=UP
{self.extra_conf}"""
        )

    def _start_munged(self) -> None:
        d = self.dir
        argv = [
            "/usr/sbin/munged",
            "--foreground",
            "--force",  # as root, and with this machine's /run/munge left alone
            f"--key-file={d / 'munge.key'}",
            f"--socket={self.socket}",
            f"--pid-file={d / 'munge' / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'munge' / 'munged.seed'}",
        ]
        self._spawn("munged", self.controller, argv)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.socket.exists():
            if self._procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"munged did not start:\n{self.log('munged')}")
            time.sleep(0.05)

    def _spawn(self, name: str, host: TestHost, argv: list[str]) -> None:
        sshd = self.cluster._sshd.get(host.name)
        if sshd is None:
            raise ClusterError(f"sshd of {host.name} is not running")
        join = ["--uts", "--mount"] if self.cluster.private_dirs else ["--uts"]
        full = ["ip", "netns", "exec", host.ns, "nsenter", *join, "-t", str(sshd.proc.pid), *argv]
        log = open(self.dir / f"{name}.out", "ab")  # noqa: SIM115 (the daemon holds it)
        with log:
            self._procs[name] = subprocess.Popen(
                full,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "SLURM_CONF": str(self.conf)},
                start_new_session=True,
            )

    def _await_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    out = (self.dir / f"{name}.out").read_text(errors="replace")
                    raise ClusterError(f"{name} exited ({proc.returncode}):\n{out}\n{self.log(name)}")
            res = self.run(["sinfo", "-h", "-N", "-o", "%N %t"])
            last = res.stdout + res.stderr
            states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
            if res.returncode == 0 and all(states.get(h.name) == "idle" for h in self.computes):
                return
            time.sleep(0.2)
        raise ClusterError(f"Slurm nodes not idle after {START_TIMEOUT}s: {last}\n{self.log('slurmctld')}")
