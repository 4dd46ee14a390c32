"""Run the WS-Management test server as a process (e.g. inside a namespace host of tests/cluster.py):

    python -m tests.winrm_server --listen ADDR:PORT --auth basic|ntlm --user U --password-env VAR
        [--tls-dir DIR] [--answers FILE.json] [--record FILE.jsonl] [--max-shells N] [--wsl FILE.json]
        [--allow-unencrypted] [--max-envelope-kb N] [--max-processes-per-shell N]
        [--max-memory-per-shell-mb N]

Prints ``LISTENING <endpoint>`` on stdout once it accepts connections (start_in_host waits for that line),
then serves until SIGTERM/SIGINT, killing whatever its shells still run when it stops.
``--answers``: a JSON list of {"match": regex searched in the script, "stdout", "stderr", "exit_code"}.
``--wsl``: JSON {"distros": [{"name", "state", "version", "default"}], "encoding", "honours_utf8",
"installed", "networking_mode"} for the fake WSL installation.
``--tls-dir``: the CA (ca.pem), server certificate and key are written there.
``--allow-unencrypted``: accept Basic and unsealed messages over HTTP (Windows' AllowUnencrypted=true;
the default refuses them, as a default Windows host does). ``--max-envelope-kb``: MaxEnvelopeSizekb
(default 500, Windows' default). ``--max-processes-per-shell``: MaxProcessesPerShell of each shell's
job (default 25, Windows' default; 0: no limit), for the played processes (tests/winrm_server/processes.py);
``--max-memory-per-shell-mb``: MaxMemoryPerShellMB likewise (default 1024; 0: no limit).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from tests.winrm_server.server import WinRMServer
from tests.winrm_server.wsl import Distro, WslConfig


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen wants ADDR:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.winrm_server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--listen", type=_listen, required=True, metavar="ADDR:PORT")
    parser.add_argument("--auth", default="basic", help="basic, ntlm or basic,ntlm")
    parser.add_argument("--user", default="bob")
    parser.add_argument("--password-env", required=True, metavar="VAR")
    parser.add_argument("--tls-dir", type=Path)
    parser.add_argument("--answers", type=Path)
    parser.add_argument("--record", type=Path)
    parser.add_argument("--max-shells", type=int, default=30)
    parser.add_argument("--wsl", type=Path)
    parser.add_argument("--computer-name", default="WINHOST")
    parser.add_argument("--allow-unencrypted", action="store_true")
    parser.add_argument("--max-envelope-kb", type=int, default=500)
    parser.add_argument("--max-processes-per-shell", type=int, default=25)
    parser.add_argument("--max-memory-per-shell-mb", type=int, default=1024)
    args = parser.parse_args(argv)
    password = os.environ.get(args.password_env)
    if password is None:
        parser.error(f"environment variable {args.password_env} is not set")
    answers = json.loads(args.answers.read_text()) if args.answers else []
    wsl = WslConfig()
    if args.wsl:
        doc = json.loads(args.wsl.read_text())
        if "distros" in doc:
            wsl.distros = [Distro(**d) for d in doc["distros"]]
        for key in ("encoding", "honours_utf8", "installed", "networking_mode", "version_text"):
            if key in doc:
                setattr(wsl, key, doc[key])
    host, port = args.listen
    server = WinRMServer(
        auth=args.auth,
        username=args.user,
        password=password,
        tls=args.tls_dir is not None,
        tls_dir=args.tls_dir,
        host=host,
        port=port,
        answers=answers,
        max_shells_per_user=args.max_shells,
        computer_name=args.computer_name,
        record=args.record,
        strict=False,
        wsl=wsl,
        allow_unencrypted=args.allow_unencrypted,
        max_envelope_kb=args.max_envelope_kb,
        max_processes_per_shell=args.max_processes_per_shell,
        max_memory_per_shell_mb=args.max_memory_per_shell_mb,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    try:
        print(f"LISTENING {server.endpoint}", flush=True)
        stop.wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
