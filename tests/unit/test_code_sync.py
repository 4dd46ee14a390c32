"""Code sync's pure parts: gitignore rules (checked against git itself), the manifest diff, the hash
cache, where the code goes, and the node script's own refusals (run locally with this Python)."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.inventory import load_inventory
from orchestrator.steps.codesync import FileEntry, IgnoreRules, build_tree, code_dest, diff
from orchestrator.steps.codesync.ignore import parse_pattern
from orchestrator.steps.codesync.manifest import list_files
from orchestrator.steps.codesync.sync import probe_script

# -- ignore rules ---------------------------------------------------------------------------------


def _excluded(patterns: list[str], path: str, is_dir: bool = False) -> bool:
    return IgnoreRules.build(patterns, defaults=()).excluded(path, is_dir)


@pytest.mark.parametrize(
    ("patterns", "path", "is_dir", "expected"),
    [
        (["*.log"], "a.log", False, True),
        (["*.log"], "deep/er/a.log", False, True),  # no slash: any depth
        (["*.log", "!keep.log"], "keep.log", False, False),  # negation, last match wins
        (["!keep.log", "*.log"], "keep.log", False, True),
        (["build/"], "build", True, True),  # directory only
        (["build/"], "build", False, False),  # ...so a file called build stays
        (["build/"], "src/build/x.o", False, True),  # below an excluded directory
        (["build/", "!build/keep.txt"], "build/keep.txt", False, True),  # no re-include inside one
        (["/top.txt"], "top.txt", False, True),  # leading slash: anchored
        (["/top.txt"], "sub/top.txt", False, False),
        (["doc/*.md"], "doc/a.md", False, True),  # middle slash: anchored too
        (["doc/*.md"], "x/doc/a.md", False, False),
        (["doc/*.md"], "doc/sub/a.md", False, False),  # * never crosses /
        (["**/cache"], "a/b/cache", True, True),
        (["**/cache"], "cache", True, True),
        (["logs/**"], "logs/a/b.txt", False, True),
        (["logs/**"], "logs", True, False),
        (["a/**/z"], "a/z", False, True),
        (["a/**/z"], "a/b/c/z", False, True),
        (["file?.txt"], "file1.txt", False, True),
        (["file?.txt"], "file10.txt", False, False),
        (["[abc].py"], "b.py", False, True),
        (["[!abc].py"], "b.py", False, False),
        (["[!abc].py"], "d.py", False, True),
        (["\\#hash"], "#hash", False, True),
        (["# comment"], "# comment", False, False),
        (["\\!bang"], "!bang", False, True),
        (["trailing   "], "trailing", False, True),  # unescaped trailing spaces dropped
        (["sp\\ "], "sp ", False, True),  # an escaped one kept
        (["name with space.txt"], "name with space.txt", False, True),
        (["[unclosed"], "[unclosed", False, True),
    ],
)
def test_gitignore_semantics(patterns: list[str], path: str, is_dir: bool, expected: bool) -> None:
    assert _excluded(patterns, path, is_dir) is expected


def test_blank_and_comment_lines_are_no_rules() -> None:
    assert parse_pattern("") is None and parse_pattern("   ") is None and parse_pattern("# x") is None
    assert parse_pattern("/") is None  # nothing left to match


def test_excludes_come_last_and_can_reinclude_a_default() -> None:
    rules = IgnoreRules.build(["!.venv-tools/"])
    assert rules.excluded(".venv/bin/python") and not rules.excluded(".venv-tools/x.py")
    assert rules.excluded("pkg/__pycache__/m.pyc") and rules.excluded("runs/1/log")
    assert not rules.excluded("src/runs/notes.txt")  # /runs/ is anchored at the top
    grown = rules.with_gitignore("!*.pyc\n", "", ".gitignore")
    assert not grown.excluded("m.pyc")  # a .gitignore after the defaults...
    assert (
        IgnoreRules.build(["*.pyc"]).with_gitignore("!*.pyc\n", "", "g").excluded("m.pyc")
    )  # ...excludes last


# Files of a tree whose .gitignore files exercise every rule kind; git decides, our walk must agree.
ORACLE_FILES = [
    "a.log", "keep.log", "src/a.log", "src/keep.log", "build/x.o", "src/build/y.o", "build.txt",
    "doc/a.md", "doc/sub/b.md", "x/doc/c.md", "top.txt", "sub/top.txt", "tmp/a/cache/z", "cache/z",
    "logs/a/b.txt", "notes/keep.me", "notes/drop.me", "deep/a/b/c/z.bin", "deep/z.bin", "space name.txt",
    "sub/nested/local.tmp", "sub/nested/other.tmp", "sub/nested/keep/kept.tmp", "b.py", "d.py",
    "sub/only-here.txt", "only-here.txt", "[x].txt",
]  # fmt: skip
ORACLE_IGNORES = {
    ".gitignore": "*.log\n!keep.log\nbuild/\n/top.txt\ndoc/*.md\n**/cache\nlogs/**\nnotes/*\n!notes/keep.me\n"
    "deep/**/*.bin\n[!abc].py\nspace\\ name.txt\n",
    "sub/.gitignore": "*.tmp\n!keep/\n/only-here.txt\n",
    "sub/nested/.gitignore": "!other.tmp\n",
}


def test_walk_agrees_with_git(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.fail("git is needed (apt-get install git)")
    for rel in ORACLE_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    for rel, text in ORACLE_IGNORES.items():
        (tmp_path / rel).write_text(text)
    ours, _, lister = list_files(tmp_path, gitignore=True)  # not a git tree yet: our own rules
    assert lister == "walk"
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    theirs, _, lister = list_files(tmp_path, gitignore=True)
    assert lister == "git"
    assert ours == theirs
    assert "notes/keep.me" in ours and "sub/nested/other.tmp" in ours and "a.log" not in ours


def test_gitignore_off_keeps_ignored_files(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / "a.log").write_text("x")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "m.pyc").write_text("x")
    files, _, _ = list_files(tmp_path, gitignore=False)
    assert files == [".gitignore", "a.log"]  # the defaults still apply


# -- diff -----------------------------------------------------------------------------------------


def _e(sha: str, size: int = 1, mode: int = 0o644, link: str | None = None) -> FileEntry:
    return FileEntry(sha, size, None if link is not None else mode, link)


def test_diff_by_hash_mode_and_kind() -> None:
    local = {
        "same": _e("a"),
        "edited": _e("b", 5),
        "new": _e("c", 7),
        "chmod": _e("d", 2, 0o755),
        "private": _e("p", 3, 0o600),
        "ln": _e("e"),
        "ckpt/best.pt": _e("project's", 9),  # the project now has a file where training wrote one
    }
    remote = {
        "same": _e("a"),
        "edited": _e("z", 5),
        "chmod": _e("d", 2, 0o644),
        "private": _e("p", 3, 0o644),  # someone widened it on the node: repaired like an edit
        "ln": _e("e", link="target"),  # same bytes, but a link there and a file here
        "gone": _e("f"),
        "out/metrics.json": _e("g"),
        "ckpt/last.pt": _e("h"),  # the node made it: never in the record of what we shipped
        "notes.txt": _e("i"),  # we shipped it, then the node rewrote it: the node's now
        "ckpt/best.pt": _e("training's", 9),
    }
    shipped = {
        "gone": remote["gone"].sha256,
        "notes.txt": _e("old").sha256,
        "out/metrics.json": "g",
        **{rel: remote[rel].sha256 for rel in ("edited", "chmod", "private", "ln")},  # as we shipped them
    }
    changes = diff(local, remote, protected=lambda rel: rel.startswith("out/"), shipped=shipped)
    assert changes.added == ["new"]
    assert changes.changed == ["chmod", "edited", "ln", "private"]
    assert changes.kept == ["ckpt/best.pt"]  # no sync put those bytes there: never overwritten
    assert changes.deleted == ["gone"]
    assert changes.deleted_shas == [("gone", remote["gone"].sha256)]
    assert diff(local, remote).deleted == []  # no record (an old or foreign directory): nothing goes
    assert changes.bytes == 7 + 5 + 2 + 1 + 3
    assert changes.to_send == ["chmod", "edited", "ln", "new", "private"]


def test_a_file_a_run_wrote_where_the_project_now_has_a_directory_is_kept() -> None:
    """A run wrote ``results`` (a file) into the code directory; the project later gets ``results/``:
    sync deleted the run's file ("1 deleted", no word). With a record it is kept (named as the node's
    own), the project's files below it are not sent; without a record (a foreign directory) the file
    gives way as before, and a file we shipped there goes as any shipped file does."""
    from orchestrator.steps.codesync.manifest import diff

    local = {"results/readme.txt": _e("hi"), "train.py": _e("t")}
    remote = {"results": _e("the run's"), "train.py": _e("t")}
    changes = diff(local, remote, shipped={"train.py": _e("t").sha256})
    assert (changes.kept, changes.blocked, changes.deleted, changes.to_send) == (
        ["results"],
        ["results/readme.txt"],
        [],
        [],
    )
    assert diff(local, remote).deleted == ["results"]  # no record: the project's directory wins
    ours = diff(local, remote, shipped={"train.py": _e("t").sha256, "results": _e("the run's").sha256})
    assert ours.deleted == ["results"] and ours.to_send == ["results/readme.txt"] and not ours.kept
    link = diff(local, {**remote, "results": _e("x", link="/elsewhere")}, shipped={})
    assert link.deleted == ["results"] and not link.kept  # a link loses nothing but itself


def test_diff_of_equal_trees_is_empty() -> None:
    tree = {"a": _e("1"), "b/c": _e("2", link="../a")}
    assert not diff(tree, dict(tree))


# -- the hash cache -------------------------------------------------------------------------------


def _age(root: Path, seconds: float = 60) -> None:
    past = time.time() - seconds
    for path in root.rglob("*"):
        os.utime(path, (past, past), follow_symlinks=False)


def test_cache_makes_the_second_listing_read_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(50):
        (src / f"m{i}.py").write_text(f"x = {i}\n")
    _age(src)
    cache = tmp_path / "cache.json"
    first = build_tree(src, cache_file=cache)
    assert first.hashed == 50 and len(first.files) == 50
    second = build_tree(src, cache_file=cache)
    assert second.hashed == 0 and second.files == first.files
    # same size, mtime put back: the ctime still tells
    before = (src / "m7.py").stat()
    (src / "m7.py").write_text("x = 9\n")
    os.utime(src / "m7.py", ns=(before.st_atime_ns, before.st_mtime_ns))
    third = build_tree(src, cache_file=cache)
    assert third.hashed == 1 and third.files["m7.py"].sha256 != first.files["m7.py"].sha256


def test_recently_modified_files_are_hashed_again(tmp_path: Path) -> None:
    # racily clean: a change within the same timestamp tick as the hash must not hide behind the cache
    src = tmp_path / "src"
    src.mkdir()
    (src / "fresh.py").write_text("1")
    cache = tmp_path / "cache.json"
    build_tree(src, cache_file=cache)
    assert build_tree(src, cache_file=cache).hashed == 1


def test_missing_source_is_a_usage_error(tmp_path: Path) -> None:
    from orchestrator.errors import UsageError

    with pytest.raises(UsageError, match="not a directory"):
        build_tree(tmp_path / "nope")


# -- where the code goes --------------------------------------------------------------------------


def _inventory(tmp_path: Path, cluster: dict[str, Any], **node: Any) -> Any:
    path = tmp_path / "h.yaml"
    path.write_text(json.dumps({"cluster": cluster, "nodes": [{"name": "a", "host": "h", **node}]}))
    return load_inventory(path)


def test_dest_defaults_follow_launch(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, {}, workdir="/srv/cb/")
    assert code_dest(inv.cluster, inv.nodes[0]) == "/srv/cb/code"
    inv = _inventory(tmp_path, {})
    assert code_dest(inv.cluster, inv.nodes[0]) == "~/cluster-bootstrap/code"
    inv = _inventory(tmp_path, {"train": {"code_dir": "/opt/old"}})
    assert code_dest(inv.cluster, inv.nodes[0]) == "/opt/old"
    inv = _inventory(tmp_path, {"code": {"dest": "~/proj"}})
    assert code_dest(inv.cluster, inv.nodes[0]) == "~/proj"
    assert inv.cluster.train.code_dir == "~/proj"  # launch runs from where sync pushed


def test_dest_and_code_dir_must_agree(tmp_path: Path) -> None:
    from orchestrator.errors import InventoryError

    with pytest.raises(InventoryError, match="differ"):
        _inventory(tmp_path, {"code": {"dest": "/a"}, "train": {"code_dir": "/b"}})


# -- the node script, run here --------------------------------------------------------------------

PROBE = probe_script()  # as a node runs it


def _probe(args: dict[str, Any], home: Path) -> dict[str, Any]:
    env = {**os.environ, "HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, env=env, check=True
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_probe_refuses_home_and_its_parents(tmp_path: Path) -> None:
    home = tmp_path / "users" / "me"
    home.mkdir(parents=True)
    assert "is the home directory" in _probe({"op": "scan", "dest": "~"}, home)["refused"]
    assert "contains the home" in _probe({"op": "scan", "dest": str(tmp_path / "users")}, home)["refused"]
    (tmp_path / "link").symlink_to(home)
    assert "is the home directory" in _probe({"op": "scan", "dest": str(tmp_path / "link")}, home)["refused"]
    assert _probe({"op": "scan", "dest": "~/code"}, home) == {
        "dest": str(home / "code"),
        "exists": False,
        "marked": False,
        "refused": None,
        "files": {},
        "errors": [],
        "posix": True,
        "probe_version": 1,
    }


def _bundle(dest: Path, name: str, delete: list[str], files: list[tuple[str, bytes]]) -> None:
    header = {
        "delete": [[rel, "0" * 64] for rel in delete],
        "files": [[rel, len(data), 0o644, None, "0" * 64] for rel, data in files],
    }
    dest.mkdir(parents=True, exist_ok=True)
    (dest / name).write_bytes(json.dumps(header).encode() + b"\n" + b"".join(d for _, d in files))


def test_apply_refuses_escaping_paths_and_keeps_going(tmp_path: Path) -> None:
    home = tmp_path / "home"
    dest = home / "code"
    (home / "secret").parent.mkdir(parents=True, exist_ok=True)
    (home / "secret").write_text("keep")
    dest.mkdir()
    (dest / "blocker").write_text("a file where a directory is wanted")
    files = [
        ("../escape.txt", b"no"),
        ("blocker/inner.txt", b"no"),
        ("ok.txt", b"fine"),
        (".bootstrap-code.json", b"x"),
    ]
    _bundle(dest, ".bootstrap-code-upload-t", ["../secret", "/etc/passwd", "missing.txt"], files)
    out = _probe({"op": "apply", "dest": "~/code", "bundle": ".bootstrap-code-upload-t"}, home)
    assert out["written"] == 1 and out["deleted"] == 0
    assert len(out["errors"]) == 5, out["errors"]  # missing.txt is simply not there: no error
    assert (dest / "ok.txt").read_bytes() == b"fine"  # the stream stayed aligned past the failures
    assert (home / "secret").read_text() == "keep" and not (home / "escape.txt").exists()
    assert not (dest / ".bootstrap-code-upload-t").exists()


def test_node_and_controller_agree_on_the_tree_digest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "naïve name.py").write_text("x")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("sub")
    tree = build_tree(src)
    unknown = _probe({"op": "scan", "dest": str(src), "rules": [], "expect": tree.digest}, tmp_path)
    assert "same" not in unknown and unknown["shipped"] is None  # no record: nothing known to be ours
    record = {"version": 1, "files": {rel: e.sha256 for rel, e in tree.files.items()}}
    (src / ".bootstrap-code-shipped.json").write_text(json.dumps(record))
    (src / "made_by_training.pt").write_bytes(b"weights")  # not ours: does not make the tree differ
    same = _probe({"op": "scan", "dest": str(src), "rules": [], "expect": tree.digest}, tmp_path)
    assert same["same"] is True and same["files"] == {}
    (src / "run.sh").chmod(0o644)
    differs = _probe({"op": "scan", "dest": str(src), "rules": [], "expect": tree.digest}, tmp_path)
    assert "same" not in differs and differs["files"]["run.sh"][2] == 0o644
    assert differs["files"]["link"][3] == "sub"


def test_probe_skips_what_the_rules_exclude(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    (dest / "outputs").mkdir(parents=True)
    (dest / "outputs" / "big.bin").write_text("x")
    (dest / "keep.py").write_text("x")
    rules = IgnoreRules.build(["outputs/"])
    raw = [[r.base, r.negate, r.dir_only, r.regex.pattern] for r in (*rules.head, *rules.tail)]
    out = _probe({"op": "scan", "dest": str(dest), "rules": raw}, tmp_path)
    assert set(out["files"]) == {"keep.py"}


def test_windows_probe_command_parses_as_powershell() -> None:
    from orchestrator.platforms.powershell import PowerShell
    from tests import pwsh

    args = json.dumps({"op": "scan", "dest": "~/cluster-bootstrap/code", "rules": [], "expect": "x"})
    command = PowerShell().join(["C:\\Python311\\python.exe", "-c", PROBE, args])
    tree = pwsh.assert_parses(command)
    assert not pwsh.errors(tree)


def _reference(pattern: str, text: str) -> bool:
    """Glob by definition, slowly: ``*`` and ``?`` never match ``/``; ``**`` between slashes (or at
    either end) spans directories; every other run of stars is one star."""

    @functools.cache
    def match(p: int, t: int) -> bool:
        if p == len(pattern):
            return t == len(text)
        if pattern[p] == "*":
            q = p
            while q < len(pattern) and pattern[q] == "*":
                q += 1
            if q - p >= 2 and (p == 0 or pattern[p - 1] == "/") and (q == len(pattern) or pattern[q] == "/"):
                if q == len(pattern):
                    return True
                # "**/": zero or more whole directories
                return match(q + 1, t) or any(
                    text[k] == "/" and match(q + 1, k + 1) for k in range(t, len(text))
                )
            return any(match(q, k) for k in range(t, len(text) + 1) if "/" not in text[t:k])
        if t == len(text):
            return False
        if pattern[p] == "?":
            return text[t] != "/" and match(p + 1, t + 1)
        return pattern[p] == text[t] and match(p + 1, t + 1)

    return match(0, 0)


@settings(max_examples=3000, deadline=None)
@given(st.text("ab/*?", min_size=1, max_size=9), st.text("ab/", max_size=9))
def test_globs_match_what_a_glob_means(pattern: str, text: str) -> None:
    from orchestrator.steps.codesync.ignore import _glob

    assert (re.fullmatch(_glob(pattern), text, re.DOTALL) is not None) == _reference(pattern, text)


@pytest.mark.timeout(30)
def test_many_stars_against_a_long_name_answer_at_once() -> None:
    """`*a*a*a*a*a*a*a*a*a*a*a*b` in a .gitignore against a 200-character name of a's: a backtracking
    regex tries every way to place eleven stars (minutes per name); each star keeps its first place."""
    rule = parse_pattern("*a*a*a*a*a*a*a*a*a*a*a*b")
    assert rule is not None
    rules = IgnoreRules([rule])
    name = "a" * 200
    assert not rules.excluded(name) and rules.excluded(name + "b")


def test_apply_deletes_only_files_still_holding_the_shipped_bytes_and_records_what_it_shipped(
    tmp_path: Path,
) -> None:
    """The node script, given deletions with the bytes they were shipped with: a file the node changed
    since (a checkpoint rewritten under a shipped name) stays; the record of what was shipped is
    replaced by the bundle's, plus what could not be deleted (still ours: tried again next time)."""
    import hashlib

    home = tmp_path / "home"
    dest = home / "code"
    dest.mkdir(parents=True)
    (dest / "old.py").write_text("shipped\n")
    (dest / "notes.txt").write_text("rewritten on the node\n")
    shipped_sha = hashlib.sha256(b"shipped\n").hexdigest()
    header = {
        "delete": [["old.py", shipped_sha], ["notes.txt", hashlib.sha256(b"as shipped\n").hexdigest()]],
        "files": [["new.py", 4, 0o644, None, hashlib.sha256(b"new\n").hexdigest()]],
        "shipped": {"new.py": hashlib.sha256(b"new\n").hexdigest()},
    }
    (dest / ".bootstrap-code-upload-t").write_bytes(json.dumps(header).encode() + b"\n" + b"new\n")
    out = _probe({"op": "apply", "dest": "~/code", "bundle": ".bootstrap-code-upload-t"}, home)
    assert (out["written"], out["deleted"], out["errors"]) == (1, 1, [])
    assert not (dest / "old.py").exists() and (dest / "notes.txt").read_text() == "rewritten on the node\n"
    record = json.loads((dest / ".bootstrap-code-shipped.json").read_text())
    assert record == {"version": 1, "files": header["shipped"]}
    assert not list(dest.glob(".bootstrap-code-shipped.json.tmp-*"))


def test_a_second_node_sharing_the_directory_leaves_the_writing_to_the_first(tmp_path: Path) -> None:
    """Two nodes of one sync, one directory (their markers both there): the later one in the order
    writes nothing and says who does; a marker of another sync (another token) does not count."""
    home = tmp_path / "home"
    dest = home / "code"
    for node, token in (("n1", "t1"), ("n2", "t2"), ("n3", "old")):
        scanned = _probe(
            {
                "op": "scan",
                "dest": "~/code",
                "rules": [],
                "create": True,
                "marker": {"name": node, "token": token},
            },
            home,
        )
        assert scanned["marker_error"] is None
    header = {"delete": [], "files": [["a.py", 2, 0o644, None, "0" * 64]], "shipped": {"a.py": "0" * 64}}
    shared = {"tokens": {"n1": "t1", "n2": "t2", "n3": "t3"}, "order": ["n1", "n2", "n3"]}
    for node in ("n2", "n1"):
        (dest / f".bootstrap-code-upload-{node}").write_bytes(json.dumps(header).encode() + b"\nx\n")
    second = _probe(
        {
            "op": "apply",
            "dest": "~/code",
            "bundle": ".bootstrap-code-upload-n2",
            "shared": {**shared, "name": "n2"},
        },
        home,
    )
    assert (second["leader"], second["shared_with"], second["written"]) == ("n1", ["n1"], 0)
    assert not (dest / "a.py").exists() and not (dest / ".bootstrap-code-upload-n2").exists()
    first = _probe(
        {
            "op": "apply",
            "dest": "~/code",
            "bundle": ".bootstrap-code-upload-n1",
            "shared": {**shared, "name": "n1"},
        },
        home,
    )
    assert "leader" not in first and first["shared_with"] == ["n2"] and (dest / "a.py").read_text() == "x\n"


def test_bundles_a_killed_sync_left_here_are_swept_by_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILLed sync left its bundle directory (the changed project, uncompressed) in the temporary
    directory for good: the next sync removes those whose process is gone, and no other."""
    import subprocess

    from orchestrator.steps.codesync import sync

    monkeypatch.setattr(sync.tempfile, "gettempdir", lambda: str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now
    prefix = sync._bundles_prefix()
    dead = tmp_path / f"{prefix}{gone.pid}-abc"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "x.bundle").write_bytes(b"x" * 100)
    alive = tmp_path / f"{prefix}{os.getppid()}-def"
    alive.mkdir()
    elsewhere = tmp_path / f"cb-code-another-host-{gone.pid}-ghi"  # a shared tmp: not this machine's
    elsewhere.mkdir()
    sync._sweep_bundles()
    assert not dead.exists() and alive.exists() and elsewhere.exists()


def test_the_inventory_in_the_project_is_not_shipped_unless_excludes_ship_it(tmp_path: Path) -> None:
    """The nodes never read hosts.yaml: shipped, every edit of it made each launch say the nodes'
    code differs from the project. It is left out; `excludes: ["!/hosts.yaml"]` ships it."""
    from orchestrator.steps.codesync.sync import prepare_tree

    (tmp_path / "train.py").write_text("print('hi')\n")
    inv = tmp_path / "hosts.yaml"
    for excludes, shipped in (("[]", ["train.py"]), ('["!/hosts.yaml"]', ["hosts.yaml", "train.py"])):
        inv.write_text(
            f"cluster: {{name: c, master: a, train: {{script: train.py}}, "
            f"code: {{source: {tmp_path}, excludes: {excludes}}}}}\n"
            "nodes:\n  - {name: a, host: 10.0.0.1}\n"
        )
        tree = prepare_tree(load_inventory(inv), cache_file=tmp_path.parent / f"{tmp_path.name}.cache.json")
        assert sorted(tree.files) == shipped


def test_the_script_launch_uploaded_counts_as_shipped_until_the_next_sync(tmp_path: Path) -> None:
    """`edit, launch` then `edit, bootstrap` (daily.md): launch uploads train.py alone, so the next
    sync found bytes no sync had shipped and warned, on every node, that the node's own train.py was
    kept and ran. launch's record of its upload makes those bytes ours: the sync replaces them, and
    its new record supersedes launch's, which goes."""
    import hashlib

    home = tmp_path / "home"
    dest = home / "code"
    dest.mkdir(parents=True)
    shipped = hashlib.sha256(b"v1\n").hexdigest()
    launched = hashlib.sha256(b"v2\n").hexdigest()
    (dest / "train.py").write_text("v2\n")
    record = {"version": 1, "files": {"train.py": shipped}}
    (dest / ".bootstrap-code-shipped.json").write_text(json.dumps(record))
    # launch appends a line per script it put there: the last of a path counts (an other.py launched
    # since must not make train.py's line go: it did, and train.py then looked like the node's own)
    other = hashlib.sha256(b"other\n").hexdigest()
    lines = [f'{shipped} "train.py"', f'{launched} "train.py"', f'{other} "other.py"', "junk"]
    (dest / ".bootstrap-code-launched").write_text("\n".join(lines) + "\n")
    from orchestrator.steps.codesync.sync import _shipped

    scan = _probe({"op": "scan", "dest": "~/code", "rules": []}, home)
    assert (scan["shipped"], scan["launched"]) == (
        {"train.py": shipped},
        {"train.py": launched, "other.py": other},
    )
    v3 = hashlib.sha256(b"v3\n").hexdigest()
    project = {"train.py": _e(v3)}
    # counted as shipped for the project's own paths only: the record is the node user's to write,
    # and a forged entry for a file of the node's own would have had the sync delete it
    forged = {**scan, "launched": {"train.py": launched, "data.bin": _e("d").sha256}}
    ours = _shipped(forged, project)
    assert ours == {"train.py": launched}
    changes = diff(project, {"train.py": _e(launched), "data.bin": _e("d")}, shipped=ours)
    assert (changes.changed, changes.deleted) == (["train.py"], [])
    header = {"delete": [], "files": [["train.py", 3, 0o644, None, v3]], "shipped": {"train.py": v3}}
    (dest / ".bootstrap-code-upload-t").write_bytes(json.dumps(header).encode() + b"\n" + b"v3\n")
    out = _probe({"op": "apply", "dest": "~/code", "bundle": ".bootstrap-code-upload-t"}, home)
    assert out["errors"] == [] and (dest / "train.py").read_text() == "v3\n"
    assert not (dest / ".bootstrap-code-launched").exists()


def test_a_project_file_where_a_run_made_a_directory_says_what_to_do(tmp_path: Path) -> None:
    """A run wrote outdir/ckpt.bin; the project now has a file named outdir: every sync failed with
    a bare "outdir: Directory not empty". The run's files stay, and the error says why and what to do."""
    import hashlib

    home = tmp_path / "home"
    dest = home / "code"
    (dest / "outdir").mkdir(parents=True)
    (dest / "outdir" / "ckpt.bin").write_bytes(b"weights")
    sha = hashlib.sha256(b"cfg\n").hexdigest()
    header = {"delete": [], "files": [["outdir", 4, 0o644, None, sha]], "shipped": {"outdir": sha}}
    (dest / ".bootstrap-code-upload-t").write_bytes(json.dumps(header).encode() + b"\n" + b"cfg\n")
    out = _probe({"op": "apply", "dest": "~/code", "bundle": ".bootstrap-code-upload-t"}, home)
    assert out["errors"] == [
        "outdir: the node has a directory there holding files no sync put there (a run wrote them), where "
        "the project now has a file: move it away on the node"
    ]
    assert (dest / "outdir" / "ckpt.bin").read_bytes() == b"weights"
