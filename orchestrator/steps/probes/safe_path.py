# Put before a node-side script (any Python 3.x, standard library only) that writes below a directory
# the inventory names (a workdir, a code destination): the Python side of the POSIX platform's
# check_path (orchestrator/platforms/posix.py, _DIR_FUNCTIONS), for what such a script writes itself.
#
# unsafe_path(path) walks path from "/" one component at a time as the kernel resolves it, following
# each symbolic link into its target, and returns None when every directory met (and every link) belongs
# to root or to us and no other user can write to it (unless it has the sticky bit, as /tmp has), or
# one line "refusing P: why" otherwise: another user could then replace what we write below it (plant a
# link where a file goes, swap a directory for a link to /etc between two steps). Components that do
# not exist yet end the walk (we create them). Not on Windows (no owners of this kind): always None.
import os as _sp_os
import stat as _sp_stat

SAFE_PATH_FIX = (
    "choose a workdir whose every directory only you or root can write to, e.g. under your home (a"
    " directory all can write to, such as /tmp, only with the sticky bit)"
)


def unsafe_path(path):
    if not hasattr(_sp_os, "geteuid"):
        return None
    me = _sp_os.geteuid()

    def who(st):  # as the shell's _cb_who says it
        try:
            import pwd

            name = pwd.getpwuid(st.st_uid).pw_name
        except (ImportError, KeyError):
            name = "UNKNOWN"
        return "owner %s (uid %d), mode %04o" % (name, st.st_uid, _sp_stat.S_IMODE(st.st_mode))

    def why_not(where, st):
        if st.st_uid not in (0, me):
            said = "it belongs to another user (%s), who could replace what bootstrap writes or reads"
            said += " below it"
            return "refusing %s: %s; %s" % (where, said % who(st), SAFE_PATH_FIX)
        mode = st.st_mode
        if not _sp_stat.S_ISLNK(mode) and mode & 0o022 and not mode & 0o1000:
            said = "other users can write to it (%s) and it has no sticky bit, so they could replace what"
            said += " bootstrap writes or reads below it"
            return "refusing %s: %s; %s, or chmod go-w it" % (where, said % who(st), SAFE_PATH_FIX)
        return None

    if not _sp_os.path.isabs(path):
        path = _sp_os.path.join(_sp_os.getcwd(), path)
    try:
        said = why_not("/", _sp_os.lstat("/"))
    except OSError as exc:
        return "refusing /: %s" % exc.strerror
    if said:
        return said
    here, todo, links = "/", [c for c in path.split("/") if c], 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            here = _sp_os.path.dirname(here)
            continue
        step = _sp_os.path.join(here, part)
        try:
            st = _sp_os.lstat(step)
        except FileNotFoundError:
            return None  # from here on, what we create
        except OSError as exc:
            return "refusing %s: %s" % (step, exc.strerror)
        said = why_not(step, st)
        if said:
            return said
        if _sp_stat.S_ISLNK(st.st_mode):
            links += 1
            if links > 40:
                return "refusing %s: too many symbolic links" % step
            target = _sp_os.readlink(step)
            if target.startswith("/"):
                here = "/"
            todo = [c for c in target.split("/") if c] + todo
            continue
        if not _sp_stat.S_ISDIR(st.st_mode):
            return "refusing %s: not a directory" % step
        here = step
    return None


# The markers nodes leave in a directory they may share (code sync's .bootstrap-code-nodes, the
# workdir's and the environment's .cluster-bootstrap-nodes): one file per node, written and read never
# through a link. A link (or a file) put where the markers' directory goes is refused, not followed:
# on a shared file system another node, or a run's code, could otherwise make this node create or
# replace <any directory>/<node name> here.
def _sp_marks(marks, create):
    """``marks`` checked to be a real directory (made when ``create``); a descriptor of it where
    descriptors can be relative to a directory (POSIX), else None (its path is used)."""
    if create:
        try:
            _sp_os.mkdir(marks)
        except FileExistsError:
            pass
    st = _sp_os.lstat(marks)
    if not _sp_stat.S_ISDIR(st.st_mode) or getattr(st, "st_reparse_tag", 0):
        raise OSError(20, "not a directory of its own (a link or a file in its place): refused", marks)
    if hasattr(_sp_os, "O_NOFOLLOW") and _sp_os.open in _sp_os.supports_dir_fd:
        flags = _sp_os.O_RDONLY | getattr(_sp_os, "O_DIRECTORY", 0) | _sp_os.O_NOFOLLOW
        return _sp_os.open(marks, flags)
    return None


def marks_write(marks, name, token):
    """``token`` (bytes) into ``marks``/``name``, replacing it by rename (which replaces a link, never
    writes through it); OSError when it cannot be written."""
    fd = _sp_marks(marks, True)
    dot = b"." if isinstance(name, bytes) else "."
    tmp = dot + name + dot + (b"%d" if isinstance(name, bytes) else "%d") % _sp_os.getpid()
    if fd is None:
        with open(_sp_os.path.join(marks, tmp), "wb") as fh:
            fh.write(token)
        _sp_os.replace(_sp_os.path.join(marks, tmp), _sp_os.path.join(marks, name))
        return
    try:
        try:
            _sp_os.unlink(tmp, dir_fd=fd)
        except FileNotFoundError:
            pass
        flags = _sp_os.O_WRONLY | _sp_os.O_CREAT | _sp_os.O_EXCL | _sp_os.O_NOFOLLOW
        out = _sp_os.open(tmp, flags, 0o644, dir_fd=fd)
        try:
            _sp_os.write(out, token)
        finally:
            _sp_os.close(out)
        _sp_os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        _sp_os.close(fd)


def marks_read(marks):
    """{name: first 200 bytes} of the regular files in ``marks`` (names as ``marks`` is: bytes or
    str; dot files left out); {} when there is no such directory. A link or a file in its place is
    refused (OSError); links and other non-files inside it are not read."""
    try:
        fd = _sp_marks(marks, False)
    except FileNotFoundError:
        return {}
    seen = {}
    if fd is None:
        for name in _sp_os.listdir(marks):
            if not name.startswith(b"." if isinstance(name, bytes) else "."):
                try:
                    with open(_sp_os.path.join(marks, name), "rb") as fh:
                        seen[name] = fh.read(200)
                except OSError:
                    pass
        return seen
    try:
        for name in _sp_os.listdir(fd):
            if name.startswith("."):
                continue
            try:
                flags = _sp_os.O_RDONLY | _sp_os.O_NOFOLLOW | getattr(_sp_os, "O_NONBLOCK", 0)
                got = _sp_os.open(name, flags, dir_fd=fd)
            except OSError:
                continue
            try:
                if _sp_stat.S_ISREG(_sp_os.fstat(got).st_mode):
                    seen[_sp_os.fsencode(name) if isinstance(marks, bytes) else name] = _sp_os.read(got, 200)
            finally:
                _sp_os.close(got)
    finally:
        _sp_os.close(fd)
    return seen
