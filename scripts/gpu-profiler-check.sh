#!/usr/bin/env bash
# The profiler's check of issue 3, run on the GPU machine: `vramfit fit` on
# CUDA at two image sizes, with the profiler as shipped (phase records every
# 10 steps, allocator sampled every 2 ms) and with it off, alternating
# on/off/on/off so that drift shows as spread. Reports the overhead (median
# ms/step, on against off) and the allocator's reserved peak against the
# driver's (NVML) peak minus the CUDA context measured when profiling began.
# Usage: scripts/gpu-profiler-check.sh [OUT_DIR]   (needs a --features cuda build)
set -euo pipefail
out=${1:-bench-results/gpu-profiler}
bin=${VRAMFIT:-target/release/vramfit}
sizes=${SIZES:-"2048x2048 7680x4320"}
gaussians=${GAUSSIANS:-10000}
steps=${STEPS:-300}
mkdir -p "$out"
work=$(mktemp -d)
common=(--device cuda --gaussians "$gaussians" --steps "$steps" --set progressive=false
        --set frame_every=0 --set checkpoint_every=0 --set check_every=100)
for size in $sizes; do
  "$bin" sample --size "$size" "$work/$size.png" >/dev/null
  for round in 1 2; do
    for mode in on off; do
      extra=()
      [ "$mode" = off ] && extra=(--set profile_every=0 --set profile_sample_ms=0)
      run="$work/$size-$mode-$round"
      "$bin" fit "$work/$size.png" "${common[@]}" "${extra[@]}" --out "$run" > "$out/$size-$mode-$round.log" 2>&1
      cp "$run/summary.json" "$out/$size-$mode-$round.summary.json"
      [ -f "$run/memory.json" ] && cp "$run/memory.json" "$out/$size-$mode-$round.memory.json"
    done
  done
done
python3 - "$out" "$sizes" <<'PY'
import json, os, statistics, sys
out, sizes = sys.argv[1], sys.argv[2].split()
mib = lambda b: f"{b / 2**20:.1f}" if b is not None else "?"
lines = ["| image | profiler on ms/step (runs) | off ms/step (runs) | overhead | allocator reserved peak MiB | NVML peak MiB | CUDA context MiB | NVML − context MiB | reserved vs NVML − context |",
         "|---|---|---|---|---|---|---|---|---|"]
for size in sizes:
    load = lambda mode, r: json.load(open(os.path.join(out, f"{size}-{mode}-{r}.summary.json")))
    on = [load("on", r) for r in (1, 2)]
    off = [load("off", r) for r in (1, 2)]
    on_ms = [s["median_step_ms"] for s in on]
    off_ms = [s["median_step_ms"] for s in off]
    overhead = (statistics.mean(on_ms) / statistics.mean(off_ms) - 1) * 100
    s = max(on, key=lambda s: s.get("driver_peak_bytes") or 0)
    res, drv, ctx = s.get("reserved_peak_bytes"), s.get("driver_peak_bytes"), s.get("driver_context_bytes")
    beyond = drv - ctx if drv is not None and ctx is not None else None
    diff = f"{(res / beyond - 1) * 100:+.1f} %" if res and beyond else "?"
    lines.append(f"| {size} | {on_ms[0]:.2f}, {on_ms[1]:.2f} | {off_ms[0]:.2f}, {off_ms[1]:.2f} | {overhead:+.1f} % | "
                 f"{mib(res)} | {mib(drv)} | {mib(ctx)} | {mib(beyond)} | {diff} |")
text = f"Command: `scripts/gpu-profiler-check.sh` ({os.environ.get('GAUSSIANS', '10000')} Gaussians, {os.environ.get('STEPS', '300')} steps, progressive=false)\n\n" + "\n".join(lines) + "\n"
open(os.path.join(out, "profiler-gpu.md"), "w").write(text)
print(text)
PY
