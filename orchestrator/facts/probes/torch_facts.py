# Runs on a node, under the node's Python: prints one JSON object describing its torch install.
# Importing torch costs seconds of CPU, so the answer is cached per interpreter + torch install +
# NVIDIA driver (a reinstall or driver change gives a new key). Standard library only, imported only
# where needed: `check` starts this on every node at once, and a node without torch answers at once.
import os
import sys

# The Python fact's answer first (facts/linux.py: one interpreter start answers both facts), before
# anything that could fail. Started with -S, so that answer does not depend on site-packages: they
# are added after it, as a plain start would have.
print(sys.executable)
print("%d.%d.%d" % sys.version_info[:3])
if sys.flags.no_site:
    import site

    site.main()

PROBE_VERSION = 4


def _stamp(path):
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return "%d:%d" % (st.st_mtime_ns, st.st_size)


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _driver():
    try:
        with open("/proc/driver/nvidia/version") as fh:
            return fh.readline().strip()
    except OSError:
        return ""


def _probe():
    import torch

    info = {
        "installed": True,
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": False,
        "cuda_devices": 0,
        "distributed": False,
        "gloo": False,
        "nccl": False,
        "nccl_version": None,
        "gloo_works": False,
        "gloo_error": None,
        "error": None,
    }
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        info["cuda_devices"] = int(torch.cuda.device_count()) if info["cuda_available"] else 0
    except Exception as exc:  # a broken driver must not hide the rest
        info["error"] = "cuda: %s: %s" % (type(exc).__name__, exc)
    import torch.distributed as dist

    info["distributed"] = bool(dist.is_available())
    if info["distributed"]:
        info["gloo"] = bool(dist.is_gloo_available())
        info["nccl"] = bool(dist.is_nccl_available())
        if info["nccl"]:
            try:
                info["nccl_version"] = ".".join(str(p) for p in torch.cuda.nccl.version())
            except Exception:
                pass
        if info["gloo"]:
            info["gloo_works"], info["gloo_error"] = _gloo_works(torch, dist)
    return info


def _gloo_works(torch, dist):
    # is_gloo_available() is True even on Windows wheels built without a gloo device (2.8-2.10):
    # only a real process group proves gloo usable. One rank, in-memory store, no network.
    import datetime

    try:
        dist.init_process_group(
            "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=30)
        )
        try:
            tensor = torch.ones(4)
            dist.all_reduce(tensor)
            if tensor.sum().item() != 4:
                return False, "all_reduce gave a wrong result"
        finally:
            dist.destroy_process_group()
    except Exception as exc:
        return False, "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    return True, None


def _hostname():
    # os.uname() where there is one: importing socket costs a few ms on every node and check
    uname = getattr(os, "uname", None)
    if uname is not None:
        return uname().nodename
    import socket

    return socket.gethostname()


def _digest(text):
    # sha256 without hashlib (OpenSSL's loading costs a few ms on every node)
    try:
        from _sha2 import sha256  # Python 3.12+
    except ImportError:
        try:
            from _sha256 import sha256
        except ImportError:
            from hashlib import sha256
    return sha256(text.encode()).hexdigest()[:20]


def _find_torch():
    # importlib.util.find_spec("torch") without importing importlib.util (a few ms on every node):
    # ask the import system's finders in turn, as find_spec does for a top-level name
    try:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find("torch", None) if find is not None else None
            if spec is not None:
                return spec
        return None
    except Exception:  # an unusual finder: the library's own way
        import importlib.util

        return importlib.util.find_spec("torch")


def main():
    spec = _find_torch()
    if spec is None or not spec.origin:
        print('{"installed": false}')
        return
    root = os.path.dirname(spec.origin)
    # The answer holds per-machine results (GPUs seen, gloo working), so the key names the machine
    # and its boot too: a home directory shared over NFS must not lend one node's answer to another,
    # and a reboot (driver reload) asks again.
    key_src = repr(
        [
            PROBE_VERSION,
            sys.executable,
            root,
            _stamp(os.path.join(root, "version.py")),
            _driver(),
            _hostname(),
            _boot_id(),
            os.environ.get("CUDA_VISIBLE_DEVICES"),
        ]
    )
    key = _digest(key_src)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    cache_dir = os.path.join(base, "cluster-bootstrap")
    cache = os.path.join(cache_dir, "torch-facts-%s.json" % key)
    # The cache holds the very line to print (written whole, then renamed into place): the json
    # module's import alone costs a node more than the rest of this answer.
    try:
        with open(cache) as fh:
            cached = fh.read().strip()
        if cached.startswith("{") and cached.endswith("}") and "\n" not in cached:
            print(cached)
            return
    except (OSError, ValueError):
        pass
    import gc
    import json

    gc.disable()  # what torch's import makes lives as long as this process: no collections meanwhile
    try:
        info = _probe()
    except Exception as exc:  # torch present but unusable: say why, never crash the gathering
        print(json.dumps({"installed": True, "error": "import torch: %s: %s" % (type(exc).__name__, exc)}))
        return
    if info.get("error") or not info.get("gloo_works"):
        info["cached"] = False
        print(json.dumps(info))  # a failure may be passing: ask again next time
        return
    try:
        import tempfile

        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(dict(info, cached=True)) + "\n")
        os.replace(tmp, cache)
    except OSError:
        pass  # read-only home: just slower next time
    info["cached"] = False
    print(json.dumps(info))


main()
