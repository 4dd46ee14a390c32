"""Recording transports for unit tests: nodes that log every command and upload a step sends them, in
order, and answer commands from a function. The step runner's tests and the dry-run tests
(tests/unit/test_dry_run_is_what_runs.py: what a dry run shows is what the nodes receive) use them."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.inventory import Inventory, Node, PasswordResolver
from orchestrator.platforms import Platform, PosixShell, platform_for_node
from orchestrator.session import Session
from orchestrator.transports import Result, SSHOptions, Transport
from orchestrator.transports.base import OnLine

#: what sudo says when it wants a password (which bootstrap never types)
SUDO_PASSWORD = "sudo: a password is required\n"


@dataclass(frozen=True)
class Sent:
    """One command as the step handed it to ``Transport.run``: before the platform wraps it (root,
    environment, directory), with whether it runs as root."""

    command: str
    become: bool = False
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None


@dataclass(frozen=True)
class Upload:
    remote: str
    data: bytes
    mode: int | None


#: what a node prints for a command: (stdout, exit code)
Answer = Callable[[str], tuple[str, int]]


class RecordingNode(Transport):
    """Records every command and upload in order (``log``); answers commands with ``answer``."""

    kind = "ssh"

    def __init__(
        self, name: str, answer: Answer, platform: Platform | None = None, *, sudo_password: bool = False
    ) -> None:
        super().__init__(name, platform or PosixShell())
        self.answer = answer
        #: sudo wants a password here: every command as root fails as ``sudo -n`` does
        self.sudo_password = sudo_password
        self.log: list[Sent | Upload] = []

    @property
    def sent(self) -> list[Sent]:
        return [entry for entry in self.log if isinstance(entry, Sent)]

    def connect(self) -> None:
        pass

    def run(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        become: bool = False,
        keep_lines: int | None = None,
    ) -> Result:
        self.log.append(Sent(command, become, tuple(sorted((env or {}).items())), cwd))
        if become and self.sudo_password:
            return Result(self.node_name, command, 1, "", SUDO_PASSWORD, 0.001)
        stdout, code = self.answer(command)
        if on_line is not None:
            for line in stdout.splitlines():
                on_line("stdout", line)
        return Result(self.node_name, command, code, stdout, "", 0.001)

    def run_raw(
        self,
        script: str,
        *,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        raise AssertionError("steps send commands through Transport.run")

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        self.log.append(Upload(remote, local.read_bytes(), mode))

    def get(self, remote: str, local: Path) -> None:
        raise AssertionError("no step here downloads")

    def close(self) -> None:
        pass


class RecordingSession(Session):
    """A session whose nodes are :class:`RecordingNode` s (one per inventory node); on those named in
    ``sudo_password`` sudo wants a password."""

    def __init__(
        self, inventory: Inventory, answers: Mapping[str, Answer], *, sudo_password: Collection[str] = ()
    ) -> None:
        super().__init__(
            inventory, list(inventory.nodes), ssh=SSHOptions(), passwords=PasswordResolver(prompt=None)
        )
        self.fakes = {
            node.name: RecordingNode(
                node.name,
                answers[node.name],
                platform_for_node(node),
                sudo_password=node.name in sudo_password,
            )
            for node in inventory.nodes
        }

    def transport(self, node: Node) -> Transport:
        return self.fakes[node.name]
