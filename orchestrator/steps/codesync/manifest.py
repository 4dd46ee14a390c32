"""The project's side of code sync: which files it has (and their hashes), and what differs on a node.

Listing: in a git work tree with ``gitignore: true``, ``git ls-files --cached --others
--exclude-standard`` (git's own answer: tracked files plus untracked ones no ignore file, global
excludes or ``.git/info/exclude`` mentions); elsewhere a walk applying ``.gitignore`` files with
:mod:`.ignore`. The default and inventory excludes apply on top in both cases.

Modes: each file's permission bits on the nodes come from its mode here (:func:`node_mode`): group
and others never get more than they have here, so a ``.env`` at 0600 stays 0600 on every node.

Hashing: SHA-256 of each file, cached in a local file keyed by (mtime_ns, ctime_ns, size, inode), so a
second sync of an unchanged tree reads no file. Entries modified within ``RACY_NS`` of the moment the
cache was written are hashed again (git's "racily clean" problem: a change in the same timestamp
tick as the hash would otherwise go unseen).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.steps.codesync.ignore import RESERVED_PREFIX, IgnoreRules

log = logging.getLogger(__name__)

CACHE_VERSION = 1
RACY_NS = 2_000_000_000
_CHUNK = 1 << 20


def node_mode(source_mode: int, reachable: int = 0o077) -> int:
    """The permission bits a file gets on the nodes, from its ``st_mode`` here.

    The owner can always read and write it (code sync replaces it) and may run it when anyone may
    here; group and others keep at most the read and run bits they have here, never write:
    0600 -> 0600, 0640 -> 0640, 0644 -> 0644, 0755 -> 0755, 0750 -> 0750, 0664 -> 0644.
    ``reachable``: the group/other bits the file's directories inside the project let through
    (a file in a 0700 directory is nobody else's here, so it is nobody else's there either).
    The one place modes are decided: the node script applies exactly what this returns.
    """
    widest = 0o755 if source_mode & 0o111 else 0o644
    return widest & (0o700 | (source_mode & reachable))


def _dir_reach(mode: int) -> int:
    """The group/other bits a directory lets through to what is inside it (its search bits)."""
    return (0o070 if mode & 0o010 else 0) | (0o007 if mode & 0o001 else 0)


@dataclass(frozen=True)
class FileEntry:
    """One file (or symbolic link) of a tree, as both sides describe it."""

    sha256: str  # of the content; of the link text for a symbolic link
    size: int
    #: permission bits the file has (node) or must have (project, see :func:`node_mode`); None for a
    #: symbolic link, and on nodes without POSIX modes (native Windows)
    mode: int | None
    link: str | None = None  # symbolic link target, as written

    @property
    def executable(self) -> bool:
        return self.mode is not None and bool(self.mode & 0o111)

    def same_as(self, other: FileEntry) -> bool:
        return (
            self.sha256 == other.sha256
            and self.mode == other.mode
            and (self.link is None) == (other.link is None)
        )


@dataclass
class LocalTree:
    """The project as code sync sees it."""

    source: Path
    files: dict[str, FileEntry]
    rules: IgnoreRules  # everything left out (defaults, every .gitignore found, excludes)
    lister: str  # "git" or "walk"
    hashed: int = 0  # files read this time (the rest came from the cache)

    @functools.cached_property
    def digest(self) -> str:
        return tree_digest(self.files)

    @functools.cached_property
    def without_modes(self) -> dict[str, FileEntry]:
        """The files as a node without POSIX modes (native Windows) reports them."""
        return {rel: dataclasses.replace(e, mode=None) for rel, e in self.files.items()}

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())


@dataclass
class Changes:
    """What one node needs: files to send (added or changed) and files to delete."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytes: int = 0  # content bytes to send
    #: each deleted path with the SHA-256 it holds (and was shipped with): the node checks it again
    deleted_shas: list[tuple[str, str]] = field(default_factory=list)
    #: the project's paths where the node holds a file no sync put there as it is (training wrote it,
    #: or it was edited on the node): left as they are, never overwritten
    kept: list[str] = field(default_factory=list)
    #: the project's files below a path where the node holds a file of its own (kept) instead of the
    #: project's directory: not sent, until that file is moved away on the node
    blocked: list[str] = field(default_factory=list)

    @property
    def to_send(self) -> list[str]:
        return sorted([*self.added, *self.changed])

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.deleted)


def diff(
    local: Mapping[str, FileEntry],
    remote: Mapping[str, FileEntry],
    protected: Callable[[str], bool] = lambda rel: False,
    shipped: Mapping[str, str] | None = None,
) -> Changes:
    """What makes ``remote`` hold ``local``: added/changed by content hash and mode; deleted: the
    node's files the project no longer has that an earlier sync put there (``shipped``: path ->
    SHA-256 it had, the node's record of what we sent) and that still hold exactly those bytes.
    A file the node made (checkpoints, outputs) or changed is never deleted; ``protected`` (ignored
    paths) never either. Nor is it overwritten: where a directory has a record (``shipped`` not None),
    a file at one of the project's paths whose bytes no sync put there (a checkpoint training wrote
    where the project now has a file of that name, a file edited on the node) is ``kept``, not
    replaced. Without a record (code copied there by hand before bootstrap) the project's files
    replace what is there, and a file or link where the project needs a directory (``pkg`` when the
    project has ``pkg/a.py``) gives way to it. With a record, such a file no sync put there is kept
    too (training wrote ``results``, the project now has ``results/``): the project's files below it
    are ``blocked``, not sent; a link there still gives way (removing it loses nothing but itself)."""
    changes = Changes()
    ours = shipped or {}
    parents = {rel[:cut] for rel in local for cut in range(len(rel)) if rel[cut] == "/"}
    blockers = set()
    if shipped is not None:
        # a link gives way (removing it loses only the link): a file's bytes would be lost
        blockers = {
            p for p in parents if p in remote and remote[p].link is None and ours.get(p) != remote[p].sha256
        }
    for rel in sorted(local):
        entry = local[rel]
        if blockers and any(rel.startswith(b + "/") for b in blockers):
            changes.blocked.append(rel)
            continue
        there = remote.get(rel)
        if there is None:
            changes.added.append(rel)
        elif entry.same_as(there):
            continue
        elif shipped is not None and there.sha256 != entry.sha256 and ours.get(rel) != there.sha256:
            changes.kept.append(rel)
            continue
        else:
            changes.changed.append(rel)
        changes.bytes += 0 if entry.link is not None else entry.size
    changes.kept += sorted(blockers)
    changes.deleted_shas = sorted(
        (rel, entry.sha256)
        for rel, entry in remote.items()
        if rel not in local
        and not protected(rel)
        and (ours.get(rel) == entry.sha256 or (rel in parents and rel not in blockers))
    )
    changes.deleted = [rel for rel, _ in changes.deleted_shas]
    return changes


def shipped_record(files: Mapping[str, FileEntry]) -> dict[str, str]:
    """What a node records after a sync as "put there by us": every project path -> its SHA-256."""
    return {rel: entry.sha256 for rel, entry in files.items()}


def tree_digest(files: Mapping[str, FileEntry]) -> str:
    """One SHA-256 over a whole listing; the node script computes the same over its own, so an
    unchanged node answers "same" instead of sending its listing back (a few bytes, not 100 kB)."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        entry = files[rel]
        link = "" if entry.link is None else "L" + entry.link
        mode = "-" if entry.mode is None else format(entry.mode, "o")
        line = f"{rel}\0{entry.sha256}\0{mode}\0{link}\n"
        digest.update(line.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


# -- listing ------------------------------------------------------------------------------------


def _git_list(source: Path) -> list[str] | None:
    """Paths git would commit from ``source`` (tracked + untracked not ignored); None: not a work tree."""
    if shutil.which("git") is None:
        return None
    try:
        inside = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(
            ["git", "-C", str(source), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("git unusable in %s (%s): walking the tree instead", source, exc)
        return None
    if listed.returncode != 0:
        # e.g. "dubious ownership" (a checkout owned by another user): the walk applies .gitignore too
        log.info("git ls-files failed in %s: %s", source, listed.stderr.decode(errors="replace").strip())
        return None
    names = {os.fsdecode(raw) for raw in listed.stdout.split(b"\0") if raw}
    return sorted(names)


def _walk(source: Path, rules: IgnoreRules, base: str, gitignore: bool) -> tuple[list[str], IgnoreRules]:
    """Files below ``source/base`` not excluded, applying .gitignore files found on the way; also the
    rules grown by every .gitignore seen (to protect ignored files on the nodes)."""
    found: list[str] = []
    every = rules
    stack: list[tuple[str, IgnoreRules]] = [(base, rules)]
    while stack:
        rel_dir, here = stack.pop()
        directory = source / rel_dir if rel_dir else source
        if gitignore:
            marker = directory / ".gitignore"
            if marker.is_file() and not marker.is_symlink():
                text = marker.read_text(encoding="utf-8", errors="surrogateescape")
                origin = f"{rel_dir}/.gitignore" if rel_dir else ".gitignore"
                here = here.with_gitignore(text, rel_dir, origin)
                every = every.with_gitignore(text, rel_dir, origin)
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            raise UsageError(f"cannot read {directory}: {exc.strerror}") from None
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if here.verdict(rel, is_dir):
                continue
            if is_dir:
                stack.append((rel, here))
            elif entry.is_symlink() or entry.is_file(follow_symlinks=False):
                found.append(rel)
    return found, every


def list_files(
    source: Path, *, excludes: Iterable[str] = (), gitignore: bool = True
) -> tuple[list[str], IgnoreRules, str]:
    """(relative paths to sync, the rules that left the rest out, "git" or "walk")."""
    rules = IgnoreRules.build(tuple(excludes))
    listed = _git_list(source) if gitignore else None
    if listed is None:
        files, every = _walk(source, rules, "", gitignore)
        return _without_reserved(sorted(files)), every, "walk"
    every = rules
    files = []
    for rel in listed:
        if rel.rsplit("/", 1)[-1] == ".gitignore":
            try:
                text = (source / rel).read_text(encoding="utf-8", errors="surrogateescape")
            except OSError:
                text = ""
            base = rel.rsplit("/", 1)[0] if "/" in rel else ""
            every = every.with_gitignore(text, base, rel)
    for rel in listed:
        if rules.excluded(rel):
            continue
        path = source / rel
        try:
            mode = path.lstat().st_mode
        except OSError:
            continue  # tracked but deleted in the work tree
        if stat.S_ISDIR(mode):  # a submodule: its own files, with its own .gitignore files
            inner, every = _walk(source, every, rel, True)
            files.extend(inner)
        elif stat.S_ISREG(mode) or stat.S_ISLNK(mode):
            files.append(rel)
    return _without_reserved(sorted(set(files))), every, "git"


def _without_reserved(files: list[str]) -> list[str]:
    # the destination's own bookkeeping names (its cache, uploads) cannot come from the project
    return [f for f in files if not f.startswith(RESERVED_PREFIX)]


# -- hashing with a cache -------------------------------------------------------------------------


def default_cache_file(source: Path) -> Path:
    """~/.cache/cluster-bootstrap/code/<hash of the source path>.json (XDG_CACHE_HOME respected)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(os.fsencode(str(source))).hexdigest()[:20]
    return root / "cluster-bootstrap" / "code" / f"{digest}.json"


def _read_cache(path: Path | None) -> tuple[int, dict[str, list[Any]]]:
    if path is None:
        return 0, {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0, {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return 0, {}
    entries = data.get("entries")
    written = data.get("written_ns")
    if not isinstance(entries, dict) or not isinstance(written, int):
        return 0, {}
    return written, entries


def _write_cache(path: Path, entries: dict[str, list[Any]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"version": CACHE_VERSION, "written_ns": time.time_ns(), "entries": entries})
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as fh:
            fh.write(body)
        os.replace(fh.name, path)
    except OSError as exc:  # a cache is an optimisation: a read-only home only costs time
        log.info("cannot write the code hash cache %s: %s", path, exc)


def _sha_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def build_tree(
    source: Path,
    *,
    excludes: Iterable[str] = (),
    gitignore: bool = True,
    cache_file: Path | None = None,
) -> LocalTree:
    """List and hash the project at ``source`` (hashes reused from ``cache_file`` when unchanged)."""
    if not source.is_dir():
        raise UsageError(
            f"code source {source} is not a directory",
            hint="set cluster.code.source in the inventory, or run bootstrap from the project directory",
        )
    names, rules, lister = list_files(source, excludes=excludes, gitignore=gitignore)
    written_ns, cached = _read_cache(cache_file)
    fresh: dict[str, list[Any]] = {}
    files: dict[str, FileEntry] = {}
    hashed = 0
    reach: dict[str, int] = {"": 0o077}  # directory (relative) -> group/other bits it lets through

    def reachable(rel_dir: str) -> int:
        known = reach.get(rel_dir)
        if known is None:
            parent = rel_dir.rsplit("/", 1)[0] if "/" in rel_dir else ""
            try:
                here = _dir_reach((source / rel_dir).lstat().st_mode)
            except OSError:
                here = 0
            known = reach[rel_dir] = reachable(parent) & here
        return known

    for rel in names:
        path = source / rel
        try:
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                raw = os.fsencode(target)
                files[rel] = FileEntry(hashlib.sha256(raw).hexdigest(), len(raw), None, target)
                continue
            key = [st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino]
            entry = cached.get(rel)
            if isinstance(entry, list) and entry[:4] == key and st.st_mtime_ns < written_ns - RACY_NS:
                sha = str(entry[4])
            else:
                sha = _sha_file(path)
                hashed += 1
        except FileNotFoundError:
            continue  # deleted while we looked
        except OSError as exc:
            raise UsageError(
                f"cannot read {path}: {exc.strerror}", hint="fix its permissions or exclude it"
            ) from None
        fresh[rel] = [*key, sha]
        parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
        files[rel] = FileEntry(sha, st.st_size, node_mode(st.st_mode, reachable(parent)))
    if cache_file is not None and (hashed or len(fresh) != len(cached)):
        _write_cache(cache_file, fresh)
    return LocalTree(source, files, rules, lister, hashed)
