"""What every transport promises (transports/base.py), checked once per transport on real parts:

- ``local``: a subprocess on this machine;
- ``ssh``: a real sshd of the namespace cluster (root's login shell is bash there);
- ``winrm``: the WS-Management test server (tests/winrm_server) and pywinrm, with the node in WSL
  mode, so every command and every file transfer runs for real as a Linux process through the
  server's ``wsl.exe`` (native PowerShell cannot run here: its cases are in test_winrm_transport.py).

All three run POSIX sh on this machine's file system as root (the namespace hosts share it), so one
command text and one look at the files serve every case. Cases that only one transport has (SSH
login shells and heartbeats, WinRM lanes, PowerShell transfers, SFTP-less servers) stay in that
transport's own tests.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import CancelledError, TransferError
from orchestrator.platforms import PosixShell
from orchestrator.platforms.wsl import WslShell
from orchestrator.transports import LocalTransport, Transport
from tests import netns
from tests.conftest import root_transport
from tests.integration.test_runs import await_
from tests.winrm_server import WinRMServer

KINDS = ["local", "ssh", "winrm"]


@pytest.fixture(scope="module")
def winrm_server() -> Iterator[WinRMServer]:
    with WinRMServer(auth="ntlm", username="bob", password="pw") as server:
        yield server


def _open(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Transport:
    if kind == "local":
        return LocalTransport("local", PosixShell())
    if kind == "ssh":
        cluster = request.getfixturevalue("cluster")
        ssh = tmp_path / "ssh"
        ssh.mkdir()
        (ssh / "known_hosts").write_text(cluster.known_hosts_text())
        (ssh / "config").write_text("")
        transport: Transport = root_transport(cluster, cluster.hosts[0], ssh / "known_hosts", ssh / "config")
        with netns.inside(cluster.controller_ns):
            transport.connect()
        return transport
    from tests.integration.test_winrm_transport import _transport

    server = request.getfixturevalue("winrm_server")
    return _transport(server, platform=WslShell("Ubuntu-22.04"))


@pytest.fixture(params=KINDS)
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Transport]:
    t = _open(request.param, request, tmp_path)
    yield t
    t.close()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory every transport's commands reach (world-readable: nothing else changes)."""
    tmp_path.chmod(0o755)
    return tmp_path


def _running(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, check=False).stdout
    return [line for line in found.splitlines() if "pgrep" not in line]


def _await_gone(marker: str, seconds: float = 15.0) -> list[str]:
    """Processes whose command line holds ``marker``, once there are none or time is up."""
    deadline = time.monotonic() + seconds
    while (left := _running(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _sleeper(marker: str) -> str:
    # a child of a child, silent: only stopping the whole tree reaches it (no SIGPIPE, no SIGHUP)
    return f"echo started; sh -c 'sleep 300; : {marker}' & sh -c 'sleep 300; : {marker}'; wait"


# -- commands --------------------------------------------------------------------------------------


def test_exit_codes_arrive_as_they_are(transport: Transport) -> None:
    codes = [transport.run(f"exit {n}").exit_code for n in (0, 1, 42, 255)]
    assert codes == [0, 1, 42, 255]
    assert transport.run("false").exit_code == 1 and not transport.run("false").ok


def test_stdout_and_stderr_are_kept_apart(transport: Transport) -> None:
    lines: list[tuple[str, str]] = []
    result = transport.run(
        "echo out; echo err >&2; echo out2; printf 'no newline'",
        on_line=lambda s, line: lines.append((s, line)),
    )
    assert result.ok and result.stdout == "out\nout2\nno newline" and result.stderr == "err\n"
    assert [line for s, line in lines if s == "stdout"] == ["out", "out2", "no newline"]
    assert [line for s, line in lines if s == "stderr"] == ["err"]
    assert result.tail(2) == ["no newline", "err"]


def test_lines_arrive_while_the_command_runs(transport: Transport, workdir: Path) -> None:
    gate = workdir / "gate"

    def on_line(stream: str, line: str) -> None:
        if line == "first":
            gate.touch()  # the command waits for this: "first" reached us before the command ended

    waits = f"i=0; while [ ! -e {gate} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done"
    result = transport.run(
        f"echo first; {waits}; [ -e {gate} ] && echo 'gate seen'; echo last", on_line=on_line, timeout=60
    )
    assert result.ok and result.stdout == "first\ngate seen\nlast\n"


def test_environment_and_working_directory(transport: Transport, workdir: Path) -> None:
    place = workdir / 'it\'s a "dir" $HOME'
    place.mkdir()
    value = 'it\'s $HOME; `x` "q" 100% naïve'
    result = transport.run('pwd; printf "%s\\n" "$CBT_VALUE"', env={"CBT_VALUE": value}, cwd=str(place))
    assert result.ok and result.stdout == f"{place}\n{value}\n"
    assert transport.run("true", cwd=str(workdir / "nope")).exit_code == 125


def test_unicode_and_undecodable_bytes(transport: Transport) -> None:
    result = transport.run(
        "printf 'naïve ✓ 日本\\n'; printf '\\303'; printf '\\251t\\n'; printf 'x\\377y\\n' >&2"
    )
    assert result.stdout == "naïve ✓ 日本\nét\n"  # a character split across writes stays whole
    assert result.stderr == "x\ufffdy\n"  # a bad byte is replaced, the stream goes on


def test_commands_reading_stdin_see_end_of_file(transport: Transport) -> None:
    assert transport.run("cat; echo done", timeout=30).stdout == "done\n"


def test_output_written_just_before_exit_is_never_lost(transport: Transport) -> None:
    result = transport.run("seq 1 20000; exit 5")
    assert result.exit_code == 5
    assert result.stdout.splitlines() == [str(n) for n in range(1, 20001)]


# -- stopping --------------------------------------------------------------------------------------


def test_a_timeout_stops_the_whole_tree_and_the_transport_goes_on(transport: Transport) -> None:
    marker = f"cbt-contract-timeout-{uuid.uuid4().hex}"
    result = transport.run(_sleeper(marker), timeout=1.5)
    assert result.timed_out and result.exit_code is None and result.stdout == "started\n"
    assert _await_gone(marker) == []
    assert transport.run("echo still usable").stdout == "still usable\n"


def test_close_from_another_thread_stops_a_running_command_for_good(transport: Transport) -> None:
    marker = f"cbt-contract-close-{uuid.uuid4().hex}"
    started = threading.Event()
    threading.Thread(target=lambda: (started.wait(20), transport.close()), daemon=True).start()
    begin = time.monotonic()
    result = transport.run(_sleeper(marker), on_line=lambda s, line: started.set())
    assert time.monotonic() - begin < 20 and result.exit_code is None and not result.timed_out
    assert transport.closed
    assert _await_gone(marker) == []
    with pytest.raises(CancelledError):
        transport.run("echo again")  # closing is for good: a cancelled session starts nothing new


def test_background_children_do_not_hold_the_command_open(transport: Transport) -> None:
    marker = f"cbt-contract-bg-{uuid.uuid4().hex}"
    begin = time.monotonic()
    result = transport.run(f"sh -c 'sleep 300; : {marker}' & echo left a child", timeout=30)
    assert result.ok and result.stdout == "left a child\n"
    assert time.monotonic() - begin < 15
    assert _await_gone(marker) == []  # what a command leaves in its group is stopped


def test_a_child_that_ignores_term_left_by_a_command_that_ended_is_gone_too(transport: Transport) -> None:
    """What a command leaves in its group is TERMed when it ends; one that ignores TERM (a server
    saving state, a stuck rank) is KILLed 5 s later, on every transport, not left running."""
    marker = f"cbt-contract-stubborn-{uuid.uuid4().hex}"
    ready = f"/tmp/{marker}"  # the child ignores TERM before the command ends (no race with the TERM)
    child = f"sh -c \"trap '' TERM; : > {ready}; sleep 300; : {marker}\""
    result = transport.run(
        f"{child} & until [ -e {ready} ]; do sleep 0.01; done; rm -f {ready}; echo left a child", timeout=30
    )
    assert result.ok and result.stdout == "left a child\n", result
    assert _await_gone(marker) == []


def test_a_local_timeout_still_reads_what_the_command_says_while_it_stops(tmp_path: Path) -> None:
    """On the controller's own machine the watcher stops a command that timed out (TERM, KILL 5 s
    later) while its output is still read: a TERM handler's last words (torchrun's report of every
    rank) arrive, even more than a pipe holds, and the handler gets to finish."""
    transport = LocalTransport("local", PosixShell())
    done = tmp_path / "handler-finished"
    # (the watcher TERMs the command's group and every process with its token: this shell gets two)
    handler = f"trap '' TERM; head -c 300000 /dev/zero | tr '\\0' x; echo; touch {done}; exit 3"
    result = transport.run(f'trap "{handler}" TERM; echo started; sleep 300 & wait', timeout=1.5)
    assert result.timed_out and result.exit_code is None, result
    assert result.stdout.startswith("started\n") and result.stdout.count("x") == 300000
    assert done.exists()


# -- files -----------------------------------------------------------------------------------------

ODD_NAMES = ['it\'s a "file" $HOME `x`.bin', "naïve ü 日本.txt", "-rf", "line\nbreak.txt", "empty"]


def test_files_round_trip_with_odd_names_and_modes(transport: Transport, workdir: Path) -> None:
    data = {name: os.urandom(70_000) + name.encode() for name in ODD_NAMES}
    data["empty"] = b""
    src = workdir / "src"
    src.mkdir()
    for index, (name, content) in enumerate(data.items()):
        (src / f"{index}").write_bytes(content)
        mode = 0o600 if index % 2 else 0o750
        transport.put(src / f"{index}", str(workdir / "on node" / "deep" / name), mode=mode)
        assert (workdir / "on node" / "deep" / name).read_bytes() == content, name
        assert (workdir / "on node" / "deep" / name).stat().st_mode & 0o777 == mode, name
        transport.get(str(workdir / "on node" / "deep" / name), workdir / "back" / name)
        assert (workdir / "back" / name).read_bytes() == content, name
    assert sorted(os.listdir(workdir / "on node" / "deep")) == sorted(ODD_NAMES)  # nothing left beside
    assert sorted(os.listdir(workdir / "back")) == sorted(ODD_NAMES)


def test_a_file_replaces_the_old_one_and_home_relative_paths_land_in_home(
    transport: Transport, workdir: Path
) -> None:
    (workdir / "v1").write_bytes(b"one")
    (workdir / "v2").write_bytes(b"two, longer")
    name = f".cbt-contract-{uuid.uuid4().hex}"
    try:
        transport.put(workdir / "v1", f"~/{name}")
        transport.put(workdir / "v2", f"~/{name}")
        assert Path(f"/root/{name}").read_bytes() == b"two, longer"
        transport.get(f"~/{name}", workdir / "back")
        assert (workdir / "back").read_bytes() == b"two, longer"
    finally:
        Path(f"/root/{name}").unlink(missing_ok=True)


def test_a_missing_file_is_named_and_nothing_is_written(transport: Transport, workdir: Path) -> None:
    with pytest.raises(TransferError) as caught:
        transport.get(str(workdir / "nope.bin"), workdir / "here" / "x.bin")
    assert "nope.bin" in str(caught.value) and transport.node_name in str(caught.value)
    assert not (workdir / "here" / "x.bin").exists() and not (workdir / "here" / "x.bin.part").exists()
    with pytest.raises(TransferError, match="nope-local"):
        transport.put(workdir / "nope-local", str(workdir / "y.bin"))


def test_nodes_sharing_a_directory_put_the_same_file_at_once_and_it_is_whole(
    request: pytest.FixtureRequest, tmp_path: Path, workdir: Path
) -> None:
    """Nodes whose workdir is one shared directory (an NFS home) get the same files at the same
    moment (a launch's training script, every node in parallel). Over SFTP each upload is written
    under a name of its own and renamed over the target: none fails, and a reader of the target (a
    rank starting from it) never finds half a file, while the uploads run or after them."""
    cluster = request.getfixturevalue("cluster")
    ssh = tmp_path / "ssh"
    ssh.mkdir()
    (ssh / "known_hosts").write_text(cluster.known_hosts_text())
    (ssh / "config").write_text("")
    known, config = ssh / "known_hosts", ssh / "config"
    transports = [root_transport(cluster, host, known, config) for host in cluster.hosts[:3]]
    with netns.inside(cluster.controller_ns):
        for t in transports:
            t.connect()
    payload = tmp_path / "train.bin"
    payload.write_bytes(os.urandom(24 * 1024))  # a training script's size
    target = workdir / "shared" / "train.bin"
    try:
        errors: list[BaseException] = []

        def put(t: Transport) -> None:
            try:
                t.put(payload, str(target), mode=0o644)
            except BaseException as exc:  # handed to the assertion below
                errors.append(exc)

        whole, seen = payload.read_bytes(), set()
        for _ in range(25):
            threads = [threading.Thread(target=put, args=(t,)) for t in transports]
            for thread in threads:
                thread.start()
            while any(thread.is_alive() for thread in threads):
                try:
                    seen.add(len(target.read_bytes()))
                except FileNotFoundError:  # the first round, before any upload arrived
                    pass
            for thread in threads:
                thread.join(120)
            assert errors == []
            assert target.read_bytes() == whole
        assert seen <= {len(whole)}, sorted(seen)  # never empty, never part of it
        assert sorted(p.name for p in target.parent.iterdir()) == ["train.bin"]  # no part file left
    finally:
        for t in transports:
            t.close()


def test_a_local_copy_ends_when_the_transport_is_closed(tmp_path: Path) -> None:
    """Ctrl-C during `fetch` from a local node: the copy went on to the end of a 2 GB file. It now
    ends at the next block (a fifo stands in for a file larger than any block), and nothing is left
    here: no partial file, no copy."""
    source = tmp_path / "big.pt"
    os.mkfifo(source)
    transport = LocalTransport("here", PosixShell())
    local = tmp_path / "back" / "big.pt"
    go_on = threading.Event()
    failed: list[BaseException] = []

    def writer() -> None:
        with source.open("wb") as fifo:
            fifo.write(b"x" * 4096)
            fifo.flush()
            go_on.wait(30)
            fifo.write(b"y" * 4096)

    def reader() -> None:
        try:
            transport.get(str(source), local)
        except BaseException as exc:  # the test looks at it
            failed.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    part = local.with_name("big.pt.part")
    await_(lambda: part.exists() and part.stat().st_size == 4096, 30, "the first block here")
    transport.close()
    go_on.set()
    for thread in threads:
        thread.join(30)
    assert failed and isinstance(failed[0], CancelledError), failed
    assert not local.exists() and not part.exists()
