#!/bin/sh
# Launch script for node head (elastic), rendered by cluster-bootstrap.
# Cluster mixed: 3 node(s), world size 4, backend nccl.
# Runs torchrun for this node's 1 rank(s); global ranks are assigned at each rendezvous.
# Standalone: copy it to the node and run `sh` on it; bootstrap launch runs the same text.
set -eu
cd "$HOME"/cluster-bootstrap/code
# lines reach the log (and bootstrap) as they are printed: torchrun's --tee copier never flushes
export PYTHONUNBUFFERED=1
# the backend the cluster chose, for training scripts that read it (the shipped example does)
export CLUSTER_BOOTSTRAP_BACKEND=nccl
# each rendezvous assigns the global ranks: torchrun tags every line with the rank itself
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[default${rank}]:'
export GLOO_SOCKET_IFNAME=eth0
export NCCL_SOCKET_IFNAME==eth0
export OMP_NUM_THREADS=16
export MY_FLAG='a b'
export WANDB_API_KEY='********'
exec python3 -m torch.distributed.run \
  --tee 3 \
  --nnodes 2:3 \
  --nproc-per-node 1 \
  --rdzv-backend c10d \
  --rdzv-endpoint 10.0.0.1:29500 \
  --rdzv-id mixed-20261202 \
  --local-addr 10.0.0.1 \
  --max-restarts 3 \
  examples/train_ddp.py --epochs 3 --note 'it'"'"'s $HOME; `x`'
