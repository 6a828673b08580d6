#!/usr/bin/env bash
# Every GPU check of the repository in one call, in priority order, each
# with its own time cap, so that one device lease (minutes, rarely lent)
# brings back whatever finished even when a later part runs out of time:
#   1. check-kernels --large (CubeCL kernels against their CPU twins)
#   2. scripts/gpu-splat-bench.sh (2048² to 16K, 10k and 30k Gaussians;
#      then the CPU-vs-CUDA quality pair)
#   3. scripts/gpu-profiler-check.sh (overhead on/off; reserved vs NVML)
#   4. scripts/transformer-variants.sh cuda
# and, named in PARTS only (not in the default), the checks added after the
# first two leases:
#   attention  scripts/attention-bench.sh on CUDA: the transformer with the
#              standard and the fused attention at 1,024-16,384 tokens,
#              beside the same model in PyTorch (explicit and SDPA), then
#              again in bf16 at 1,024 and 4,096 tokens (the kernels reading
#              16-bit Q, K, V; PyTorch under autocast, SDPA's flash kernel)
#   scene      the scene's whole training steps at 1 M and 6 M Gaussians,
#              SH degree 3, moments on the device and the host, SH in f32
#              and f16 (bench scene-memory), then `plan scene` at 4 GiB
#              with the preset table for 8-80 GiB cards
#   planner    `bench plan` on CUDA (the transformer at 1,024 tokens):
#              the planner's predictions against measured peaks at budgets
#              from infeasible to ample
#   plan-scene `bench plan-scene` on CUDA (the five-budget check)
#   toolkit    the toolkit's test bodies on CUDA (vramfit::test_backends!'s
#              cuda arm: checkpointed and accumulated gradients equal the
#              plain ones, the loss scaler, precision curves, host moments),
#              from the test binary at $TOOLKIT (see docs/gpu.md)
#   budget     `train transformer --budget` on CUDA: the planner's whole
#              path (probes, verification, the run held to the budget)
#   steps      the scene's whole training steps alone (the first half of
#              `scene`), with the host's copies and Adam timed apart
#   speed      issue 46's three in one call of about eight minutes: kernels
#              (the tiled attention's and the scene loss's twin checks among
#              them), attention (the tiled fused attention against SDPA and
#              the standard attention) and steps (host moments with the
#              pipelined reads; the scene's step with its loss on the device,
#              against the third lease's table at the same command)
#   ranks      scripts/gpu-ranks.sh: one rank against two on CUDA (sharing
#              the GPU where there is one), then --ranks 2 --budget; needs
#              a binary built with --features cuda,mpi (not the build
#              below) and mpirun there (exit 3 where it is missing)
# Measured on an H200 (2026-11-27): kernels 46 s, steps 33 s, plan-scene
# 131 s, toolkit 103-115 s, budget 53-56 s.
# The device tool brings back a limited number of files: everything also
# goes into OUT/all.tgz (run files that are large and not needed dropped).
# Usage (on the GPU machine, from the repository root, with the binary of
# `cargo build --release --features cuda -p vramfit-cli` at $VRAMFIT):
#   VRAMFIT=.gpu/vramfit scripts/gpu-all.sh OUT_DIR
# Caps in seconds: CAP_KERNELS, CAP_SPLAT, CAP_PROFILER, CAP_TRANSFORMER
# (60 + 300 + 190 + 160 by default: more than one 600 s device call, so a
# lease runs it as two calls, PARTS="kernels splat" then
# PARTS="profiler transformer"; PARTS defaults to all four).
# Measured on an H100 (2026-11-25): kernels 5 s, splat 184 s with a 30 s
# per-run cap (three runs cut), profiler about 170 s, transformer about 20 s
# a variant.
set -uo pipefail
out=${1:?usage: scripts/gpu-all.sh OUT_DIR}
export VRAMFIT=${VRAMFIT:-target/release/vramfit}
export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
mkdir -p "$out"
log() { echo "[$(date +%T)] $*" | tee -a "$out/gpu-all.log"; }

{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; lscpu | head -20; } > "$out/machine.txt" 2>&1

parts=${PARTS:-kernels splat profiler transformer}
if [[ " $parts " == *" speed "* ]]; then parts="$parts kernels attention steps"; fi
wants() { [[ " $parts " == *" $1 "* ]]; }

if wants kernels; then
log "check-kernels"
timeout -k 5 "${CAP_KERNELS:-60}" "$VRAMFIT" check-kernels --device cuda --large --out "$out/check-kernels.json" \
  > "$out/check-kernels.log" 2>&1
log "check-kernels: exit $?"
fi

if wants splat; then
log "splat bench"
RUN_TIMEOUT=${RUN_TIMEOUT:-60} timeout -k 5 "${CAP_SPLAT:-300}" scripts/gpu-splat-bench.sh "$out/splat" > "$out/splat.log" 2>&1
log "splat bench: exit $?"
fi

if wants profiler; then
log "profiler check"
timeout -k 5 "${CAP_PROFILER:-190}" scripts/gpu-profiler-check.sh "$out/profiler" > "$out/profiler.log" 2>&1
log "profiler check: exit $?"
fi

if wants transformer; then
log "transformer variants"
# Its run folders under OUT (mktemp honours TMPDIR): a cut run still brings
# back the summaries of the variants that finished.
mkdir -p "$out/transformer/runs"
TMPDIR="$out/transformer/runs" timeout -k 5 "${CAP_TRANSFORMER:-160}" scripts/transformer-variants.sh cuda "$out/transformer/transformer-cuda" \
  > "$out/transformer.log" 2>&1
log "transformer variants: exit $?"
fi

if wants attention; then
log "attention"
DEVICE=cuda RUN_TIMEOUT=${RUN_TIMEOUT_ATTENTION:-90} timeout -k 5 "${CAP_ATTENTION:-200}" \
  scripts/attention-bench.sh "$out/attention-cuda" > "$out/attention.log" 2>&1
log "attention: exit $?"
# The same in bf16: the kernels read 16-bit Q, K, V; SDPA takes flash.
PRECISION=bf16 TOKENS="${TOKENS_BF16:-1024 4096}" DEVICE=cuda RUN_TIMEOUT=${RUN_TIMEOUT_ATTENTION:-90} \
  timeout -k 5 "${CAP_ATTENTION_BF16:-120}" \
  scripts/attention-bench.sh "$out/attention-cuda-bf16" > "$out/attention-bf16.log" 2>&1
log "attention bf16: exit $?"
fi

if wants scene || wants steps; then
log "scene steps"
mkdir -p "$out/scene"
timeout -k 5 "${CAP_SCENE_STEPS:-90}" "$VRAMFIT" bench scene-memory --device cuda --gaussians 1000000,6000000 \
  --sh-degrees 3 --moments device,host --sh-storage f32,f16 --steps-only \
  --out "$out/scene/scene-steps-cuda.json" > "$out/scene/scene-steps.log" 2>&1
log "scene steps: exit $?"
fi

if wants scene; then
timeout -k 5 "${CAP_SCENE_PLAN:-120}" "$VRAMFIT" plan scene --device cuda --max-gaussians 6000000 --budget 4GiB \
  --gpus 8,12,16,24,48,80 --json "$out/scene/plan-scene-presets-cuda.json" > "$out/scene/plan-scene.log" 2>&1
log "plan scene: exit $?"
fi

if wants planner; then
log "planner"
timeout -k 5 "${CAP_PLANNER:-120}" "$VRAMFIT" bench plan --device cuda --no-sweep --batch-size 16 \
  --set model.width=512 --set model.heads=8 --set model.context=1024 --set task.tokens=1024 \
  --out "$out/plan-transformer-cuda.json" > "$out/planner.log" 2>&1
log "planner: exit $?"
fi

if wants plan-scene; then
log "plan-scene"
timeout -k 5 "${CAP_PLAN_SCENE:-200}" "$VRAMFIT" bench plan-scene --device cuda --max-gaussians 2000000 \
  --out "$out/plan-scene-cuda.json" > "$out/plan-scene.log" 2>&1
log "plan-scene: exit $?"
fi

if wants toolkit; then
log "toolkit on cuda"
# Every body's cuda arm, one at a time (they share the card).
timeout -k 5 "${CAP_TOOLKIT:-150}" "${TOOLKIT:-.gpu/toolkit}" ::cuda --test-threads 1 > "$out/toolkit-cuda.log" 2>&1
log "toolkit on cuda: exit $?"
fi

if wants budget; then
log "train --budget"
mkdir -p "$out/budget"
timeout -k 5 "${CAP_BUDGET:-120}" "$VRAMFIT" train transformer --device cuda --batch-size 16 --steps 30 \
  --set model.width=256 --set model.heads=4 --set model.context=512 --set task.tokens=512 \
  --budget "${BUDGET:-1.3GiB}" --out "$out/budget/run" > "$out/budget/train.log" 2>&1
log "train --budget: exit $?"
fi

if wants ranks; then
log "ranks"
timeout -k 5 "${CAP_RANKS:-480}" scripts/gpu-ranks.sh "$out/ranks" > "$out/ranks.log" 2>&1
log "ranks: exit $?"
fi

find "$out" \( -name '*.ckpt' -o -name weights.bin -o -name 'events.out.tfevents*' -o -name '*.png' \) -delete
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")" && mv "$out.tgz" "$out/all.tgz"
log "archive: $out/all.tgz"
