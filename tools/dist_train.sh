#!/usr/bin/env bash
# Usage: bash tools/dist_train.sh CONFIG GPUS [train.py options]
# Launches tools/train.py on GPUS processes of this node with torchrun (set NNODES,
# NODE_RANK, MASTER_ADDR, PORT for several nodes).
CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
DIR="$(cd "$(dirname "$0")" && pwd)"
PYTHONPATH="$DIR/..":$PYTHONPATH \
exec python -m torch.distributed.run --nnodes="$NNODES" --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" --nproc_per_node="$GPUS" --master_port="$PORT" \
  "$DIR/train.py" "$CONFIG" --launcher pytorch "${@:3}"
