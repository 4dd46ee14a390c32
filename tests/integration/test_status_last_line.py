"""`bootstrap status`'s "last line" is what the ranks said last, not torch's reverse-DNS noise
(issue 15): on a LAN without reverse DNS, TCPStore logs `[c10d] The hostname of the client socket
cannot be retrieved. err=-3` on every connection, often after the rank's own last line.

The real status script of a POSIX node, run on this machine (local transport) over a run directory
laid out as launch leaves it."""

from __future__ import annotations

from pathlib import Path

from orchestrator.inventory import load_inventory_text
from orchestrator.platforms import PosixShell
from orchestrator.runs.control import status_node
from orchestrator.runs.layout import run_dir_for
from orchestrator.transports.local import LocalTransport

NOISE = (
    "[W1203 10:41:07.123456 socket.cpp:467] [c10d] The hostname of the client socket cannot be "
    "retrieved. err=-3"
)


def test_the_c10d_hostname_warning_never_becomes_the_last_line(tmp_path: Path) -> None:
    text = f"nodes:\n  - {{name: n1, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    node = load_inventory_text(text, str(tmp_path / "hosts.yaml")).nodes[0]
    run_dir = Path(run_dir_for(node, "r1"))
    run_dir.mkdir(parents=True)
    (run_dir / "node.log").write_text(
        f"[default0]:{NOISE}\n"
        "[default0]:[rank 0/2] epoch 3/3 complete\n"
        f"[default1]:{NOISE}\n"
        f"[default0]:{NOISE}\n"
    )
    (run_dir / "node.log.rc").write_text("0\n")
    status = status_node(node, LocalTransport("n1", PosixShell()), "r1")
    assert status.last_line == "[rank 0/2] epoch 3/3 complete", status

    # a log of nothing else: no last line rather than the noise
    (run_dir / "node.log").write_text(f"[default0]:{NOISE}\n")
    assert status_node(node, LocalTransport("n1", PosixShell()), "r1").last_line == ""


def test_a_nul_byte_in_the_log_does_not_blank_the_last_line(tmp_path: Path) -> None:
    """grep reads text holding a NUL byte as binary ("binary file matches", on stderr): a rank that
    printed one must not leave `status` without its last line."""
    text = f"nodes:\n  - {{name: n1, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    node = load_inventory_text(text, str(tmp_path / "hosts.yaml")).nodes[0]
    run_dir = Path(run_dir_for(node, "r1"))
    run_dir.mkdir(parents=True)
    (run_dir / "node.log").write_bytes(b"[default0]:has a \x00 byte\n[default0]:rank 0 final line\n")
    (run_dir / "node.log.rc").write_text("0\n")
    assert status_node(node, LocalTransport("n1", PosixShell()), "r1").last_line == "rank 0 final line"


def test_a_metric_record_is_not_the_last_line(tmp_path: Path) -> None:
    """The example prints a CB_METRIC record every few steps (the dashboard's): what a user asks
    `status` for is the last thing a rank said."""
    text = f"nodes:\n  - {{name: n1, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    node = load_inventory_text(text, str(tmp_path / "hosts.yaml")).nodes[0]
    run_dir = Path(run_dir_for(node, "r1"))
    run_dir.mkdir(parents=True)
    (run_dir / "node.log").write_text(
        '[default0]:[rank 0/2] epoch 2/3 complete\n[default0]:CB_METRIC {"kind":"window","step":40}\n'
    )
    (run_dir / "node.log.rc").write_text("0\n")
    status = status_node(node, LocalTransport("n1", PosixShell()), "r1")
    assert status.last_line == "[rank 0/2] epoch 2/3 complete", status


#: torchrun's failure summary as torch 2.x prints it (untagged: torchrun's own lines)
SUMMARY = """\
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_08:01:02
  host      : node2
  rank      : 3 (local_rank: 1)
  exitcode  : 7 (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_failed_run_names_the_rank_and_its_exit_code_as_launch_does(tmp_path: Path) -> None:
    """torchrun exits 1 whatever its rank's code: status shows the rank its summary names and that
    rank's exit code (launch says `exit 7 (rank 3)`), and a rank cannot forge that summary."""
    text = f"nodes:\n  - {{name: n1, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    node = load_inventory_text(text, str(tmp_path / "hosts.yaml")).nodes[0]
    run_dir = Path(run_dir_for(node, "r1"))
    run_dir.mkdir(parents=True)
    transport = LocalTransport("n1", PosixShell())
    (run_dir / "node.log").write_text("[default1]:boom\n" + SUMMARY)
    (run_dir / "node.log.rc").write_text("1\n")
    status = status_node(node, transport, "r1")
    assert (status.exit_code, status.failed_rank, status.label) == (1, (3, 7), "exited (rank 3: exit 7)")

    # the same summary printed by a rank (tagged) is the rank's word, not torchrun's
    forged = "".join(f"[default1]:{line}\n" for line in SUMMARY.splitlines())
    (run_dir / "node.log").write_text(forged)
    status = status_node(node, transport, "r1")
    assert (status.failed_rank, status.label) == (None, "exited (1)")

    # a run that exited 0 names no rank, whatever its log holds
    (run_dir / "node.log").write_text(SUMMARY)
    (run_dir / "node.log.rc").write_text("0\n")
    assert status_node(node, transport, "r1").failed_rank is None
