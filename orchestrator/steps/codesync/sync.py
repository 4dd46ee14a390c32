"""Push the project to every node: three round trips per node, content hashes decide what moves.

Per node: (1) a probe (``orchestrator/steps/probes/code_tree.py``, the node's Python) walks the destination
and prints every file's SHA-256 (cached on the node, so an unchanged tree reads nothing) and its record of the
files earlier syncs shipped there; (2) when something differs, one bundle (a JSON header line, then the
changed files' bytes) travels through the transport's ``put`` (one SFTP upload, whatever the number of files:
one put per small file costs a round trip each); (3) the probe applies it: deletions, then each file written
beside its target (created owner-only) and renamed over it (atomic per file), never through a symbolic link,
then the new record of what was shipped (renamed into place).

Deletions: only files an earlier sync shipped (the node's record, ``.bootstrap-code-shipped.json``)
that the project no longer has and that still hold the shipped bytes. What training writes into the
code directory (checkpoints, outputs, a file beside the script) is never deleted, ignored or not; a
directory without a record (a first sync, an older version's, a foreign one) loses nothing.

Shared destinations (NFS homes: several nodes, one directory): each scan that finds work leaves the
node's marker (this sync's token) in the destination; after every scan (a barrier), each node about
to write reads the markers and only the first of the nodes sharing it writes; the others report
``synced_by``.

Modes: every file carries the exact permission bits it must have on the node
(:func:`~orchestrator.steps.codesync.manifest.node_mode`: group and others never get more than they
have here, so a 0600 ``.env`` stays 0600); the probe reports each node file's bits and applies the
header's, so a mode changed on either side is a change like a content edit. The bundle itself holds
those files' bytes: it is uploaded owner-only (``put(mode=0o600)``, set before any byte is written).
Native Windows nodes have no POSIX modes (files inherit their directory's ACL): modes are neither
compared nor applied there. Nodes needing the same change share one bundle built once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import BootstrapError, CommandFailedError, TransferError, UnsafeDirectoryError
from orchestrator.executor import Outcome
from orchestrator.facts.base import Read, Sections
from orchestrator.plans import NodePlan, Put, Run
from orchestrator.plans import apply as apply_plan
from orchestrator.platforms import Platform
from orchestrator.runs.layout import in_workdir
from orchestrator.steps.codesync.ignore import RESERVED_PREFIX, IgnoreRules
from orchestrator.steps.codesync.manifest import (
    Changes,
    FileEntry,
    LocalTree,
    build_tree,
    default_cache_file,
    diff,
    shipped_record,
    tree_digest,
)
from orchestrator.steps.node_facts import interpreter_for
from orchestrator.steps.preflight.shared_fs import PLANTED
from orchestrator.view import human_bytes

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.inventory.cluster import Cluster
    from orchestrator.session import Session
    from orchestrator.transports import Result, Transport

#: called with (node name, what is happening now), e.g. ("node2", "sending 3 files (12 KiB)")
ProgressFn = Callable[[str, str], None]

#: ``Session.recall`` key of a node's read-only scan taken by the main pipeline's first round trip
#: (orchestrator/pipeline.py, through the runner: scan_read): spares the scan when it shows nothing to send
SCAN = "codesync.scan"
SCAN_TIMEOUT = 600.0  # the first scan of a large existing tree hashes every file
APPLY_TIMEOUT = 1800.0
NOT_FOUND = 127


class CodeDestRefused(BootstrapError):
    """The destination is not one code sync may write to (a home, a root, a foreign directory)."""


@dataclass
class CodeSyncResult:
    """What code sync did (or, with ``dry_run``, would do) on one node."""

    dest: str  # absolute path on the node
    files: int  # files in the project
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    #: the project's paths where the node holds a file no sync put there as it is: left as they are
    kept: list[str] = field(default_factory=list)
    #: the project's files below a kept file that stands where the project has a directory: not sent
    blocked: list[str] = field(default_factory=list)
    bytes_sent: int = 0  # content bytes of added and changed files
    dry_run: bool = False
    #: the other nodes of this sync whose destination is this same directory (a shared file system)
    shared_with: list[str] = field(default_factory=list)
    #: set when another node sharing the directory wrote it (this one wrote nothing)
    synced_by: str | None = None
    #: what is sent after the comparison (``NodePlan.public_dict``: the bundle, the command applying
    #: it): planned by a dry run, applied by the real one; None when nothing was to send
    plan: dict[str, Any] | None = None

    @property
    def unchanged(self) -> bool:
        """Nothing moved: the node already had exactly the project."""
        return not (self.added or self.changed or self.deleted) and self.synced_by is None

    def summary(self) -> str:
        """One line for the summary table: "unchanged (1000 files)", "2 added, 1 deleted, 3.1 KiB"."""
        if self.synced_by is not None:
            return f"synced from {self.synced_by} (the same directory)"
        kept = f"; {len(self.kept)} kept (the node's own, see below)" if self.kept else ""
        if self.unchanged:
            return f"unchanged ({_files(self.files)}){kept}"
        verb = "would be " if self.dry_run else ""
        parts = [
            f"{len(items)} {verb}{label}"
            for items, label in ((self.added, "added"), (self.changed, "changed"), (self.deleted, "deleted"))
            if items
        ]
        return ", ".join(parts) + f", {human_bytes(self.bytes_sent)}{kept}"

    def file_lines(self, most: int = 50) -> list[str]:
        """What moves, a file a line, as ``rsync -n`` lists it: ``+ added``, ``~ changed``,
        ``- deleted``, ``= kept`` (the node's own); the first ``most``, then how many more."""
        marked = [
            *(f"+ {rel}" for rel in self.added),
            *(f"~ {rel}" for rel in self.changed),
            *(f"- {rel}" for rel in self.deleted),
            *(f"= {rel} (kept: the node's own)" for rel in self.kept),
        ]
        more = [f"... and {len(marked) - most} more (--json lists them all)"] if len(marked) > most else []
        return marked[:most] + more

    def kept_warning(self) -> str:
        """What a human must know about the files kept: which, why, what to do; "" when none."""
        if not self.kept:
            return ""
        shown = ", ".join(self.kept[:5]) + (f" and {len(self.kept) - 5} more" if len(self.kept) > 5 else "")
        below = (
            f" ({len(self.blocked)} project file(s) below a path where the node has a file were not sent)"
            if self.blocked
            else ""
        )
        return (
            f"{shown} in {self.dest}: the node's file is not what bootstrap shipped there (training wrote"
            " it, or it was edited on the node), so it was kept, not replaced by the project's: the node"
            f" runs the project with it{below}; move it away on the node and sync again to ship the project's"
        )

    def public_dict(self) -> dict[str, Any]:
        return {
            "dest": self.dest,
            "files": self.files,
            "unchanged": self.unchanged,
            "added": self.added,
            "changed": self.changed,
            "deleted": self.deleted,
            "kept": self.kept,
            "blocked": self.blocked,
            "bytes_sent": self.bytes_sent,
            "dry_run": self.dry_run,
            "shared_with": self.shared_with,
            "synced_by": self.synced_by,
            **({"plan": self.plan} if self.plan is not None else {}),
        }


def _files(count: int) -> str:
    return f"{count} file" if count == 1 else f"{count} files"


def code_source(cluster: Cluster) -> Path:
    """The project directory on this machine: ``code.source`` (relative to the current directory, as
    ``train.script`` is), else the current directory: the project bootstrap is run from."""
    return Path(os.path.expanduser(cluster.code.source or ".")).resolve()


def code_dest(cluster: Cluster, node: Node) -> str:
    """The code directory on ``node``, as the inventory says it (``~`` expands on the node):
    ``code.dest``, else ``train.code_dir`` (the same directory, older spelling), else
    ``<workdir>/code``: the one directory launch runs the training script from."""
    if cluster.code.dest:
        return cluster.code.dest
    if cluster.train.code_dir:
        return cluster.train.code_dir
    return in_workdir(node, "code")


def probe_script() -> str:
    """The code probe as it runs on a node: with ``unsafe_path`` before it."""
    from orchestrator.steps.preflight.shared_fs import safe_path_source

    tree = resources.files("orchestrator.steps.probes").joinpath("code_tree.py").read_text()
    return safe_path_source() + tree


def _rules_for_probe(rules: IgnoreRules) -> list[list[Any]]:
    return [[r.base, r.negate, r.dir_only, r.regex.pattern] for r in (*rules.head, *rules.tail)]


def _header_entry(rel: str, entry: FileEntry) -> list[Any]:
    size = 0 if entry.link is not None else entry.size  # a link's text travels in the header
    return [rel, size, entry.mode, entry.link, entry.sha256]


class _Bundles:
    """Bundle files shared by nodes that need the same change (built once, uploaded many times)."""

    def __init__(self, tree: LocalTree, directory: Path) -> None:
        self.tree = tree
        self.directory = directory
        self._lock = threading.Lock()
        self._built: dict[str, Path] = {}

    def get(self, changes: Changes, record: dict[str, str]) -> Path:
        """The bundle for ``changes``, ending with ``record``: what the node records as shipped."""
        send = changes.to_send
        # a deletion names the bytes we shipped: the node deletes the file only while it holds them
        deleted = [[rel, record_sha] for rel, record_sha in changes.deleted_shas]
        key = hashlib.sha256(
            json.dumps([send, deleted, sorted(record.items())]).encode("utf-8", "surrogateescape")
        ).hexdigest()
        with self._lock:
            path = self._built.get(key)
            if path is None:
                path = self.directory / f"{key[:24]}.bundle"
                self._write(path, send, deleted, record)
                self._built[key] = path
            return path

    def _write(self, path: Path, send: list[str], deleted: list[list[str]], record: dict[str, str]) -> None:
        files = self.tree.files
        header = {
            "delete": deleted,
            "files": [_header_entry(rel, files[rel]) for rel in send],
            "shipped": record,
        }
        with path.open("wb") as out:
            out.write(json.dumps(header).encode("ascii") + b"\n")
            for rel in send:
                entry = files[rel]
                if entry.link is not None:
                    continue
                data = (self.tree.source / rel).read_bytes()
                # the header promised these bytes: a file edited since it was hashed would land on
                # the node under a stale hash (and its cache would hide it next time)
                if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
                    raise TransferError(
                        f"{rel} changed while it was being synced",
                        hint="run bootstrap sync again once the project is saved",
                    )
                out.write(data)


def probe_command(node: Node, platform: Platform, args: dict[str, Any]) -> str:
    """The command that runs the node-side script (``op`` scan or apply) with the node's Python."""
    return platform.join([interpreter_for(node), "-c", probe_script(), json.dumps(args)])


def scan_args(tree: LocalTree, dest: str, *, windows: bool, dry_run: bool) -> dict[str, Any]:
    """The scan of ``dest`` against ``tree``: ``dry_run`` creates nothing and writes no cache."""
    return {
        "op": "scan",
        "dest": dest,
        "rules": _rules_for_probe(tree.rules),
        "write_cache": not dry_run,
        "create": not dry_run,
        "expect": tree_digest(tree.without_modes) if windows else tree.digest,
    }


def scan_read(node: Node, tree: LocalTree, dest: str) -> Read:
    """The scan of ``dest`` as a read (:data:`SCAN`), read-only: it creates nothing and writes no
    cache (the main pipeline's first round trip asks it; the sync scans for real when it shows work)."""
    args = scan_args(tree, dest, windows=False, dry_run=True)

    def parse(sections: Sections, ran: Result) -> dict[str, Any]:
        output, code = sections.get("code_scan", ("", 1))
        found = parse_probe_output(output) if code == 0 else None
        if found is None:
            raise CommandFailedError("the code scan gave no answer", node=node.name)
        return found

    return Read(
        SCAN,
        lambda platform: [("code_scan", probe_command(node, platform, args))],
        parse,
        timeout=SCAN_TIMEOUT,
    )


def parse_probe_output(stdout: str) -> dict[str, Any] | None:
    """The script's JSON answer (its last line), None when there is none."""
    lines = stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _run_probe(node: Node, transport: Transport, args: dict[str, Any], timeout: float) -> dict[str, Any]:
    return _answer(node, transport.run(probe_command(node, transport.platform, args), timeout=timeout))


def _answer(node: Node, result: Result) -> dict[str, Any]:
    """The code script's answer in ``result``, or a clear error."""
    if result.exit_code == NOT_FOUND:
        raise CommandFailedError(
            f"no Python at {interpreter_for(node)!r} on the node (code sync runs a small standard-library "
            "script there)",
            node=node.name,
            hint="install python3 on the node or set its python: in the inventory",
            result=result,
        )
    if not result.ok or not result.stdout.strip():
        what = "timed out" if result.timed_out else f"failed (exit {result.exit_code})"
        raise CommandFailedError(
            f"the code sync script {what}: {' | '.join(result.tail(3))}", node=node.name, result=result
        )
    data = parse_probe_output(result.stdout)
    if data is None:
        raise CommandFailedError(
            f"the code sync script printed no result: {' | '.join(result.tail(3))}", node=node.name
        )
    return data


def _nothing_to_send(scan: dict[str, Any] | None, local: dict[str, FileEntry], tree: LocalTree) -> bool:
    """Whether a scan taken earlier (read-only: the main pipeline's first round trip) shows the node's
    existing directory already holding exactly the project, with the record of it written."""
    if not scan or scan.get("refused") or scan.get("errors") or not scan.get("exists"):
        return False
    if scan.get("same"):
        return True
    remote = _remote_files(scan.get("files") or {})
    shipped = _shipped(scan, local)
    return not diff(local, remote, tree.rules.excluded, shipped) and shipped == shipped_record(local)


def _shipped(scan: dict[str, Any], local: dict[str, FileEntry]) -> dict[str, str] | None:
    """The node's record of what syncs shipped, with what `launch` uploaded since (the training
    script: its record beside the sync's) for the project's own paths only: that file is the node
    user's to write, and a forged entry must not make a node's own file look like ours to delete."""
    raw = scan.get("shipped")
    if not isinstance(raw, dict):
        return None
    shipped = {str(k): str(v) for k, v in raw.items()}
    launched = scan.get("launched")
    if isinstance(launched, dict):
        shipped.update((str(k), str(v)) for k, v in launched.items() if str(k) in local)
    return shipped


def _remote_files(raw: dict[str, Any]) -> dict[str, FileEntry]:
    return {
        rel: FileEntry(str(sha), int(size), None if mode is None else int(mode), link)
        for rel, (sha, size, mode, link) in raw.items()
    }


def _check_overlap(node: Node, transport: Transport, tree: LocalTree, dest: str) -> None:
    """On this machine, the destination must not be the project or inside it (nor the reverse)."""
    if transport.kind != "local":
        return
    path = Path(os.path.expanduser(dest))
    real_dest = Path(os.path.realpath(path if path.is_absolute() else Path.home() / path))  # as the probe
    source = tree.source
    if real_dest == source or source in real_dest.parents or real_dest in source.parents:
        raise CodeDestRefused(
            f"code dest {dest} overlaps the project {source} on this machine",
            node=node.name,
            hint="set cluster.code.dest (or the node's workdir) to a directory outside the project",
        )


@dataclass
class _Pending:
    """A node whose scan found work: the changes to send and the result to report once applied."""

    node: Node
    transport: Transport
    where: str
    changes: Changes
    record: dict[str, str]  # what the node records as shipped afterwards
    result: CodeSyncResult


def scan_node(
    node: Node,
    transport: Transport,
    tree: LocalTree,
    *,
    dest: str,
    dry_run: bool = False,
    progress: Callable[[str], None] = lambda text: None,
    earlier: dict[str, Any] | None = None,
    marker: dict[str, str] | None = None,
) -> CodeSyncResult | _Pending:
    """Round trip 1: compare ``dest`` on one node with the project. A result when there is nothing
    to write, else what :func:`plan_apply` plans to send (``dry_run``: the comparison only reads).
    ``earlier``: a read-only scan this session already took (:data:`SCAN`): when it shows nothing to
    send, the node is not asked again. ``marker``: this node's name and this sync's token, left in
    ``dest`` (shared destinations)."""
    # native Windows has no POSIX modes: compare without them there (its probe reports none)
    windows = not transport.platform.file_modes
    local = tree.without_modes if windows else tree.files
    _check_overlap(node, transport, tree, dest)  # before the scan, which creates dest
    progress("comparing")
    if _nothing_to_send(earlier, local, tree):
        scan: dict[str, Any] = earlier or {}
    else:
        args = scan_args(tree, dest, windows=windows, dry_run=dry_run)
        if marker is not None and not dry_run:
            args["marker"] = marker
        scan = _run_probe(node, transport, args, SCAN_TIMEOUT)
    where = str(scan.get("dest") or dest)
    if scan.get("refused"):
        refused = str(scan["refused"])
        if refused.startswith("refusing "):  # a path another user can change: said whole, exit 2
            raise UnsafeDirectoryError(refused, node=node.name, hint="nothing was written there")
        raise CodeDestRefused(
            f"refusing to sync code into {refused}: sync writes the project's files there",
            node=node.name,
            hint="set cluster.code.dest to a directory of its own, e.g. ~/cluster-bootstrap/code",
        )
    marker_error = str(scan.get("marker_error") or "")
    if PLANTED in marker_error:  # a link or a file where the nodes' markers go: never written through
        raise CommandFailedError(
            f"cannot leave this node's marker in {where}: {marker_error}",
            node=node.name,
            hint="remove it (bootstrap makes that directory itself), then rerun; nothing was written",
        )
    problems = [str(e) for e in scan.get("errors") or []]
    if problems:  # an unreadable directory would look empty: its files resent
        raise CommandFailedError(
            f"cannot read {where} on the node: {'; '.join(problems[:3])}",
            node=node.name,
            hint="fix the permissions there (the node's user must own its code directory)",
        )
    record = shipped_record(local)
    if scan.get("same"):
        changes, recorded = Changes(), True
    else:
        shipped = _shipped(scan, local)
        changes = diff(local, _remote_files(scan.get("files") or {}), tree.rules.excluded, shipped)
        # a file kept (the node's own) is not recorded as ours: never deleted, never overwritten
        # later, and a launch sees that the node's code is not the project's
        left = {*changes.kept, *changes.blocked}  # not ours there: never sent, never recorded
        record = {rel: sha for rel, sha in record.items() if rel not in left}
        recorded = shipped == record
    result = CodeSyncResult(
        dest=where,
        files=len(tree.files),
        added=changes.added,
        changed=changes.changed,
        deleted=changes.deleted,
        kept=changes.kept,
        blocked=changes.blocked,
        bytes_sent=changes.bytes,
        dry_run=dry_run,
    )
    if not changes and recorded:
        progress(result.summary())
        return result
    if (running := [str(r) for r in scan.get("running") or []]) and not dry_run:
        raise CodeInUseError(
            f"run {', '.join(running)} is running from {where} on this node: syncing now would change "
            "its code under it (what it imports later, a restart of its ranks); nothing was written",
            node=node.name,
            hint=f"`bootstrap stop --run {running[0]}` first, or sync once it has ended",
        )
    return _Pending(node, transport, where, changes, record, result)


class CodeInUseError(CommandFailedError):
    """A node's code directory that a run is running from: not synced (its code would change under it)."""


#: the temporary directories holding a sync's bundles: ``cb-code-<host>-<pid>-<random>`` (the host:
#: a temporary directory shared between machines holds other machines' syncs, whose pids mean
#: nothing here)
BUNDLES_PREFIX = "cb-code-"


def _bundles_prefix() -> str:
    host = "".join(c if c.isalnum() or c in "._" else "_" for c in socket.gethostname())
    return f"{BUNDLES_PREFIX}{host}-"


def _sweep_bundles() -> None:
    """The bundle directories of this machine's syncs whose process is gone (SIGKILLed: a sync's
    whole changed project, uncompressed, was left in the temporary directory for good): removed, when
    they are this user's. A directory whose pid is alive (that sync, or a process that reused its
    pid) stays."""
    base = Path(tempfile.gettempdir())
    prefix = _bundles_prefix()
    try:
        names = [n for n in os.listdir(base) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive
        except ProcessLookupError:
            pass
        except OSError:
            continue  # another user's process: not ours to judge
        path = base / name
        try:
            st = path.lstat()
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def new_token() -> str:
    """This sync's marker token for one node (shared destinations)."""
    return secrets.token_hex(8)


def upload_name() -> str:
    """The bundle's file name in the destination (reserved: never a project file)."""
    return f"{RESERVED_PREFIX}-upload-{secrets.token_hex(6)}"


def plan_apply(pending: _Pending, bundles: _Bundles, *, shared: dict[str, Any] | None = None) -> NodePlan:
    """What rounds 2 and 3 send: the bundle (owner-only: it carries the bytes of files that are
    private here, .env at 0600), then the command applying it (deletions, files, then the record of
    what was shipped). ``shared``: this sync's markers (node -> token) and node order: a node finding
    another one's marker in its destination leaves the writing to the first of them."""
    node, where, changes = pending.node, pending.where, pending.changes
    bundle = bundles.get(changes, pending.record)
    name = upload_name()
    args: dict[str, Any] = {"op": "apply", "dest": where, "bundle": name}
    if shared is not None:
        args["shared"] = {**shared, "name": node.name}
    sending = f"{_files(len(changes.to_send))} ({human_bytes(changes.bytes)})"
    return NodePlan(
        node.name,
        [
            Put(f"{where.rstrip('/')}/{name}", source=bundle, mode=0o600, what=f"the changes: {sending}"),
            Run(
                probe_command(node, pending.transport.platform, args),
                timeout=APPLY_TIMEOUT,
                what=f"apply them in {where}: {len(changes.deleted)} deleted, {sending} written",
            ),
        ],
    )


def apply_node(
    pending: _Pending, plan: NodePlan, *, progress: Callable[[str], None] = lambda text: None
) -> CodeSyncResult:
    """Rounds 2 and 3: apply ``plan`` (:func:`plan_apply`) on the node, then judge its answer."""
    node, where, changes, result = pending.node, pending.where, pending.changes, pending.result
    if changes:
        progress(f"sending {_files(len(changes.to_send))} ({human_bytes(changes.bytes)})")
    applied = _answer(node, apply_plan(plan, pending.transport)[-1])
    result.shared_with = sorted(str(n) for n in applied.get("shared_with") or [])
    if applied.get("leader"):
        result.synced_by = str(applied["leader"])
        result.added, result.changed, result.deleted, result.bytes_sent = [], [], [], 0
        progress(result.summary())
        return result
    errors = [str(e) for e in applied.get("errors") or []]
    if errors:
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise CommandFailedError(
            f"code sync into {where} failed for {len(errors)} paths: {'; '.join(errors[:3])}{more}",
            node=node.name,
            hint="files already written are complete (each is replaced atomically); fix the cause and "
            "run bootstrap sync again",
        )
    progress(result.summary())
    return result


def sync_node(
    node: Node,
    transport: Transport,
    tree: LocalTree,
    bundles: _Bundles,
    *,
    dest: str,
    dry_run: bool = False,
    progress: Callable[[str], None] = lambda text: None,
    earlier: dict[str, Any] | None = None,
) -> CodeSyncResult:
    """Make ``dest`` on one node hold the project (``tree``), alone: :func:`scan_node`, then
    :func:`plan_apply` and :func:`apply_node` when something must be written."""
    scanned = scan_node(node, transport, tree, dest=dest, dry_run=dry_run, progress=progress, earlier=earlier)
    if isinstance(scanned, CodeSyncResult):
        return scanned
    plan = plan_apply(scanned, bundles)
    if dry_run:
        scanned.result.plan = plan.public_dict(transport)
        return scanned.result
    return apply_node(scanned, plan, progress=progress)


def inventory_rule(inventory: Inventory, source: Path) -> list[str]:
    """The inventory file, when it lies in the project: left out (the nodes never read it, and every
    edit of it would make each node's code differ from the project); ``excludes`` can ship it
    (``"!/hosts.yaml"``). A name with pattern characters in it is not matched by a rule: shipped."""
    try:
        where = Path(str(inventory.source)).resolve().relative_to(source.resolve()).as_posix()
    except (OSError, ValueError):
        return []  # elsewhere, or the embedded inventory
    return [] if re.search(r"[][*?!#\\ ]", where) else [f"/{where}"]


def prepare_tree(inventory: Inventory, *, cache_file: Path | None = None) -> LocalTree:
    """The project listed and hashed (the local part of code sync, done once for all nodes)."""
    code = inventory.cluster.code
    source = code_source(inventory.cluster)
    return build_tree(
        source,
        excludes=[*inventory_rule(inventory, source), *code.excludes],
        gitignore=code.gitignore,
        cache_file=cache_file or default_cache_file(source),
    )


def sync_code(
    session: Session,
    inventory: Inventory,
    nodes: list[Node],
    *,
    dry_run: bool = False,
    on_progress: ProgressFn | None = None,
) -> list[Outcome[CodeSyncResult]]:
    """Push the project (``cluster.code``) to ``nodes`` in parallel; one outcome per node, in order.

    Only files whose content hash or mode differs travel; files the project no longer has are deleted
    on the node when an earlier sync shipped them (never what the node wrote: checkpoints, outputs).
    An unchanged node costs one round trip and reads no file on either side (both keep hash caches).
    Nodes whose destination is one directory write it once, from the first of them.
    ``dry_run``: compare only (the node's cache is not written) and report what would move, with
    the plan (``CodeSyncResult.plan``) the real run applies: the bundle, the command applying it.
    ``on_progress(node, text)``: called from worker threads as each node moves on.

    Raises :class:`UsageError` before contacting any node when the source directory is unusable;
    per-node failures (unreachable, refused destination, write errors) are in the outcomes.
    """
    tree = prepare_tree(inventory)
    tokens = {n.name: new_token() for n in nodes} if len(nodes) > 1 else {}

    def progress_of(node: Node) -> Callable[[str], None]:
        def progress(text: str) -> None:
            if on_progress is not None:
                on_progress(node.name, text)

        return progress

    def scan(node: Node, transport: Transport) -> CodeSyncResult | _Pending:
        earlier = session.recall(node.name, SCAN)
        session.forget(node.name, SCAN)  # read once: after this step it would be history
        return scan_node(
            node,
            transport,
            tree,
            dest=code_dest(inventory.cluster, node),
            dry_run=dry_run,
            progress=progress_of(node),
            earlier=earlier if isinstance(earlier, dict) else None,
            marker={"name": node.name, "token": tokens[node.name]} if tokens else None,
        )

    scanned = session.map(scan, step="code compare", nodes=nodes)
    pending = {o.node: o.value for o in scanned if isinstance(o.value, _Pending)}
    # Every scan has left its marker (the end of a fan-out is a barrier): a node applying now finds
    # the markers of every other node writing into the same directory, and only the first one writes.
    writers = [n for n in nodes if n.name in pending]
    shared = (
        {
            "tokens": {n.name: tokens[n.name] for n in writers},
            "order": [n.name for n in writers],
        }
        if len(writers) > 1
        else None
    )
    if not dry_run:
        _sweep_bundles()
    with tempfile.TemporaryDirectory(prefix=f"{_bundles_prefix()}{os.getpid()}-") as tmp:
        bundles = _Bundles(tree, Path(tmp))
        plans = {n.name: plan_apply(pending[n.name], bundles, shared=shared) for n in writers}
        for name, plan in plans.items():
            pending[name].result.plan = plan.public_dict(pending[name].transport)
        if dry_run:
            applied = {}
            for waiting in pending.values():
                progress_of(waiting.node)(waiting.result.summary())
        else:
            applied = {
                o.node: o
                for o in session.map(
                    lambda node, transport: apply_node(
                        pending[node.name], plans[node.name], progress=progress_of(node)
                    ),
                    step="code sync",
                    nodes=writers,
                )
            }
    merged: list[Outcome[CodeSyncResult]] = []
    for first in scanned:
        second = applied.get(first.node)
        if second is not None:
            merged.append(dataclasses.replace(second, duration=first.duration + second.duration))
        elif isinstance(first.value, _Pending):  # a dry run: the result with its plan
            merged.append(Outcome(first.node, first.value.result, None, first.duration, first.finished))
        else:
            merged.append(Outcome(first.node, first.value, first.error, first.duration, first.finished))
    return merged
