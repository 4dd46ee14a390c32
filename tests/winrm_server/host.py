"""Run the WS-Management test server as a process inside a namespace host of tests/cluster.py, so a
"Windows in WSL mode" node takes part in multi-host tests: its address is the host's, and what its
wsl.exe commands run, runs in that host's network namespace (and UTS namespace: ``hostname``)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import pwsh
from tests.winrm_server.server import PwshCall

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


@dataclass
class HostedServer:
    """A server process in a test host. ``calls()``, ``commands()`` and ``parse_errors()`` read its record."""

    endpoint: str
    ca_file: Path | None
    record_file: Path
    log_file: Path
    proc: subprocess.Popen[bytes]
    workdir: Path
    _own_workdir: bool = False
    _records: list[dict[str, Any]] = field(default_factory=list)

    def records(self) -> list[dict[str, Any]]:
        try:
            text = self.record_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def calls(self) -> list[PwshCall]:
        out = []
        for r in self.records():
            if r.get("kind") != "powershell" or "script" not in r:
                continue
            tree = pwsh.parse(r["script"])
            out.append(
                PwshCall(
                    r["script"],
                    tree,
                    pwsh.commands(tree),
                    base64.b64decode(r.get("stdin", "")),
                    r["command_line"],
                    file=r.get("file"),
                )
            )
        return out

    def commands(self) -> list[str]:
        return [r["command_line"] for r in self.records() if r.get("kind") == "command"]

    def refusals(self) -> list[str]:
        """Requests refused by Windows' defaults (401 for clear text over HTTP, 413 over the envelope)."""
        return [r["reason"] for r in self.records() if r.get("kind") == "refused"]

    def parse_errors(self) -> list[str]:
        return [r["report"] for r in self.records() if r.get("kind") in ("parse_error", "handler_error")]

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> HostedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_host(
    cluster: Any,
    host: Any,
    *,
    auth: str = "basic",
    username: str = "bob",
    password: str = "pw",
    tls: bool = False,
    port: int | None = None,
    answers: list[dict[str, Any]] | None = None,
    max_shells_per_user: int = 30,
    wsl: dict[str, Any] | None = None,
    workdir: Path | None = None,
    module: str = "tests.winrm_server",
    allow_unencrypted: bool = False,
    max_envelope_kb: int = 500,
) -> HostedServer:
    """Start ``python -m tests.winrm_server`` on ``host`` (a tests.cluster.TestHost) listening on its
    address (port 5985, or 5986 with TLS, like Windows), and return once it accepts connections.

    ``module``: another entry point taking the same options (a server with the Windows side played,
    tests/e2e/windows_host.py). ``allow_unencrypted``, ``max_envelope_kb``: as for WinRMServer (the
    defaults are Windows' own: plain HTTP only NTLM-sealed, 500 KiB envelopes)."""
    own = workdir is None
    wd = Path(tempfile.mkdtemp(prefix=f"winrm-{host.name}-")) if workdir is None else workdir
    wd.mkdir(parents=True, exist_ok=True)
    port = port if port is not None else (5986 if tls else 5985)
    argv = [
        sys.executable,
        "-m",
        module,
        "--listen",
        f"{host.addr}:{port}",
        "--auth",
        auth,
        "--user",
        username,
        "--password-env",
        "WINRM_TEST_SERVER_PASSWORD",
        "--record",
        str(wd / "record.jsonl"),
        "--max-shells",
        str(max_shells_per_user),
        "--max-envelope-kb",
        str(max_envelope_kb),
    ]
    if allow_unencrypted:
        argv.append("--allow-unencrypted")
    if tls:
        argv += ["--tls-dir", str(wd / "tls")]
    if answers is not None:
        (wd / "answers.json").write_text(json.dumps(answers))
        argv += ["--answers", str(wd / "answers.json")]
    if wsl is not None:
        (wd / "wsl.json").write_text(json.dumps(wsl))
        argv += ["--wsl", str(wd / "wsl.json")]
    # join the host's UTS namespace too (hostname), as cluster.host_run does, when its sshd runs
    sshd = getattr(cluster, "_sshd", {}).get(host.name)
    prefix = ["ip", "netns", "exec", host.ns]
    if sshd is not None and sshd.proc.poll() is None:
        join = ["--uts", "--mount"] if getattr(cluster, "private_dirs", ()) else ["--uts"]
        prefix += ["nsenter", *join, "-t", str(sshd.proc.pid)]
    env = dict(os.environ)
    env["WINRM_TEST_SERVER_PASSWORD"] = password
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    log_file = wd / "server.log"
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            [*prefix, *argv],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )
    handle = HostedServer(
        "", (wd / "tls" / "ca.pem") if tls else None, wd / "record.jsonl", log_file, proc, wd, own
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
        if not ready:
            handle.stop()
            raise RuntimeError(
                f"WinRM test server on {host.name} did not start in {START_TIMEOUT}s:\n{handle.log()}"
            )
        byte = os.read(proc.stdout.fileno(), 1)
        if not byte:
            handle.stop()
            raise RuntimeError(f"WinRM test server on {host.name} exited ({proc.poll()}):\n{handle.log()}")
        line += byte
    handle.endpoint = line.decode().split(" ", 1)[1].strip()
    return handle
