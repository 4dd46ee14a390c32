"""Fan-out benchmark: `bootstrap facts` and `bootstrap check` on 1, 4, 16 and 64 namespace hosts vs
Ansible's minimal facts.

Builds a namespace cluster (tests/cluster.py: real sshd per host), then times, from the controller
namespace, the whole CLI process (start-up included):
  - `bootstrap facts --json` (connect + every fact in one round trip per node)
  - `bootstrap check --json` (the whole preflight: facts, clock samples, the reachability mesh, sudo;
    on Linux nodes the facts, a clock sample and the node's listener share one round trip)
  - `ansible all -m setup -a gather_subset=min` (when ansible-core is installed), with its defaults
    (forks raised to the node count so both work on all nodes at once; ControlPersist on, as shipped)
All log in as a dedicated user with stock dotfiles (no sudo). Prints a table of medians: wall
seconds, and CPU seconds (the CLI process plus every sshd of the cluster with all it started: the
nodes' side). The nodes are namespaces of this machine, so they share its CPUs with the controller:
on a quiet machine the wall time is about the CPU time divided by the number of CPUs, and the CPU
time barely changes when other work loads the machine, the wall time does.

`--compare DIR` times a second checkout of this repository (e.g. `git worktree add /tmp/base HEAD`)
in the same cluster, its runs interleaved with ours: on a busy machine both see the same load.

Every namespace gets permanent neighbour entries for all the others: the kernel's neighbour table is
shared by all namespaces and holds 1024 dynamic entries (net.ipv4.neigh.default.gc_thresh3), which a
64-host full mesh (4,032 pairs) overflows: connections would then time out for reasons no real LAN
has. Permanent entries are not counted against that limit.

A second table splits the CPU per node into the node's side and the controller's. The node's side
misses what outlives the command's shell (the heartbeat watcher, orphaned when the script exits, is
reaped by init): the third table counts one node's processes instead, with strace following its sshd
in one more, untimed, run of each command (--no-count skips it).

Targets: 16 nodes <= 3 s and >= 4x faster than Ansible (issue 2); `check` on 64 nodes <= 6 s (issue 13),
<= 4 s (issue 29).

    sudo python benchmarks/fanout.py [--runs 5] [--sizes 1,4,16,64] [--compare /tmp/base]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def _sshd_pids(cluster: NamespaceCluster) -> list[int]:
    # tests/cluster.py: "ip netns exec, unshare and `sh -c '... && exec'` all exec: this pid is sshd"
    return [sshd.proc.pid for sshd in cluster._sshd.values()]


def _sshd_cpu(pids: list[int]) -> float:
    """CPU seconds of the sshd listeners and everything they started and reaped (sessions, commands)."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _sessions_over(pids: list[int], timeout: float = 5.0) -> None:
    """Wait until no sshd has a session process left (their CPU is then in the listener's cutime)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}/task/{pid}/children").read_text().split() for pid in pids):
            return
        time.sleep(0.05)


def _own_children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(
    cluster: NamespaceCluster, argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)
) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds: the command plus the nodes' side, CPU seconds of the nodes' side)."""
    pids = _sshd_pids(cluster)
    _sessions_over(pids)
    own, nodes = _own_children_cpu(), _sshd_cpu(pids)
    start = time.monotonic()
    proc = subprocess.run(cluster.controller_argv(argv, env=env), capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    if proc.returncode not in ok:
        raise SystemExit(
            f"{argv[0]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    _sessions_over(pids)
    node_cpu = _sshd_cpu(pids) - nodes
    return took, _own_children_cpu() - own + node_cpu, node_cpu


def processes_per_node(
    cluster: NamespaceCluster, argv: list[str], env: dict[str, str]
) -> tuple[int, int, str]:
    """One untimed run of ``argv`` with strace following the first host's sshd: (processes it and its
    descendants started, programs they executed, the most executed programs). Every node runs the
    same commands, so this is what each node pays."""
    pid = _sshd_pids(cluster)[0]
    with tempfile.NamedTemporaryFile(prefix="cb-strace-", suffix=".txt") as out:
        tracer = subprocess.Popen(
            [
                "strace",
                "-f",
                "-qq",
                "-e",
                "trace=execve,fork,vfork,clone,clone3",
                "-o",
                out.name,
                "-p",
                str(pid),
            ],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # strace attaches
        subprocess.run(cluster.controller_argv(argv, env=env), capture_output=True, timeout=300)
        _sessions_over([pid])
        tracer.terminate()
        tracer.wait()
        lines = Path(out.name).read_text().splitlines()
        if os.environ.get("CB_STRACE_KEEP"):  # to read the calls one by one
            shutil.copyfile(out.name, f"{os.environ['CB_STRACE_KEEP']}-{len(lines)}.txt")
    pids: set[str] = set()
    threads: set[str] = set()
    programs: dict[str, int] = {}
    for line in lines:
        who, _, call = line.partition(" ")
        call = call.lstrip()  # strace pads the pid column
        pids.add(who)
        if "CLONE_THREAD" in call and "= " in call:  # a thread, not a process
            threads.add(call.rsplit("= ", 1)[1].split()[0])
        elif call.startswith("execve(") and "= -1" not in call:  # done, or "<unfinished ...>"
            name = Path(call.split('"', 2)[1]).name
            programs[name] = programs.get(name, 0) + 1
    forks = len(pids - threads - {str(pid)})
    top = ", ".join(f"{n} {c}" for n, c in sorted(programs.items(), key=lambda kv: -kv[1])[:8])
    return forks, sum(programs.values()), top


def pin_neighbours(cluster: NamespaceCluster) -> None:
    """Permanent neighbour entries in every namespace for every other one (see the module docstring)."""
    spaces = [(cluster.controller_ns, cluster.controller_addr)] + [(h.ns, h.addr) for h in cluster.hosts]
    macs = {}
    for ns, addr in spaces:
        shown = subprocess.run(
            ["ip", "-n", ns, "-j", "link", "show", "eth0"], capture_output=True, text=True, check=True
        )
        macs[addr] = json.loads(shown.stdout)[0]["address"]
    for ns, own in spaces:
        batch = "".join(
            f"neigh replace {addr} lladdr {mac} dev eth0 nud permanent\n"
            for addr, mac in macs.items()
            if addr != own
        )
        subprocess.run(["ip", "-n", ns, "-batch", "-"], input=batch, text=True, check=True)


Timers = dict[str, tuple[list[str], dict[str, str], tuple[int, ...]]]


def _median_interleaved(
    runs: int, timers: Timers, cluster: NamespaceCluster
) -> dict[str, tuple[float, float, float]]:
    """Each command once to warm up (the page cache, not our caches: facts are not cached), then
    ``runs`` rounds of every command in turn; the median wall and CPU seconds of each."""
    for argv, env, ok in timers.values():
        _time(cluster, argv, env, ok)
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in timers}
    for _ in range(runs):
        for name, (argv, env, ok) in timers.items():
            times[name].append(_time(cluster, argv, env, ok))
    return {
        name: (
            statistics.median(w for w, _, _ in values),
            statistics.median(c for _, c, _ in values),
            statistics.median(n for _, _, n in values),
        )
        for name, values in times.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="1,4,16,64")
    parser.add_argument("--compare", type=Path, help="another checkout, timed beside this one")
    parser.add_argument(
        "--no-count",
        action="store_true",
        help="skip the untimed run per command that counts one node's processes (strace)",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    bootstrap = BIN / "bootstrap"
    ansible = BIN / "ansible" if (BIN / "ansible").exists() else shutil.which("ansible")
    # the code each column runs (the venv's `bootstrap` imports `orchestrator` from PYTHONPATH first)
    codes = {"": REPO}
    if args.compare is not None:
        codes[f" ({args.compare.name})"] = args.compare.resolve()
    for code in codes.values():
        # an installed package has its bytecode compiled; a source checkout may not (PYTHONDONTWRITEBYTECODE)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "orchestrator")], check=True)
    rows = []
    counts: list[tuple[int, str, int, int, str]] = []
    started_load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cb-bench-") as tmp, NamespaceCluster(max(sizes)) as cluster:
        pin_neighbours(cluster)
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
            timers: Timers = {}
            for label, code in codes.items():
                code_env = {**env, "PYTHONPATH": str(code)}
                timers["facts" + label] = (
                    [str(bootstrap), "-i", str(inv), "facts", "--json"],
                    code_env,
                    (0,),
                )
                # the whole preflight; exit 1 is fine here: the stock user's Python has no torch (the
                # versions check fails) and no sudo
                timers["check" + label] = (
                    [str(bootstrap), "-i", str(inv), "check", "--json"],
                    code_env,
                    (0, 1),
                )
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
                timers["ansible"] = (aargv, aenv, (0,))
            rows.append((n, _median_interleaved(args.runs, timers, cluster)))
            if not args.no_count and shutil.which("strace"):
                for name, (argv, cmd_env, _) in timers.items():
                    if name != "ansible":
                        counts.append((n, name, *processes_per_node(cluster, argv, cmd_env)))
    columns = [f"{what}{label}" for label in codes for what in ("facts", "check")]
    print(
        f"\nbootstrap facts and check vs ansible -m setup (gather_subset=min), median of {args.runs} runs "
        f"(interleaved), {os.cpu_count()} CPUs, load {started_load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end; seconds, wall / CPU\n"
    )
    print(
        "| nodes | "
        + " | ".join(f"bootstrap {c}" for c in columns)
        + " | ansible setup min | ansible / bootstrap facts (wall) |"
    )
    print("| ---: " * (len(columns) + 3) + "|")
    for n, medians in rows:
        theirs = medians.get("ansible")
        a = f"{theirs[0]:.2f} / {theirs[1]:.2f}" if theirs is not None else "not installed"
        ratio = f"{theirs[0] / medians['facts'][0]:.1f}x" if theirs is not None else "-"
        cells = [f"{medians[c][0]:.2f} / {medians[c][1]:.2f}" for c in columns]
        print(f"| {n} | " + " | ".join(cells) + f" | {a} | {ratio} |")
    print("\nCPU milliseconds per node: all / the node's side (its sshd and all it ran) / the controller\n")
    print("| nodes | " + " | ".join(f"bootstrap {c}" for c in columns) + " |")
    print("| ---: " * (len(columns) + 1) + "|")
    for n, medians in rows:
        cells = [
            f"{medians[c][1] * 1000 / n:.0f} / {medians[c][2] * 1000 / n:.0f} / "
            f"{(medians[c][1] - medians[c][2]) * 1000 / n:.0f}"
            for c in columns
        ]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if counts:
        print("\nprocesses one node ran (its sshd and everything under it; one untimed run, strace -f)\n")
        print("| nodes | command | processes | programs executed | most executed |")
        print("| ---: | --- | ---: | ---: | --- |")
        for n, name, forks, execs, top in counts:
            print(f"| {n} | {name} | {forks} | {execs} | {top} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
