"""The real CLI on a terminal: node output that tries to drive the operator's terminal (clipboard,
title, clear screen, cursor moves, a ``\\r`` overwrite, an 8-bit CSI) is shown visibly, colour
kept; the controller's log and the node's node.log keep the bytes the node wrote.

"A terminal" is a pty here (stdout and stderr each on their own, in raw mode so the bytes read are
the bytes written), read until every writer has closed it. The node is this machine (the local
connection): `bootstrap run -- printf ...`, and a training script through `launch`, then `logs` and
`status` on that run.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import socket
import struct
import subprocess
import termios
import tty
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import BOOTSTRAP

#: what the node prints (one line), and what the operator must see of it
HOSTILE = (
    "clip \x1b]52;c;SGVsbG8=\x07 title \x1b]0;owned\x07 clear \x1b[2J\x1b[H"
    " c1 \x9b2J red \x1b[31mRED\x1b[0m tab\there h\u00e9llo \u4e2d\u6587 end"
)
SHOWN = (
    "clip ^[]52;c;SGVsbG8=^G title ^[]0;owned^G clear ^[[2J^[[H"
    " c1 <U+009B>2J red \x1b[31mRED\x1b[0m tab\there h\u00e9llo \u4e2d\u6587 end"
)
#: a rank's line redrawn with a lone "\r": shown as a terminal shows it, its last state, after the
#: rank's label (the "\r" never reaches the terminal to return over the label); the logs keep it all
REDRAWN = "real\r[other:9] fake"
REDRAWN_SHOWN = "[other:9] fake"
#: the node's sequences, as a terminal would act on them if they arrived raw (stderr also carries
#: rich's own cursor control for the progress display: \r, erase line, cursor up)
RAW = [b"\x1b]52", b"\x1b]0;", b"\x1b[2J", b"\x1b[H", b"\xc2\x9b", b"\x07", b"real\r"]
NOT_SGR = re.compile(rb"\x1b(?!\[[0-9;:]*m)")
TIMEOUT = 120.0


@dataclass
class TermRun:
    returncode: int
    stdout: bytes
    stderr: bytes

    def __str__(self) -> str:
        return f"[exit {self.returncode}]\n--- stdout\n{self.stdout!r}\n--- stderr\n{self.stderr!r}"


def _terminal() -> tuple[int, int]:
    master, slave = pty.openpty()
    tty.setraw(slave)  # no output processing (\n stays \n): what is read is what was written
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    return master, slave


def on_terminal(args: list[str], home: Path, cwd: Path) -> TermRun:
    """``bootstrap ARGS`` with stdout and stderr each a terminal; their bytes once both are closed."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "BOOTSTRAP_INVENTORY", "XDG_STATE_HOME")
    }
    env.update(HOME=str(home), TERM="xterm-256color", COLUMNS="200")
    (out_master, out_slave), (err_master, err_slave) = _terminal(), _terminal()
    proc = subprocess.Popen(
        [BOOTSTRAP, *args], stdin=subprocess.DEVNULL, stdout=out_slave, stderr=err_slave, env=env, cwd=cwd
    )
    os.close(out_slave)
    os.close(err_slave)
    got = {out_master: bytearray(), err_master: bytearray()}
    open_fds = set(got)
    try:
        while open_fds:
            ready, _, _ = select.select(list(open_fds), [], [], TIMEOUT)
            assert ready, f"no output for {TIMEOUT}s; so far: {got}"
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: every process holding the terminal has closed it
                    data = b""
                if data:
                    got[fd] += data
                else:
                    open_fds.discard(fd)
        returncode = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(out_master)
        os.close(err_master)
    return TermRun(returncode, bytes(got[out_master]), bytes(got[err_master]))


def assert_neutralised(text: bytes) -> None:
    for raw in RAW:
        assert raw not in text, f"{raw!r} reached the terminal raw:\n{text!r}"


def test_run_on_a_terminal_shows_sequences_and_logs_the_bytes(tmp_path: Path) -> None:
    octal = "".join(c if (c.isascii() and c.isalnum()) or c in " :=;[]" else _octal(c) for c in HOSTILE)
    run = on_terminal(
        ["run", "--", f"printf '{octal}\\n'; printf 'err \\033]52;c;eA==\\007\\n' >&2"], tmp_path, tmp_path
    )
    assert run.returncode == 0, run
    # stdout: each line neutralised, colour kept (the printer colours on a terminal), the label first
    assert not NOT_SGR.search(run.stdout) and b"\r" not in run.stdout, run  # nothing but colour
    assert_neutralised(run.stdout)
    assert sorted(run.stdout.decode().split("\n")) == sorted(
        [
            "",
            "\x1b[0;36m[local]\x1b[0m " + SHOWN + "\x1b[0m",
            "\x1b[0;36m[local]\x1b[0m \x1b[31m!\x1b[0m err ^[]52;c;eA==^G",  # the stderr line
        ]
    ), run
    assert_neutralised(run.stderr)
    # the controller's copy: the bytes as sent
    (log,) = (tmp_path / ".local" / "state" / "cluster-bootstrap" / "runs").glob("*/local.log")
    assert log.read_bytes() == (HOSTILE + "\nerr \x1b]52;c;eA==\x07\n").encode()


def test_piped_and_json_output_carry_no_raw_sequence(tmp_path: Path) -> None:
    """Piped (a file a later `cat` prints): neutralised too, colour removed; --json: exact text,
    every control character escaped by JSON."""
    octal = "".join(c if (c.isascii() and c.isalnum()) or c in " :=;[]" else _octal(c) for c in HOSTILE)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "BOOTSTRAP_INVENTORY")}
    env.update(HOME=str(tmp_path))
    piped = subprocess.run(
        [BOOTSTRAP, "run", "--", f"printf '{octal}\\n'"], capture_output=True, env=env, timeout=TIMEOUT
    )
    assert piped.returncode == 0, piped
    assert b"\x1b" not in piped.stdout and b"\x1b" not in piped.stderr
    assert piped.stdout.decode() == "[local] " + SHOWN.replace("\x1b[31m", "").replace("\x1b[0m", "") + "\n"
    as_json = subprocess.run(
        [BOOTSTRAP, "--json", "run", "--", f"printf '{octal}\\n'"],
        capture_output=True,
        env=env,
        timeout=TIMEOUT,
    )
    assert as_json.returncode == 0, as_json
    assert_neutralised(as_json.stdout.replace(b"\n", b""))
    assert b"\x1b" not in as_json.stdout
    assert json.loads(as_json.stdout)["nodes"][0]["stdout"] == HOSTILE + "\n"


TRAIN = f"""\
import sys
sys.stdout.write({REDRAWN!r} + "\\n")
sys.stdout.write({HOSTILE!r} + "\\n")
sys.stdout.flush()
sys.exit(3)
"""

INVENTORY = """\
cluster:
  name: esc
  master: local
  port: {port}
  backend: gloo
  train: {{script: hostile.py}}
nodes:
  - {{name: local, connection: local, gpus: 0, nproc: 1}}
"""


def test_training_output_failure_summary_logs_and_status_are_neutralised(tmp_path: Path) -> None:
    (tmp_path / "hostile.py").write_text(TRAIN)
    with socket.socket() as probe:  # a free port: other runs on this machine may hold 29500
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "inv.yaml").write_text(INVENTORY.format(port=port))
    launch = on_terminal(["-i", "inv.yaml", "launch"], tmp_path, tmp_path)
    assert launch.returncode == 1, launch
    # streamed as [local:0] (torchrun's [default0]: replaced), neutralised, colour kept
    assert ("\x1b[0;36m[local:0]\x1b[0m " + SHOWN + "\x1b[0m\n").encode() in launch.stdout, launch
    assert ("\x1b[0;36m[local:0]\x1b[0m " + REDRAWN_SHOWN + "\x1b[0m\n").encode() in launch.stdout, launch
    assert not NOT_SGR.search(launch.stdout) and b"\r" not in launch.stdout, launch
    assert_neutralised(launch.stdout)
    # the fail-fast summary's last lines (stderr): shown neutralised
    assert b"[local:0] clip ^[]52;c;SGVsbG8=^G title ^[]0;owned^G clear ^[[2J^[[H c1 <U+009B>2J" in (
        launch.stderr
    ), launch
    assert_neutralised(launch.stderr)
    # both logs keep the bytes: the controller's runs/<id>/local.log and the node's node.log
    (run_dir,) = (tmp_path / "runs").iterdir()
    line = ("[default0]:" + HOSTILE + "\n").encode()
    assert line in (run_dir / "local.log").read_bytes()
    assert ("[default0]:" + REDRAWN + "\n").encode() in (run_dir / "local.log").read_bytes()
    assert (
        line in (tmp_path / "cluster-bootstrap" / "runs" / run_dir.name / "local" / "node.log").read_bytes()
    )

    logs = on_terminal(["-i", "inv.yaml", "logs"], tmp_path, tmp_path)
    assert ("\x1b[0;36m[local:0]\x1b[0m " + SHOWN + "\x1b[0m\n").encode() in logs.stdout, logs
    assert not NOT_SGR.search(logs.stdout) and b"\r" not in logs.stdout, logs
    assert_neutralised(logs.stdout)
    assert line in (run_dir / "local.log").read_bytes()  # the copy `logs` wrote: the bytes again

    status = on_terminal(["-i", "inv.yaml", "status"], tmp_path, tmp_path)
    assert status.returncode == 1, status  # the run failed there (it exited 3)
    assert b"clip ^[]52;c;SGVsbG8=^G title ^[]0;owned^G clear" in status.stdout, status
    assert_neutralised(status.stdout)
    assert_neutralised(status.stderr)


def _octal(char: str) -> str:
    return "".join(f"\\{byte:03o}" for byte in char.encode())
