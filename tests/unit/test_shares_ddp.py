"""Unequal shares train exactly like one process over the whole global batch.

The sampler gives each rank its piece of every global batch and the loss scale makes DDP's gradient
average the mean over the global batch. Checked twice: the arithmetic in one process (what DDP's
average of the ranks' gradients would be), and real DDP with gloo on 3 processes of this machine,
uneven shares and a last partial batch, against one process stepping through the same batches.

Run as ``python -m tests.unit.test_shares_ddp worker OUT`` it is one rank of that real run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from orchestrator.bench.cb_shares import ShareBatchSampler, SharesError, StepTimer, split_batch

ROOT = Path(__file__).resolve().parents[2]
SHARES = [5, 2, 1]  # a global batch of 8
SAMPLES = 23  # 2 full global batches and a last one of 7: split 4, 2, 1
SEED, LR = 3, 0.1

if TYPE_CHECKING:  # imported where used: collecting the tests must not cost every worker torch's import
    import torch
    from torch import nn


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    g = torch.Generator().manual_seed(11)
    x = torch.randn(SAMPLES, 6, generator=g, dtype=torch.float64)
    y = torch.randn(SAMPLES, 2, generator=g, dtype=torch.float64)
    return x, y


def _model() -> nn.Module:
    import torch
    from torch import nn

    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2)).double()


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


# -- the sampler ----------------------------------------------------------------------------------


def test_every_sample_once_per_epoch_in_the_same_global_batches_whatever_the_shares() -> None:
    reference = ShareBatchSampler(SAMPLES, [8], 0, seed=SEED)
    ranks = [ShareBatchSampler(SAMPLES, SHARES, r, seed=SEED) for r in range(3)]
    assert len(reference) == 3 and {len(s) for s in ranks} == {3}
    for epoch in (0, 1):
        for s in [reference, *ranks]:
            s.set_epoch(epoch)
        pieces = [list(s) for s in ranks]
        for step, whole in enumerate(reference):
            # rank order, concatenated: exactly the single process's global batch
            assert pieces[0][step] + pieces[1][step] + pieces[2][step] == whole
        assert sorted(i for p in pieces for batch in p for i in batch) == list(range(SAMPLES))
        assert [len(b) for b in pieces[0]] == [5, 5, 4] and [len(b) for b in pieces[2]] == [1, 1, 1]
    ranks[0].set_epoch(0)
    first = list(ranks[0])
    ranks[0].set_epoch(1)
    assert list(ranks[0]) != first  # a new order each epoch


def test_a_last_batch_smaller_than_the_world_is_dropped_on_every_rank() -> None:
    samplers = [ShareBatchSampler(18, SHARES, r, seed=0) for r in range(3)]  # 2 x 8, then 2 < 3 ranks
    assert {len(s) for s in samplers} == {2}
    assert sum(len(b) for s in samplers for b in s) == 16
    assert len(ShareBatchSampler(23, SHARES, 1, drop_last=True)) == 2
    with pytest.raises(SharesError, match="gives no step"):
        ShareBatchSampler(2, SHARES, 0)
    with pytest.raises(SharesError, match="rank 3 has no share"):
        ShareBatchSampler(23, SHARES, 3)


def test_loss_scales_follow_each_step_and_equal_shares_scale_by_one() -> None:
    s = ShareBatchSampler(SAMPLES, SHARES, 0)
    assert [s.loss_scale(i) for i in range(3)] == [5 * 3 / 8, 5 * 3 / 8, 4 * 3 / 7]
    assert ShareBatchSampler(30, [5, 5, 5], 2).loss_scale(0) == 1.0


# -- the arithmetic, in one process ---------------------------------------------------------------


def test_the_ranks_average_of_scaled_gradients_is_the_global_batch_gradient() -> None:
    import torch
    from torch import nn

    x, y = _data()
    model = _model()
    loss_fn = nn.MSELoss()
    ranks = [ShareBatchSampler(SAMPLES, SHARES, r, seed=SEED) for r in range(3)]
    pieces = [list(s) for s in ranks]
    for step, whole in enumerate(ShareBatchSampler(SAMPLES, [8], 0, seed=SEED)):
        model.zero_grad()
        loss_fn(model(x[whole]), y[whole]).backward()
        expected = _grads(model)
        per_rank = []
        for r, sampler in enumerate(ranks):
            model.zero_grad()
            idx = pieces[r][step]
            (loss_fn(model(x[idx]), y[idx]) * sampler.loss_scale(step)).backward()
            per_rank.append(_grads(model))
        averaged = [sum(g[k] for g in per_rank) / 3 for k in range(len(expected))]  # what DDP does
        for a, e in zip(averaged, expected, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
        # without the scale, unequal shares would weight the lone sample of rank 2 like rank 0's five
        model.zero_grad()
        unscaled = []
        for r in range(3):
            model.zero_grad()
            idx = pieces[r][step]
            loss_fn(model(x[idx]), y[idx]).backward()
            unscaled.append(_grads(model))
        plain = [sum(g[k] for g in unscaled) / 3 for k in range(len(expected))]
        assert not all(torch.allclose(p, e) for p, e in zip(plain, expected, strict=True))


# -- real DDP, gloo, 3 processes --------------------------------------------------------------------


def _train_single() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One process, the whole global batch: (gradient of the first step, final parameters)."""
    import torch
    from torch import nn

    x, y = _data()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    sampler = ShareBatchSampler(SAMPLES, [8], 0, seed=SEED)
    first: list[torch.Tensor] = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for idx in sampler:
            optimizer.zero_grad()
            nn.MSELoss()(model(x[idx]), y[idx]).backward()
            first = first or _grads(model)
            optimizer.step()
    return first, [p.detach().clone() for p in model.parameters()]


def worker(out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    try:
        x, y = _data()
        ddp = DDP(_model())
        timer = StepTimer(ddp)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
        sampler = ShareBatchSampler(SAMPLES, SHARES, rank, seed=SEED)
        first: list[torch.Tensor] = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for step, idx in enumerate(sampler):
                timer.start()
                optimizer.zero_grad()
                (nn.MSELoss()(ddp(x[idx]), y[idx]) * sampler.loss_scale(step)).backward()
                first = first or _grads(ddp.module)
                optimizer.step()
                timer.stop()
        window = timer.window()
        params = [p.detach().clone() for p in ddp.module.parameters()]
        torch.save({"first": first, "params": params, "window": window, "hooked": timer.hooked}, out)
    finally:
        dist.destroy_process_group()


def test_real_ddp_with_uneven_shares_equals_one_process(tmp_path: Path) -> None:
    import torch
    from torch.distributed import TCPStore

    # The store is this process's, on a port the kernel picked and that stays held, as torchrun's
    # agent hosts it for its ranks (TORCHELASTIC_USE_AGENT_STORE): a port picked free and handed to
    # rank 0 to bind could be taken meanwhile by another test's listener on this machine, and ranks 1
    # and 2 would then wait on a stranger.
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    procs = []
    try:
        for rank in range(3):
            env = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "3",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(store.port),
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "OMP_NUM_THREADS": "1",
            }
            argv = [
                sys.executable,
                "-m",
                "tests.unit.test_shares_ddp",
                "worker",
                str(tmp_path / f"r{rank}.pt"),
            ]
            procs.append(
                subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            )
        outputs = [p.communicate(timeout=300)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        del store
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    first, final = _train_single()
    for rank in range(3):
        got = torch.load(tmp_path / f"r{rank}.pt", weights_only=True)
        for a, e in zip(got["first"], first, strict=True):  # DDP's averaged gradient, step 1
            torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
        for a, e in zip(got["params"], final, strict=True):  # 2 epochs of 3 steps, the last ones partial
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)
        # the comm hook timed every step: compute is a part of the wall time
        assert got["hooked"] is True
        assert got["window"]["steps"] == 6
        assert 0 < got["window"]["compute"] <= got["window"]["seconds"]


def test_shares_of_the_last_batch_are_the_same_proportions() -> None:
    assert ShareBatchSampler(SAMPLES, SHARES, 0).step_shares(2) == split_batch(7, SHARES) == [4, 2, 1]


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker(sys.argv[2])
