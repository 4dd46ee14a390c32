"""One rank of `bootstrap bench`: how many samples per second this rank trains, on its own device.

Started like the validation worker: once per local rank, with torchrun's environment and everything
else the launch gives the rank (interface, OMP_NUM_THREADS, the inventory's train.env), from the
rendered ``ranks.sh``. Every result it prints is ``[default<local rank>]:`` and the record ``probe <json>``
(orchestrator/records.py; ``record`` below is that module's encoder, the same source) with the nonce
the controller put in its environment (``CB_RECORD_NONCE``).

The ranks meet in the master's TCPStore (rank 0 names the ranks that never come, as validation
does) and start each timed repeat together: every rank of a node shares the node's cores during
training, so they are measured sharing them too. No process group is made: nothing is communicated.

The workload: forward, backward and an SGD step of a small MLP (the shape of the shipped example)
at ``--batch-size`` samples, or the user's ``--callable module:function``. That function is called
once as ``function(batch_size, device)`` and returns the step: a callable with no arguments that
trains on one batch of ``batch_size`` samples. The module is imported from the code directory.

Standard library and torch only; runs under the node's Python.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import gc
import importlib
import json
import os
import platform
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
FEATURES, HIDDEN, CLASSES = 64, 256, 10  # examples/train_ddp.py's MLP
CALIBRATION = 5  # steps timed to choose how many make one repeat
NONCE = os.environ.get("CB_RECORD_NONCE", "")


def record(nonce: "str", kind: "str", *fields: "bytes | str") -> "str":  # noqa: UP037
    """One record line, newline included. ``str`` fields travel as their UTF-8 bytes."""
    # the annotations are strings and only base64 is used: node-side Python (3.8 and later) runs this
    # very source (PYTHON_ENCODER)
    parts = ["@@" + nonce, kind]
    for value in fields:
        data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
        parts.append(":" + base64.b64encode(data).decode("ascii"))
    return " ".join(parts) + "\n"


def emit(kind: str, **data: Any) -> None:
    data.update(kind=kind, rank=RANK)
    sys.stdout.write(f"[default{LOCAL_RANK}]:" + record(NONCE, "probe", json.dumps(data, sort_keys=True)))
    sys.stdout.flush()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5, help="target time of one repeat")
    parser.add_argument("--callable", default="", help="module:function (see the module docstring)")
    parser.add_argument("--code-dir", default="", help="where the callable's module is imported from")
    return parser.parse_args()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def describe_device(device: Any, torch: Any) -> str:
    if device.type == "cuda":
        return f"GPU {torch.cuda.get_device_name(device)} (cuda:{device.index or 0})"
    return f"CPU {cpu_model()}, {torch.get_num_threads()} thread(s)"


class Store:
    """The master's TCPStore: joining (missing ranks named) and barriers."""

    def __init__(self, store: Any, timeout: float) -> None:
        self.store = store
        self.timeout = timeout
        self.count = 0

    def join(self) -> bool:
        self.store.set(f"cb/bench/joined/{RANK}", socket.gethostname())
        if RANK != 0:
            self.store.wait(["cb/bench/verdict"], datetime.timedelta(seconds=self.timeout))
            return bool(self.store.get("cb/bench/verdict").decode() == "go")
        deadline = time.monotonic() + self.timeout
        missing = list(range(WORLD))
        while True:
            missing = [r for r in missing if not self.store.check([f"cb/bench/joined/{r}"])]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if missing:
            emit("missing", ranks=missing, timeout=self.timeout)
            self.store.set("cb/bench/verdict", "abort")
            return False
        self.store.set("cb/bench/verdict", "go")
        return True

    def barrier(self) -> None:
        self.count += 1
        key = f"cb/bench/barrier/{self.count}"
        if int(self.store.add(key, 1)) == WORLD:
            self.store.set(key + "/go", "1")
        self.store.wait([key + "/go"], datetime.timedelta(seconds=self.timeout))

    def finish(self) -> None:
        """Rank 0 serves the store: it leaves last."""
        self.store.add("cb/bench/done", 1)
        if RANK != 0:
            return
        deadline = time.monotonic() + self.timeout
        while int(self.store.add("cb/bench/done", 0)) < WORLD and time.monotonic() < deadline:
            time.sleep(0.02)


def builtin_step(batch_size: int, device: Any) -> Callable[[], object]:
    import torch
    from torch import nn

    torch.manual_seed(RANK)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch_size, FEATURES, device=device)
    y = torch.randint(0, CLASSES, (batch_size,), device=device)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> object:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return None

    return step


def user_step(spec: str, code_dir: str, batch_size: int, device: Any) -> Callable[[], object]:
    module_name, _, function_name = spec.partition(":")
    if code_dir:
        sys.path.insert(0, os.path.expanduser(code_dir))
    module = importlib.import_module(module_name)
    factory = getattr(module, function_name)
    step = factory(batch_size, device)
    if not callable(step):
        raise TypeError(f"{spec} returned {step!r}, not a step function (a callable with no arguments)")
    return step  # type: ignore[no-any-return]


def main() -> int:
    args = parse_args()
    # what torch's import makes lives as long as this process: collecting while it loads only costs
    # CPU (about a tenth of the import)
    gc.disable()
    try:
        import torch
        import torch.distributed as dist
    finally:
        gc.enable()

    if torch.cuda.is_available() and torch.cuda.device_count() > LOCAL_RANK:
        torch.cuda.set_device(LOCAL_RANK)
        device = torch.device("cuda", LOCAL_RANK)
    else:
        device = torch.device("cpu")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    emit(
        "start",
        host=socket.gethostname(),
        pid=os.getpid(),
        torch=torch.__version__,
        device=describe_device(device, torch),
        device_type=device.type,
    )
    master = os.environ["MASTER_ADDR"]
    port = int(os.environ["MASTER_PORT"])
    try:
        raw = dist.TCPStore(  # type: ignore[attr-defined]
            master,
            port,
            WORLD,
            RANK == 0,
            timeout=datetime.timedelta(seconds=args.timeout),
            wait_for_workers=False,
        )
    except Exception as exc:
        emit("unreachable", master=f"{master}:{port}", error=str(exc).splitlines()[0][:300])
        return 2
    store = Store(raw, args.timeout)
    if not store.join():
        return 3
    emit("joined")
    try:
        if args.callable:
            step = user_step(args.callable, args.code_dir, args.batch_size, device)
        else:
            step = builtin_step(args.batch_size, device)
        for _ in range(3):  # warm-up: allocator, kernels, caches
            step()
        sync()
        start = time.perf_counter()
        for _ in range(CALIBRATION):  # a few steps: one can fall into a pause of a busy machine
            step()
        sync()
        once = max((time.perf_counter() - start) / CALIBRATION, 1e-6)
        error = ""
    except Exception as exc:  # the user's callable: every rank must still reach the barriers
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        traceback.print_exc()
        once = 0.0
    iters = min(10000, max(1, int(args.seconds / once))) if once else 0
    rates = []
    for _ in range(args.repeats):
        store.barrier()  # every rank starts each repeat at the same time: they share the node
        if error:
            continue
        start = time.perf_counter()
        for _ in range(iters):
            step()
        sync()
        rates.append(iters * args.batch_size / max(time.perf_counter() - start, 1e-9))
    store.barrier()
    if error:
        emit("error", error=error)
    else:
        median = statistics.median(rates)
        emit(
            "result",
            batch_size=args.batch_size,
            iters=iters,
            rates=rates,
            samples_per_s=median,
            spread=(max(rates) - min(rates)) / median if median else 0.0,
        )
    store.finish()
    return 1 if error else 0


def finish(code: int) -> None:
    """Exit once every line is out, without Python's teardown (the validation worker says why)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    try:
        exit_code = main()
    except Exception:
        traceback.print_exc()
        exit_code = 1
    finish(exit_code)
