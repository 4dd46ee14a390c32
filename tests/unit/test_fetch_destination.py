"""fetch writes only below runs/<run-id>/<node>/ here, whatever names the node sends (a node is not
trusted: docs/security.md), and never replaces a copy here that holds other bytes (a checkpoint
fetched before may be its only copy once `clean --outputs` ran)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.inventory import load_inventory_text
from orchestrator.inventory.model import Node
from orchestrator.platforms import PosixShell
from orchestrator.records import record
from orchestrator.runs.base import below, safe_parts
from orchestrator.runs.control import fetch_node
from orchestrator.transports.base import Result


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("out/last.pt", ["out", "last.pt"]),
        ("//etc/hostname", ["etc", "hostname"]),  # two slashes are no root of their own
        ("/etc//cron.d/./x/", ["etc", "cron.d", "x"]),
        ("a/../../b", None),
        ("..", None),
        ("//", None),
        ("a\0b", None),
    ],
)
def test_a_path_becomes_names_below_the_destination(path: str, parts: list[str] | None) -> None:
    assert safe_parts(path) == parts


def test_below_refuses_what_would_leave_the_directory(tmp_path: Path) -> None:
    assert below(tmp_path, ["a", "b"]) == tmp_path / "a" / "b"
    for parts in (["//", "etc"], ["/etc"], [".."], [], ["a/b"], ["."]):
        with pytest.raises(ValueError, match="does not lie below"):
            below(tmp_path, parts)


class _Node:
    """A node whose login shell answers every listing with what an attacker chose (``answer``), and
    whose files all hold ``content``."""

    platform = PosixShell()
    kind = "ssh"

    def __init__(self, answer: list[tuple[str, ...]], content: bytes = b"node's bytes\n") -> None:
        self.answer, self.content, self.written = answer, content, []

    def run(self, script: str, **_: object) -> Result:
        nonce = re.search(r"cb-[0-9a-f]{12}", script)
        assert nonce is not None
        out = "".join(record(nonce.group(0), *fields) for fields in self.answer)
        return Result("n1", script, 0, out, "", 0.01)

    def get(self, remote: str, local: Path) -> None:
        self.written.append(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(self.content)


def _node(tmp_path: Path) -> Node:
    text = f"nodes:\n  - {{name: n1, host: 10.0.0.1, workdir: {tmp_path / 'wd'}}}\n"
    return load_inventory_text(text, str(tmp_path / "hosts.yaml")).nodes[0]


def test_names_a_node_sends_cannot_write_outside_the_runs_directory(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    dest = tmp_path / "controller" / "runs" / "r1" / "n1"
    listing = b"".join(
        size + b"\0" + name + b"\0"
        for size, name in (
            (b"5", b"//" + str(outside / "pwned.sh").lstrip("/").encode()),
            (b"5", b"../../escape.sh"),
            (b"5", b"ok.txt"),
        )
    )
    node = _Node([("dir", "0", "/wd/runs/r1/n1/out", listing)])
    (got,) = fetch_node(_node(tmp_path), node, "r1", ["out"], code_dir=None, dest=dest)
    # copies arrive in a private directory of the run's, then move below dest
    assert node.written and all(dest.parent in p.parents for p in node.written), node.written
    assert not outside.exists() and not (tmp_path / "controller" / "runs" / "escape.sh").exists()
    assert (dest / "out" / "ok.txt").read_bytes() == b"node's bytes\n"
    assert {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()} == {
        f"out/{str(outside / 'pwned.sh').lstrip('/')}",
        "out/ok.txt",
    }
    assert got.files == 2 and got.skipped == 1  # the absolute-looking name lands below dest; "../" not
    assert sorted(p.name for p in dest.parent.iterdir()) == ["n1"]  # the arrivals' directory is gone

    node = _Node([("file", "0", "12", "//etc/hostname")])
    fetch_node(_node(tmp_path), node, "r1", ["//etc/hostname"], code_dir=None, dest=dest)
    assert (dest / "etc" / "hostname").read_bytes() == b"node's bytes\n"


def test_a_copy_here_with_other_bytes_is_kept_beside_the_new_one(tmp_path: Path) -> None:
    dest = tmp_path / "runs" / "r1" / "n1"
    (dest).mkdir(parents=True)
    (dest / "last.pt").write_bytes(b"the checkpoint fetched before\n")
    answer = [("file", "0", "9", "/wd/code/last.pt")]
    node = _Node(answer, b"another\n")
    (got,) = fetch_node(_node(tmp_path), node, "r1", ["last.pt"], code_dir=None, dest=dest)
    assert (dest / "last.pt").read_bytes() == b"another\n"
    assert (dest / "last.pt.~1~").read_bytes() == b"the checkpoint fetched before\n"
    assert got.kept == [str(dest / "last.pt.~1~")]
    (again,) = fetch_node(_node(tmp_path), node, "r1", ["last.pt"], code_dir=None, dest=dest)
    assert again.kept == [] and sorted(p.name for p in dest.iterdir()) == ["last.pt", "last.pt.~1~"]


def test_a_slurm_node_list_holds_host_names_only() -> None:
    """The job's node list is a file on the shared file system (a compute node can rewrite it); each
    name becomes runs/<run-id>/<node>/ here."""
    from orchestrator.slurm.queue import host_names

    lines = ["c1", "gpu-02.lab", "../../etc", "/root/.ssh", "a/b", "..", "", "c3"]
    assert host_names(lines) == ["c1", "gpu-02.lab", "c3"]


def test_a_name_a_node_sent_cannot_start_a_line_of_its_own_in_fetchs_notes() -> None:
    """The note about a kept copy repeated a node's file name with its newline: a run's file named
    "x\nerror: ..." added a fake error line under fetch's table."""
    from orchestrator.executor import GroupResult, Outcome
    from orchestrator.runs.commands import FetchReport
    from orchestrator.runs.control import Fetched

    name = "runs/r1/n1/out/x\nerror: disk corrupt, run `bootstrap clean --outputs --yes`"
    kept = Fetched("out", "/w/out", 1, 5, "runs/r1/n1/out", kept=[name + ".~1~"])
    shared = Fetched("ckpt", "/w/code/ckpt\nerror: forged", 1, 5, "runs/r1/n1/ckpt")
    notes = FetchReport(GroupResult([Outcome("n1", [kept, shared], None, 0.1)])).said("r1")
    lines = [said.text for said in notes if hasattr(said, "text")]
    assert lines and all("\n" not in line for line in lines), lines
    assert any("x^Jerror: disk corrupt" in line for line in lines), lines


def test_file_names_in_a_nodes_code_record_cannot_start_a_line_of_ours() -> None:
    """The launch's stale-code warning lists names from the node's record of its last code sync,
    which any run's code can rewrite: a name with a newline added a fake line under the summary."""
    import json

    from orchestrator.records import record
    from orchestrator.steps.launch import CODE_RECORD, stale_code

    nonce = "cb-0123456789ab"
    forged = {"train.py": "a", "x\nerror: checkpoint corrupt: run `bootstrap clean --outputs --yes`": "b"}
    said = stale_code(
        record(nonce, CODE_RECORD, json.dumps({"files": forged})), nonce, {"train.py": "a"}, None
    )
    assert said is not None and "\n" not in said and "x^Jerror: checkpoint corrupt" in said


def _listing(*names: bytes) -> bytes:
    return b"".join(b"5\0" + name + b"\0" for name in names)


def test_a_name_that_is_no_plain_file_name_here_is_left_and_counted_the_others_copied(tmp_path: Path) -> None:
    """One output named ``trap`` + newline ended the whole fetch of its directory with "unexpected
    ValueError ... report it as a bug", and the files listed after it were not copied."""
    dest = tmp_path / "runs" / "r1" / "n1"
    node = _Node([("dir", "0", "/wd/out/ck", _listing(b"a.pt", b"trap\n", b"x\x1b[2J", b"z.pt"))])
    (got,) = fetch_node(_node(tmp_path), node, "r1", ["ck"], code_dir=None, dest=dest)
    assert sorted(p.name for p in (dest / "ck").iterdir()) == ["a.pt", "z.pt"]
    assert (got.files, got.skipped) == (2, 2)


def test_no_copy_here_is_removed_to_make_room_for_one_on_its_way(tmp_path: Path) -> None:
    """Copies arrived as ``NAME.part`` and ``.NAME.fetching`` beside NAME, removing a file of that
    name fetched before (its only copy, maybe); and a kept copy's ``NAME.~1~`` could be a name the
    node sends next, so the note pointed at the node's bytes."""
    dest = tmp_path / "runs" / "r1" / "n1"
    (dest / "ck").mkdir(parents=True)
    for name, text in (("w", "W-v1"), ("w.part", "PART"), (".w.fetching", "FETCHING")):
        (dest / "ck" / name).write_text(text)
    node = _Node([("dir", "0", "/wd/out/ck", _listing(b"w", b"w.~1~"))], b"new\n")
    (got,) = fetch_node(_node(tmp_path), node, "r1", ["ck"], code_dir=None, dest=dest)
    held = {p.name: p.read_bytes() for p in (dest / "ck").iterdir()}
    assert held == {
        "w": b"new\n",
        "w.~1~": b"new\n",  # the node's own file of that name
        "w.~2~": b"W-v1",  # the copy fetched before, kept under a name the node did not send
        "w.part": b"PART",
        ".w.fetching": b"FETCHING",
    }
    assert got.kept == [str(dest / "ck" / "w.~2~")]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["n1"]


def test_a_listing_longer_than_the_cap_is_cut_on_the_node_and_only_its_whole_entries_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50,000 empty files under 3.8 KB paths (a run's code makes them in a second) took the controller
    to 1.5 GiB: the node cuts the listing one byte after the cap, the controller copies the entries
    wholly inside it and says the directory was cut (exit 1)."""
    import subprocess

    from orchestrator import records
    from orchestrator.executor import GroupResult, Outcome
    from orchestrator.runs import control, posix
    from orchestrator.runs.commands import FetchReport

    monkeypatch.setattr(posix, "LISTING_CAP", 100)
    monkeypatch.setattr(control, "LISTING_CAP", 100)
    out = tmp_path / "out"
    out.mkdir()
    for i in range(20):
        (out / f"file-{i:02d}.bin").write_bytes(b"x" * i)
    script = posix.PosixRuns(PosixShell()).list_files([[str(out)]], "cb-0123456789ab")
    ran = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    (found,) = [r for r in records.decode(ran.stdout, "cb-0123456789ab") if r.kind == "dir"]
    assert len(found.fields[2]) == 101  # cut on the node, one byte past the cap

    dest = tmp_path / "runs" / "r1" / "n1"
    node = _Node([("dir", "0", str(out), found.fields[2])])
    (got,) = fetch_node(_node(tmp_path), node, "r1", ["out"], code_dir=None, dest=dest)
    copied = sorted(p.name for p in (dest / "out").iterdir())
    assert got.cut and got.files == len(copied) > 0
    assert all(re.fullmatch(r"file-\d\d\.bin", n) for n in copied), copied
    report = FetchReport(GroupResult([Outcome("n1", [got], None, 0.1)]))
    assert report.exit_code() == 1
    assert any("only the first" in line and "one by one" in line for line in report.cut()), report.cut()


def test_a_place_here_of_the_other_kind_is_said_and_the_rest_is_copied(tmp_path: Path) -> None:
    """ck/w was a directory at an earlier fetch and is a file now (or the other way round): the whole
    node's fetch ended as "unexpected IsADirectoryError ... report it as a bug". The file is left,
    said as not copied (exit 1), the others are copied; and a kept copy's name is never a directory
    the node's listing needs (w.~1~/z)."""
    from orchestrator.executor import GroupResult, Outcome
    from orchestrator.runs.commands import FetchReport

    dest = tmp_path / "runs" / "r1" / "n1"
    (dest / "ck" / "w").mkdir(parents=True)
    (dest / "ck" / "w" / "old").write_text("an earlier fetch\n")
    node = _Node([("dir", "0", "/wd/out/ck", _listing(b"w", b"x"))], b"new\n")
    (got,) = fetch_node(_node(tmp_path), node, "r1", ["ck"], code_dir=None, dest=dest)
    assert (got.clashed, got.files) == (["w"], 1)
    assert (dest / "ck" / "x").read_bytes() == b"new\n" and (dest / "ck" / "w" / "old").exists()
    report = FetchReport(GroupResult([Outcome("n1", [got], None, 0.1)]))
    assert report.exit_code() == 1 and "1 file(s) not copied, the first w" in report.cut()[0]

    again = tmp_path / "again" / "runs" / "r1" / "n1"
    (again / "ck").mkdir(parents=True)
    (again / "ck" / "w").write_text("fetched before\n")
    node = _Node([("dir", "0", "/wd/out/ck", _listing(b"w", b"w.~1~/z"))], b"new\n")
    (got,) = fetch_node(_node(tmp_path), node, "r1", ["ck"], code_dir=None, dest=again)
    assert got.kept == [str(again / "ck" / "w.~2~")] and not got.clashed
    assert (again / "ck" / "w.~2~").read_text() == "fetched before\n"
    assert (again / "ck" / "w.~1~" / "z").read_bytes() == b"new\n"
