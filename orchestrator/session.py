"""One invocation of bootstrap: the selected nodes, one reused connection each, the executor."""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from orchestrator.errors import CancelledError, UnreachableError
from orchestrator.executor import Executor, GroupResult, NodeEvent, Outcome
from orchestrator.transports import SSHOptions, Transport, open_transport

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node, PasswordResolver

T = TypeVar("T")

#: seconds a node's first connection may take before the wait is announced: an SSH handshake on a
#: LAN takes a fraction of that; a node that is down makes us wait the whole connect timeout
ANNOUNCE_AFTER = 1.0


class Session:
    def __init__(
        self,
        inventory: Inventory,
        nodes: list[Node],
        *,
        ssh: SSHOptions,
        passwords: PasswordResolver,
        on_event: Callable[[NodeEvent], None] | None = None,
        max_workers: int = 64,
        on_wait: Callable[[str, str], None] | None = None,
    ) -> None:
        """``on_wait(node, text)``: told when a node's first connection is slow to answer (the CLI
        prints ``text``); the executor's ``on_event`` then gets a ``waiting`` event too."""
        self.inventory = inventory
        self.nodes = nodes
        self.ssh = ssh
        self.passwords = passwords
        self.on_wait = on_wait
        # nodes that answered once (a later failure to reconnect is a lost connection, retried), and
        # the first error of those that never did: never dialled again in this session
        self._answered: set[str] = set()
        self._unreachable: dict[str, UnreachableError] = {}
        self._lost: set[str] = set()  # nodes whose connection was lost while a command ran
        self._announced: set[str] = set()  # nodes whose slow first answer was said (_waiting)
        self._transports: dict[str, Transport] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._memo: dict[tuple[str, str], object] = {}
        self._memo_locks: dict[tuple[str, str], threading.Lock] = {}
        self.executor = Executor(max_workers=max_workers, on_event=on_event, cancel=self.close)

    def transport(self, node: Node) -> Transport:
        """The node's one transport (created on first use, connected by the caller)."""
        with self._lock:
            if self._closed:  # cancelled: a node whose turn comes now must not start anything
                raise CancelledError("cancelled before this node was contacted", node=node.name)
            existing = self._transports.get(node.name)
            if existing is None:
                existing = open_transport(node, ssh=self.ssh, passwords=self.passwords)
                timeout = existing.connect_timeout
                existing.dial_watch = lambda t=existing: self._dial(node.name, node.host, timeout, t)
                self._transports[node.name] = existing
            return existing

    @contextlib.contextmanager
    def _dial(self, node: str, host: str, timeout: float | None, transport: Transport) -> Iterator[None]:
        """Around one connection attempt to ``node``: a node that never answered in this session
        fails at once with its first error (one dead node costs one connect timeout per run, not
        one per phase), unless the caller dials again on purpose (``transport.retrying``: a follow
        waiting for it to come back); a first attempt still waiting after ``ANNOUNCE_AFTER`` is
        announced."""
        with self._lock:
            first = self._unreachable.get(node)
            answered = node in self._answered
        if first is not None and not transport.retrying:
            raise copy.copy(first)  # shown once: the copy keeps the original's `shown`
        timer = None
        if not answered and timeout is not None and timeout > ANNOUNCE_AFTER:
            timer = threading.Timer(ANNOUNCE_AFTER, self._waiting, args=(node, host, timeout))
            timer.daemon = True
            timer.start()
        try:
            yield
        except UnreachableError as exc:
            with self._lock:
                if not answered and not self._closed:
                    self._unreachable.setdefault(node, exc)
            raise
        else:
            with self._lock:
                self._answered.add(node)
                self._unreachable.pop(node, None)  # back: a later phase reaches it
        finally:
            if timer is not None:
                timer.cancel()

    def _waiting(self, node: str, host: str, timeout: float) -> None:
        with self._lock:  # said once per node: a second attempt while the first waits says nothing new
            first = node not in self._announced
            self._announced.add(node)
        text = f"waiting for {node} ({host}, up to {timeout:g} s): no answer yet"
        if self.on_wait is not None and first:
            self.on_wait(node, text)
        on_event = self.executor.on_event
        if on_event is not None:
            on_event(NodeEvent(node, "waiting", "connect", text))

    def unreachable(self) -> list[str]:
        """The nodes found unreachable in this session (never answered), in inventory order."""
        with self._lock:
            dead = set(self._unreachable)
        return [n.name for n in self.inventory.nodes if n.name in dead]

    def gone(self) -> list[str]:
        """The nodes that never answered in this session or whose connection was lost while a
        command ran, in inventory order: what the run could go on without."""
        with self._lock:
            dead = set(self._unreachable) | self._lost
        return [n.name for n in self.inventory.nodes if n.name in dead]

    def peer_address(self, node: str) -> str | None:
        """The address ``node``'s connection reached, when it is connected directly (no proxy), else
        None (computes and connects nothing)."""
        with self._lock:
            existing = self._transports.get(node)
        return existing.peer_address if existing is not None else None

    def opened(self) -> set[str]:
        """The names of the nodes whose transport exists (contacted, or about to be)."""
        with self._lock:
            return set(self._transports)

    def remember(self, node: str, key: str, compute: Callable[[], T]) -> T:
        """What ``compute()`` returns for ``node``, computed once per session: facts gathered by the
        preflight are handed to validate and launch instead of being asked for again. A failure is not
        remembered (the next phase asks again)."""
        slot = (node, key)
        with self._lock:
            if slot in self._memo:
                return self._memo[slot]  # type: ignore[return-value]
            guard = self._memo_locks.setdefault(slot, threading.Lock())
        with guard:  # two phases asking at once wait for one answer
            with self._lock:
                if slot in self._memo:
                    return self._memo[slot]  # type: ignore[return-value]
            value = compute()
            with self._lock:
                self._memo[slot] = value
            return value

    def forget(self, node: str | None = None, *keys: str) -> None:
        """Drop remembered values (of one node; only ``keys`` when given): after a step changed what
        they describe."""
        with self._lock:
            for slot in list(self._memo):
                if (node is None or slot[0] == node) and (not keys or slot[1] in keys):
                    del self._memo[slot]

    def keys(self, node: str) -> list[str]:
        """The keys remembered for ``node``."""
        with self._lock:
            return [key for name, key in self._memo if name == node]

    def recall(self, node: str, key: str) -> object | None:
        """What is remembered for ``node`` under ``key`` (None: nothing), computing nothing."""
        with self._lock:
            return self._memo.get((node, key))

    def map(
        self,
        fn: Callable[[Node, Transport], T],
        *,
        step: str,
        connect: bool = True,
        fail_fast: bool = False,
        consequence: Callable[[Outcome[T]], bool] | None = None,
        nodes: list[Node] | None = None,
        stop_on: Callable[[Outcome[T]], bool] | None = None,
    ) -> GroupResult[T]:
        """``fn(node, transport)`` on every selected node (or on ``nodes``) in parallel, outcomes in
        inventory order (``fail_fast``, ``consequence``, ``stop_on``: see Executor.map)."""

        def one(node: Node) -> T:
            transport = self.transport(node)
            if connect:
                transport.connect()
            return fn(node, transport)

        chosen = self.nodes if nodes is None else nodes
        done = self.executor.map(
            chosen,
            one,
            name=lambda n: n.name,
            step=step,
            fail_fast=fail_fast,
            consequence=consequence,
            stop_on=stop_on,
        )
        lost = [o.node for o in done if isinstance(o.error, UnreachableError)]
        if lost:
            with self._lock:
                self._lost.update(lost)
        return done

    def subset(self, nodes: list[Node]) -> Session:
        """This session over fewer nodes: the same connections, memo and executor (the main pipeline's
        one session, handed to a phase that works on the selected nodes only). Closing it closes them all."""
        view = copy.copy(self)
        view.nodes = nodes
        return view

    def reopened(self) -> Session:
        """A new session over the same nodes and credentials (no new prompt): for work after this
        one was cancelled, such as making sure a stopped run left nothing behind."""
        fresh = Session(
            self.inventory,
            self.nodes,
            ssh=self.ssh,
            passwords=self.passwords,
            max_workers=self.executor.max_workers,
            on_wait=self.on_wait,
        )
        fresh._answered, fresh._unreachable = self._answered, self._unreachable  # found in this run
        fresh._lost = self._lost
        return fresh

    def close(self) -> None:
        """Close every connection (also from another thread: unblocks running commands)."""
        with self._lock:
            self._closed = True
            transports = list(self._transports.values())
        for transport in transports:
            try:
                transport.close()
            except Exception:  # closing is best effort; the run is over either way
                pass

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
