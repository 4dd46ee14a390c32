"""Smallest useful DDP job: the first thing to run on a cluster made by cluster-bootstrap.

Trains an MLP classifier on synthetic data (no downloads, no network beyond the process group) on
CPUs (gloo) or CUDA GPUs (nccl). Launch it with torchrun on every node, for example:

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr 192.168.1.100 \\
        --master-port 29500 examples/train_ddp.py --epochs 3

or, where torchrun does not work (native Windows, pytorch#148283), start one process per rank yourself
with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
Exit code 0 on success, non-zero on any error. Standard library and torch only.

Unequal machines (docs/bench.md). Each rank takes its share of every global batch of
``--global-batch`` samples (default: ``--batch-size`` x world size) through the helper that
`bootstrap launch` ships beside the run (``cb_shares.py``, named by ``$CB_SHARES_HELPER``; its
shares in ``$CB_SHARES_FILE``; equal shares without that file, as plain DDP). Each rank's mean loss
is scaled by ``n_r * world / B`` so that DDP's averaged gradient is the mean over the global batch:
training is the same whatever the shares, only faster when the fast machines take more. Every
``--log-every`` steps and at the end each rank prints a metrics line read by `bootstrap bench
--scaling`::

    CB_METRIC {"kind": "window", "rank": 0, "step": 50, "steps": 10, "seconds": ..., "step_time": ...,
               "compute_time": ..., "samples_per_s": ..., "global_samples": ..., "loss": ...}
    CB_METRIC {"kind": "summary", ...}   (the same figures over the run, warm-up steps left out)

Checkpoints need no shared storage. ``--checkpoint PATH`` is a path on each node's own disk: after
every epoch, each node's local rank 0 writes its copy there (DDP keeps every replica identical, so
every node holds the same state, and a node that dies takes no state with it). On start, every node
says which epoch its copy holds; the newest copy on any node wins: the rank that holds it loads it and
broadcasts model, optimizer and GradScaler state and the epoch to every rank, so a node that has no
copy (a new or reinstalled machine, or rank 0 moved by an elastic restart) resumes with the others.
A copy that exists but cannot be read stops every rank with the node named, instead of hanging.

Under `bootstrap launch`, every run has a directory of its own on each node, ``$CB_RUN_DIR``
(``<workdir>/runs/<run-id>/<node>/out``; the run id is ``$CB_RUN_ID``): the checkpoint goes to
``$CB_RUN_DIR/checkpoints/last.pt`` unless ``--checkpoint`` says otherwise, and `bootstrap fetch
checkpoints/last.pt` brings it back. ``--resume`` starts from the last checkpoint of the newest
earlier run that has one on each node (``--resume RUN_ID``: of that run), and saves into this run's
own directory: the earlier run's files stay as they were.
On shared storage (NFS) the same path works too: the nodes replace the one file atomically.
The broadcast pickles the whole state through the process group: right for this example; for a
model of several GB, save shards with torch.distributed.checkpoint instead.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

REQUIRED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
FEATURES, CLASSES = 64, 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DDP smoke-test training on synthetic data.")
    p.add_argument(
        "--backend",
        # the backend cluster-bootstrap chose for the whole cluster (gloo when one node has no GPU:
        # nccl on some ranks and gloo on others cannot form one group), else this machine's best
        default=os.environ.get("CLUSTER_BOOTSTRAP_BACKEND")
        or ("nccl" if torch.cuda.is_available() else "gloo"),
        help="gloo or nccl (default: $CLUSTER_BOOTSTRAP_BACKEND, set by bootstrap's launch scripts; "
        "else nccl with CUDA, gloo without)",
    )
    # The only real knob for collective timeouts: env vars such as GLOO_TIMEOUT_SECONDS are read by nothing.
    p.add_argument("--timeout", type=float, default=300.0, help="init/collective timeout, seconds")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per rank, on average")
    p.add_argument(
        "--global-batch",
        type=int,
        default=0,
        help="samples per step over all ranks, split by the shares (default: --batch-size x world size)",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=20_000, help="synthetic dataset size (all ranks together)")
    p.add_argument("--amp", action="store_true", help="autocast: fp16 + GradScaler on CUDA, bf16 on CPU")
    p.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="checkpoint on each node's own disk: saved there after each epoch by every node; "
        "resume from the newest copy found on any node (no shared storage needed)",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        metavar="RUN_ID",
        help="start from the checkpoint an earlier run saved in its $CB_RUN_DIR on each node: the newest "
        "run that has one, or RUN_ID (the checkpoint of this run is saved in this run's directory)",
    )
    p.add_argument("--max-steps", type=int, default=0, help="stop after N steps in this run (0: no limit)")
    p.add_argument("--log-every", type=int, default=50, help="log every N steps (0: only per epoch)")
    p.add_argument(
        "--metric-warmup", type=int, default=2, help="steps left out of the CB_METRIC summary (start-up)"
    )
    return p.parse_args(argv)


def load_shares_helper() -> Any:
    """The cb_shares helper: the file `bootstrap launch` names in $CB_SHARES_HELPER, else a
    ``cb_shares.py`` beside this script (or importable), else the installed cluster-bootstrap's."""
    path = os.environ.get("CB_SHARES_HELPER")
    if path:
        import importlib.util

        spec = importlib.util.spec_from_file_location("cb_shares", os.path.expanduser(path))
        if spec is None or spec.loader is None:
            raise RuntimeError(f"CB_SHARES_HELPER={path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    try:
        import cb_shares  # type: ignore[import-not-found]

        return cb_shares
    except ImportError:
        pass
    try:
        from orchestrator.bench import cb_shares as installed

        return installed
    except ImportError:
        raise RuntimeError(
            "cb_shares.py not found: launch with `bootstrap launch` (it ships it and sets "
            "CB_SHARES_HELPER), or copy orchestrator/bench/cb_shares.py beside this script"
        ) from None


def run_checkpoint(run_dir: str) -> str:
    """Where a run's checkpoint lives in its $CB_RUN_DIR."""
    return os.path.join(run_dir, "checkpoints", "last.pt")


def resume_path(wanted: str, run_dir: str | None) -> str:
    """The checkpoint ``--resume`` names on this node: RUN_ID's, or ("latest") the newest earlier run's
    (by the file's time) among this node's runs; a path that does not exist when there is none (the
    node then has no copy, and the others' is used: :func:`newest_checkpoint`)."""
    if not run_dir:
        raise RuntimeError(
            "--resume needs $CB_RUN_DIR (set by `bootstrap launch`); started by hand, give --checkpoint PATH"
        )
    here = os.path.abspath(run_dir)
    node = os.path.basename(os.path.dirname(here))  # <workdir>/runs/<run-id>/<node>/out
    runs = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    if wanted != "latest":
        return run_checkpoint(os.path.join(runs, wanted, node, os.path.basename(here)))
    found = []
    for run_id in os.listdir(runs) if os.path.isdir(runs) else []:
        other = os.path.join(runs, run_id, node, os.path.basename(here))
        path = run_checkpoint(other)
        if os.path.abspath(other) != here and os.path.isfile(path):
            found.append((os.path.getmtime(path), path))
    return max(found)[1] if found else run_checkpoint(os.path.join(runs, "(none)", node))


def make_dataset(seed: int, samples: int) -> TensorDataset:
    # Same seed on every rank -> identical data everywhere; DistributedSampler then gives each rank a shard.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)  # labels from a noisy linear "teacher": learnable
    y = (x @ teacher + 0.5 * torch.randn(samples, CLASSES, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def make_model(hidden: int = 256) -> nn.Module:
    layers = [nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, CLASSES))


def save_checkpoint(path: str, state: dict[str, object]) -> None:
    # Write-then-rename: a crash mid-save leaves the previous checkpoint intact, never a truncated one.
    # The temporary name is per host and process: nodes sharing the directory (NFS) never collide.
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_node_checkpoint(path: str, local_rank: int) -> tuple[dict[str, Any] | None, int, str]:
    """This node's copy, read by its local rank 0 only: (state, epoch it holds or -1, error text)."""
    if local_rank != 0 or not os.path.exists(path):
        return None, -1, ""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        return state, int(state["epoch"]), ""
    except Exception as exc:  # unreadable, another torch's format, not our checkpoint
        return None, -1, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def newest_checkpoint(
    path: str | None, rank: int, local_rank: int, world: int, device: torch.device, log: Callable[[str], None]
) -> tuple[dict[str, Any] | None, int]:
    """The newest checkpoint any node holds, on every rank (None: start from scratch), and its rank.

    Collective: every rank must call it. Each node's local rank 0 reports the epoch of its own copy;
    the lowest rank holding the newest one broadcasts it, so nodes without a copy need no shared disk.
    Plain tensor collectives only: torch's object collectives need numpy, which torch does not install.
    """
    if not path:  # the same arguments on every rank: all skip the collectives together
        return None, -1
    state, epoch, error = read_node_checkpoint(path, local_rank)
    if error:
        log(f"cannot read checkpoint {path} on {socket.gethostname()}: {error}")
    mine = torch.tensor([epoch, 1 if error else 0], dtype=torch.int64, device=device)
    found = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(found, mine)
    epochs = [int(t[0]) for t in found]
    broken = [str(r) for r, t in enumerate(found) if int(t[1])]
    if broken:  # every rank sees the same list: all stop together instead of some waiting forever
        raise RuntimeError(
            f"rank {', '.join(broken)} cannot read its node's checkpoint (its log names the file and why): "
            "move that file away to start over, or restore it"
        )
    newest = max(epochs)
    if newest < 0:
        return None, -1
    source = epochs.index(newest)
    payload = b""
    if rank == source:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        payload = buffer.getvalue()
        log(f"sending checkpoint {path} (epoch {newest + 1}, {len(payload) / 1e6:.1f} MB) to every rank")
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=source)
    data = bytearray(payload) if rank == source else bytearray(int(size.item()))
    host_bytes = torch.frombuffer(data, dtype=torch.uint8)  # shares memory with data
    wire = host_bytes.to(device)  # the same tensor on CPU; NCCL needs a copy on the GPU
    dist.broadcast(wire, src=source)
    if wire.data_ptr() != host_bytes.data_ptr():
        host_bytes.copy_(wire.cpu())
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True), source


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = os.environ.get("CB_RUN_DIR")
    if args.checkpoint is None and run_dir:
        args.checkpoint = run_checkpoint(run_dir)  # this run's own directory on this node
    resume_from = resume_path(args.resume, run_dir) if args.resume else args.checkpoint
    missing = [name for name in REQUIRED_ENV if name not in os.environ]
    if missing:
        print(
            f"missing environment: {', '.join(missing)} (launch with torchrun, or set them per rank)",
            file=sys.stderr,
            flush=True,
        )
        return 2
    rank, world, local_rank = (int(os.environ[n]) for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    prefix = f"[rank {rank}/{world}]"

    def log(msg: str) -> None:  # one write per line: ranks share the terminal, lines must not interleave
        print(f"{prefix} {msg}\n", end="", flush=True)

    if sys.platform == "win32":
        # Windows builds have no libuv TCPStore; torch 2.4-2.6 need this set explicitly (2.7+ default it off).
        os.environ.setdefault("USE_LIBUV", "0")

    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) visible")
        torch.cuda.set_device(local_rank)  # before init: NCCL binds each rank to the current device
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:  # torchrun sets 1; started directly, share the cores out
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
        if args.backend == "nccl":
            raise RuntimeError("backend nccl needs CUDA GPUs; use --backend gloo on CPU-only machines")

    dist.init_process_group(backend=args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        # Prove the group works before training: every rank contributes 1, so the sum is the world size.
        ones = torch.ones(1, device=device)
        dist.all_reduce(ones, op=dist.ReduceOp.SUM)
        if int(ones.item()) != world:
            raise RuntimeError(f"all_reduce check failed: sum of ones is {ones.item()}, world size {world}")
        if rank == 0:
            log(
                f"torch {torch.__version__}, backend {args.backend}, device {device.type}, "
                f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}; "
                f"all_reduce check ok: {int(ones.item())} == world size {world}"
            )

        dataset = make_dataset(args.seed, args.samples)
        helper = load_shares_helper()
        shares_info = helper.load_shares(world)
        global_batch = args.global_batch or args.batch_size * world
        shares = shares_info.for_batch(global_batch)
        # The same seed on every rank: each epoch's permutation is identical everywhere, and rank r takes
        # its piece of every global batch. set_epoch() below reseeds it per epoch (else: same order).
        sampler = helper.ShareBatchSampler(len(dataset), shares, rank, shuffle=True, seed=args.seed)
        loader = DataLoader(dataset, batch_sampler=sampler, pin_memory=device.type == "cuda")
        if rank == 0:
            log(f"{shares_info.describe()}: {shares} of a global batch of {global_batch}")

        torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
        model = make_model().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        scaler = torch.amp.GradScaler("cuda") if args.amp and device.type == "cuda" else None
        # fp16 needs loss scaling against gradient underflow; CPU autocast uses bf16, which does not.
        amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16

        start_epoch, last_loss = 0, float("nan")
        state, source = newest_checkpoint(resume_from, rank, local_rank, world, device, log)
        if state is not None:  # the same state on every rank: they all start at the same epoch
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])  # moves its tensors to the parameters' device
            if scaler is not None and state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            start_epoch, last_loss = int(state["epoch"]) + 1, float(state["loss"])
            log(
                f"resumed from the checkpoint of rank {source}: "
                f"{start_epoch} of {args.epochs} epochs already done"
            )
            del state

        # device_ids only for a module on one device; a model spread over several GPUs needs None.
        ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
        timer = helper.StepTimer(ddp, device)  # wall and compute time per step, for CB_METRIC lines
        loss_fn = nn.CrossEntropyLoss()
        steps = run_samples = epochs_run = 0
        run_time = 0.0
        window = {"local": 0, "global": 0}
        totals = {"local": 0, "global": 0}

        def global_mean(loss_sum: torch.Tensor, count: int) -> float:
            # collective: every rank calls it at the same steps. SUM, since gloo < 2.7 rejects AVG
            both = torch.stack([loss_sum.detach().float(), torch.tensor(float(count), device=device)])
            dist.all_reduce(both, op=dist.ReduceOp.SUM)
            return float(both[0].item() / max(both[1].item(), 1.0))

        def metric(kind: str, figures: dict[str, Any], samples: dict[str, int], **extra: Any) -> None:
            count = int(figures["steps"])
            if not count:
                return
            seconds, compute = float(figures["seconds"]), figures["compute"]
            helper.print_metric(
                kind=kind,
                rank=rank,
                world=world,
                step=steps,
                steps=count,
                seconds=round(seconds, 6),
                step_time=round(seconds / count, 6),
                compute_time=None if compute is None else round(float(compute) / count, 6),
                local_samples=samples["local"],
                global_samples=samples["global"],
                samples_per_s=round(samples["global"] / seconds, 3) if seconds > 0 else None,
                **extra,
            )

        def close_window(loss: float | None) -> None:
            figures = timer.window()
            metric("window", figures, window, loss=loss)
            totals["local"] += window["local"]
            totals["global"] += window["global"]
            window["local"] = window["global"] = 0

        for epoch in range(start_epoch, args.epochs):
            if args.max_steps and steps >= args.max_steps:
                break
            sampler.set_epoch(epoch)  # new shuffle each epoch, identical on all ranks
            ddp.train()
            loss_sum = torch.zeros((), device=device)  # accumulate on device: no sync per step
            seen, epoch_steps, t0 = 0, 0, time.perf_counter()
            for step, (x, y) in enumerate(loader, start=1):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                timer.start()
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=args.amp):
                    loss = loss_fn(ddp(x), y)
                # this rank's n_r of the step's B samples: DDP's average of the scaled losses' gradients
                # is the mean over the global batch (cb_shares.py says why; 1.0 with equal shares)
                scaled = loss * sampler.loss_scale(step - 1)
                if scaler is not None:
                    scaler.scale(scaled).backward()  # DDP all-reduces (averages) gradients during backward
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    scaled.backward()
                    optimizer.step()
                timer.stop()
                loss_sum += loss.detach().float() * len(y)
                seen += len(y)
                epoch_steps += 1
                steps += 1
                window["local"] += len(y)
                window["global"] += sampler.global_batch_size(step - 1)
                if steps == args.metric_warmup:  # start-up steps: not in the CB_METRIC figures
                    timer.reset()
                    window["local"] = window["global"] = totals["local"] = totals["global"] = 0
                if args.log_every and step % args.log_every == 0:
                    step_loss = global_mean(loss.detach().float() * len(y), len(y))
                    close_window(step_loss)
                    if rank == 0:
                        where = f"epoch {epoch + 1}/{args.epochs} step {step}/{len(sampler)}"
                        log(f"{where} loss {step_loss:.4f}")
                # Every rank has the same number of steps (the sampler says so), so all stop together.
                if args.max_steps and steps >= args.max_steps:
                    break
            if device.type == "cuda":
                torch.cuda.synchronize()  # CUDA is asynchronous: wait before reading the clock
            elapsed = time.perf_counter() - t0
            close_window(None)  # windows end with the epoch
            run_samples, run_time = run_samples + seen, run_time + elapsed
            # Global mean loss over every sample of the epoch (the ranks' counts differ with shares).
            last_loss = global_mean(loss_sum, seen)
            complete = not (args.max_steps and steps >= args.max_steps) or epoch_steps == len(sampler)
            log(
                f"epoch {epoch + 1}/{args.epochs} {'complete' if complete else 'stopped by --max-steps'}: "
                f"global mean loss {last_loss:.4f}, {seen} samples in {elapsed:.2f}s = "
                f"{seen / elapsed:.0f} samples/s"
            )
            if not complete:
                break
            epochs_run += 1
            if args.checkpoint and local_rank == 0:  # one copy per node, on its own disk
                scaler_state = scaler.state_dict() if scaler is not None else None
                ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
                save_checkpoint(args.checkpoint, {**ckpt, "loss": last_loss, "scaler": scaler_state})

        metric("summary", timer.totals, totals, shares=shares, shares_mode=shares_info.mode)
        # Cluster throughput is the sum of what each rank processed per second.
        total = torch.tensor([run_samples / run_time if run_time else 0.0], device=device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        if rank == 0:
            print(
                f"done: {start_epoch + epochs_run} epochs, final loss {last_loss:.4f}, "
                f"{total.item():.0f} samples/s total\n",
                end="",
                flush=True,
            )
        return 0
    finally:
        dist.destroy_process_group()  # always: lets peers exit cleanly instead of waiting for a timeout


def finish(code: int) -> NoReturn:
    """Exit with ``code`` once every line is out, without Python's interpreter teardown.

    Why (torch 2.13, gloo): each process group keeps worker threads that finish a collective, wake the
    waiting rank, and only then drop their reference to the collective's tensors. DDP's reducer holds
    the group from C++, so destroy_process_group() does not join those threads. When the rank returns
    and Python starts finalizing before such a thread has dropped its reference, the thread's attempt
    to take the GIL ends it with pthread_exit inside a noexcept destructor: std::terminate, "terminate
    called without an active exception", SIGABRT, a run that trained fully reported as failed (about
    1 run in 6 here). Everything the rank owns is already written; os._exit skips the finalization
    those threads race with. Any training script with DDP on gloo can end the same way.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said anyway
            pass
    os._exit(code)


if __name__ == "__main__":
    try:
        exit_code = main()
    except Exception:  # the traceback Python would print, then the exit code it would give
        traceback.print_exc()
        exit_code = 1
    finish(exit_code)
