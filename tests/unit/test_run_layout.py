"""One node layout (runs/layout.py): ``{node}`` in ``workdir`` gives nodes that share a filesystem a
directory each, for everything placed below it; what the user is told names the real paths; the
commands printed after a detached launch work as pasted."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

from orchestrator.cli.common import Settings
from orchestrator.inventory import load_inventory_text
from orchestrator.render import plan_launch
from orchestrator.runs.layout import (
    controller_lost,
    finish_record,
    logs_where,
    read_record,
    run_dir_for,
    workdir_for,
    write_record,
)
from orchestrator.runs.next_command import again, train_without
from orchestrator.steps.codesync.sync import code_dest
from orchestrator.steps.envsync.spec import env_path
from orchestrator.steps.preflight import preflight_facts
from tests.conftest import BOOTSTRAP

SHARED = """\
cluster: {name: lab, master: a}
defaults: {workdir: "/nfs/home/jo/cb-{node}/", user: jo}
nodes:
  - {name: a, host: 10.0.0.1}
  - {name: b, host: 10.0.0.2}
  - {name: c, host: 10.0.0.3, workdir: /scratch/c-own}
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "BOOTSTRAP_INVENTORY"}
    env.update({"NO_COLOR": "1", "HOME": str(cwd)})
    return subprocess.run(
        [BOOTSTRAP, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_nodes_sharing_a_filesystem_get_a_workdir_each() -> None:
    inventory = load_inventory_text(SHARED, "hosts.yaml")
    a, b, c = inventory.nodes
    assert [workdir_for(n) for n in (a, b, c)] == ["/nfs/home/jo/cb-a", "/nfs/home/jo/cb-b", "/scratch/c-own"]
    # everything below the workdir follows: runs, the code, the environment, the disk-space check
    assert run_dir_for(a, "r1") == "/nfs/home/jo/cb-a/runs/r1/a"
    specs = plan_launch(
        inventory, backend="gloo", master_addr="10.0.0.1", run_id="r1", interfaces={}, cpus={}, pythons={}
    )
    assert [s.code_dir for s in specs] == [
        "/nfs/home/jo/cb-a/code",
        "/nfs/home/jo/cb-b/code",
        "/scratch/c-own/code",
    ]
    assert code_dest(inventory.cluster, b) == "/nfs/home/jo/cb-b/code"
    assert env_path(b) == "/nfs/home/jo/cb-b/venv"
    disk = [f for f in preflight_facts(b, a) if type(f).__name__ == "DiskFree"]
    assert [f.workdir for f in disk] == ["/nfs/home/jo/cb-b"]


def test_without_a_workdir_the_default_one_and_a_root_workdir_stays_a_path() -> None:
    inventory = load_inventory_text(
        "nodes:\n  - {name: a, host: 10.0.0.1}\n  - {name: b, host: 10.0.0.2, workdir: /}\n", "h.yaml"
    )
    a, b = inventory.nodes
    assert workdir_for(a) == "~/cluster-bootstrap" and run_dir_for(a, "r") == "~/cluster-bootstrap/runs/r/a"
    assert workdir_for(b) == "/" and run_dir_for(b, "r") == "/runs/r/b" and env_path(b) == "/venv"


def test_the_end_of_run_line_names_the_path_when_every_node_has_it() -> None:
    same = load_inventory_text("nodes:\n  - {name: a, host: h1}\n  - {name: b, host: h2}\n", "h.yaml")
    assert logs_where(same.nodes, "r1") == "~/cluster-bootstrap/runs/r1/<node>/node.log on each node"
    shared = load_inventory_text(SHARED, "hosts.yaml")
    assert logs_where(shared.nodes, "r1") == (
        "runs/r1/<node>/node.log under each node's workdir, which `bootstrap inventory` lists"
    )


def test_inventory_shows_each_nodes_workdir(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text(SHARED)
    shown = _cli("-i", "hosts.yaml", "inventory", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    # rich's table: the header between ┃, the rows between │
    lines = [ln.replace("┃", "│") for ln in shown.stdout.splitlines()]
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in lines if "│" in ln]
    header, *nodes = rows
    workdirs = {row[0]: row[header.index("workdir")] for row in nodes}
    assert workdirs == {"a (master)": "/nfs/home/jo/cb-a", "b": "/nfs/home/jo/cb-b", "c": "/scratch/c-own"}


def test_a_launch_puts_each_nodes_run_in_its_own_workdir(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text(SHARED)
    dry = _cli("-i", "hosts.yaml", "--json", "launch", "--dry-run", "--run-id", "r1", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    nodes = json.loads(dry.stdout)["nodes"]
    assert [n["run_dir"] for n in nodes] == [
        "/nfs/home/jo/cb-a/runs/r1/a",
        "/nfs/home/jo/cb-b/runs/r1/b",
        "/scratch/c-own/runs/r1/c",
    ]


def test_the_next_command_carries_the_files_that_reach_the_nodes() -> None:
    settings = Settings(
        inventory=Path("lab hosts.yaml"),
        known_hosts=Path("/home/jo/lab known_hosts"),
        ssh_config=Path("ssh/config"),
        nodes=("a",),
    )
    assert shlex.split(again(settings, "status", "lab-1")) == [
        "bootstrap",
        "-i",
        "lab hosts.yaml",
        "--known-hosts",
        "/home/jo/lab known_hosts",
        "--ssh-config",
        "ssh/config",
        "status",
        "--run",
        "lab-1",
    ]  # no --nodes: a run spans the whole inventory
    assert again(Settings(), "stop", "r1") == "bootstrap stop --run r1"


def test_a_suggested_command_gets_the_inventory_unless_it_names_one_before_dashes() -> None:
    from orchestrator.runs.next_command import with_user_options

    settings = Settings(inventory=Path("lab.yaml"))
    said = with_user_options(
        settings,
        "run `bootstrap check`, or `bootstrap launch -- -i 3`; "
        "`bootstrap -i other.yaml status` and `bootstrap --inventory=x.yaml logs` name their own",
    )
    assert said == (
        "run `bootstrap -i lab.yaml check`, or `bootstrap -i lab.yaml launch -- -i 3`; "
        "`bootstrap -i other.yaml status` and `bootstrap --inventory=x.yaml logs` name their own"
    )
    assert with_user_options(settings, said) == said  # a message passes here twice on its way out


def test_training_without_a_dead_node_repeats_this_runs_arguments_but_never_a_secret() -> None:
    inventory = load_inventory_text(SHARED, "lab.yaml")
    plain = inventory.for_run(["--lr", "0.1"], {"TAG": "a b"})
    said = train_without(Settings(), plain, ["a"], "launch")
    assert said.endswith("`bootstrap launch --nodes b,c --master b -e 'TAG=a b' -- --lr 0.1`"), said
    secrets = (
        inventory.for_run(["--hf-token", "s3cret"], {}),
        inventory.for_run(None, {"API_KEY": "k"}),
        inventory.for_run(["--data", "https://jo:s3cret@data.lab/set"], {}),  # a login in a URL
    )
    for secret in secrets:
        said = train_without(Settings(), secret, ["a"], "launch")
        assert "s3cret" not in said and "API_KEY" not in said and "not repeated here" in said, said


def test_a_training_script_that_is_not_here_is_named_before_a_launch(tmp_path: Path) -> None:
    """A relative train.script is uploaded from the current directory; run from elsewhere, nothing is
    uploaded and every node would fail on it: launch (and its dry run) say so first."""
    (tmp_path / "hosts.yaml").write_text(
        "cluster: {name: lab, master: a, train: {script: train.py}}\n"
        "nodes:\n  - {name: a, host: 10.255.0.1}\n"
    )
    dry = _cli("-i", "hosts.yaml", "--json", "launch", "--dry-run", "--run-id", "r1", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert f"train.script 'train.py' is not in {tmp_path}: it is not uploaded" in dry.stderr
    assert (
        "(~/cluster-bootstrap/code/train.py; an earlier launch's copy included)" in dry.stderr
        and "add cluster.code" in dry.stderr
    )
    assert not [u for u in json.loads(dry.stdout)["nodes"][0]["uploads"] if u.endswith("train.py")]
    (tmp_path / "train.py").write_text("print('hi')\n")  # here: uploaded, nothing to say
    dry = _cli("-i", "hosts.yaml", "--json", "launch", "--dry-run", "--run-id", "r1", cwd=tmp_path)
    assert "train.script" not in dry.stderr
    assert [u for u in json.loads(dry.stdout)["nodes"][0]["uploads"] if u.endswith("/code/train.py")]


def test_a_mistyped_training_script_is_refused_naming_the_file_meant(tmp_path: Path) -> None:
    """`script: trian.py` beside a train.py: the launch warned that every node would fail, then
    started them all, which failed (exit 1, a failed run recorded). Refused now, as a syntax error is:
    exit 2 before anything connects, the inventory and the file meant named."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "hosts.yaml").write_text(
        "cluster: {name: lab, master: a, train: {script: trian.py}}\n"
        "nodes:\n  - {name: a, host: 10.255.0.1}\n"
    )
    for args in (["launch"], ["launch", "--dry-run"], ["--until", "check"]):
        refused = _cli("-i", "hosts.yaml", *args, cwd=tmp_path)
        assert refused.returncode == 2, refused
        assert "train.script 'trian.py' is not in" in refused.stderr, refused.stderr
        assert "(did you mean 'train.py'?)" in refused.stderr and "nothing was started" in refused.stderr
    assert not (tmp_path / "runs").exists()


def test_a_launch_of_a_synced_project_from_another_directory_says_so_first(tmp_path: Path) -> None:
    """With cluster.code (source: the current directory), a launch from the project's parent ran the
    nodes' old code and kept its logs there, silently, exit 0: it names the mistake first."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    (project / "hosts.yaml").write_text(
        "cluster: {name: lab, master: a, train: {script: train.py}, code: {source: .}}\n"
        "nodes:\n  - {name: a, host: 10.255.0.1}\n"
    )
    here = _cli("-i", "hosts.yaml", "launch", "--dry-run", "--run-id", "r1", cwd=project)
    assert here.returncode == 0 and "train.script" not in here.stderr, here.stderr
    there = _cli("-i", "proj/hosts.yaml", "launch", "--dry-run", "--run-id", "r1", cwd=tmp_path)
    assert there.returncode == 0, there.stderr
    assert f"train.script 'train.py' is not in {tmp_path}, the project cluster.code syncs" in there.stderr
    assert "run bootstrap from your project's directory" in there.stderr


def test_launch_uploads_the_projects_training_script_wherever_it_runs_from(tmp_path: Path) -> None:
    """code.source names the project (not the current directory): the syntax check read the
    project's train.py, the upload looked here, found none, and every node ran the last sync's copy.
    The project's script is the one uploaded."""
    import hashlib

    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('v2')\n")
    (tmp_path / "hosts.yaml").write_text(
        f"cluster: {{name: lab, master: a, train: {{script: train.py}}, code: {{source: {project}}}}}\n"
        "nodes:\n  - {name: a, host: 10.255.0.1}\n"
    )
    dry = _cli("-i", "hosts.yaml", "--json", "launch", "--dry-run", "--run-id", "r1", cwd=tmp_path)
    assert dry.returncode == 0 and "train.script" not in dry.stderr, dry.stderr
    (node,) = json.loads(dry.stdout)["nodes"]
    # beside its place (code sync's directory: a script edited on the node is kept, not overwritten)
    uploads = [a for a in node["plan"]["actions"] if "/code/.train.py." in a.get("put", "")]
    assert [a["sha256"] for a in uploads] == [hashlib.sha256(b"print('v2')\n").hexdigest()], node["plan"]


def test_a_foreground_record_left_unfinished_tells_one_story_for_a_lost_controller(tmp_path: Path) -> None:
    """Issue 33 item 3: after a killed controller, one node said `stopped` and another `exited (1)`
    (whichever of the watchdog and the rank's own failure came first); the record decides."""
    inv = load_inventory_text(
        "cluster: {name: c, master: a, train: {script: t.py}}\n"
        "nodes:\n  - {name: a, host: 10.0.0.1, nproc: 1}\n  - {name: b, host: 10.0.0.2, nproc: 1}\n",
        "hosts.yaml",
    )
    specs = plan_launch(
        inv, backend="gloo", master_addr="10.0.0.1", run_id="r1", interfaces={}, cpus={}, pythons={}
    )
    fg, bg = tmp_path / "fg", tmp_path / "bg"
    write_record(fg, "r1", specs, detached=False)
    write_record(bg, "r1", specs, detached=True)
    unfinished = read_record(fg)
    assert controller_lost(unfinished, ["stopped", "exited"])
    assert not controller_lost(unfinished, ["running", "exited"])  # the controller may still be there
    assert not controller_lost(unfinished, ["stopped", "unknown"])  # a node not read: no story told
    assert not controller_lost(read_record(bg), ["stopped", "exited"])  # detached: no controller to lose
    assert not controller_lost({"run_id": "r1", "detached": False}, ["stopped", "exited"])  # older record
    # started nowhere yet: lost only once the process that launched it is gone
    assert not controller_lost(unfinished, ["not started", "not started"])  # this test is its controller
    ended = subprocess.Popen(["true"])  # a process that has ended: its pid names none now
    ended.wait()
    killed = {**unfinished, "controller": {**unfinished["controller"], "pid": ended.pid}}
    assert controller_lost(killed, ["not started", "not started"])
    assert not controller_lost(killed, ["not started", "unknown"])
    rebooted = {**unfinished, "controller": {**unfinished["controller"], "boot": "another-boot"}}
    assert controller_lost(rebooted, ["not started"])
    elsewhere = {**killed, "controller": {**killed["controller"], "host": "another-machine"}}
    assert not controller_lost(elsewhere, ["not started"])  # cannot be told from here
    finish_record(fg)
    assert not controller_lost(read_record(fg), ["stopped", "exited"])
    assert not controller_lost(read_record(fg), ["not started"])
    assert oct((fg / "run.json").stat().st_mode & 0o777) == "0o600"


def test_a_key_file_that_is_not_here_is_said_once_before_any_connection(tmp_path: Path) -> None:
    """`key_file:` naming a file this machine does not have was paramiko's "[Errno 2] No such file",
    as a connection failure on every node (exit 3). It is one line for the nodes naming it, exit 2,
    and no connection is tried (the TEST-NET addresses would time out)."""
    import time

    (tmp_path / "hosts.yaml").write_text(
        "cluster: {name: lab}\ndefaults: {key_file: ~/.ssh/nope_rsa}\n"
        "nodes:\n  - {name: a, host: 192.0.2.1}\n  - {name: b, host: 192.0.2.2}\n"
    )
    begin = time.monotonic()
    run = _cli("-i", "hosts.yaml", "check", cwd=tmp_path)
    assert run.returncode == 2, run
    said = [line for line in run.stderr.splitlines() if "key_file" in line]
    assert len(said) == 1 and "nodes 'a', 'b': key_file '~/.ssh/nope_rsa' does not exist" in said[0], (
        run.stderr
    )
    assert "Errno" not in run.stderr and time.monotonic() - begin < 30


def test_an_inventory_given_where_a_command_goes_says_how_to_give_it(tmp_path: Path) -> None:
    """`bootstrap hosts.yaml` (the -i forgotten) was click's "No such command 'hosts.yaml'" alone."""
    (tmp_path / "hosts.yaml").write_text("nodes: []\n")
    run = _cli("hosts.yaml", "launch", "--", "--lr", "0.1", cwd=tmp_path)
    assert run.returncode == 2
    assert "Did you mean `bootstrap -i hosts.yaml launch -- --lr 0.1`?" in run.stderr, run.stderr
    secret = _cli("hosts.yaml", "launch", "-e", "HF_TOKEN=hf_s3cret", cwd=tmp_path)  # never repeated
    assert secret.returncode == 2 and "hf_s3cret" not in secret.stderr, secret.stderr
    assert "Type `bootstrap -i hosts.yaml` before the rest of the line" in secret.stderr, secret.stderr
    after = _cli("launch", "hosts.yaml", cwd=tmp_path)  # given where the script's arguments go
    assert after.returncode == 2 and "`bootstrap -i hosts.yaml launch`" in after.stderr, after.stderr
    other = _cli("lunch", cwd=tmp_path)  # a mistyped command is click's own message
    assert other.returncode == 2 and "-i" not in other.stderr.split("Error:")[1], other.stderr
