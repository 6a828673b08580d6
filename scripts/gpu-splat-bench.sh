#!/usr/bin/env bash
# The GPU benchmark of issue 4, run on the GPU machine: the procedural
# sample at 2048², 3840×2160, 7680×4320 and 15360×8640 with 10,000 and
# 30,000 Gaussians, all present from step 1, 200 steps. Records median
# ms/step, PSNR, the allocator's peaks (in use and reserved, sampled by the
# profiler), the driver's per-process peak read in-process through NVML, and
# nvidia-smi's per-process used memory polled from outside every 20 ms.
# Then the quality check: the README's CPU fit of the built-in sample on the
# CPU and on CUDA, same seed and schedule, PSNR side by side.
# Usage: scripts/gpu-splat-bench.sh [OUT_DIR]   (needs a --features cuda build)
set -euo pipefail
out=${1:-bench-results/gpu}
bin=${VRAMFIT:-target/release/vramfit}
sizes=${SIZES:-"2048x2048 3840x2160 7680x4320 15360x8640"}
counts=${COUNTS:-"10000 30000"}
steps=${STEPS:-200}
limit=${RUN_TIMEOUT:-600}   # seconds per run, so one slow case cannot eat the lease
mkdir -p "$out"
work=$(mktemp -d)
for size in $sizes; do
  "$bin" sample --size "$size" "$work/$size.png" >/dev/null
  for n in $counts; do
    name="splat-$size-$n"
    smi="$work/$name.smi"
    timeout "$limit" "$bin" bench splat --device cuda --image "$work/$size.png" --gaussians "$n" --steps "$steps" \
      --set progressive=false --set log_every=50 --set check_every=50 \
      --out "$out/$name.json" > "$work/$name.log" 2>&1 &
    pid=$!
    : > "$smi"
    # Every compute process on the card, summed: the bench is the only one
    # (and runs under `timeout`, so its PID is not $pid).
    while kill -0 "$pid" 2>/dev/null; do
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null \
        | awk -F', ' '{ s += $2 } END { if (NR) print s }' >> "$smi" || true
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
lines = ["| image | Gaussians | ms/step (median) | PSNR dB | peak in use (allocator) MiB | peak reserved (allocator) MiB | peak NVML (process) MiB | peak nvidia-smi (process) MiB | bytes/pixel (in use) | status |",
         "|---|---|---|---|---|---|---|---|---|---|"]
mib = lambda b: "" if b is None else f"{b/2**20:.0f}"
for smi, b in rows:
    if b is None:
        lines.append(f"| {smi['name']} | | | | | | | {smi['nvidia_smi_peak_mib']} | | {smi['status']} |")
        continue
    s = b["summary"]
    # The headline (peak_memory_bytes) is the reserved figure on CUDA; the
    # in-use column is the allocator's own in-use peak.
    peak = s.get("in_use_peak_bytes") or s["peak_memory_bytes"]
    lines.append(f"| {s['width']}×{s['height']} | {s['gaussians']} | {s['median_step_ms']:.2f} | {s['psnr_db']:.2f} | "
                 f"{mib(peak)} | {mib(s.get('reserved_peak_bytes'))} | {mib(s.get('driver_peak_bytes'))} | "
                 f"{smi['nvidia_smi_peak_mib']} | {peak/(s['width']*s['height']):.1f} | ok |")
lines.append("")
lines.append("headline figure (what decides an out-of-memory): " + (rows[0][1]["summary"]["peak_memory_source"] if rows and rows[0][1] else "?"))
open(os.path.join(out, "splat-gpu.md"), "w").write("Command: `scripts/gpu-splat-bench.sh`\n\n" + "\n".join(lines) + "\n")
print("\n".join(lines))
PY

# Quality: the same fit (image, seed, schedule) on the CPU and on CUDA.
for dev in ${QUALITY_DEVICES:-cpu cuda}; do
  "$bin" bench splat --device "$dev" --gaussians 4000 --steps 1200 --set add_every=200 \
    --out "$out/quality-$dev.json" > "$out/quality-$dev.log" 2>&1 || echo "quality run on $dev failed"
done
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
p = {d: json.load(open(os.path.join(out, f"quality-{d}.json")))["summary"]["psnr_db"]
     for d in ("cpu", "cuda") if os.path.exists(os.path.join(out, f"quality-{d}.json"))}
line = f"quality (built-in sample, 4000 Gaussians, 1200 steps): PSNR cpu {p.get('cpu')} dB, cuda {p.get('cuda')} dB"
if len(p) == 2:
    line += f", difference {p['cuda'] - p['cpu']:+.3f} dB (target within 0.3)"
print(line)
open(os.path.join(out, "splat-gpu.md"), "a").write("\n" + line + "\n")
PY
