"""One rank of `bootstrap validate`: join, check all_reduce, time all_reduce for a few sizes.

Started once per local rank with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) by the rendered ranks.sh. Every result it prints is ``[default<local rank>]:`` (the prefix
launch lines carry, so the controller parses both the same way) and the record ``validate <json>``
(orchestrator/records.py; ``record`` below is that module's encoder, the same source) with the nonce
the controller put in its environment (``CB_RECORD_NONCE``).

Joining is done in two steps so that a hang becomes a list of names: every rank first registers its
key in the master's TCPStore; rank 0 waits for all keys until the timeout and, if some never arrive,
reports exactly which ranks are missing. Only then is the process group created on that store.
"""

import argparse
import base64
import datetime
import gc
import json
import os
import socket
import sys
import time
import traceback

RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
NONCE = os.environ.get("CB_RECORD_NONCE", "")


def record(nonce: "str", kind: "str", *fields: "bytes | str") -> "str":
    """One record line, newline included. ``str`` fields travel as their UTF-8 bytes."""
    # the annotations are strings and only base64 is used: node-side Python (3.8 and later) runs this
    # very source (PYTHON_ENCODER)
    parts = ["@@" + nonce, kind]
    for value in fields:
        data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
        parts.append(":" + base64.b64encode(data).decode("ascii"))
    return " ".join(parts) + "\n"


def emit(kind, **data):
    data.update(kind=kind, rank=RANK)
    sys.stdout.write(
        "[default%d]:%s" % (LOCAL_RANK, record(NONCE, "validate", json.dumps(data, sort_keys=True)))
    )
    sys.stdout.flush()


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--sizes", default="4096,262144,4194304")
    parser.add_argument("--seconds", type=float, default=0.3, help="target time per size")
    return parser.parse_args()


def join(store, timeout):
    """Register; rank 0 waits for everyone and says who never came."""
    store.set("cb/joined/%d" % RANK, socket.gethostname())
    if RANK != 0:
        store.wait(["cb/verdict"], datetime.timedelta(seconds=timeout))
        return store.get("cb/verdict").decode() == "go"
    deadline = time.monotonic() + timeout
    missing = list(range(WORLD))
    while True:
        missing = [r for r in missing if not store.check(["cb/joined/%d" % r])]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if missing:
        emit("missing", ranks=missing, timeout=timeout)
        store.set("cb/verdict", "abort")
        return False
    store.set("cb/verdict", "go")
    return True


def main():
    args = parse_args()
    # what torch's import makes lives as long as this process: collecting while it loads only costs
    # CPU (about a tenth of the import)
    gc.disable()
    try:
        import torch
        import torch.distributed as dist
    finally:
        gc.enable()

    emit("start", host=socket.gethostname(), pid=os.getpid(), torch=torch.__version__)
    master = os.environ["MASTER_ADDR"]
    port = int(os.environ["MASTER_PORT"])
    t0 = time.monotonic()
    try:
        store = dist.TCPStore(
            master,
            port,
            WORLD,
            RANK == 0,
            timeout=datetime.timedelta(seconds=args.timeout),
            wait_for_workers=False,
        )
    except Exception as exc:  # the error text says refused / timed out
        emit("unreachable", master="%s:%d" % (master, port), error=str(exc).splitlines()[0][:300])
        return 2
    if not join(store, args.timeout):
        return 3
    device = "cpu"
    if args.backend == "nccl":
        torch.cuda.set_device(LOCAL_RANK)
        device = "cuda:%d" % LOCAL_RANK
    dist.init_process_group(
        args.backend,
        store=store,
        rank=RANK,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    emit("joined", seconds=round(time.monotonic() - t0, 3))

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    # correctness: rank r contributes r + 1 everywhere; the sum is known
    probe = torch.full((1 << 12,), float(RANK + 1), device=device)
    dist.all_reduce(probe)
    expected = WORLD * (WORLD + 1) / 2.0
    correct = bool(torch.all(probe == expected).item())
    emit("correct", ok=correct, expected=expected, got=float(probe[0].item()))
    if not correct:
        dist.destroy_process_group()
        return 4

    for size in [int(s) for s in args.sizes.split(",") if s]:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        for _ in range(2):  # warm-up: connections, allocator
            dist.all_reduce(tensor)
        sync()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        once = max(time.perf_counter() - start, 1e-6)
        # every rank must run the same number of collectives: the slowest estimate decides
        wanted = min(200, max(3, int(args.seconds / once)))
        proposal = torch.tensor([wanted], dtype=torch.float64, device=device)
        dist.all_reduce(proposal, op=dist.ReduceOp.MIN)
        iters = int(proposal.item())
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(tensor)
        sync()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        latency = float(elapsed.item()) / iters
        nbytes = tensor.numel() * 4
        algbw = nbytes / latency
        if RANK == 0:
            emit(
                "result",
                bytes=nbytes,
                iters=iters,
                latency_s=latency,
                algbw=algbw,
                busbw=algbw * 2.0 * (WORLD - 1) / WORLD if WORLD > 1 else algbw,
            )
    dist.barrier()
    dist.destroy_process_group()
    emit("done")
    return 0


def finish(code):
    """Exit once every line is out, skipping Python's teardown (examples/train_ddp.py `finish` says why:
    a gloo worker thread that drops a tensor after finalization began aborts the rank with SIGABRT)."""
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
