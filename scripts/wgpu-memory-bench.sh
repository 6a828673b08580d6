#!/usr/bin/env bash
# The splat GPU path's memory on wgpu, measured by CubeCL's own allocator:
# the headline peak (reserved high-water, the figure that decides an
# out-of-memory on CubeCL), the declared workspace and bytes per pixel at
# 2048² with 10,000 Gaussians and at 3840×2160 and 7680×4320 with 30,000,
# beside Image-GS's published reserved figures on an H100. Two steps each
# (an 8K step takes minutes on a software Vulkan device).
#
#   scripts/wgpu-memory-bench.sh OUT_PREFIX [BAND_ROWS]
#
# Needs a vramfit built with --features wgpu (VRAMFIT=path, default
# target/release/vramfit) and a Vulkan driver (lavapipe in CI:
# VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json).
# Writes OUT_PREFIX.json and OUT_PREFIX.md.
set -euo pipefail
out=${1:?usage: $0 OUT_PREFIX [BAND_ROWS]}
band_rows=${2:-0}
vramfit=${VRAMFIT:-target/release/vramfit}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"

cases="2048x2048:10000 3840x2160:30000 7680x4320:30000"
for c in $cases; do
  size=${c%%:*}; n=${c##*:}
  "$vramfit" sample --size "$size" "$work/$size.png" >/dev/null
  start=$(date +%s.%N)
  "$vramfit" fit "$work/$size.png" --device wgpu --gaussians "$n" --steps 2 \
    --set progressive=false --set profile_every=1 --set log_every=1 --set check_every=1 \
    --set frame_every=0 --set checkpoint_every=0 --set band_rows="$band_rows" \
    --out "$work/run-$size" >"$work/$size.log" 2>&1 || { cat "$work/$size.log"; exit 1; }
  end=$(date +%s.%N)
  echo "$size $n $start $end" >>"$work/times"
  cp "$work/run-$size/summary.json" "$work/$size.summary.json"
  cp "$work/run-$size/memory.json" "$work/$size.memory.json"
done

python3 - "$work" "$out" "$band_rows" "$vramfit" <<'EOF'
import json, sys, platform, subprocess
work, out, band_rows, vramfit = sys.argv[1:5]
# Image-GS on an H100 (its paper's memory table): reserved GiB.
reference = {"2048x2048": 0.586, "3840x2160": 1.162, "7680x4320": 4.584}
rows, times = [], {}
for line in open(f"{work}/times"):
    size, n, t0, t1 = line.split()
    times[size] = (int(n), float(t1) - float(t0))
gib = 2**30
for size, (n, secs) in times.items():
    s = json.load(open(f"{work}/{size}.summary.json"))
    m = json.load(open(f"{work}/{size}.memory.json"))
    w, h = map(int, size.split("x"))
    peak = s["peak_memory_bytes"]
    rows.append({
        "size": size, "gaussians": n, "pixels": w * h,
        "headline_peak_bytes": peak, "headline_figure": m["headline"]["figure"],
        "headline_exact": m["headline"]["exact"], "peak_at": s.get("peak_at"),
        "workspace_bytes": s["workspace_bytes"], "in_use_peak_bytes": s.get("in_use_peak_bytes"),
        "bytes_per_pixel": peak / (w * h),
        "image_gs_h100_reserved_gib": reference[size],
        "image_gs_bytes_per_pixel": reference[size] * gib / (w * h),
        "wall_seconds": secs, "device": s["device"],
    })
record = {
    "bench": "splat memory on wgpu", "band_rows": int(band_rows), "vramfit": vramfit,
    "host": platform.node(), "cpu": platform.processor() or platform.machine(),
    "note": "measured: headline (allocator reserved high-water), workspace (engine scratch held at once), in-use peak (sampled); derived: bytes per pixel. Image-GS figures are published, on an H100, not measured here.",
    "rows": rows,
}
json.dump(record, open(f"{out}.json", "w"), indent=2)
lines = [
    "| image | Gaussians | peak (reserved, exact) | workspace | bytes/pixel | Image-GS reserved (H100, published) | Image-GS bytes/pixel | wall s (2 steps + eval) |",
    "|---|---|---|---|---|---|---|---|",
]
for r in rows:
    lines.append(
        f"| {r['size']} | {r['gaussians']:,} | {r['headline_peak_bytes']/2**20:.1f} MiB | {r['workspace_bytes']/2**20:.1f} MiB | "
        f"{r['bytes_per_pixel']:.1f} | {r['image_gs_h100_reserved_gib']:.3f} GiB | {r['image_gs_bytes_per_pixel']:.0f} | {r['wall_seconds']:.0f} |"
    )
lines.append("")
lines.append(f"Device: {rows[0]['device'] if rows else '?'}; band_rows = {band_rows} (0: automatic). Peak: the CubeCL allocator's reserved high-water, the figure that decides an out-of-memory on CubeCL.")
open(f"{out}.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
