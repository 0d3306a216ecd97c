#!/usr/bin/env bash
# The short sweep behind configs/cpu_learn.yaml: 10 GRPO steps (frontier + dynamic sampling) from
# seed 0's shared warm start of `make experiment-learn`, one setting changed per point, two points
# side by side; prints each point's first-pass training reward (first vs last quarter, with the
# interval over tasks) and its least-squares slope per step. Usage:
#   examples/sweep_learn.sh [OUT] [POINT ...]   (default runs/sweep-learn, every point; finished
#                                               points are skipped; POINT none: only the table)
# The experiment's own RL arm (seed 0; LoRA r16 at 3e-4 since 2026-12-04), when it exists, is read too:
# its first 10 steps. Points: the first round changed one setting of full fine-tuning at lr 3e-5.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/sweep-learn}
WARM=experiments/cpu-learn/warm-start/seed0/checkpoints/step-000000/model
[ -d "$WARM" ] || { echo "no warm start at $WARM: run make experiment-learn first (its warm start is enough)" >&2; exit 1; }
HARNESSRL=${HARNESSRL:-.venv/bin/harnessrl}
COMMON=(--set "model=$WARM" --set sft_warm_start_steps=0 --set steps=10 --set eval_base=false
        --set eval_held_out=0 --set eval_out_of_space=false --set frontier=true --set dynamic_sampling_rounds=1
        --set ppo_epochs=1 --set mini_batches=1 --set micro_batch_tokens=2048 --set save_every=5 --set seed=0)
declare -A POINTS=(
  [lr-3e-5]="--set learning_rate=3e-5"
  [lr-1e-5]="--set learning_rate=1e-5"
  [lr-1e-4]="--set learning_rate=1e-4"
  [lora-r16-lr-3e-4]="--set learning_rate=3e-4 --set lora_rank=16"
  [group-8]="--set learning_rate=3e-5 --set group_size=8"
  [turns-5]="--set learning_rate=3e-5 --set max_turns=5"
  # Second round, from the best first-round point (LoRA r16 at 3e-4): group size and episode length.
  [lora-r16-group-8]="--set learning_rate=3e-4 --set lora_rank=16 --set group_size=8"
  [lora-r16-turns-5]="--set learning_rate=3e-4 --set lora_rank=16 --set max_turns=5"
)
run_point() {
  local name=$1
  [ -n "${POINTS[$name]+set}" ] || { echo "unknown point $name; points: ${!POINTS[*]}" >&2; return 1; }
  [ -f "$OUT/$name/summary.json" ] && { echo "$name: finished earlier"; return; }
  # shellcheck disable=SC2086
  MALLOC_ARENA_MAX=2 OMP_NUM_THREADS=1 "$HARNESSRL" train --run-dir "$OUT/$name" "${COMMON[@]}" ${POINTS[$name]} \
    > "$OUT/$name.log" 2>&1 && echo "$name: done" || echo "$name: FAILED (see $OUT/$name.log)"
}
mkdir -p "$OUT"
names=("${@:2}")
[ ${#names[@]} -gt 0 ] || names=("${!POINTS[@]}")
[ "${names[0]}" = none ] && names=()
for ((i = 0; i < ${#names[@]}; i += 2)); do
  run_point "${names[i]}" &
  [ $((i + 1)) -lt ${#names[@]} ] && run_point "${names[i + 1]}" &
  wait
done
"${HARNESSRL%harnessrl}python" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
import numpy as np
from harnessrl.experiment.learning import reward_gain
print("| point | steps | first-pass reward per step | slope per step | last - first quarter [95% CI] | valid groups | rollouts | wall min |")
print("|---|---|---|---|---|---|---|---|")
arm = Path("experiments/cpu-learn/arms/rl-frontier-seed0")  # the experiment's arm, its steps 1-10
runs = [(arm, "the experiment's RL arm (steps 1-10)")] if (arm / "metrics.jsonl").exists() else []
runs += [(p, p.name) for p in sorted(Path(sys.argv[1]).iterdir()) if (p / "metrics.jsonl").exists()]
for run, name in runs:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    records = [r for r in records if "sampling/first_pass_reward" in r and r["step"] <= 10]
    rewards = [r["sampling/first_pass_reward"] for r in records]
    slope = float(np.polyfit([r["step"] for r in records], rewards, 1)[0]) if len(records) > 1 else float("nan")
    gain = reward_gain(records)
    cell = "-" if gain is None else f"{gain['gain']:+.3f} [{gain['ci'][0]:+.3f}, {gain['ci'][1]:+.3f}]"
    rollouts = sum(r.get("episodes", 0) + r.get("sampling/extra_rollouts", 0) for r in records)
    wall = sum(r.get("rollout_time_s", 0) + r.get("update_time_s", 0) for r in records) / 60
    valid = np.mean([r.get("valid_group_ratio", 0) for r in records])
    print(f"| {name} | {len(records)} | {', '.join(f'{x:.2f}' for x in rewards)} | {slope:+.4f} | {cell} | "
          f"{valid:.2f} | {rollouts} | {wall:.1f} |")
PY
