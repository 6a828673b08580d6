#!/usr/bin/env bash
# The U-Net's memory and techniques, measured:
#  1. activation memory against resolution and batch (short runs): the
#     bytes held at the end of the forward pass beyond parameters,
#     gradients, optimiser state and inputs, against the model's
#     resolution² × batch law anchored at 64² × 8;
#  2. the default run once per technique combination (full runs): final and
#     eval loss, step time against f32, activations and peak.
# Writes OUT_PREFIX.json and OUT_PREFIX.md.
# Usage: scripts/unet-variants.sh [cpu|wgpu|cuda] [OUT_PREFIX]
# (OUT_PREFIX defaults to bench-results/unet-<device>; VRAMFIT picks the binary,
#  STEPS the full runs' steps, default 200; SCALING_ONLY=1 skips part 2, for
#  slow devices such as lavapipe).
set -euo pipefail
device=${1:-cpu}
prefix=${2:-bench-results/unet-$device}
bin=${VRAMFIT:-target/release/vramfit}
steps=${STEPS:-200}
runs=$(mktemp -d)
short="--steps 4 --set profile_every=1 --set checkpoint_every=0"
for shape in 32x8 64x8 128x8 64x4 64x16; do
  r=${shape%x*}; b=${shape#*x}
  # shellcheck disable=SC2086
  "$bin" train unet --device "$device" --out "$runs/scale-$shape" $short --set task.resolution="$r" --batch-size "$b" >/dev/null
  # shellcheck disable=SC2086
  "$bin" train unet --device "$device" --out "$runs/scale-ckpt-$shape" $short --checkpoint all --set task.resolution="$r" --batch-size "$b" >/dev/null
  echo "done: scale $shape"
done
declare -A variants=()
[ "${SCALING_ONLY:-0}" = 1 ] || variants=(
  [1-f32]=""
  [2-checkpoint-all]="--checkpoint all"
  [3-checkpoint-every-2]="--checkpoint every:2"
  [4-bf16]="--precision bf16"
  [5-f16-dynamic-scale]="--precision f16"
  [6-micro-batch-2x4]="--micro-batch 2 --accumulate 4"
  [7-groupnorm-micro-batch-2x4]="--micro-batch 2 --accumulate 4 --set model.norm=group"
  [8-bf16-storage-and-moments]="--precision bf16 --storage *:bf16 --moments bf16"
  [9-all-together]="--precision bf16 --checkpoint all --micro-batch 4 --accumulate 2 --moments bf16"
)
for name in $(printf '%s\n' "${!variants[@]}" | sort); do
  # shellcheck disable=SC2086
  "$bin" train unet --device "$device" --out "$runs/$name" --steps "$steps" ${variants[$name]} >/dev/null
  echo "done: $name"
done
mkdir -p "$(dirname "$prefix")"
python3 - "$runs" "$prefix" "$bin --device $device" "$steps" <<'PY'
import json, os, sys
runs, prefix, cmd, steps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

def activations(run):
    """Largest activations figure at the end of a forward pass (bytes)."""
    m = json.load(open(os.path.join(runs, run, "memory.json")))
    return max(r["categories"].get("activations", 0) for r in m["records"] if r["phase"] == "forward")

def summary(run):
    s = json.load(open(os.path.join(runs, run, "summary.json")))
    s["activations_bytes"] = activations(run)
    return s

scale = []
for shape in ["32x8", "64x8", "128x8", "64x4", "64x16"]:
    r, b = map(int, shape.split("x"))
    plain, ckpt = summary("scale-" + shape), summary("scale-ckpt-" + shape)
    scale.append({"resolution": r, "batch": b, "plain": plain, "checkpoint_all": ckpt})
anchor = next(x for x in scale if (x["resolution"], x["batch"]) == (64, 8))["plain"]["activations_bytes"]
rows = sorted(n for n in os.listdir(runs) if not n.startswith("scale-"))
variants = [dict(summary(n), variant=n) for n in rows]
json.dump({"command": f"scripts/unet-variants.sh ({cmd}), STEPS={steps}", "scaling": scale, "runs": variants},
          open(prefix + ".json", "w"), indent=2)
mib = lambda x: f"{x / 2**20:.1f} MiB"
lines = ["Activations at the end of the forward pass (measured: in use minus parameters, gradients, optimiser state and inputs), "
         "against resolution² × batch scaled from 64² × 8:", "",
         "| resolution | batch | activations | law (r²·b) | measured / law | with --checkpoint all | cut | peak (plain) | peak (checkpoint all) |",
         "|---|---|---|---|---|---|---|---|---|"]
for x in scale:
    r, b, p, c = x["resolution"], x["batch"], x["plain"], x["checkpoint_all"]
    law = anchor * (r / 64) ** 2 * (b / 8)
    lines.append(f"| {r}² | {b} | {mib(p['activations_bytes'])} | {mib(law)} | {p['activations_bytes'] / law:.3f} | "
                 f"{mib(c['activations_bytes'])} | {1 - c['activations_bytes'] / p['activations_bytes']:.0%} | "
                 f"{mib(p['peak_memory_bytes'])} | {mib(c['peak_memory_bytes'])} |")
ref = variants[0] if variants else scale[1]["plain"]
if variants:
    lines += ["", f"Default U-Net ({steps} steps, 64² crops, batch 8, width 8, depth 3, BatchNorm):", "",
              "| variant | final loss | eval loss | ms/step (median) | × f32 time | activations | peak memory |",
              "|---|---|---|---|---|---|---|"]
for v in variants:
    lines.append(f"| {v['variant']} | {v['final_loss']:.5f} | {v['eval_loss']:.5f} | {v['median_step_ms']:.1f} | "
                 f"{v['median_step_ms'] / ref['median_step_ms']:.2f} | {mib(v['activations_bytes'])} | {mib(v['peak_memory_bytes'])} |")
lines += ["", f"Noise floor {ref['noise_floor']:.5f}, the noisy input's loss {ref['identity_loss']:.5f}; device: {ref['device']}; "
          f"peak memory: {ref['peak_memory_source']}. Command: scripts/unet-variants.sh ({cmd})."]
open(prefix + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
