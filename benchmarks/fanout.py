"""Fan-out benchmark: `bootstrap facts` on 1, 4 and 16 namespace hosts vs Ansible's minimal facts.

Builds a namespace cluster (tests/cluster.py: real sshd per host), then times, from the controller
namespace, the whole CLI process (start-up included):
  - `bootstrap facts --json` (connect + every fact in one round trip per node)
  - `bootstrap check --json` (the whole preflight, reported beside: it adds clock samples and the
    reachability mesh)
  - `ansible all -m setup -a gather_subset=min` (when ansible-core is installed), with its defaults
    (forks raised to the node count so both work on all nodes at once; ControlPersist on, as shipped)
Both log in as a dedicated user with stock dotfiles. Prints a table of medians and the ratio.
Target (issue 2): 16 nodes <= 3 s, >= 4x faster than Ansible.

    sudo python benchmarks/fanout.py [--runs 5] [--sizes 1,4,16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster import NamespaceCluster  # noqa: E402

BIN = Path(sys.executable).parent
USER = "cbtbench"


def _time(
    cluster: NamespaceCluster, argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)
) -> float:
    start = time.monotonic()
    proc = subprocess.run(cluster.controller_argv(argv, env=env), capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    if proc.returncode not in ok:
        raise SystemExit(
            f"{argv[0]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return took


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="1,4,16")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    bootstrap = BIN / "bootstrap"
    ansible = BIN / "ansible" if (BIN / "ansible").exists() else shutil.which("ansible")
    rows = []
    # an installed package has its bytecode compiled; a source checkout may not (PYTHONDONTWRITEBYTECODE)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "orchestrator")], check=True)
    with tempfile.TemporaryDirectory(prefix="cb-bench-") as tmp, NamespaceCluster(max(sizes)) as cluster:
        # A dedicated account with Debian's stock dotfiles, like a lab's training user. (root on the
        # development machines sources pyenv from ~/.bashrc: bash runs it for every SSH command, which
        # adds ~0.2 s of CPU per command to any tool, Ansible included.)
        cluster.add_user(USER)
        home = Path(tmp) / "home"
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        shutil.copyfile(cluster.client_key, home / ".ssh" / "id_ed25519")
        (home / ".ssh" / "id_ed25519").chmod(0o600)
        (home / ".ssh" / "known_hosts").write_text(cluster.known_hosts_text())
        env = {"HOME": str(home), "NO_COLOR": "1", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        for n in sizes:
            hosts = cluster.hosts[:n]
            inv = Path(tmp) / f"hosts-{n}.yaml"
            nodes = [
                {"name": h.name, "host": h.addr, "user": USER, "python": "/usr/bin/python3"} for h in hosts
            ]
            inv.write_text(json.dumps({"nodes": nodes}))
            argv = [str(bootstrap), "-i", str(inv), "facts", "--json"]
            _time(cluster, argv, env)  # warm-up: the page cache, not our caches (facts are not cached)
            ours = statistics.median(_time(cluster, argv, env) for _ in range(args.runs))
            # the whole preflight: facts + clock samples + reachability mesh (exit 1 is fine here:
            # the stock user's Python has no torch, so the versions check fails)
            pargv = [str(bootstrap), "-i", str(inv), "check", "--json"]
            preflight = statistics.median(_time(cluster, pargv, env, ok=(0, 1)) for _ in range(args.runs))
            theirs = None
            if ansible:
                ainv = Path(tmp) / f"ansible-{n}.yaml"
                ahosts = {
                    h.name: {
                        "ansible_host": h.addr,
                        "ansible_user": USER,
                        "ansible_python_interpreter": "/usr/bin/python3",
                    }
                    for h in hosts
                }
                ainv.write_text(json.dumps({"all": {"hosts": ahosts}}))
                aenv = {**env, "ANSIBLE_FORKS": str(max(n, 5)), "ANSIBLE_HOST_KEY_CHECKING": "True"}
                aenv["ANSIBLE_LOCAL_TEMP"] = str(Path(tmp) / "ansible-tmp")
                # OpenSSH reads ~ from the password database, not $HOME: name the files explicitly,
                # keeping Ansible's default multiplexing options
                aenv["ANSIBLE_SSH_ARGS"] = (
                    "-C -o ControlMaster=auto -o ControlPersist=60s "
                    f"-o UserKnownHostsFile={home / '.ssh' / 'known_hosts'} "
                    f"-o IdentityFile={home / '.ssh' / 'id_ed25519'}"
                )
                aargv = [str(ansible), "all", "-i", str(ainv), "-m", "setup", "-a", "gather_subset=min"]
                _time(cluster, aargv, aenv)
                theirs = statistics.median(_time(cluster, aargv, aenv) for _ in range(args.runs))
            rows.append((n, ours, theirs, preflight))
    print(
        f"\nbootstrap facts vs ansible -m setup (gather_subset=min), median of {args.runs} runs, "
        f"{os.cpu_count()} CPUs\n"
    )
    print(
        "| nodes | bootstrap facts (s) | ansible setup min (s) | ansible / bootstrap | bootstrap check (s) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n, ours, theirs, preflight in rows:
        a = f"{theirs:.2f}" if theirs is not None else "not installed"
        ratio = f"{theirs / ours:.1f}x" if theirs is not None else "-"
        print(f"| {n} | {ours:.2f} | {a} | {ratio} | {preflight:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
