#!/usr/bin/env bash
# Trains the default transformer once per technique combination and
# collects each run's summary.json into one JSON file and a Markdown table.
# Usage: scripts/transformer-variants.sh [cpu|cuda] [OUT_PREFIX]
# (OUT_PREFIX defaults to bench-results/transformer-<device>).
set -euo pipefail
device=${1:-cpu}
prefix=${2:-bench-results/transformer-$device}
bin=${VRAMFIT:-target/release/vramfit}
runs=$(mktemp -d)
declare -A variants=(
  [1-f32]=""
  [2-bf16]="--precision bf16"
  [3-f16-dynamic-scale]="--precision f16"
  [4-f32-checkpoint-auto]="--checkpoint auto"
  [5-f32-accumulate-4x4]="--micro-batch 4 --accumulate 4"
  [6-bf16-storage-and-moments]="--precision bf16 --storage *:bf16 --moments bf16"
  [7-all-together]="--precision bf16 --checkpoint auto --micro-batch 4 --accumulate 4 --storage token_embedding:bf16 --moments bf16 --allocator-cleanup every:50"
)
for name in $(printf '%s\n' "${!variants[@]}" | sort); do
  # shellcheck disable=SC2086
  "$bin" train transformer --device "$device" --out "$runs/$name" ${variants[$name]} >/dev/null
  echo "done: $name"
done
mkdir -p "$(dirname "$prefix")"
python3 - "$runs" "$prefix" "$bin --device $device" <<'PY'
import json, os, sys
runs, prefix, cmd = sys.argv[1], sys.argv[2], sys.argv[3]
rows = []
for name in sorted(os.listdir(runs)):
    s = json.load(open(os.path.join(runs, name, "summary.json")))
    s["variant"] = name
    rows.append(s)
json.dump({"command": f"scripts/transformer-variants.sh ({cmd})", "runs": rows}, open(prefix + ".json", "w"), indent=2)
ref = rows[0]
lines = ["| variant | final loss (nats) | ms/step (median) | × f32 time | parameter bytes | optimizer bytes | skipped | peak memory |",
         "|---|---|---|---|---|---|---|---|"]
for r in rows:
    lines.append(f"| {r['variant']} | {r['final_loss']:.4f} | {r['median_step_ms']:.1f} | {r['median_step_ms']/ref['median_step_ms']:.2f} | "
                 f"{r['parameter_bytes']:,} | {r['optimizer_state_bytes']:,} | {r['skipped_steps']} | {r['peak_memory_bytes']/2**20:.0f} MiB |")
lines.append("")
lines.append(f"Task entropy floor {ref['entropy_floor']:.4f} nats; device: {ref['device']}; peak memory: {ref['peak_memory_source']}.")
open(prefix + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
