#!/usr/bin/env bash
# Data-parallel ranks on CUDA (issue 30): not yet run. Each rank uses the
# GPU of its local rank (vramfit::ranks::local_rank), modulo the GPUs
# there are: on a one-GPU machine both ranks share it, which checks the
# CUDA ranks' sums and per-rank memory (each rank is a process with its
# own allocator) but says nothing of speed. The gradients are summed
# through MPI in host memory (not NCCL). It checks:
#   1. one rank against two, the same global batch: the final losses and
#      every rank's deciding peak (CubeCL's reserved bytes), with and
#      without sharded moments;
#   2. `train --ranks 2 --budget` at a budget the one-rank plan cannot hold
#      (the budget from the one-rank leanest plan, minus a tenth), every
#      rank's peak against it.
# Usage (on the GPU machine, from the repository root; Open MPI and
# libclang installed, and the binary of
# `cargo build --release -p vramfit-cli --features cuda,mpi` at $VRAMFIT):
#   VRAMFIT=.gpu/vramfit scripts/gpu-ranks.sh OUT_DIR
# Each run is capped at CAP_RUN seconds (90); exit 3: nothing could run.
set -uo pipefail
out=${1:?usage: scripts/gpu-ranks.sh OUT_DIR}
vramfit=${VRAMFIT:-target/release/vramfit}
mkdir -p "$out"
if ! command -v mpirun >/dev/null 2>&1; then
  echo "no mpirun on this machine (Open MPI): the ranks cannot start; nothing run" | tee "$out/ranks.log"
  exit 3
fi
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
echo "GPUs: $gpus" | tee "$out/ranks.log"
if [ "$gpus" -lt 1 ]; then
  echo "no GPU: nothing run" | tee -a "$out/ranks.log"
  exit 3
fi
[ "$gpus" -lt 2 ] && echo "one GPU: the two ranks share it (sums and per-rank memory, not speed)" | tee -a "$out/ranks.log"
shape=(--device cuda --steps 50 --batch-size 8 --micro-batch 4 --accumulate 2 --set model.width=512
  --set model.heads=8 --set model.depth=8 --set model.vocab=8192 --set model.context=256 --set task.tokens=256)
run() { # NAME ARGS...: one run, its log and its summary kept
  local name=$1; shift
  timeout -k 5 "${CAP_RUN:-90}" "$vramfit" train transformer "${shape[@]}" "$@" --out "$out/$name" > "$out/$name.log" 2>&1
  echo "$name: exit $?" | tee -a "$out/ranks.log"
}
run one
run two --ranks 2
run two-sharded --ranks 2 --shard-moments
python3 - "$out" <<'PY' | tee -a "$out/ranks.log"
import json, os, sys
out = sys.argv[1]
for name in ["one", "two", "two-sharded"]:
    dirs = [os.path.join(out, name)] + sorted(
        os.path.join(out, name, "ranks", d) for d in os.listdir(os.path.join(out, name, "ranks"))
    ) if os.path.isdir(os.path.join(out, name, "ranks")) else [os.path.join(out, name)]
    rows = []
    for d in dirs:
        try:
            s = json.load(open(os.path.join(d, "summary.json")))
            rows.append(f"{s['peak_memory_bytes'] / 2**20:.1f} MiB, loss {s['final_loss']:.6f}, {s['median_step_ms']:.1f} ms")
        except (OSError, KeyError, ValueError) as e:
            rows.append(f"no summary ({e})")
    print(f"{name}: " + " | ".join(rows))
PY
# The one-rank plan's leanest budget, then a tenth below it on two ranks.
timeout -k 5 "${CAP_RUN:-90}" "$vramfit" plan transformer "${shape[@]}" --budget 1MiB > "$out/plan-one.log" 2>&1
budget=$(grep -o -- '--budget [0-9]*' "$out/plan-one.log" | head -1 | awk '{print int($2 * 0.9)}')
if [ -n "$budget" ]; then
  run budget-two --ranks 2 --budget "$budget"
  grep -E "verified on 2 ranks|every rank within|OVER" "$out/budget-two.log" | tee -a "$out/ranks.log"
else
  echo "no leanest budget read from plan-one.log" | tee -a "$out/ranks.log"
fi
