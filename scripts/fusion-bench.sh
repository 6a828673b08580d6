#!/usr/bin/env bash
# Burn's operation fusion on wgpu, measured (issue 28): the transformer
# (width 64, 2 heads, depth 2, batch 2 at 512 and 1,024 tokens) and the
# U-Net (its defaults), three profiled steps each on `--device wgpu` and
# `--device wgpu-fusion` (a debug build with `--features fusion`). The
# figures are the CubeCL allocator's: reserved peak (the deciding figure),
# in-use peak at the phase ends, activations after the forward; and the
# median step time (lavapipe's, software: not a GPU's).
#
#   VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json scripts/fusion-bench.sh [OUT_PREFIX]
#   (default bench-results/fusion-wgpu)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/fusion-wgpu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
cargo build -p vramfit-cli --features fusion >/dev/null
vramfit="$work/vramfit"
cp target/debug/vramfit "$vramfit"
common=(--steps 3 --set checkpoint_every=0 --set profile_every=1 --set log_every=1)
for device in wgpu wgpu-fusion; do
  for t in 512 1024; do
    echo "transformer, $t tokens, $device" >&2
    "$vramfit" train transformer --device "$device" "${common[@]}" --batch-size 2 --set model.width=64 \
      --set model.heads=2 --set model.depth=2 --set model.context="$t" --set task.tokens="$t" \
      --out "$work/transformer-$t-$device" >/dev/null 2>&1
  done
  echo "U-Net, $device" >&2
  "$vramfit" train unet --device "$device" "${common[@]}" --out "$work/unet-$device" >/dev/null 2>&1
done
python3 - "$work" "$out" <<'PY'
import json, sys
work, out = sys.argv[1:3]
mib = lambda b: b / 2**20
rows = []
for name, label in [("transformer-512", "transformer, 512 tokens"), ("transformer-1024", "transformer, 1,024 tokens"),
                    ("unet", "U-Net (defaults)")]:
    for device in ("wgpu", "wgpu-fusion"):
        d = f"{work}/{name}-{device}"
        mem, s = json.load(open(f"{d}/memory.json")), json.load(open(f"{d}/summary.json"))
        fwd = [r for r in mem["records"] if r["phase"] == "forward"]
        rows.append({"workload": label, "device": device, "reserved_peak_bytes": mem["peak_bytes"],
                     "in_use_peak_bytes": s["in_use_peak_bytes"],
                     "forward_activations_bytes": max(r["categories"].get("activations", 0) for r in fwd),
                     "final_loss": s["final_loss"], "median_step_ms": s["median_step_ms"],
                     "source": s["peak_memory_source"]})
md = ["| workload | device | reserved peak MiB | in-use peak MiB | activations after the forward MiB | final loss | median step ms (lavapipe) |",
      "|---|---|---|---|---|---|---|"]
for r in rows:
    md.append(f'| {r["workload"]} | {r["device"]} | {mib(r["reserved_peak_bytes"]):,.1f} | {mib(r["in_use_peak_bytes"]):,.1f} | '
              f'{mib(r["forward_activations_bytes"]):,.1f} | {r["final_loss"]:.4f} | {r["median_step_ms"]:,.0f} |')
text = "\n".join(md)
print(text)
json.dump({"bench": "fusion", "rows": rows,
           "measured": "the CubeCL allocator on wgpu (reserved peak: exact; in use: at the phase ends, after a sync "
                       "under fusion); three profiled steps"}, open(f"{out}.json", "w"), indent=2)
open(f"{out}.md", "w").write(f"Command: `scripts/fusion-bench.sh` (lavapipe)\n\n{text}\n")
print(f"wrote {out}.json and {out}.md")
PY
