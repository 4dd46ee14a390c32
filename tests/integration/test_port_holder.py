"""Who holds a busy port is found from the kernel's socket table and the processes' descriptors
(/proc), never from another program's text: a process of another user that names itself
``pid=N<newline>`` (N: a process of ours carrying a run id) is not taken for a run of ours, so
bootstrap never suggests stopping a run of ours for a port someone else holds (rev7 attack F2).
Checked for both readers: launch's shell snippet (platforms/posix.py) and the preflight's probe."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.platforms import PosixShell
from orchestrator.runs.layout import RUN_MARKER_ENV

ROOT = Path(__file__).resolve().parents[2]
OTHER_USER = ("setpriv", "--reuid=54321", "--regid=54321", "--clear-groups", "/usr/bin/python3")
LISTEN = (
    "import socket, sys\n"
    "name = sys.argv[2].encode().replace(b'\\\\n', b'\\n')\n"
    "open('/proc/self/comm', 'wb').write(name[:15])\n"
    "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
    "print('up', flush=True); sys.stdin.read()\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _probe() -> object:
    spec = importlib.util.spec_from_file_location(
        "cb_reach", ROOT / "orchestrator" / "steps" / "preflight" / "probes" / "reach.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _snippet_says(port: int) -> str:
    body = PosixShell().say_if_listening(port, "port-busy", holder_env=RUN_MARKER_ENV)
    script = '_cb_rec() { echo "REC $*"; }\n' + body + "\necho free\n"
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def our_run() -> Iterator[subprocess.Popen[bytes]]:
    """A process of ours carrying the marker of run held-7 (a healthy run of the operator's)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env={**os.environ, RUN_MARKER_ENV: "held-7/node1/1-2"},
    )
    yield proc
    proc.kill()
    proc.wait()


def _listener(argv: tuple[str, ...], port: int, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [*argv, "-c", LISTEN, str(port), name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd="/",
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def test_another_users_process_naming_itself_after_our_run_is_not_taken_for_it(
    our_run: subprocess.Popen[bytes],
) -> None:
    port = _free_port()
    forged = f"pid={our_run.pid}\\nx"  # `ss -p` prints it as it is: a line ending with our pid
    squatter = _listener(OTHER_USER, port, forged, {"PATH": "/usr/bin:/bin"})
    try:
        assert _snippet_says(port) == "REC port-busy"  # busy, no run named
        holder, runs = _probe().port_holder(port)  # type: ignore[attr-defined]
        assert runs == "-" and f"pid {squatter.pid})" in holder and "held-7" not in holder, holder
        assert "\n" not in holder and holder.startswith(f"pid={our_run.pid}?x"), holder  # one line of ours
    finally:
        squatter.kill()
        squatter.wait()
    assert _snippet_says(port) == "free"


def test_a_run_of_ours_holding_the_port_is_named() -> None:
    port = _free_port()
    ours = _listener((sys.executable,), port, "python3", {**os.environ, RUN_MARKER_ENV: "held-8/node1/1-2"})
    try:
        assert _snippet_says(port) == "REC port-busy held-8"
        holder, runs = _probe().port_holder(port)  # type: ignore[attr-defined]
        assert (holder, runs) == (f"python3 (pid {ours.pid}, run held-8)", "held-8")
    finally:
        ours.kill()
        ours.wait()


def test_a_run_still_starting_on_the_master_holds_its_port_before_it_listens(tmp_path: Path) -> None:
    """`launch --detach`, then `launch` a second later: the first run's torchrun was still importing
    torch, nothing listened yet, so the second was not refused; it failed on EADDRINUSE while its
    other nodes dialled the first run's store. A run of this workdir on the master whose launcher is
    alive, that has no exit code yet and said it takes this port, holds it."""
    from orchestrator.inventory import load_inventory_text
    from orchestrator.steps.launch import PORT_FILE, port_busy

    workdir = tmp_path / "wd"
    node = load_inventory_text(
        f"nodes:\n  - {{name: n1, connection: local, workdir: {workdir}}}\n", str(tmp_path / "h.yaml")
    ).nodes[0]
    port = _free_port()
    run_dir = workdir / "runs" / "lab-1" / "n1"
    run_dir.mkdir(parents=True)
    (run_dir / PORT_FILE).write_text(f"{port}\n")
    launcher = subprocess.Popen(["sleep", "60"])
    try:
        start = Path(f"/proc/{launcher.pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
        (run_dir / "pid").write_text(f"{launcher.pid} {launcher.pid} {start}\n")

        def says() -> str:
            script = (
                '_cb_rec() { echo "REC $*"; }\n' + port_busy(PosixShell(), port, "n", node) + "\necho free\n"
            )
            return subprocess.run(
                ["sh", "-c", script], capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()

        assert says() == "REC port-busy lab-1"
        (run_dir / PORT_FILE).write_text(f"{port + 1}\n")  # another port: not this one's holder
        assert says() == "free"
        (run_dir / PORT_FILE).write_text(f"{port}\n")
        (run_dir / "node.log.rc").write_text("0\n")  # it ended: holds nothing
        assert says() == "free"
        (run_dir / "node.log.rc").unlink()
        (run_dir / "pid").write_text(f"{launcher.pid} {launcher.pid} 1\n")  # a reused pid: not it
        assert says() == "free"
        (run_dir / "pid").unlink()
        os.mkfifo(run_dir / "pid")  # a FIFO a run's code put there: never opened (it blocked 60 s)
        assert says() == "free"
    finally:
        launcher.kill()
        launcher.wait()
