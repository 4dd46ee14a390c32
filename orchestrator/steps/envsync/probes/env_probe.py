# Runs on a node, under the node's own Python (any 3.x, standard library only): prints one JSON line
# describing what `bootstrap sync` needs to decide, so an unchanged node costs ONE round trip:
# the interpreter (version, wheel platform tags), uv on PATH, the managed venv (its stamp and the
# versions installed in it) and, when asked, a listing of the node's wheelhouse with SHA-256 hashes.
# Argument: a JSON object {"path": venv path ("~" allowed), "stamp": file name, "wheelhouse": dir|null,
# "create_wheelhouse": bool, "marker": {"dir", "name", "token", "marker_dir"} (optional: written, see
# write_marker), "index": {"urls", "node_default", "timeout", "unless"} (optional: see index_check),
# "safe": the directory walked first (unsafe_path: another user's directory: {"unsafe": why} alone)}.
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time

# the same listing the build prints (orchestrator/steps/envsync/ops.py LIST_CODE): PEP 503 names
LIST_CODE = (
    "import json, re, sys\n"
    "from importlib import metadata\n"
    "out = {}\n"
    "for d in metadata.distributions():\n"
    "    name = d.metadata['Name']\n"
    "    if name:\n"
    "        out[re.sub(r'[-_.]+', '-', name).lower()] = d.version\n"
    "print(json.dumps({'packages': out, 'python': '%d.%d.%d' % sys.version_info[:3]}))\n"
)


def venv_python(path):
    if os.name == "nt":
        return os.path.join(path, "Scripts", "python.exe")
    return os.path.join(path, "bin", "python")


def manylinux_platforms(machine, libc):
    """Platform tags a wheel may carry to install here (pip's --platform does not expand manylinux_X_Y)."""
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine.lower())
    tags = []
    name, version = libc
    if name == "glibc" and version:
        try:
            major, minor = [int(p) for p in version.split(".")[:2]]
        except ValueError:
            major, minor = 0, 0
        if major == 2:
            for m in range(minor, 4, -1):
                tags.append("manylinux_2_%d_%s" % (m, arch))
                legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(m)
                if legacy and ((m != 12 and m != 5) or arch in ("x86_64", "i686")):
                    tags.append("%s_%s" % (legacy, arch))
    tags.append("linux_%s" % arch)
    return tags


def python_info():
    info = {
        "executable": sys.executable,
        "version": "%d.%d.%d" % sys.version_info[:3],
        "implementation": platform.python_implementation().lower(),
        "abi": "cp%d%d" % sys.version_info[:2],
        "sysconfig_platform": sysconfig.get_platform(),
        "machine": platform.machine(),
        "os": os.name,
        "venv_module": importlib.util.find_spec("venv") is not None
        and importlib.util.find_spec("ensurepip") is not None,
    }
    info.update(pip_info())
    if os.name == "nt":
        info["platforms"] = [sysconfig.get_platform().replace("-", "_").replace(".", "_")]
        info["libc"] = ""
    else:
        libc = platform.libc_ver()
        info["libc"] = "%s %s" % libc if libc[0] else ""
        info["platforms"] = manylinux_platforms(platform.machine(), libc)
    return info


def pip_info():
    """How pip can install into a venv made --without-pip (ensurepip costs many seconds per venv):
    this interpreter's own pip (``--python``, pip >= 22.3), or a pip wheel shipped with Python
    (runnable as ``python pip.whl/pip``)."""
    out = {"pip": None, "pip_wheel": None}
    if importlib.util.find_spec("pip") is not None:
        try:
            from importlib import metadata

            out["pip"] = metadata.version("pip")
        except Exception:
            out["pip"] = None
    candidates = []
    spec = importlib.util.find_spec("ensurepip")
    if spec is not None and spec.origin:
        candidates.append(os.path.join(os.path.dirname(spec.origin), "_bundled"))
    candidates.append("/usr/share/python-wheels")  # Debian/Ubuntu keep ensurepip's wheels here
    for directory in candidates:
        try:
            names = sorted(n for n in os.listdir(directory) if n.startswith("pip-") and n.endswith(".whl"))
        except OSError:
            continue
        if names:
            out["pip_wheel"] = os.path.join(directory, names[-1])
            break
    return out


def find_uv():
    """uv on PATH, else where its installer puts it (~/.local/bin, ~/.cargo/bin): SSH sessions are
    not login shells, so their PATH often lacks those."""
    found = shutil.which("uv")
    if found:
        return found
    exe = "uv.exe" if os.name == "nt" else "uv"
    for directory in ("~/.local/bin", "~/.cargo/bin"):
        candidate = os.path.join(os.path.expanduser(directory), exe)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def read_stamp(path, name):
    try:
        with open(os.path.join(path, name)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def venv_info(path, stamp_name):
    out = {"path": path, "state": "missing", "target": None, "stamp": None, "packages": None}
    junction = None
    if os.name == "nt" and not os.path.islink(path) and os.path.isdir(path):
        try:  # a directory junction (what Windows nodes use): readlink reads it on 3.8+
            junction = os.readlink(path)
        except (OSError, ValueError, AttributeError):
            junction = None
    if os.path.islink(path) or junction:
        out["state"] = "link"
        out["target"] = junction or os.readlink(path)
    elif os.path.isdir(path):
        out["state"] = "dir"
    elif os.path.lexists(path):
        out["state"] = "other"
    if out["state"] not in ("link", "dir") or not os.path.isdir(path):
        return out
    out["stamp"] = read_stamp(path, stamp_name)
    python = venv_python(path)
    if not os.path.exists(python):
        out["error"] = "no interpreter at %s" % python
        return out
    direct = read_installed(path)
    if direct is not None:
        out["packages"], out["python"] = direct
        return out
    try:
        proc = subprocess.run(
            [python, "-c", LIST_CODE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as exc:
        out["error"] = str(exc)
        return out
    if proc.returncode != 0:
        out["error"] = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["failed"]
        out["error"] = out["error"][0]
        return out
    data = json.loads(proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    out["packages"] = data.get("packages")
    out["python"] = data.get("python")
    return out


def read_installed(path):
    """(packages, python version) of the venv read from its files by this interpreter, or None.

    Saves starting the venv's own interpreter on every unchanged sync. Only when this interpreter is
    the venv's Python (same X.Y in pyvenv.cfg): site-packages layout and metadata are then the same.
    """
    try:
        from importlib import metadata
    except ImportError:
        return None
    version = None
    try:
        with open(os.path.join(path, "pyvenv.cfg")) as fh:
            for line in fh:
                key, _, value = line.partition("=")
                if key.strip() in ("version_info", "version"):
                    version = value.strip()
                    if key.strip() == "version_info":
                        break
    except OSError:
        return None
    if not version or version.split(".")[:2] != [str(p) for p in sys.version_info[:2]]:
        return None
    if os.name == "nt":
        site = os.path.join(path, "Lib", "site-packages")
    else:
        site = os.path.join(path, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    if not os.path.isdir(site):
        return None
    packages = {}
    for dist in metadata.distributions(path=[site]):
        name = dist.metadata["Name"]
        if name:
            packages[re.sub(r"[-_.]+", "-", name).lower()] = dist.version
    return packages, ".".join(version.split(".")[:3])


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheelhouse_listing(directory, create):
    # Hashing multi-GB wheels (torch) on every sync would cost seconds: hashes are cached by
    # (size, mtime) in a file beside them.
    if create and not os.path.isdir(directory):
        os.makedirs(directory)
    if not os.path.isdir(directory):
        return {"dir": directory, "files": {}}
    cache_path = os.path.join(directory, ".sha256-cache.json")
    try:
        with open(cache_path) as fh:
            cache = json.load(fh)
    except (OSError, ValueError):
        cache = {}
    files, fresh = {}, {}
    for name in sorted(os.listdir(directory)):
        full = os.path.join(directory, name)
        if name.startswith(".") or not os.path.isfile(full):
            continue
        st = os.stat(full)
        sig = "%d:%d" % (st.st_size, st.st_mtime_ns)
        known = cache.get(name)
        digest = known[1] if known and known[0] == sig else sha256(full)
        files[name] = digest
        fresh[name] = [sig, digest]
    if fresh != cache:
        try:
            with open(cache_path + ".tmp", "w") as fh:
                json.dump(fresh, fh)
            os.replace(cache_path + ".tmp", cache_path)
        except OSError:
            pass
    return {"dir": directory, "files": files}


def write_marker(marker):
    """This node's marker for the shared-directory check (orchestrator/steps/preflight/shared_fs.py):
    a file named after the node, holding this sync's token, in <dir>/<marker_dir>/."""
    path = os.path.abspath(os.path.expanduser(marker["dir"]))
    marks = os.path.join(path, marker["marker_dir"])
    refused = unsafe_path(path)  # noqa: F821 (prepended: probes/safe_path.py)
    if refused:  # another user could plant a link where the marker (or a build) goes
        return {"path": path, "error": refused}
    try:
        if not os.path.isdir(marks):
            os.makedirs(marks)
        tmp = os.path.join(marks, ".%s.%d" % (marker["name"], os.getpid()))
        with open(tmp, "w") as fh:
            fh.write(marker["token"])
        os.replace(tmp, os.path.join(marks, marker["name"]))
    except OSError as exc:
        return {"path": path, "error": "%s: %s" % (exc.filename or path, exc.strerror or exc)}
    return {"path": path}


def stamp_key(spec_digest, fmt):
    """The key a build for this interpreter carries (orchestrator/steps/envsync/spec.py stamp_key)."""
    platform_key = "%s-%s-cp%d%d" % (
        sysconfig.get_platform(),
        platform.python_implementation().lower(),
        sys.version_info[0],
        sys.version_info[1],
    )
    material = {
        "format": fmt,
        "spec": spec_digest,
        "python": "%d.%d.%d" % sys.version_info[:3],
        "platform": platform_key,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def pip_config_index():
    """The index pip uses here when the sync names none: PIP_INDEX_URL, else index-url of the pip
    configuration files (later files win, [install] over [global]), else PyPI; None with no-index."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    try:
        import configparser
    except ImportError:
        return "https://pypi.org/simple/"
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    dirs = [d for d in (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep) if d]
    files = [os.path.join(d, "pip", "pip.conf") for d in reversed(dirs)] + ["/etc/pip.conf"]
    files += [os.path.join(home, ".pip", "pip.conf"), os.path.join(xdg, "pip", "pip.conf")]
    files += [os.path.join(sys.prefix, "pip.conf")]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(os.environ["PIP_CONFIG_FILE"])
    url, no_index = "https://pypi.org/simple/", False
    for name in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(name)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in ("global", "install"):
            if parser.has_option(section, "index-url"):
                url = parser.get(section, "index-url").strip() or url
            if parser.has_option(section, "no-index"):
                no_index = parser.get(section, "no-index").strip().lower() in ("1", "true", "yes", "on")
    return None if no_index else url


def reach(url, timeout):
    """None when ``url`` answers (any HTTP status: the index is there), else why not."""
    from urllib.parse import urlsplit

    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        return None  # a local directory (file://): the installer reports what is wrong with it
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # it answered (401, 404, 405...): reachable
    except urllib.error.URLError as exc:
        reason = exc.reason
        if type(reason).__name__.startswith("SSL"):
            return None  # it answered; a certificate problem is the installer's to report
        return str(getattr(reason, "strerror", None) or reason)
    except Exception as exc:  # a timeout, a reset connection, a bad URL
        return str(exc) or type(exc).__name__
    return None


class IndexCheck:
    """Can this node reach the index the installer will use? Each URL is tried in its own thread
    (a name lookup cannot be given a timeout: a missing DNS server would block the whole probe), and
    :meth:`result` waits until the deadline at most."""

    def __init__(self, spec):
        self.timeout = float(spec.get("timeout") or 4)
        self.deadline = time.monotonic() + self.timeout
        urls = list(spec.get("urls") or [])
        if spec.get("node_default"):
            own = pip_config_index()
            if own:
                urls.insert(0, own)
        self.urls = list(dict.fromkeys(urls))
        self.failed = {}
        self.threads = []
        for url in self.urls:
            thread = threading.Thread(target=self._try, args=(url,), daemon=True)
            thread.start()
            self.threads.append((url, thread))

    def _try(self, url):
        why = reach(url, self.timeout)
        if why is not None:
            self.failed[url] = why

    def result(self):
        failed = []
        for url, thread in self.threads:
            thread.join(max(0.0, self.deadline - time.monotonic()))
            if thread.is_alive():
                failed.append({"url": url, "error": "no answer within %g s" % self.timeout})
            elif url in self.failed:
                failed.append({"url": url, "error": self.failed[url]})
        return {"urls": self.urls, "failed": failed}


def index_check(args, path):
    """Started before the rest of the probe, so that its wait overlaps the probe's own work. Skipped
    when the environment's stamp says it is current (``unless``: the keys it may carry): an
    unchanged node installs nothing and needs no index."""
    spec = args.get("index")
    if not spec:
        return None
    unless = spec.get("unless")
    if unless:
        stamp = read_stamp(path, args["stamp"]) or {}
        keys = [stamp_key(digest, unless.get("format")) for digest in unless.get("specs") or []]
        if stamp.get("key") in keys:
            return None
    return IndexCheck(spec)


def main():
    args = json.loads(sys.argv[1])
    path = os.path.abspath(os.path.expanduser(args["path"]))
    if args.get("safe"):  # another user could plant a link where a build, or its clean-up, goes
        refused = unsafe_path(os.path.abspath(os.path.expanduser(args["safe"])))  # noqa: F821 (prepended)
        if refused:  # nothing read or written below it
            sys.stdout.write(json.dumps({"unsafe": refused}) + "\n")
            return
    check = index_check(args, path)
    result = {
        "home": os.path.expanduser("~"),
        "python": python_info(),
        "uv": find_uv(),
        "venv": venv_info(path, args["stamp"]),
        "wheelhouse": None,
    }
    if args.get("marker"):
        result["marker"] = write_marker(args["marker"])
    if args.get("wheelhouse"):
        directory = os.path.abspath(os.path.expanduser(args["wheelhouse"]))
        result["wheelhouse"] = wheelhouse_listing(directory, args.get("create_wheelhouse"))
    if check is not None:
        result["index"] = check.result()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":  # python -c runs it as __main__; tests import the helpers
    main()
