"""The dashboard in a real browser (issue 31): Debian's chromium, headless, through chromium-driver.

A 3-node x 2-rank run of the example with `launch --dashboard`, listening on the controller's own
(non-loopback) address: the page shows 6 ranks whose steps rise; a rank that prints markup shows it
as text and runs nothing; from another machine without the token the page is refused; a rank made to
fail shows on the page with its last lines within 2 s. The screenshot in docs/dashboard.md is taken
here, while the run trains.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from tests.cluster import NamespaceCluster
from tests.conftest import BOOTSTRAP, CliRun, write_inventory
from tests.e2e.test_stop_drain import Spawned
from tests.integration.test_runs import await_
from tests.netns import inside

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
SCREENSHOT = REPO / "docs" / "dashboard.png"
FAKE_SMI = REPO / "tests" / "data" / "nvidia_smi"  # a stand-in nvidia-smi: no GPU where tests run
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
MARKUP = '<img src=x onerror="window.__pwned=1"></textarea><script>window.__pwned=2</script>'

# the example as it is, plus: rank 1 prints markup first; rank 3 (node2's second rank) fails (exit 3)
# once the test creates the trigger file, after saying its last words. Its node's local rank 0 may die
# of the closed connection within the same second, which torchrun then names as its first failure
# (ties go to the lower local rank): the page must name rank 3 all the same
WRAPPER = """\
import os, runpy, sys, threading, time
rank = int(os.environ["RANK"])
if rank == 1:
    print({markup!r}, flush=True)
if rank == 3:
    def fail_on_trigger():
        while not os.path.exists({trigger!r}):
            time.sleep(0.05)
        print("culprit last words: out of patience", flush=True)
        os._exit(3)
    threading.Thread(target=fail_on_trigger, daemon=True).start()
sys.argv = [{example!r}] + sys.argv[1:]
runpy.run_path({example!r}, run_name="__main__")
"""


def _chrome() -> webdriver.Chrome:
    """Headless chromium (in the namespace the caller is inside)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1700"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def _url(spawned: Spawned) -> str:
    """The dashboard's address, as the command printed it."""
    url = await_(
        lambda: (
            next((m.group(1) for m in map(re.compile(r"dashboard: (\S+)").search, spawned.err) if m), None)
            or (spawned.proc.poll() is not None and "exited")
        ),
        120,
        "the dashboard's URL",
    )
    assert url != "exited", "".join(spawned.err)
    return str(url)


def _use(driver: webdriver.Chrome) -> dict[str, list[str]]:
    """Each node's GPU / CPU cell as the page shows it, a line per GPU."""
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#nodes tbody tr'))"
        ".map(r => [r.dataset.node, Array.from(r.querySelectorAll('td.use div')).map(d => d.textContent)])"
    )
    return {node: lines for node, lines in rows}


def _steps(driver: webdriver.Chrome) -> dict[int, int]:
    """Each rank's step as the page shows it (read in one script: the page rebuilds its rows)."""
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#ranks tbody tr'))"
        ".map(r => [r.dataset.rank, r.querySelector('td.step').textContent])"
    )
    return {int(rank): int(step) for rank, step in rows if step.isdigit()}


def _failures(driver: webdriver.Chrome) -> list[tuple[str, str]]:
    """(node, text) of every failure event the page shows."""
    return [
        (node, text)
        for node, text in driver.execute_script(
            "return Array.from(document.querySelectorAll(\"#events .event[data-kind='failure']\"))"
            ".map(e => [e.dataset.node, e.textContent])"
        )
    ]


def test_the_dashboard_shows_a_run_live_in_a_real_browser(
    cluster: NamespaceCluster, trusted_home: Path, tmp_path: Path
) -> None:
    # required, never skipped: tests/run.sh installs both
    assert shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER), "apt-get install chromium chromium-driver"
    trigger = tmp_path / "fail-now"
    script = tmp_path / "train_wrapped.py"
    script.write_text(WRAPPER.format(markup=MARKUP, trigger=str(trigger), example=str(EXAMPLE)))
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable, "nproc": 2}
        for h in cluster.hosts
    ]
    args = ["--epochs", "1000", "--log-every", "2", "--batch-size", "16", "--timeout", "60"]
    inv = write_inventory(
        tmp_path / "h.yaml",
        nodes,
        name="ns",
        master="node1",
        backend="gloo",
        train={"script": str(script), "args": args},
    )
    env = {"HOME": str(trusted_home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = [BOOTSTRAP, "-i", str(inv), "launch", "--dashboard", "--listen", f"{cluster.controller_addr}:0"]
    launch = Spawned(cluster.controller_argv(argv, env=env), tmp_path)
    driver = None
    try:
        url = _url(launch)
        assert "token=" in url  # a non-loopback address: the token, printed once
        assert sum("token=" in line for line in launch.err) == 1

        # from another machine (node2) without the token: refused; with it: served
        probe = (
            "import sys, urllib.request, urllib.error\n"
            "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=10).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n"
        )
        bare = url.split("?")[0]
        for target, expected in ((bare, "403"), (bare + "api/state?token=wrong", "403"), (url, "200")):
            got = cluster.ns_run(cluster.hosts[1].ns, [sys.executable, "-c", probe, target]).stdout.strip()
            assert got == expected, f"{target}: {got}"

        with inside(cluster.controller_ns):  # the browser on the controller, as a user on the LAN would be
            driver = _chrome()
            driver.get(url)
            first = await_(lambda: (s := _steps(driver)) and len(s) == 6 and s, 240, "6 ranks with a step")
            assert sorted(first) == [0, 1, 2, 3, 4, 5]
            await_(
                lambda: all(v > first[r] for r, v in _steps(driver).items()), 120, "every rank's step rising"
            )

            # markup a rank printed: shown as text, nothing run, no element made of it
            shown = await_(
                lambda: MARKUP in driver.find_element(By.ID, "lines").text, 30, "rank 1's markup line"
            )
            assert shown
            # the nodes' CPU samples (records of the run's nonce) are in the GPU / CPU column, not lines
            await_(lambda: all(_use(driver).values()), 30, "every node's CPU load")
            assert "@@cb-" not in driver.find_element(By.ID, "lines").text
            assert driver.execute_script("return window.__pwned === undefined") is True
            assert driver.find_elements(By.CSS_SELECTOR, "img, textarea, main script") == []

            await_(lambda: driver.find_elements(By.CSS_SELECTOR, "#ranks tr.slowest"), 30, "the slowest rank")
            driver.save_screenshot(str(SCREENSHOT))

            trigger.touch()
            failed_at = time.monotonic()

            def failure_shown() -> list[tuple[str, str]]:
                return [f for f in _failures(driver) if "culprit last words: out of patience" in f[1]]

            shown = []
            while not shown and time.monotonic() < failed_at + 30:
                shown = failure_shown()
            assert shown, (
                f"no failure with rank 3's last words: {_failures(driver)}\n{''.join(launch.err)[-3000:]}"
            )
            shown_failure = shown[0]
            took = time.monotonic() - failed_at
            assert took <= 2.0, f"the failure reached the page after {took:.1f} s"
            assert shown_failure[0] == "node2"  # rank 3: node2's second rank
            # named as the rank that failed, never as its co-located victim, also once torchrun's
            # summary has arrived: every node's end reaches the page before the run's end
            await_(
                lambda: driver.find_elements(By.CSS_SELECTOR, "#events .event[data-kind='end']"),
                60,
                "the run's end, on the page",
            )
            node2 = [t for n, t in _failures(driver) if n == "node2"]
            assert len(node2) == 1 and "rank 3 exited with code 3" in node2[0], node2
        assert launch.wait(120) == 1, "".join(launch.err)
        # the summary names node2's rank 3 when node2's end is told (the order of the nodes' ends is
        # torchrun's here: test_the_culprits_node_is_named_when_a_victims_node_ends_first fixes it)
        said = "".join(launch.err)
        assert "rank 2 exited" not in said and (
            "node 'node2': rank" not in said or "rank 3 exited" in said
        ), said
    finally:
        if driver is not None:
            with inside(cluster.controller_ns):
                driver.quit()
        launch.kill()


def test_status_watch_shows_each_ranks_steps_in_place(
    bootstrap: Callable[..., CliRun], cluster: NamespaceCluster, trusted_home: Path, tmp_path: Path
) -> None:
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts
    ]
    args = ["--epochs", "1", "--max-steps", "80", "--log-every", "2", "--batch-size", "16"]
    inv = write_inventory(
        tmp_path / "h.yaml",
        nodes,
        name="ns",
        master="node1",
        backend="gloo",
        train={"script": str(EXAMPLE), "args": args},
    )
    started = bootstrap("-i", str(inv), "launch", "--detach", cwd=tmp_path, timeout=120)
    assert started.returncode == 0, started
    watched = bootstrap("-i", str(inv), "status", "--watch", cwd=tmp_path, timeout=300)
    assert watched.returncode == 0, watched
    # the last table stays: every rank with the last step it reported (80 steps, one metric every 2)
    table = " ".join(watched.stdout.replace("\u2502", " ").split())
    for node, rank in (("node1", 0), ("node2", 1), ("node3", 2)):
        assert re.search(rf"{node} ok \d+ .*? {rank} (\d+) \d+\.\d{{4}} ", table), table
    assert re.search(r" 80 ", table), table


class OnTerminal:
    """A CLI process whose stdin and stderr are a terminal (a pty, as a user's over SSH) and whose
    stdout is a pipe: its lines, and what it shows on the terminal, collected as they come."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.master, terminal = os.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))  # 200 columns
        self.proc = subprocess.Popen(argv, stdin=terminal, stdout=subprocess.PIPE, stderr=terminal, cwd=cwd)
        os.close(terminal)
        self.out: list[str] = []
        self.screen: list[str] = []
        self.readers = [
            threading.Thread(target=self._lines, daemon=True),
            threading.Thread(target=self._terminal, daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def _lines(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self.out.append(line.decode("utf-8", "replace"))

    def _terminal(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the last writer is gone
                return
            if not data:
                return
            self.screen.append(data.decode("utf-8", "replace"))

    def shown(self) -> str:
        return "".join(self.screen)

    def key(self, char: str) -> None:
        os.write(self.master, char.encode())

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def test_logs_follow_shows_a_detached_run_on_the_page_and_its_key_switches_to_the_table(
    bootstrap: Callable[..., CliRun], cluster: NamespaceCluster, trusted_home: Path, tmp_path: Path
) -> None:
    """`logs --follow --dashboard` on a run started with --detach: the page shows its ranks' steps
    rising, and each node's GPUs (node2, a stand-in nvidia-smi on its PATH) or CPU load (the others);
    on a terminal, the key shows the `status --watch` table instead of the lines, and back."""
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts
    ]
    args = ["--epochs", "1", "--max-steps", "400", "--log-every", "2", "--batch-size", "16"]
    inv = write_inventory(
        tmp_path / "h.yaml",
        nodes,
        name="ns",
        master="node1",
        backend="gloo",
        train={
            "script": str(EXAMPLE),
            "args": args,
            # every node finds the stand-in; it answers on node2 only (the others: a broken driver)
            "env": {"PATH": f"{FAKE_SMI}:/usr/bin:/bin", "CB_FAKE_GPU_NODE": "node2"},
        },
    )
    started = bootstrap("-i", str(inv), "launch", "--detach", cwd=tmp_path, timeout=120)
    assert started.returncode == 0, started
    env = {"HOME": str(trusted_home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = [BOOTSTRAP, "-i", str(inv), "logs", "--follow", "--dashboard", "--listen", "127.0.0.1:0"]
    # rich sizes its console from stdout, a pipe here: the terminal's width comes from COLUMNS
    follow = OnTerminal(cluster.controller_argv(argv, env={**env, "COLUMNS": "200"}), tmp_path)
    driver = None
    try:
        url = await_(
            lambda: re.search(r"dashboard: (\S+)", follow.shown()), 120, "the dashboard's URL"
        ).group(1)
        assert "token=" in url  # loopback too: other users of this machine reach it as well
        # the key's note follows the URL (a separate write): awaited, not assumed already there
        await_(lambda: "press t:" in follow.shown(), 30, "the note on the t key")
        with inside(cluster.controller_ns):
            driver = _chrome()
            driver.get(url)
            first = await_(lambda: (s := _steps(driver)) and len(s) == 3 and s, 240, "3 ranks with a step")
            await_(
                lambda: all(v > first[r] for r, v in _steps(driver).items()), 120, "every rank's step rising"
            )
            # per node, per GPU: sampled on the node every few seconds
            use = await_(lambda: (u := _use(driver)) and all(u.values()) and u, 30, "every node's use")
            assert use["node2"] == ["GPU 0: 87% · 20513 / 24576 MiB", "GPU 1: 3% · 1024 / 24576 MiB"], use
            for name in ("node1", "node3"):
                assert re.fullmatch(r"CPU load \d+\.\d\d \(\d+ CPUs\)", use[name][0]), use
        assert not any("@@cb-" in line for line in follow.out)  # the samples are not lines
        await_(lambda: any(line.startswith("[node2:1]") for line in follow.out), 30, "node2's lines")
        follow.key("t")  # the table, in place on the terminal, instead of the lines
        await_(
            lambda: "samples/s" in follow.shown(), 30, f"the table on the terminal: {follow.screen[-20:]!r}"
        )
        await_(
            lambda: re.search(r"0: 87% 20513/24576 MiB\s+1: 3% 1024/", follow.shown()),
            30,
            f"node2's GPUs in the table: {follow.shown()[-3000:]!r}",
        )
        assert re.search(r"node2\W+running", follow.shown()), follow.shown()[-2000:]
        hidden_from = len(follow.out)
        follow.key("t")  # the lines again, after a note of those not shown
        note = await_(
            lambda: next(
                (x for x in follow.out[hidden_from:] if "not shown while the table was up" in x), None
            ),
            30,
            "the lines back",
        )
        assert re.fullmatch(r"\(\d+ line\(s\) not shown while the table was up: runs/ns-[-\d]+\)\n", note), (
            note
        )
        after = follow.out.index(note)
        await_(lambda: any(x.startswith("[node") for x in follow.out[after:]), 60, "lines after the note")
        assert follow.wait(300) == 0, follow.shown()[-3000:]
    finally:
        if driver is not None:
            with inside(cluster.controller_ns):
                driver.quit()
        follow.close()
        # a failed check must not leave the detached run training: the next tests need its port
        bootstrap("-i", str(inv), "stop", "--run", "latest", cwd=tmp_path, timeout=120)


# rank 3 (node2's local rank 1) exits 3 at step 60; every other rank dies of the closed connection.
# Rank 2 trains in a child process and the process torchrun waits for outlives it by a second (TERM
# ignored): its connections close at once, so node1's ranks die as promptly as ever, but node2's
# torchrun always ends a second after node1's, whose ranks are only victims. node3's ranks outlive
# the closed connection: the fail fast stops them
#: node1's ranks end first by construction, not by gloo's timing: at step 60 rank 3 (node2) leaves a
#: marker and exits 3; every other rank stops reducing there and waits for the marker; node1's ranks
#: then die as gloo's victims do (its "Connection reset by peer" traceback, exit 1); node2's rank 2
#: does too, but its parent holds node2's end back a second; node3's ranks wait to be stopped
VICTIM_FIRST = """\
import datetime, os, signal, sys, time
MARKER = {marker!r}
rank = int(os.environ["RANK"])
if rank == 2:
    child = os.fork()
    if child:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _, status = os.waitpid(child, 0)
        time.sleep(1.0)
        os._exit(os.waitstatus_to_exitcode(status))
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.ones(1)
for step in range(61):
    if step % 20 == 0:
        print(f"step {{step}}", flush=True)
    dist.all_reduce(t)
if rank == 3:
    print("culprit last words: out of patience", flush=True)
    open(MARKER, "w").close()
    os._exit(3)
while not os.path.exists(MARKER):
    time.sleep(0.02)
if rank >= 4:  # node3's ranks go on (until stopped): a node the fail fast stops
    time.sleep(600)
print("Traceback (most recent call last):", file=sys.stderr)
print("RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer.", file=sys.stderr)
sys.stderr.flush()
os._exit(1)
"""


def test_the_culprits_node_is_named_when_a_victims_node_ends_first(
    bootstrap: Callable[..., CliRun], cluster: NamespaceCluster, trusted_home: Path, tmp_path: Path
) -> None:
    """The fail fast waits a moment (at most 5 s: CAUSE_GRACE) after a node whose ranks died of gloo's closed
    connection: node2, whose rank 3 failed, ends a second after node1 (by construction: see
    VICTIM_FIRST) and is the one named, in the
    line that stops the run (node3) and first in the summary; node1 is listed after it."""
    script = tmp_path / "victim_first.py"
    script.write_text(VICTIM_FIRST.format(marker=str(tmp_path / "culprit-gone")))
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable, "nproc": 2}
        for h in cluster.hosts
    ]
    inv = write_inventory(
        tmp_path / "h.yaml", nodes, name="ns", master="node1", backend="gloo", train={"script": str(script)}
    )
    ran = bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=300)
    assert ran.returncode == 1, ran
    said = ran.stderr
    stopping = (
        "warning: node 'node2': rank 3 exited with code 3 (torchrun exited 1) (the node keeps its log in"
    )
    assert (
        stopping in said and "; stopping the run on the other nodes" in said.split(stopping)[1].split("\n")[0]
    ), said
    assert said.count("stopping the run on the other nodes") == 1, said
    assert re.search(r"node2\W+exit 3 \(rank 3\)", said) and re.search(
        r"node1\W+exit 1 \(rank [01]\)", said
    ), said
    assert re.search(r"node3\W+stopped", said) and "stopped because node2 failed first: node3" in said, said
    errors = [line for line in said.splitlines() if line.startswith("error: ")]
    assert errors[0].startswith("error: node 'node2': rank 3 exited with code 3 (torchrun exited 1)"), said
    assert errors[1].startswith("error: node 'node1'"), said
