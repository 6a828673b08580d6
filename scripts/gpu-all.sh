#!/usr/bin/env bash
# Every GPU check of the repository in one call, in priority order, each
# with its own time cap, so that one device lease (minutes, rarely lent)
# brings back whatever finished even when a later part runs out of time:
#   1. check-kernels --large (CubeCL kernels against their CPU twins)
#   2. scripts/gpu-splat-bench.sh (2048² to 16K, 10k and 30k Gaussians;
#      then the CPU-vs-CUDA quality pair)
#   3. scripts/gpu-profiler-check.sh (overhead on/off; reserved vs NVML)
#   4. scripts/transformer-variants.sh cuda
# Usage (on the GPU machine, from the repository root, with the binary of
# `cargo build --release --features cuda -p vramfit-cli` at $VRAMFIT):
#   VRAMFIT=.gpu/vramfit scripts/gpu-all.sh OUT_DIR
# Caps in seconds: CAP_KERNELS, CAP_SPLAT, CAP_PROFILER, CAP_TRANSFORMER.
set -uo pipefail
out=${1:?usage: scripts/gpu-all.sh OUT_DIR}
export VRAMFIT=${VRAMFIT:-target/release/vramfit}
export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
mkdir -p "$out"
log() { echo "[$(date +%T)] $*" | tee -a "$out/gpu-all.log"; }

{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; lscpu | head -20; } > "$out/machine.txt" 2>&1

log "check-kernels"
timeout -k 5 "${CAP_KERNELS:-60}" "$VRAMFIT" check-kernels --device cuda --large --out "$out/check-kernels.json" \
  > "$out/check-kernels.log" 2>&1
log "check-kernels: exit $?"

log "splat bench"
RUN_TIMEOUT=${RUN_TIMEOUT:-30} timeout -k 5 "${CAP_SPLAT:-250}" scripts/gpu-splat-bench.sh "$out/splat" > "$out/splat.log" 2>&1
log "splat bench: exit $?"

log "profiler check"
timeout -k 5 "${CAP_PROFILER:-100}" scripts/gpu-profiler-check.sh "$out/profiler" > "$out/profiler.log" 2>&1
log "profiler check: exit $?"

log "transformer variants"
# Its run folders under OUT (mktemp honours TMPDIR): a cut run still brings
# back the summaries of the variants that finished.
mkdir -p "$out/transformer/runs"
TMPDIR="$out/transformer/runs" timeout -k 5 "${CAP_TRANSFORMER:-110}" scripts/transformer-variants.sh cuda "$out/transformer/transformer-cuda" \
  > "$out/transformer.log" 2>&1
log "transformer variants: exit $?"
