"""Fan-out over nodes: all in parallel, results in inventory order, one failure never hides the rest."""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from orchestrator.errors import BootstrapError, CancelledError, ConnectError, ExitCode, SetupError

log = logging.getLogger(__name__)

T = TypeVar("T")
N = TypeVar("N")

EventKind = Literal["start", "done", "failed", "waiting"]

#: seconds a fail-fast map waits, after a failure that may be another's consequence (a peer's closed
#: connection), for the failure that caused it before it stops the others. The culprit's node often
#: ends a second after its victims' (its torchrun first stops its other local ranks); on a busy machine
#: its answer then takes another two seconds or more to arrive: 2 s, then 3 s, named the victim's node
#: there (CI)
CAUSE_GRACE = 5.0


@dataclass
class NodeEvent:
    """Progress of one node through one step, for progress displays (``waiting``: its connection
    is slow to answer; ``detail`` says for how long it may wait)."""

    node: str
    kind: EventKind
    step: str
    detail: str = ""


@dataclass
class Outcome(Generic[T]):
    """What a step did on one node: a value, or the error that stopped it."""

    node: str
    value: T | None
    error: BootstrapError | None
    duration: float
    #: when it ended (time.monotonic()): which of several failures came first
    finished: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class GroupResult(list[Outcome[T]]):
    """The outcomes of one step on a group of nodes, in inventory order (a list, so existing code
    reads it as one), and what a report needs to know about them: which nodes succeeded, which
    failed (the first to fail first: in DDP the others fail moments later because of it), which were
    stopped because of them, and the exit code they deserve."""

    @property
    def succeeded(self) -> list[Outcome[T]]:
        return [o for o in self if o.ok]

    @property
    def failed(self) -> list[Outcome[T]]:
        """Failed of their own (not stopped), the earliest first."""
        return sorted(
            (o for o in self if o.error is not None and not isinstance(o.error, CancelledError)),
            key=lambda o: o.finished,
        )

    @property
    def cancelled(self) -> list[Outcome[T]]:
        return [o for o in self if isinstance(o.error, CancelledError)]

    @property
    def first_failure(self) -> Outcome[T] | None:
        failed = self.failed
        return failed[0] if failed else None

    def exit_code(self, failed: Callable[[Outcome[Any]], bool] | None = None) -> ExitCode:
        return exit_code_for(self, failed)


class InternalError(BootstrapError):
    """A bug: an exception that is not one of ours. The message says where to report it."""


def exit_code_for(
    outcomes: Sequence[Outcome[Any]], failed: Callable[[Outcome[Any]], bool] | None = None
) -> ExitCode:
    """Connection problems outrank other failures: they mean the step never ran on that node."""
    if any(isinstance(o.error, ConnectError) for o in outcomes):
        return ExitCode.CONNECTION
    errors = [o.error for o in outcomes if o.error is not None]
    if errors and all(isinstance(e, CancelledError) for e in errors):
        return ExitCode.INTERRUPTED  # stopped (stop --run, Ctrl-C), nothing failed of its own
    if any(isinstance(e, SetupError) for e in errors) and all(
        isinstance(e, (SetupError, CancelledError)) for e in errors
    ):
        return ExitCode.USAGE  # the inventory or this machine must change (an unsafe workdir, a key)
    if any((not o.ok) or (failed is not None and failed(o)) for o in outcomes):
        return ExitCode.NODES_FAILED
    return ExitCode.OK


class Executor:
    """Runs a function for every node on a thread pool.

    ``cancel`` is called once when the user interrupts (or fail-fast triggers): it must make blocked
    workers return promptly (closing their transports does that), since Python threads cannot be killed.
    """

    def __init__(
        self,
        *,
        max_workers: int = 64,
        on_event: Callable[[NodeEvent], None] | None = None,
        cancel: Callable[[], None] | None = None,
    ) -> None:
        self.max_workers = max_workers
        self.on_event = on_event
        #: further event callbacks that live across steps (a dashboard), unlike ``on_event``, which
        #: each step's progress display sets and clears
        self.observers: list[Callable[[NodeEvent], None]] = []
        self.cancel = cancel
        #: told the failure that makes a fail-fast map stop the others, just before it does
        self.on_cause: Callable[[Outcome[Any]], None] | None = None
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _emit(self, event: NodeEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)
        for observer in self.observers:
            observer(event)

    def _one(self, name: str, step: str, fn: Callable[[], T]) -> Outcome[T]:
        start = time.monotonic()
        self._emit(NodeEvent(name, "start", step))
        try:
            value = fn()
        except BootstrapError as exc:
            if exc.node is None:
                exc.node = name
            outcome: Outcome[T] = Outcome(name, None, exc, time.monotonic() - start, time.monotonic())
            self._emit(NodeEvent(name, "failed", step, str(exc)))
            return outcome
        except Exception as exc:  # a bug must not hide the other nodes' results
            log.debug("unexpected error on node %s", name, exc_info=True)
            err = InternalError(
                f"unexpected {type(exc).__name__}: {exc}",
                node=name,
                hint="rerun with -v for a traceback and report it as a bug",
            )
            self._emit(NodeEvent(name, "failed", step, str(err)))
            return Outcome(name, None, err, time.monotonic() - start, time.monotonic())
        outcome = Outcome(name, value, None, time.monotonic() - start, time.monotonic())
        self._emit(NodeEvent(name, "done", step))
        return outcome

    def map(
        self,
        items: Sequence[N],
        fn: Callable[[N], T],
        *,
        name: Callable[[N], str],
        step: str,
        fail_fast: bool = False,
        consequence: Callable[[Outcome[T]], bool] | None = None,
        stop_on: Callable[[Outcome[T]], bool] | None = None,
    ) -> GroupResult[T]:
        """``fn(item)`` for every item in parallel; outcomes in the order of ``items``.

        With ``fail_fast`` the first failure triggers ``cancel`` so the others stop early (and
        ``on_cause`` is told which), unless none is left; without it, only a failure ``stop_on``
        is true for does (a node lost: the others would wait for it in vain). A failure for which
        ``consequence`` is true (another node's failure may have caused it) waits up to
        ``CAUSE_GRACE`` seconds for one that is not, which then is the cause told; the others are
        stopped at once after that one, or when the wait is over. KeyboardInterrupt triggers
        ``cancel`` too, then propagates.
        """
        if not items:
            return GroupResult()
        # Each future reports itself into a queue, and so does Ctrl-C (or SIGTERM) while the nodes
        # work: the main thread takes both from the queue and raises the interrupt there, between two
        # items. Raised wherever the main thread happened to be, it could land inside the lock
        # handling of concurrent.futures.wait() or of the pool's own semaphore: a lock left held
        # hung the workers finishing their futures, and the interpreter's exit, which joins them.
        finished: queue.SimpleQueue[Future[Outcome[T]] | int] = queue.SimpleQueue()
        workers = max(1, min(self.max_workers, len(items)))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"bootstrap-{step}")
        with _signals_into(finished) as handlers:
            try:
                futures: list[Future[Outcome[T]]] = []
                for item in items:
                    future = pool.submit(self._one, name(item), step, lambda item=item: fn(item))
                    future.add_done_callback(finished.put)
                    futures.append(future)
                remaining = len(futures)
                held: Outcome[T] | None = None  # a consequence waiting for its cause until ``deadline``
                deadline = 0.0
                while remaining:
                    # never a wait without end: a signal the kernel hands to a worker thread (one
                    # in a sleep or a connect) only sets a flag, which this thread acts on when it
                    # wakes (a Ctrl-C waited for good while a follow retried a node)
                    left = WAKE if held is None else max(0.0, min(WAKE, deadline - time.monotonic()))
                    try:
                        done = finished.get(timeout=left)
                    except queue.Empty:  # no other failure within the grace: the consequence it is
                        if held is not None and time.monotonic() >= deadline:
                            self._fail_fast(held)
                            held = None
                        continue
                    if isinstance(done, int):  # a signal: its handler (the CLI's) raises here
                        handlers[done](done, None)
                        continue
                    remaining -= 1
                    outcome = done.result()
                    if self.cancelled or not _failed(outcome):
                        continue
                    if not fail_fast and not (stop_on is not None and stop_on(outcome)):
                        continue
                    secondary = consequence is not None and consequence(outcome)
                    if not remaining:
                        # nothing left to stop: no cancel, which would close the connections the
                        # caller goes on using (to look for what the run left behind)
                        held = None
                    elif not secondary:
                        self._fail_fast(outcome)
                        held = None
                    elif held is None:
                        held, deadline = outcome, time.monotonic() + CAUSE_GRACE
                return GroupResult(f.result() for f in futures)
            except KeyboardInterrupt:
                self.trigger_cancel()
                raise
            finally:
                pool.shutdown(wait=not self.cancelled, cancel_futures=True)

    def _fail_fast(self, cause: Outcome[Any]) -> None:
        """``cause`` stops the others: told to ``on_cause``, then ``cancel``."""
        if not self.cancelled and self.on_cause is not None:
            self.on_cause(cause)
        self.trigger_cancel()

    def trigger_cancel(self) -> None:
        if self._cancelled.is_set():
            return
        self._cancelled.set()
        if self.cancel is not None:
            self.cancel()


SignalHandler = Callable[[int, Any], Any]


#: seconds the thread that waits for the nodes sleeps at most: then it runs the signal handlers a
#: worker thread's signal left pending
WAKE = 0.5


@contextlib.contextmanager
def _signals_into(into: queue.SimpleQueue[Any]) -> Iterator[dict[int, SignalHandler]]:
    """While the block runs, SIGINT and SIGTERM only put their number into ``into`` (a SimpleQueue's
    put is safe in a signal handler); yields the handlers they had, which the block calls itself
    (one still queued when the block ends normally is handled as it leaves).
    Signals without a Python handler (default, ignored) are left alone, as is every signal when this
    is not the main thread (only that one can set handlers)."""
    previous: dict[int, SignalHandler] = {}
    if threading.current_thread() is threading.main_thread():
        for number in (int(signal.SIGINT), int(signal.SIGTERM)):
            handler = signal.getsignal(number)
            if callable(handler):
                previous[number] = handler
                signal.signal(number, lambda signum, _frame: into.put(signum))
    try:
        yield previous
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    # one that came after the block took its last item: delivered now, not lost
    while True:
        try:
            item = into.get_nowait()
        except queue.Empty:
            break
        if isinstance(item, int) and item in previous:
            previous[item](item, None)


def _failed(outcome: Outcome[Any]) -> bool:
    """A failure that stops the others under fail fast: not a node that was itself stopped (Ctrl-C,
    or `stop --run`, which reaches every node of the run by itself: cancelling them early would cut
    their last lines and hide that they were stopped too)."""
    return outcome.error is not None and not isinstance(outcome.error, CancelledError)
