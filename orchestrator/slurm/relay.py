"""The compute nodes of an allocation as nodes of a session: `check` inside the job.

Each allocated node gets a transport that runs its scripts as a job step on that node (``srun
--jobid J --overlap -w NODE``) through the login host's one connection, so the existing facts and
probes (the preflight, orchestrator/steps/preflight) and validate's ranks run there unchanged and
name each node as on a cluster reached over SSH. Files go through the login host: the nodes'
directories are on the shared file system.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from orchestrator.errors import BootstrapError
from orchestrator.inventory import Inventory, Node
from orchestrator.inventory.settings import EnvSettings, FirewallSettings, TimeSettings
from orchestrator.platforms import PosixShell
from orchestrator.session import Session
from orchestrator.slurm.job import job_python, slurm_settings
from orchestrator.transports import Result, Transport
from orchestrator.transports.base import OnLine


class SrunTransport(Transport):
    """Scripts for ``node`` run as a step of job ``job_id``, through ``login``'s connection.

    The relays of one allocation share ``files``: the login connection's one SFTP session takes one
    transfer at a time (paramiko's client reads its answers without a lock: two threads waiting at
    once lose each other's and wait forever). :meth:`close` ends this node's running steps (a
    cancel: fail fast, validate's watchdog), which closing the relay alone would leave running."""

    kind = "srun"

    def __init__(self, node: str, login: Transport, job_id: str, files: threading.Lock) -> None:
        super().__init__(node, PosixShell())
        self.login = login
        self.job_id = job_id
        self.files = files
        #: the name of this relay's steps (srun --job-name): what close() cancels
        self.step_name = f"cb-{node}-{secrets.token_hex(4)}"
        self._running = 0
        self._count = threading.Lock()

    def connect(self) -> None:
        self.login.connect()

    def relay(self, script: str) -> str:
        """The login host's command for ``script``: a one-task step on this node, sharing the job's
        resources with the other steps (--overlap: the probes of every node run at once)."""
        posix = self.platform.as_posix()
        assert posix is not None  # made with a PosixShell
        step = ["srun", f"--jobid={self.job_id}", f"--job-name={self.step_name}", "--overlap"]
        step += ["--nodes=1", "--ntasks=1", f"--nodelist={self.node_name}", "--quiet", "--"]
        return posix.join(step) + " " + posix.login_command(script)

    def plan(self, script: str) -> str:
        return self.relay(script)

    def run_raw(
        self,
        script: str,
        *,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        with self._count:
            self._running += 1
        try:
            result = self.login.run_raw(
                self.login.platform.wrap(self.relay(script)),
                timeout=timeout,
                on_line=on_line,
                keep_lines=keep_lines,
            )
        finally:
            with self._count:
                self._running -= 1
        if self._closed and result.exit_code != 0:
            # its step was cancelled by close(): stopped, as a closed connection's command is
            result = dataclasses.replace(result, exit_code=None)
        return dataclasses.replace(result, node=self.node_name)

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        with self.files:
            self.login.put(local, remote, mode=mode)

    def get(self, remote: str, local: Path) -> None:
        with self.files:
            self.login.get(remote, local)

    def close(self) -> None:
        """Closed for good; this node's steps that still run are cancelled (best effort: the
        allocation's job is cancelled on the way out anyway)."""
        with self._count:
            running, self._closed = self._running and not self._closed, True
        if running:
            from orchestrator.slurm import queue

            with contextlib.suppress(BootstrapError):
                queue.cancel_steps(self.login, self.login.node_name, self.job_id, self.step_name)

    def describe(self) -> str:
        return f"srun in job {self.job_id} via {self.login.node_name}"


def allocation_inventory(inventory: Inventory, nodes: list[str]) -> Inventory:
    """The allocated nodes as an inventory the preflight checks: the first node is the master (the
    rendezvous host of the job), each has a directory of its own under ``<dir>/check/`` (the
    shared-workdir check then passes: on Slurm the shared disk is by design), the request's GPUs and
    ranks per node (what `validate` starts there), firewall and time sync
    unmanaged (the cluster's admins own them), the job's interpreter. ``cluster.slurm`` stays: the
    preflight's fixes then name what sets a compute node's interpreter."""
    slurm = slurm_settings(inventory)
    python = job_python(inventory)
    members = [
        Node(
            name=n,
            host=n,
            workdir=f"{slurm.dir}/check/{n}",
            python=python,
            gpus=slurm.gpus or 0,
            nproc=slurm.ranks_per_node,
        )
        for n in nodes
    ]
    cluster = inventory.cluster.model_copy(
        update={
            "master": nodes[0],
            "firewall": FirewallSettings(manage=False),
            "time": TimeSettings(manage=False),
            "env": EnvSettings(),  # the interpreter is the job's (job_python), found already
        }
    )
    return dataclasses.replace(inventory, cluster=cluster, nodes=members)


class AllocationSession(Session):
    """A session whose nodes are the allocation's: every transport relays through the login host."""

    def __init__(self, inventory: Inventory, nodes: list[Node], base: Session, login: Transport, job_id: str):
        super().__init__(inventory, nodes, ssh=base.ssh, passwords=base.passwords, max_workers=64)
        files = threading.Lock()
        self._relays = {n.name: SrunTransport(n.name, login, job_id, files) for n in nodes}

    def transport(self, node: Node) -> Transport:
        with self._lock:
            self._transports.setdefault(node.name, self._relays[node.name])
        return super().transport(node)


@contextlib.contextmanager
def on_allocation(
    session: Session, inventory: Inventory, say: Callable[[str], None], what: str
) -> Iterator[tuple[Inventory, Session]]:
    """A job holding the request's nodes (:func:`allocate`), as an inventory of those nodes and a
    session whose scripts run on them as job steps; the job is cancelled on the way out. ``what``
    (check, validate) names the job in what is said."""
    from orchestrator.slurm import queue
    from orchestrator.slurm.job import login_node
    from orchestrator.slurm.run import allocate

    login = login_node(inventory)
    transport = session.transport(login)
    job, nodes = allocate(transport, inventory, say, what=what)
    try:
        say(f"{what}: job {job} on {', '.join(nodes)}")
        allocated = allocation_inventory(inventory, nodes)
        with AllocationSession(allocated, list(allocated.nodes), session, transport, job) as on:
            yield allocated, on
    finally:
        queue.cancel(transport, login.name, job)
