"""A foreground run whose ranks all went quiet is said to be maybe hung, once per silence.

A rank that hangs outside a collective (a deadlocked data loader, a wait on a file) raises nothing:
the other ranks block in their next collective and wait for it up to the process group's timeout
(30 min for gloo by default) before anything fails. Until then the terminal shows nothing, which
looks the same as slow progress. After ``BOOTSTRAP_STALL_NOTE`` seconds (default 300; 0: never)
without a line from any rank, the launch says so with each node's last line and its time, the
quietest node first (the hung rank stopped first), and how to look and how to stop.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Protocol

#: seconds without a line from any rank before the note (BOOTSTRAP_STALL_NOTE overrides; 0: never)
STALL_SECONDS = 300.0


class Heard(Protocol):
    #: when a rank of the node last printed (monotonic, wall clock) and its last line; None: not yet
    heard: tuple[float, float, str] | None


def stall_seconds() -> float:
    """$BOOTSTRAP_STALL_NOTE (seconds; 0 or less: never), else STALL_SECONDS."""
    raw = os.environ.get("BOOTSTRAP_STALL_NOTE", "").strip()
    try:
        return float(raw) if raw else STALL_SECONDS
    except ValueError:
        return STALL_SECONDS


def span(seconds: float) -> str:
    """A silence as it is said: seconds, or minutes from two on."""
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


class StallWatch:
    """While in its ``with``: says ``note(text)`` when no rank of ``outputs`` printed for ``after``
    seconds, again only after a rank printed and went quiet once more."""

    def __init__(
        self,
        outputs: Mapping[str, Heard],
        note: Callable[[str], None],
        run_id: str,
        after: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.outputs = outputs
        self.note = note
        self.run_id = run_id
        self.after = after
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._said_for: float | None = None  # the silence already said (its start)

    def __enter__(self) -> StallWatch:
        if self.after > 0 and self.outputs:
            self._started = self.clock()
            self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        period = min(30.0, max(self.after / 10, 0.05))
        while not self._stop.wait(period):
            if text := self.check():
                self.note(text)

    def check(self) -> str | None:
        """The note, when the run has been quiet for long enough and that silence was not said yet."""
        heard = {name: out.heard for name, out in self.outputs.items()}
        since = max((h[0] for h in heard.values() if h is not None), default=self._started)
        quiet = self.clock() - since
        if quiet < self.after or self._said_for == since:
            return None
        self._said_for = since
        order = sorted(heard, key=lambda name: (heard[name] is not None, (heard[name] or (0.0,))[0]))
        lines = []
        for name in order:
            h = heard[name]
            if h is None:
                lines.append(f"  {name}: no line from its ranks yet")
            else:
                when = time.strftime("%H:%M:%S", time.localtime(h[1]))
                lines.append(f"  {name}: last at {when}{': ' + h[2] if h[2] else ''}")
        return (
            f"no rank has printed anything for {span(quiet)}; the last lines, the quietest node first:\n"
            + "\n".join(lines)
            + "\nA rank may be hung (a data loader, a wait): the others then wait for it in their next"
            " collective up to the process group's timeout (30 min for gloo by default) before the run"
            " fails. To see where a rank is: `py-spy dump --pid PID` on its node; to stop the run:"
            f" Ctrl-C here, or `bootstrap stop --run {self.run_id}`. If the script is only quiet, this"
            " can be ignored (BOOTSTRAP_STALL_NOTE=SECONDS sets when this is said, 0 never)."
        )
