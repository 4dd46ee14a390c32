# Runs on a node, under the node's Python (any 3.x, standard library only), for `bootstrap sync` (code).
# argv[1] is a JSON object:
#   {"op": "scan", "dest": D, "rules": [[base, negate, dir_only, regex], ...], "write_cache": bool,
#    "expect": DIGEST, "create": bool, "marker": {"name": NODE, "token": T} (optional)}
#       prints {"dest", "exists", "marked", "refused", "running": [run ids working in dest now],
#       "files": {rel: [sha256, size, mode, link]},
#       "shipped": {rel: sha256} or null}: mode is the file's permission bits (null for a link, and on
#       Windows, which has none), leaving out what the rules exclude (the controller's ignore rules);
#       "shipped" is the record of what earlier syncs put there (SHIPPED; null: none, an old or foreign
#       directory). When the shipped files' digest is "expect" (the project's), "same": true and no
#       listing (files the node made itself, checkpoints and outputs, do not count). "marker": unless
#       "same", this node's name and this sync's token are left in MARKS, so that nodes sharing dest
#       find out before writing.
#   {"op": "apply", "dest": D, "bundle": NAME, "shared": {"name", "tokens": {node: token}, "order"}}
#       first, when "shared" is given: other nodes of this sync whose marker is in MARKS share dest;
#       only the first of them in "order" applies, the others delete the bundle and print
#       {"shared_with": [...], "leader": NODE}. Then applies the bundle file NAME (inside dest;
#       deleted afterwards): a JSON header line {"delete": [[rel, sha256]...], "files": [[rel, size,
#       mode, link, sha256], ...], "shipped": {rel: sha256}} followed by the contents of the files, in
#       order; prints {"written", "deleted", "errors", "shared_with"}. A file is deleted only while it
#       still holds the bytes we shipped (sha256). Each file gets exactly the header's mode (the
#       controller decided it: manifest.node_mode); while it is written it is owner-only (0600).
#       Last, "shipped" (plus what could not be deleted) becomes the record SHIPPED, replaced
#       atomically: it is what a later sync may delete, nothing else. Uploads earlier syncs cut short
#       left in dest (ten minutes untouched at least) are removed.
# Paths are handled as bytes (UTF-8 with surrogateescape), so names survive any locale. Nothing is ever
# written or deleted through a symbolic link: every directory between dest and a file must be a real
# directory, files are replaced by rename (which replaces a link, never its target).
import errno
import hashlib
import json
import os
import re
import stat
import sys
import time

PROBE_VERSION = 1
RESERVED = b".bootstrap-code"  # our own names at the top of dest: the cache (marker) and uploads
CACHE = b".bootstrap-code.json"
SHIPPED = b".bootstrap-code-shipped.json"  # what syncs put here: the only files a sync may delete
LAUNCHED = b".bootstrap-code-launched"  # what `launch` put here since the last sync: SHA256 "REL" lines
MARKS = b".bootstrap-code-nodes"  # one file per node syncing here: shared destinations are found
CHUNK = 1 << 20
#: Windows has no POSIX modes: reported as null there, and the controller compares accordingly
POSIX = os.name == "posix"


def enc(text):
    return text.encode("utf-8", "surrogateescape")


def dec(raw):
    return raw.decode("utf-8", "surrogateescape")


def resolve(dest):
    path = os.path.expanduser(dest)
    if not os.path.isabs(path):
        path = os.path.join(os.path.expanduser("~"), path)  # like SFTP: relative to the login directory
    return os.path.normpath(path)


RUN_ENV = b"CLUSTER_BOOTSTRAP_RUN="  # every process of a run carries it (orchestrator/runs/layout.py)
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def running_from(path):
    """The runs whose processes work in ``path`` or below it now (their current directory: a launch
    runs the training script from the code directory), by run id; [] where /proc is not there. Only
    processes of this user count: anyone may start one there with a made-up run marker (another
    user's ``sleep`` held up root's sync, with a `stop --run` that could stop nothing)."""
    found = set()
    me = os.geteuid()
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit():
            continue
        try:
            if os.stat("/proc/%s" % pid).st_uid != me:
                continue
            cwd = os.readlink("/proc/%s/cwd" % pid)
            if cwd != path and not cwd.startswith(path.rstrip("/") + "/"):
                continue
            with open("/proc/%s/environ" % pid, "rb") as fh:
                environ = fh.read().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        for entry in environ:
            if entry.startswith(RUN_ENV):
                run_id = entry[len(RUN_ENV) :].decode("utf-8", "replace").split("/")[0]
                if RUN_ID.match(run_id):  # any process may carry any value: only a run id is named
                    found.add(run_id)
    return sorted(found)


def refusal(path):
    """Why dest must not be synced into (sync writes the project's files there), or None. Asked by
    the scan and again by the apply, right before it writes or deletes anything: a path another user
    can change (``unsafe_path``, prepended: probes/safe_path.py) could be swapped for a link to any
    directory between the two (what the scan found there, deleted there by the apply)."""
    said = unsafe_path(path)  # noqa: F821 (prepended)
    if said:
        return said
    real = os.path.realpath(path)
    home = os.path.realpath(os.path.expanduser("~"))
    if os.path.dirname(real) == real:
        return "%s is the root of a file system" % path
    if real == home:
        return "%s is the home directory" % path
    if home.startswith(real.rstrip(os.sep) + os.sep):
        return "%s contains the home directory %s" % (path, home)
    if os.path.lexists(path) and not os.path.isdir(path):
        return "%s exists and is not a directory" % path
    return None


def file_sha(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(CHUNK)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def cache_key(st):
    # ctime too: touch can restore an mtime, nothing can restore a ctime
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino]


def load_cache(root):
    try:
        with open(os.path.join(root, CACHE), "rb") as fh:
            data = json.loads(fh.read().decode("utf-8"))
        if data.get("version") == PROBE_VERSION and isinstance(data.get("entries"), dict):
            return data["entries"]
    except (OSError, ValueError, AttributeError):
        pass
    return {}


def save_json(root, name, doc):
    """Write ``doc`` to root/name atomically (a temporary file renamed over it); False: it failed."""
    path = os.path.join(root, name)
    tmp = path + b".tmp-" + enc(os.urandom(6).hex())
    try:
        with open(tmp, "wb") as fh:
            fh.write(json.dumps(doc).encode("ascii"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def save_cache(root, entries):
    save_json(root, CACHE, {"version": PROBE_VERSION, "entries": entries})


def load_shipped(root):
    """The record of what syncs put here ({rel: sha256}), None when there is none (or it is unreadable:
    then nothing here is known to be ours, and nothing is deleted)."""
    path = os.path.join(root, SHIPPED)
    if os.path.islink(path):
        return None
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) and data.get("version") == PROBE_VERSION else None
    if not isinstance(files, dict):
        return None
    return dict((k, v) for k, v in files.items() if isinstance(k, str) and isinstance(v, str))


def load_launched(root):
    """What `launch` put here since the last sync ({rel: sha256}, the last line of each path), {}
    when nothing: sent back for the controller, which counts it as shipped for the project's own
    paths only (any process of the node's user can write this file)."""
    path = os.path.join(root, LAUNCHED)
    found = {}
    try:
        if os.path.islink(path):
            return found
        with open(path, "rb") as fh:
            lines = fh.read(1 << 20).decode("utf-8", "replace").splitlines()
    except OSError:
        return found
    for line in lines:
        sha, _, rel = line.partition(" ")
        try:
            name = json.loads(rel)
        except ValueError:
            continue
        if len(sha) == 64 and isinstance(name, str):
            found[name] = sha
    return found


def write_marker(root, marker):
    """Leave this node's marker (its name, this sync's token) in root/MARKS, never through a link
    (``marks_write``, prepended: probes/safe_path.py); an error text or None."""
    marks = os.path.join(root, MARKS)
    try:
        marks_write(marks, enc(marker["name"]), enc(marker["token"]))  # noqa: F821 (prepended)
    except OSError as exc:
        return "%s: %s" % (dec(marks), exc.strerror)
    return None


def read_markers(root):
    """{node: token} of the markers in root/MARKS (none when it is a link or a file: refused)."""
    try:
        found = marks_read(os.path.join(root, MARKS))  # noqa: F821 (prepended)
    except OSError:
        return {}
    return dict((dec(name), dec(token.strip())) for name, token in found.items())


def compile_rules(raw):
    return [(base, negate, dir_only, re.compile(regex, re.DOTALL)) for base, negate, dir_only, regex in raw]


def excluded(rules, rel, is_dir):
    """The controller's gitignore verdict for ``rel`` itself (IgnoreRules.verdict): later rules win."""
    for base, negate, dir_only, regex in reversed(rules):
        if dir_only and not is_dir:
            continue
        sub = rel
        if base:
            if not rel.startswith(base + "/"):
                continue
            sub = rel[len(base) + 1 :]
        if regex.fullmatch(sub) is not None:
            return not negate
    return False


def scan(args):
    root_text = resolve(args["dest"])
    out = {"dest": root_text, "exists": False, "marked": False, "refused": None, "files": {}, "errors": []}
    out["posix"] = POSIX
    out["refused"] = refusal(root_text)
    root = enc(root_text)
    if not out["refused"] and args.get("create"):
        try:
            os.makedirs(root, exist_ok=True)  # race-free when nodes share a file system (NFS homes)
        except OSError as exc:
            out["errors"].append("cannot create %s: %s" % (root_text, exc.strerror))
    if out["refused"] or not os.path.isdir(root):
        return out
    out["exists"] = True
    out["running"] = running_from(os.path.realpath(root_text))
    shipped = load_shipped(root)
    out["shipped"] = shipped
    out["launched"] = load_launched(root)
    cache_path = os.path.join(root, CACHE)
    out["marked"] = os.path.isfile(cache_path) and not os.path.islink(cache_path)
    cache = load_cache(root) if out["marked"] else {}
    fresh = {}
    dirty = False
    files = out["files"]
    rules = compile_rules(args.get("rules", []))
    stack = [b""]
    while stack:
        rel_dir = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel_dir) if rel_dir else root))
        except OSError as exc:
            out["errors"].append("%s: %s" % (dec(rel_dir) or ".", exc.strerror))
            continue
        for entry in entries:
            name = entry.name
            if not rel_dir and name.startswith(RESERVED):
                continue
            rel_b = rel_dir + b"/" + name if rel_dir else name
            rel = dec(rel_b)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished meanwhile
            if excluded(rules, rel, stat.S_ISDIR(st.st_mode)):
                continue  # left out of the sync, so never deleted: not even looked at (a venv, outputs)
            if stat.S_ISDIR(st.st_mode):
                stack.append(rel_b)
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(entry.path)
                files[rel] = [hashlib.sha256(target).hexdigest(), len(target), None, dec(target)]
            elif stat.S_ISREG(st.st_mode):
                key = cache_key(st)
                cached = cache.get(rel)
                if isinstance(cached, list) and cached[:4] == key:
                    sha = cached[4]
                else:
                    try:
                        sha = file_sha(entry.path)
                    except OSError as exc:
                        out["errors"].append("%s: %s" % (rel, exc.strerror))
                        continue
                    dirty = True
                fresh[rel] = [*key, sha]
                files[rel] = [sha, st.st_size, stat.S_IMODE(st.st_mode) if POSIX else None, None]
    if out["marked"] and args.get("write_cache") and (dirty or len(fresh) != len(cache)):
        save_cache(root, fresh)
    ours = dict((rel, entry) for rel, entry in files.items() if shipped is not None and rel in shipped)
    if shipped is not None and args.get("expect") and tree_digest(ours) == args["expect"]:
        # what we shipped is exactly the project: no need to send the listing back
        out["same"] = True
        out["files"] = {}
        out["shipped"] = None  # nothing to decide with it: not sent back either
    elif args.get("marker") and args.get("create"):
        # something may be written: leave this node's marker (a node with nothing to write needs none)
        out["marker_error"] = write_marker(root, args["marker"])
    return out


def tree_digest(files):
    """One hash of a whole listing (the controller computes the same: manifest.tree_digest)."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        sha, _, mode, link = files[rel]
        mode_text = "-" if mode is None else "%o" % mode
        line = "%s\0%s\0%s\0%s\n" % (rel, sha, mode_text, "" if link is None else "L" + link)
        digest.update(enc(line))
    return digest.hexdigest()


class Refused(Exception):
    pass


def parts_of(rel):
    """The components of a relative path from the controller, refusing anything leaving dest."""
    parts = enc(rel).split(b"/")
    if not rel or any(p in (b"", b".", b"..") for p in parts) or parts[0].startswith(RESERVED):
        raise Refused("refusing path %r" % rel)
    return parts


def real_dirs(root, parts, create, known):
    """The directory holding parts[-1], checked (and made) one component at a time: never a link."""
    path = root
    for part in parts[:-1]:
        path = os.path.join(path, part)
        if path in known:
            continue
        try:
            st = os.lstat(path)
        except OSError as exc:
            if exc.errno != errno.ENOENT or not create:
                raise
            os.mkdir(path)
            st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise Refused("%s is %s" % (dec(path), kind))
        known.add(path)
    return path


class Stream(object):
    """The bundle after its header: each file's bytes in turn; skip() keeps it aligned after an error."""

    def __init__(self, fh):
        self.fh = fh
        self.left = 0

    def start(self, size):
        self.skip()
        self.left = size

    def copy_to(self, fd):
        while self.left:
            block = self.fh.read(min(CHUNK, self.left))
            if not block:
                raise EOFError("the upload ended early")
            self.left -= len(block)
            view = memoryview(block)
            while view:
                view = view[os.write(fd, view) :]

    def skip(self):
        if self.left:
            self.fh.seek(self.left, 1)
            self.left = 0


def current_sha(path):
    """SHA-256 of a file's bytes (of the link text for a symbolic link), None for anything else."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return hashlib.sha256(os.readlink(path)).hexdigest()
    if stat.S_ISREG(st.st_mode):
        return file_sha(path)
    return None


def leader_of(root, shared):
    """(first node of this sync sharing root, the others sharing it) from the markers in root."""
    me = shared["name"]
    tokens = shared.get("tokens") or {}
    seen = read_markers(root)
    others = sorted(n for n, t in seen.items() if n != me and n in tokens and tokens[n] == t)
    order = list(shared.get("order") or [])
    rank = dict((n, i) for i, n in enumerate(order))
    first = min([me, *others], key=lambda n: (rank.get(n, len(order)), n))
    return first, others


#: an upload no sync is writing any more (a sync cut short: Ctrl-C, a lost connection): its last write
#: is this old; one being written is written to every few milliseconds (ten minutes: on a shared
#: file system, another machine's clock sets its mtime)
STALE_UPLOAD = 600.0
UPLOADS = RESERVED + b"-upload-"


def sweep_uploads(root):
    """The uploads (bundles, and their ``.part`` while they arrive) earlier syncs cut short left in
    dest: removed once stale, regular files only (a link is never followed or removed)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    now = time.time()
    for name in names:
        if not name.startswith(UPLOADS):
            continue
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime >= STALE_UPLOAD:
                os.unlink(path)
        except OSError:
            pass


def apply(args):
    root_text = resolve(args["dest"])
    reason = refusal(root_text)
    if reason:
        return {"written": 0, "deleted": 0, "errors": ["refused: " + reason]}
    root = enc(root_text)
    bundle = os.path.join(root, enc(args["bundle"]))
    shared_with = []
    if args.get("shared"):
        first, shared_with = leader_of(root, args["shared"])
        if first != args["shared"]["name"]:
            try:
                os.unlink(bundle)
            except OSError:
                pass
            return {"written": 0, "deleted": 0, "errors": [], "shared_with": shared_with, "leader": first}
    written = deleted = 0
    errors = []
    known = set()
    cache = load_cache(root)
    kept = {}  # shipped files that could not be deleted: still ours, tried again next time
    done = set()  # files of this upload written: only those (and what was there already) are shipped
    plan = None
    try:
        with open(bundle, "rb") as fh:
            plan = json.loads(fh.readline().decode("ascii"))
            parents = set()
            for rel, sha in plan["delete"]:
                try:
                    parts = parts_of(rel)
                    path = os.path.join(real_dirs(root, parts, False, known), parts[-1])
                    if stat.S_ISDIR(os.lstat(path).st_mode):
                        continue  # only files and links are deleted; emptied directories below
                    if current_sha(path) != sha:
                        continue  # changed on the node since the scan: the node's now, kept
                    os.unlink(path)
                    deleted += 1
                    cache.pop(rel, None)
                    parents.add(os.path.dirname(path))
                except Refused as exc:
                    errors.append(str(exc))
                except OSError as exc:
                    if exc.errno != errno.ENOENT:
                        errors.append("%s: %s" % (rel, exc.strerror))
                        kept[rel] = sha
            # directories the deletions emptied, deepest first, never dest itself
            for directory in sorted(parents, key=len, reverse=True):
                while directory != root and directory.startswith(root + b"/"):
                    try:
                        os.rmdir(directory)
                    except OSError:
                        break
                    known.discard(directory)
                    directory = os.path.dirname(directory)
            stream = Stream(fh)
            for rel, size, mode, link, sha in plan["files"]:
                stream.start(size)
                tmp = None
                try:
                    parts = parts_of(rel)
                    parent = real_dirs(root, parts, True, known)
                    target = os.path.join(parent, parts[-1])
                    if os.path.isdir(target) and not os.path.islink(target):
                        try:  # a directory the project replaced by a file (emptied above)
                            os.rmdir(target)
                        except OSError as exc:
                            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                                raise
                            raise Refused(
                                "the node has a directory there holding files no sync put there (a run"
                                " wrote them), where the project now has a file: move it away on the node"
                            ) from None
                    tmp = os.path.join(parent, b"." + parts[-1][:60] + b".bcs-" + enc(os.urandom(6).hex()))
                    if link is not None:
                        os.symlink(enc(link), tmp)
                    else:
                        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o777:
                            raise Refused("no valid mode for %r in the upload: %r" % (rel, mode))
                        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                        fd = os.open(tmp, flags, 0o600)  # owner-only while its bytes arrive
                        try:
                            stream.copy_to(fd)
                            if POSIX:
                                os.fchmod(fd, mode)  # exactly the controller's, whatever the umask says
                        finally:
                            os.close(fd)
                    os.replace(tmp, target)
                    tmp = None
                    written += 1
                    done.add(rel)
                    if link is None:
                        cache[rel] = [*cache_key(os.lstat(target)), sha]
                except (Refused, OSError) as exc:
                    errors.append("%s: %s" % (rel, getattr(exc, "strerror", None) or exc))
                finally:
                    if tmp is not None:
                        try:
                            os.unlink(tmp)
                        except OSError:
                            pass
    except (OSError, ValueError, KeyError, EOFError) as exc:
        errors.append("cannot read the upload: %s" % (getattr(exc, "strerror", None) or exc))
    finally:
        try:
            os.unlink(bundle)
        except OSError:
            pass
    save_cache(root, cache)
    sweep_uploads(root)
    if plan is not None and isinstance(plan.get("shipped"), dict):
        # what this sync shipped, less what it could not write (a name training made a directory
        # of, an upload cut short): such a path stays as the record had it (an earlier sync's file
        # is still ours, with the bytes it had) and is never recorded as ours by a failure
        before = load_shipped(root) or {}
        unwritten = set(row[0] for row in plan.get("files") or []) - done
        record = dict((rel, sha) for rel, sha in plan["shipped"].items() if rel not in unwritten)
        record.update((rel, before[rel]) for rel in unwritten if rel in before)
        record.update(kept)
        if not save_json(root, SHIPPED, {"version": PROBE_VERSION, "files": record}):
            errors.append("cannot write %s" % dec(os.path.join(root, SHIPPED)))
        else:
            try:  # the new record holds what launch put here too (as it was): launch's goes
                os.unlink(os.path.join(root, LAUNCHED))
            except OSError:
                pass
    return {"written": written, "deleted": deleted, "errors": errors, "shared_with": shared_with}


def main():
    args = json.loads(sys.argv[1])
    out = apply(args) if args.get("op") == "apply" else scan(args)
    out["probe_version"] = PROBE_VERSION
    sys.stdout.write(json.dumps(out) + "\n")


main()
