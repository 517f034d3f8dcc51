#!/usr/bin/env bash
# README command 1: set up (or reuse) .venv, generate the mini COCO set if it is missing,
# train the SOFT-Tiny RetinaNet on it from scratch (400 iterations, a few minutes on a
# CPU) and evaluate the final checkpoint with COCO bbox mAP.
#   bash scripts/quickstart.sh [CONFIG] [WORK_DIR]
# MMSOFT_STACK=onedl runs it in .venv-onedl on the OneDL stack (scripts/setup_env.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG="${1:-configs/_mini_/retinanet_soft-t_fpn_mini-coco.py}"
WORK_DIR="${2:-work_dirs/quickstart}"
source "$ROOT/scripts/stack.sh"  # STACK, VENV
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
PY="$VENV/bin/python"
if [ ! -f data/mini_coco/annotations/instances_val.json ] || [ ! -d data/mini_ade ]; then
  echo "[quickstart] making the mini datasets in data/"
  "$PY" tools/misc/make_mini_dataset.py --out data
fi
# The console shows progress (a line every 20 iterations: the mini config's logger
# interval), results and errors; the full output (environment, config, every log line)
# goes to $WORK_DIR/quickstart.log.
mkdir -p "$WORK_DIR"
LOG="$WORK_DIR/quickstart.log"
SHOW='Iter\((train|test)\)|Saving checkpoint|bbox_mAP|mIoU|Error|error:|Traceback|Exception'
echo "[quickstart] training $CONFIG (full log: $LOG)"
"$PY" tools/train.py "$CONFIG" --work-dir "$WORK_DIR" 2>&1 | tee "$LOG" \
  | { grep -E --line-buffered "$SHOW" || true; }
CKPT="$(cat "$WORK_DIR/last_checkpoint")"
echo "[quickstart] evaluating $CKPT"
"$PY" tools/test.py "$CONFIG" "$CKPT" --work-dir "$WORK_DIR/test" 2>&1 | tee -a "$LOG" \
  | { grep -E --line-buffered "$SHOW" || true; }
echo "[quickstart] trained checkpoint: $CKPT; metrics above and in $WORK_DIR/test; full log: $LOG"
