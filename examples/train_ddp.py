"""Smallest useful DDP job: the first thing to run on a cluster made by cluster-bootstrap.

Trains an MLP classifier on synthetic data (no downloads, no network beyond the process group) on
CPUs (gloo) or CUDA GPUs (nccl). Launch it with torchrun on every node, for example:

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr 192.168.1.100 \\
        --master-port 29500 examples/train_ddp.py --epochs 3

or, where torchrun does not work (native Windows, pytorch#148283), start one process per rank yourself
with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
Exit code 0 on success, non-zero on any error. Standard library and torch only.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

REQUIRED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
FEATURES, CLASSES, SAMPLES = 64, 10, 20_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DDP smoke-test training on synthetic data.")
    p.add_argument("--backend", default="nccl" if torch.cuda.is_available() else "gloo")
    # The only real knob for collective timeouts: env vars such as GLOO_TIMEOUT_SECONDS are read by nothing.
    p.add_argument("--timeout", type=float, default=300.0, help="init/collective timeout, seconds")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--amp", action="store_true", help="autocast: fp16 + GradScaler on CUDA, bf16 on CPU")
    p.add_argument(
        "--checkpoint", metavar="PATH", help="resume from PATH if it exists; save after each epoch"
    )
    p.add_argument("--max-steps", type=int, default=0, help="stop after N steps in this run (0: no limit)")
    p.add_argument("--log-every", type=int, default=50, help="log every N steps (0: only per epoch)")
    return p.parse_args(argv)


def make_dataset(seed: int) -> TensorDataset:
    # Same seed on every rank -> identical data everywhere; DistributedSampler then gives each rank a shard.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)  # labels from a noisy linear "teacher": learnable
    y = (x @ teacher + 0.5 * torch.randn(SAMPLES, CLASSES, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def make_model(hidden: int = 256) -> nn.Module:
    layers = [nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, CLASSES))


def save_checkpoint(path: str, state: dict[str, object]) -> None:
    # Write-then-rename: a crash mid-save leaves the previous checkpoint intact, never a truncated one.
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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

        dataset = make_dataset(args.seed)
        # shuffle=True with the same seed on every rank: each epoch's permutation is identical everywhere,
        # so the shards stay disjoint. set_epoch() below reseeds it per epoch (else: same order every epoch).
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(
            dataset, batch_size=args.batch_size, sampler=sampler, pin_memory=device.type == "cuda"
        )

        torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
        model = make_model().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        scaler = torch.amp.GradScaler("cuda") if args.amp and device.type == "cuda" else None
        # fp16 needs loss scaling against gradient underflow; CPU autocast uses bf16, which does not.
        amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16

        start_epoch, last_loss = 0, float("nan")
        if args.checkpoint and os.path.exists(args.checkpoint):
            state = torch.load(args.checkpoint, map_location=device, weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            if scaler is not None and state.get("scaler"):
                scaler.load_state_dict(state["scaler"])
            start_epoch, last_loss = int(state["epoch"]) + 1, float(state["loss"])
            log(f"resumed from {args.checkpoint}: {start_epoch} of {args.epochs} epochs already done")
        # Only rank 0 writes the checkpoint: if PATH is not on storage every node shares, ranks would
        # disagree on where to start and hang later. Fail now instead (max(-e) == -min(e)).
        agree = torch.tensor([start_epoch, -start_epoch], device=device)
        dist.all_reduce(agree, op=dist.ReduceOp.MAX)
        if int(agree[0]) != -int(agree[1]):
            raise RuntimeError("ranks found different checkpoints: put --checkpoint on shared storage")

        # device_ids only for a module on one device; a model spread over several GPUs needs None.
        ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
        loss_fn = nn.CrossEntropyLoss()
        steps = run_samples = epochs_run = 0
        run_time = 0.0
        for epoch in range(start_epoch, args.epochs):
            if args.max_steps and steps >= args.max_steps:
                break
            sampler.set_epoch(epoch)  # new shuffle each epoch, identical on all ranks
            ddp.train()
            loss_sum = torch.zeros((), device=device)  # accumulate on device: no sync per step
            seen, t0 = 0, time.perf_counter()
            for step, (x, y) in enumerate(loader, start=1):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=args.amp):
                    loss = loss_fn(ddp(x), y)
                if scaler is not None:
                    scaler.scale(loss).backward()  # DDP all-reduces (averages) gradients during backward
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
                loss_sum += loss.detach().float() * len(y)
                seen += len(y)
                steps += 1
                if args.log_every and step % args.log_every == 0:
                    log(f"epoch {epoch + 1}/{args.epochs} step {step}/{len(loader)} loss {loss.item():.4f}")
                # Every rank has the same number of batches (the sampler pads), so all stop together.
                if args.max_steps and steps >= args.max_steps:
                    break
            if device.type == "cuda":
                torch.cuda.synchronize()  # CUDA is asynchronous: wait before reading the clock
            elapsed = time.perf_counter() - t0
            run_samples, run_time = run_samples + seen, run_time + elapsed
            # Global mean loss: SUM then divide, since gloo before torch 2.7 rejects ReduceOp.AVG.
            mean_loss = loss_sum / max(seen, 1)
            dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
            last_loss = mean_loss.item() / world
            complete = not (args.max_steps and steps >= args.max_steps) or seen == len(sampler)
            log(
                f"epoch {epoch + 1}/{args.epochs} {'complete' if complete else 'stopped by --max-steps'}: "
                f"global mean loss {last_loss:.4f}, {seen} samples in {elapsed:.2f}s = "
                f"{seen / elapsed:.0f} samples/s"
            )
            if not complete:
                break
            epochs_run += 1
            if args.checkpoint and rank == 0:
                scaler_state = scaler.state_dict() if scaler is not None else None
                ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
                save_checkpoint(args.checkpoint, {**ckpt, "loss": last_loss, "scaler": scaler_state})

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


if __name__ == "__main__":
    sys.exit(main())
