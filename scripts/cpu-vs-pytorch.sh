#!/usr/bin/env bash
# CPU speed in one invocation on one machine, as ratios:
#  1. the README's main job (the built-in sample, 4,000 Gaussians, 1,200
#     steps) with this checkout's vramfit and, when BASE_REF is given, with
#     a build of that commit (the "before"): wall time, ms per step, PSNR;
#  2. the transformer at PyTorch's comparison shape (width 256, depth 4,
#     8 heads, 128 tokens, vocab 256, batch 16, f32, AdamW, 2 threads)
#     against the same model in PyTorch (scripts/pytorch_gpt.py): tokens
#     per second and peak resident set;
#  3. the README's command itself (`fit --config configs/sample-fit.toml`,
#     this checkout's schedule): wall time and PSNR against issue 15's
#     targets (60 s or less, 32.5 dB or more).
# PyTorch is installed by this script into a virtual environment
# (VENV, default /tmp/vramfit-torch-venv), not by CI.
#
#   scripts/cpu-vs-pytorch.sh [OUT_PREFIX]    (default bench-results/cpu-vs-pytorch)
#   BASE_REF=<commit> scripts/cpu-vs-pytorch.sh   also builds and runs that commit's main job
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/cpu-vs-pytorch}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
cargo build --release -p vramfit-cli >/dev/null
vramfit="$work/vramfit"
cp target/release/vramfit "$vramfit"
main_job() { # BIN LABEL
  local start end
  start=$(date +%s.%N)
  "$1" fit --gaussians 4000 --steps 1200 --set add_every=200 --out "$work/fit-$2" >/dev/null
  end=$(date +%s.%N)
  python3 - "$work/fit-$2/summary.json" "$2" "$start" "$end" >>"$work/fits.jsonl" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"label": sys.argv[2], "wall_seconds": float(sys.argv[4]) - float(sys.argv[3]),
                  "median_step_ms": s["median_step_ms"], "psnr_db": s["psnr_db"], "steps": s["steps"]}))
PY
}
if [ -n "${BASE_REF:-}" ]; then
  # A target directory of its own (BASE_TARGET, default target/base): sharing
  # this checkout's would mix the two builds' workspace crates.
  git worktree add --detach "$work/base" "$BASE_REF" >/dev/null
  base_target=${BASE_TARGET:-$PWD/target/base}
  (cd "$work/base" && CARGO_TARGET_DIR="$base_target" cargo build --release -p vramfit-cli >/dev/null)
  cp "$base_target/release/vramfit" "$work/vramfit-base"
  git worktree remove --force "$work/base"
  main_job "$work/vramfit-base" "base $BASE_REF"
fi
main_job "$vramfit" "this checkout"

start=$(date +%s.%N)
"$vramfit" fit --config configs/sample-fit.toml --out "$work/readme" >/dev/null
end=$(date +%s.%N)
python3 - "$work/readme/summary.json" "$start" "$end" >"$work/readme.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"command": "vramfit fit --config configs/sample-fit.toml",
                  "wall_seconds": float(sys.argv[3]) - float(sys.argv[2]), "steps": s["steps"],
                  "median_step_ms": s["median_step_ms"], "psnr_db": s["psnr_db"]}))
PY

"$vramfit" train transformer --set model.width=256 --set model.heads=8 --set model.vocab=256 \
  --set model.context=128 --set task.tokens=128 --batch-size 16 --steps 20 --set checkpoint_every=0 \
  --out "$work/gpt" >/dev/null
venv=${VENV:-/tmp/vramfit-torch-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch
fi
"$venv/bin/python" scripts/pytorch_gpt.py --steps 20 >"$work/torch.json"

python3 - "$work" "$out" <<'PY'
import json, os, sys, platform
work, out = sys.argv[1:3]
fits = [json.loads(l) for l in open(f"{work}/fits.jsonl")]
gpt = json.load(open(f"{work}/gpt/summary.json"))
torch = json.load(open(f"{work}/torch.json"))
readme = json.load(open(f"{work}/readme.json"))
def cpu_model():
    # platform.processor() is empty on Linux; timings are only comparable on one CPU.
    try:
        with open("/proc/cpuinfo") as f:
            return next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        return platform.processor()
record = {"bench": "cpu-vs-pytorch", "host": platform.node(), "cpu": cpu_model(),
          "main_job": fits, "vramfit_transformer": {k: gpt.get(k) for k in
          ["median_step_ms", "tokens_per_second", "host_peak_bytes", "parameter_bytes"]}, "pytorch": torch,
          "readme_command": readme}
json.dump(record, open(out + ".json", "w"), indent=2)
lines = [f"CPU: {record['cpu']} ({os.cpu_count()} cores)", "",
         "| main job | wall s | ms/step | PSNR dB | × this checkout's time |", "|---|---|---|---|---|"]
mine = fits[-1]
for f in fits:
    lines.append(f"| {f['label']} | {f['wall_seconds']:.1f} | {f['median_step_ms']:.1f} | {f['psnr_db']:.2f} | {f['wall_seconds'] / mine['wall_seconds']:.2f} |")
g = record["vramfit_transformer"]
lines += ["", "| transformer (width 256, depth 4, 128 tokens, batch 16, f32, 2 threads) | ms/step | tokens/s | peak RSS MiB |",
          "|---|---|---|---|",
          f"| vramfit | {g['median_step_ms']:.0f} | {g['tokens_per_second']:.0f} | {(g['host_peak_bytes'] or 0) / 2**20:.0f} |",
          f"| PyTorch {torch['torch']} | {torch['median_step_ms']:.0f} | {torch['tokens_per_second']:.0f} | {torch['peak_rss_bytes'] / 2**20:.0f} |",
          f"| PyTorch / vramfit tokens per second | | {torch['tokens_per_second'] / g['tokens_per_second']:.2f} | |",
          "", "| README command (configs/sample-fit.toml) | wall s | steps | ms/step | PSNR dB | target: ≤ 60 s, ≥ 32.5 dB |",
          "|---|---|---|---|---|---|",
          f"| this checkout | {readme['wall_seconds']:.1f} | {readme['steps']} | {readme['median_step_ms']:.1f} | {readme['psnr_db']:.2f} | "
          + ("met" if readme['wall_seconds'] <= 60 and readme['psnr_db'] >= 32.5 else "not met") + " |"]
open(out + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
