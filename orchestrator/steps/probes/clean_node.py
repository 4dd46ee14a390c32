# Runs on a node, under the node's Python (any 3.x, standard library only), for `bootstrap clean`.
# argv[1] is a JSON object {"nonce": N, "node": NAME, "workdir": W, "env": P, "code": D, "remove": bool,
# "outputs": bool, "runs": null or {"ids": [...], "older_than": SECONDS, "keep": N} (only run
# directories, those chosen: chosen_runs; the answer then says which, "runs": [ids])};
# the controller puts orchestrator/records.py's encoder (``record``) and probes/safe_path.py's
# ``unsafe_path`` before this text: a group whose directory another user can change (a code directory
# they could swap for a link while its files are hashed) is refused, never listed or removed.
# Finds what bootstrap put on this node, each by its own marker, never by a name alone:
#   env   P (a symlink to P.versions/<id>), the builds in P.versions carrying the stamp STAMP, their
#         upload leftovers (<id>.requirements.txt, <id>.index.env, <id>.job), the wheels bootstrap
#         pushed (P.wheels/*.whl and its hash cache), this node's marker in <parent>/ENV_MARKS
#   code  the files of D that code sync's record SHIPPED lists and that still hold the bytes shipped,
#         the record, the scan cache CACHE, uploads a sync cut short left (UPLOADS*) and this node's
#         marker in MARKS
#   runs  W/runs/<id>/<node>/ holding a launcher (launch.sh, launch.ps1, node.log or pid): the run
#         directory, with the run's outputs (out/); validate's runs (validate-<id>) alike
#   cache the torch probe's answers (torch-facts-*.json in ~/.cache/cluster-bootstrap/) and this
#         node's marker in W/ENV_MARKS (the preflight's shared-directory check)
# then the directories those leave empty (never one holding anything else). Prints one record "clean"
# (nonce N) whose field is the JSON object
# {"items": [{"kind", "path", "bytes", "files"}], "running": [run ids], "removed": bool, "errors": []}
# (with "refused": why, and nothing else found, for a directory another user can change).
# A run whose processes are still alive here (their environment carries RUN_ENV=<id>/<node>/<token>)
# stops everything: nothing is removed, "running" names it.
import errno
import hashlib
import json
import os
import re
import stat
import sys
import time

STAMP = ".cluster-bootstrap-env.json"
ENV_MARKS = ".cluster-bootstrap-nodes"
SHIPPED = ".bootstrap-code-shipped.json"
CACHE = ".bootstrap-code.json"
LAUNCHED = ".bootstrap-code-launched"
MARKS = ".bootstrap-code-nodes"
UPLOADS = ".bootstrap-code-upload-"  # code sync's uploads (probes/code_tree.py)
RUN_ENV = "CLUSTER_BOOTSTRAP_RUN"
LAUNCHERS = ("launch.sh", "launch.ps1", "node.log", "pid", "validate_worker.py", "probe_worker.py")
#: what only a check's run holds (`validate`, `bench`'s probe): not a training run, so never one of
#: the N newest that ``--keep N`` keeps (a validation after every change would push training out)
CHECK_WORKERS = ("validate_worker.py", "probe_worker.py")
OUTPUTS = "out"  # runs/<id>/<node>/out: $CB_RUN_DIR (orchestrator.runs.layout.RUN_OUTPUTS)
#: what a kept run keeps beside its outputs: its log and how it ended (status, logs --follow and stop
#: read them: without them a run that ended long ago looked "not started", and a follow waited forever)
KEPT = (OUTPUTS, "node.log", "node.log.rc", "pid", "stopped", "signalled")


def resolve(path):
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        path = os.path.join(os.path.expanduser("~"), path)
    return os.path.normpath(path)


class Sizes:
    """Bytes and files under paths, each inode counted once (a cloned build shares its files with
    the previous one through hard links)."""

    def __init__(self):
        self.seen = set()

    def measure(self, path):
        total, count = 0, 0
        for top in [path]:
            try:
                st = os.lstat(top)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                return self._file(st)
            for root, dirs, files in os.walk(top):
                for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                    try:
                        size, n = self._file(os.lstat(os.path.join(root, name)))
                    except OSError:
                        continue
                    total += size
                    count += n
        return total, count

    def _file(self, st):
        key = (st.st_dev, st.st_ino)
        if key in self.seen:
            return 0, 1
        self.seen.add(key)
        return st.st_size, 1


def sha256(base, path):
    """The sha256 of the regular file ``path`` below ``base``, reached without following a link
    (:func:`below`); None when it is not one."""
    parent, name = below(base, path)
    if parent is None:
        return None
    try:
        # O_NONBLOCK: a fifo named there does not hold the open (and the clean) until a writer comes
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
    except OSError:
        return None
    finally:
        os.close(parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory training made where a file was shipped
        os.close(fd)
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        try:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        except OSError:
            return None  # unreadable: not known to be ours
    return digest.hexdigest()


# Removal walks from a base directory (the code directory, the workdir, ...) one part at a time, each
# opened without following a link, and removes by name in the directory it opened: a path the record
# names, or a directory on its way, that is (or becomes) a symlink never leads out of the base.


def below(base, path):
    """(fd of the directory holding ``path``'s last part, that part): every part of ``path`` below
    ``base`` a real directory, walked without following links. (None, None) when it is not below
    ``base`` or a part is not a real directory (a symlink: refused, whatever it points to)."""
    rel = os.path.relpath(path, base)
    parts = rel.split(os.sep)
    if any(part in ("", ".", "..") for part in parts):
        return None, None
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None, None
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
    except OSError:
        os.close(fd)
        return None, None
    return fd, parts[-1]


def base_of(path, bases):
    """The deepest of ``bases`` ``path`` is below."""
    found = [b for b in bases if path.startswith(b.rstrip(os.sep) + os.sep)]
    return max(found, key=len) if found else None


def env_paths(path):
    """What bootstrap built for the environment at ``path``: [(path, is_dir)]."""
    out = []
    versions = path + ".versions"
    builds = set()
    if os.path.isdir(versions) and not os.path.islink(versions):
        for name in sorted(os.listdir(versions)):
            full = os.path.join(versions, name)
            if os.path.isdir(full) and not os.path.islink(full) and os.path.isfile(os.path.join(full, STAMP)):
                builds.add(name)
                out.append((full, True))
        for name in sorted(os.listdir(versions)):
            full = os.path.join(versions, name)
            for suffix in (".requirements.txt", ".index.env", ".job"):
                if name.endswith(suffix) and len(name) > len(suffix) and (full, True) not in out:
                    out.append((full, os.path.isdir(full) and not os.path.islink(full)))
    if os.path.islink(path):
        target = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
        if os.path.dirname(target) == versions:
            out.insert(0, (path, False))
    wheels = path + ".wheels"
    if os.path.isdir(wheels) and not os.path.islink(wheels):
        for name in sorted(os.listdir(wheels)):
            full = os.path.join(wheels, name)
            if (name.endswith(".whl") or name == ".sha256-cache.json") and os.path.isfile(full):
                out.append((full, False))
    return out, [versions, wheels]


def code_paths(dest):
    """The files code sync shipped to ``dest`` that still hold the bytes it shipped, and its own."""
    out = []
    try:
        with open(os.path.join(dest, SHIPPED)) as fh:
            shipped = json.load(fh).get("files") or {}
    except (OSError, ValueError, AttributeError):
        shipped = None
    if shipped is None and not os.path.isfile(os.path.join(dest, CACHE)):
        return [], []  # not a directory code sync made: nothing in it is ours
    dirs = set()
    for rel, digest in sorted((shipped or {}).items()):
        full = os.path.normpath(os.path.join(dest, rel))
        # a regular file below dest, reached through real directories only: the record is a file in
        # dest, which a training script (or whoever else can write dest) may have rewritten
        if not full.startswith(dest + os.sep) or sha256(dest, full) != digest:
            continue  # not ours, or changed on the node since it was shipped: someone's edit
        out.append((full, False))
        parent = os.path.dirname(full)
        while parent != dest and parent.startswith(dest + os.sep):
            dirs.add(parent)
            parent = os.path.dirname(parent)
    for own in (SHIPPED, CACHE, LAUNCHED):
        if os.path.isfile(os.path.join(dest, own)):
            out.append((os.path.join(dest, own), False))
    for name in sorted(os.listdir(dest)) if os.path.isdir(dest) else []:
        full = os.path.join(dest, name)
        if name.startswith(UPLOADS) and os.path.isfile(full) and not os.path.islink(full):
            out.append((full, False))  # an upload a sync cut short left behind
    return out, [*sorted(dirs, key=len, reverse=True), dest]


def last_written(directory):
    """When a run last wrote: its node.log's time, else its directory's."""
    for path in (os.path.join(directory, "node.log"), directory):
        try:
            return os.lstat(path).st_mtime
        except OSError:
            continue
    return 0.0


def chosen_runs(runs, node, selection):
    """The run ids under ``runs`` with a directory of ``node``'s that ``selection`` picks (None: every
    run): ``ids`` (these only), ``older_than`` (seconds since it last wrote), ``keep`` (not the newest
    N training runs: a check's run, validate's or bench's probe, is never one of them); each given
    one must hold."""
    found, training = [], []
    for run_id in sorted(os.listdir(runs)):
        mine = os.path.join(runs, run_id, node)
        if os.path.islink(os.path.join(runs, run_id)) or not os.path.isdir(mine) or os.path.islink(mine):
            continue
        if any(os.path.lexists(os.path.join(mine, name)) for name in LAUNCHERS):
            found.append((last_written(mine), run_id))
            if not any(os.path.lexists(os.path.join(mine, name)) for name in CHECK_WORKERS):
                training.append(found[-1])
    if selection is None:
        return [run_id for _, run_id in found]
    newest_first = sorted(training, reverse=True)
    kept = set(run_id for _, run_id in newest_first[: selection.get("keep") or 0])
    ids, older = selection.get("ids"), selection.get("older_than")
    now = time.time()
    return [
        run_id
        for written, run_id in found
        if run_id not in kept and (not ids or run_id in ids) and (older is None or now - written >= older)
    ]


def run_paths(workdir, node, outputs, selection=None):
    """Run directories of ``node`` (those ``selection`` picks: chosen_runs). A run's outputs (``out``:
    $CB_RUN_DIR, checkpoints and what training wrote) stay unless ``outputs``, with the run's
    ``node.log`` (what made them, and the mark a later ``--outputs`` finds the run by) and the files
    saying how it ended (``KEPT``): the rest of that run directory goes. Also the run ids chosen."""
    out = []
    runs = os.path.join(workdir, "runs")
    if not os.path.isdir(runs) or os.path.islink(runs):
        return out, [], []
    parents, named = [], []
    for run_id in chosen_runs(runs, node, selection):
        mine = os.path.join(runs, run_id, node)
        kept = os.path.join(mine, OUTPUTS)
        before = len(out)
        if not outputs and os.path.isdir(kept) and not os.path.islink(kept) and os.listdir(kept):
            for name in sorted(os.listdir(mine)):
                if name not in KEPT:
                    full = os.path.join(mine, name)
                    out.append((full, os.path.isdir(full) and not os.path.islink(full)))
        else:
            out.append((mine, True))
        parents.append(os.path.join(runs, run_id))
        if len(out) > before:  # a run an earlier clean left only its outputs of: nothing to name
            named.append(run_id)
    return out, [*parents, runs], named


def marker_paths(directory, node):
    marks = os.path.join(directory, node)
    return ([(marks, False)] if os.path.isfile(marks) else []), [directory]


def running(workdir, node):
    """Run ids of this workdir whose processes are alive here: this user's (another user's process
    may carry any marker: it would hold up every clean)."""
    found = set()
    suffix = "/" + node
    me = os.geteuid()
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit():
            continue
        try:
            if os.stat("/proc/%s" % pid).st_uid != me:
                continue
            with open("/proc/%s/environ" % pid, "rb") as fh:
                environ = fh.read().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(RUN_ENV.encode() + b"="):
                marker = entry.split(b"=", 1)[1].decode("utf-8", "replace")
                # <id>/<node>/<launcher pid>-<start time> (orchestrator/runs/posix.py run_identity)
                marker = re.sub(r"/[0-9]+-[0-9-]*$", "", marker)
                if marker.endswith(suffix):
                    run_id = marker[: -len(suffix)]
                    if os.path.isdir(os.path.join(workdir, "runs", run_id, node)):
                        found.add(run_id)
    return sorted(found)


def remove(path, is_dir, bases):
    """``path`` removed (``is_dir``: with everything below it) by name in its directory, reached from
    its base without following a link; an OSError when a directory on its way is not a real one."""
    base = base_of(path, bases)
    parent, name = below(base, path) if base is not None else (None, None)
    if parent is None:
        if not os.path.lexists(path):
            return  # listed twice (the environment's marker directory may be the workdir's), or gone
        raise OSError(errno.ELOOP, "not removed: a directory on its way is a symlink, or cannot be opened")
    try:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if is_dir and stat.S_ISDIR(st.st_mode):
            remove_tree(parent, name)
        else:
            os.unlink(name, dir_fd=parent)
    finally:
        os.close(parent)


def remove_tree(parent, name):
    """The directory ``name`` in the directory ``parent`` (an fd) with everything below it; links in
    it are removed, never followed."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    try:
        for name_in in os.listdir(fd):  # an fd: Python 3.3+ (os.scandir(fd) needs 3.7)
            if stat.S_ISDIR(os.stat(name_in, dir_fd=fd, follow_symlinks=False).st_mode):
                remove_tree(fd, name_in)
            else:
                os.unlink(name_in, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def remove_empty(directory, bases):
    """``directory`` removed when it is empty (anything in it stays), reached as :func:`remove` does."""
    base = base_of(directory, bases)
    if base is None:
        os.rmdir(directory)  # a base itself
        return
    parent, name = below(base, directory)
    if parent is None:
        return
    try:
        os.rmdir(name, dir_fd=parent)
    finally:
        os.close(parent)


def main():
    args = json.loads(sys.argv[1])
    try:
        result = clean(args)
    except Exception as exc:  # said in the answer: the controller reads no stderr of a read
        said = "the clean script stopped: %s: %s" % (type(exc).__name__, exc)
        result = {"items": [], "running": [], "removed": False, "errors": [said]}
    sys.stdout.write(record(args["nonce"], "clean", json.dumps(result)))  # noqa: F821 (prepended)


def clean(args):
    node = args["node"]
    workdir = resolve(args["workdir"])
    result = {"items": [], "running": running(workdir, node), "removed": False, "errors": []}
    sizes = Sizes()
    groups = []
    cache = os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cluster-bootstrap"
    )
    # a directory another user can change (they could swap it for a link while its files are
    # hashed): nothing on this node is listed, read or removed
    bases = [workdir, cache]
    bases += [os.path.dirname(resolve(args["env"]))] if args.get("env") else []
    bases += [resolve(args["code"])] if args.get("code") else []
    for said in filter(None, map(unsafe_path, bases)):  # noqa: F821 (prepended)
        result["refused"] = said
        return result
    selection = args.get("runs")  # None: everything; else only run directories, those it picks
    if args.get("env") and selection is None:
        env = resolve(args["env"])
        paths, dirs = env_paths(env)
        marks, mark_dirs = marker_paths(os.path.join(os.path.dirname(env), ENV_MARKS), node)
        chosen = paths + (marks if paths else [])
        groups.append(("env", env, chosen, dirs + (mark_dirs if paths else []), [os.path.dirname(env)]))
    if args.get("code") and selection is None:
        dest = resolve(args["code"])
        paths, dirs = code_paths(dest)
        marks, mark_dirs = marker_paths(os.path.join(dest, MARKS), node)
        groups.append(("code", dest, paths + marks, mark_dirs + dirs, [dest]))
    paths, dirs, chosen = run_paths(workdir, node, bool(args.get("outputs")), selection)
    groups.append(("runs", os.path.join(workdir, "runs"), paths, dirs, [workdir]))
    if selection is not None:  # only the runs chosen: one that is running elsewhere stops nothing
        result["running"] = [run_id for run_id in result["running"] if run_id in chosen]
        result["runs"] = chosen
    paths = []
    if selection is None and os.path.isdir(cache) and not os.path.islink(cache):
        for name in sorted(os.listdir(cache)):
            full = os.path.join(cache, name)
            if name.startswith("torch-facts-") and name.endswith(".json") and os.path.isfile(full):
                paths.append((full, False))
    marks, mark_dirs = (
        ([], []) if selection is not None else marker_paths(os.path.join(workdir, ENV_MARKS), node)
    )
    groups.append(("cache", cache, paths + marks, [*mark_dirs, cache], [cache, workdir]))
    for kind, where, paths, _, _ in groups:
        if not paths:
            continue
        total, count = 0, 0
        for path, _is_dir in paths:
            size, n = sizes.measure(path)
            total += size
            count += n
        result["items"].append({"kind": kind, "path": where, "bytes": total, "files": count})
    if args.get("remove") and not result["running"]:
        for _kind, _, paths, dirs, bases in groups:
            for path, is_dir in paths:
                try:
                    remove(path, is_dir, bases)
                except FileNotFoundError:
                    pass  # gone meanwhile (another check rewrote its torch cache, another clean): as asked
                except OSError as exc:
                    result["errors"].append("%s: %s" % (path, exc.strerror or exc))
            for directory in [*dirs, workdir]:
                try:
                    remove_empty(directory, [*bases, os.path.dirname(workdir)])  # anything in it stays
                except OSError:
                    pass
        result["removed"] = True
    return result


if __name__ == "__main__":
    main()
