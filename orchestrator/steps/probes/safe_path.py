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
