#!/usr/bin/env bash
# The GPU benchmark of issue 4, run on the GPU machine: the procedural
# sample at 2048², 3840×2160, 7680×4320 and 15360×8640 with 10,000 and
# 30,000 Gaussians, all present from step 1, 200 steps. Records median
# ms/step, PSNR, the allocator's peak (the profiler) and an independent
# peak (nvidia-smi's per-process used memory, polled every 20 ms).
# Usage: scripts/gpu-splat-bench.sh [OUT_DIR]   (needs a --features cuda build)
set -euo pipefail
out=${1:-bench-results/gpu}
bin=${VRAMFIT:-target/release/vramfit}
sizes=${SIZES:-"2048x2048 3840x2160 7680x4320 15360x8640"}
counts=${COUNTS:-"10000 30000"}
steps=${STEPS:-200}
mkdir -p "$out"
work=$(mktemp -d)
for size in $sizes; do
  "$bin" sample --size "$size" "$work/$size.png" >/dev/null
  for n in $counts; do
    name="splat-$size-$n"
    smi="$work/$name.smi"
    "$bin" bench splat --device cuda --image "$work/$size.png" --gaussians "$n" --steps "$steps" \
      --set progressive=false --set log_every=50 --set check_every=50 \
      --out "$out/$name.json" > "$work/$name.log" 2>&1 &
    pid=$!
    : > "$smi"
    while kill -0 "$pid" 2>/dev/null; do
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null \
        | awk -F', ' -v p="$pid" '$1 == p { print $2 }' >> "$smi" || true
      sleep 0.02
    done
    if wait "$pid"; then status=ok; else status=failed; fi
    peak=$(sort -n "$smi" | tail -1)
    echo "{\"name\": \"$name\", \"status\": \"$status\", \"nvidia_smi_peak_mib\": ${peak:-null}}" > "$out/$name.smi.json"
    cp "$work/$name.log" "$out/$name.log"
    echo "$name: $status, nvidia-smi peak ${peak:-?} MiB"
  done
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = []
for f in sorted(os.listdir(out)):
    if not f.endswith(".smi.json"):
        continue
    smi = json.load(open(os.path.join(out, f)))
    bench = os.path.join(out, smi["name"] + ".json")
    b = json.load(open(bench)) if os.path.exists(bench) and smi["status"] == "ok" else None
    rows.append((smi, b))
lines = ["| image | Gaussians | ms/step (median) | PSNR dB | peak (allocator) MiB | peak (nvidia-smi, process) MiB | bytes/pixel (allocator) | status |",
         "|---|---|---|---|---|---|---|---|"]
for smi, b in rows:
    if b is None:
        lines.append(f"| {smi['name']} | | | | | {smi['nvidia_smi_peak_mib']} | | {smi['status']} |")
        continue
    s = b["summary"]
    peak = s["peak_memory_bytes"]
    lines.append(f"| {s['width']}×{s['height']} | {s['gaussians']} | {s['median_step_ms']:.2f} | {s['psnr_db']:.2f} | "
                 f"{peak/2**20:.0f} ({s['peak_memory_source']}) | {smi['nvidia_smi_peak_mib']} | {peak/(s['width']*s['height']):.1f} | ok |")
open(os.path.join(out, "splat-gpu.md"), "w").write("Command: `scripts/gpu-splat-bench.sh`\n\n" + "\n".join(lines) + "\n")
print("\n".join(lines))
PY
