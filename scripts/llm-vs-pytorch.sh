#!/usr/bin/env bash
# TinyLlama-1.1B LoRA (rank 8 on q, k, v, o; 64 tokens, batch 1) on the CPU
# in one sitting, vramfit against PyTorch + PEFT (scripts/pytorch_llama_lora.py),
# as ratios of median step times and host resident sets:
#   vramfit f32   (f32 base, f32 compute)    against PyTorch f32
#   vramfit bf16  (bf16 base, bf16 compute)  against PyTorch bf16
# ROUNDS rounds (default 2), the four runs interleaved in each, so that a
# slower minute of a shared machine falls on all of them; each figure is
# the median of its rounds. vramfit's deciding peak and the phase it falls
# in come from its summary. PyTorch, transformers and PEFT are installed by
# this script into a virtual environment (VENV, default
# /tmp/vramfit-torch-venv), not by CI. Writes OUT.json and OUT.md.
#
#   scripts/llm-vs-pytorch.sh [OUT_PREFIX]   (default bench-results/llm-lora-vs-pytorch)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/llm-lora-vs-pytorch}
rounds=${ROUNDS:-2}
steps=${STEPS:-6}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
cargo build --release -p vramfit-cli >/dev/null
vramfit="$work/vramfit"
cp target/release/vramfit "$vramfit"
venv=${VENV:-/tmp/vramfit-torch-venv}
# The versions of the recorded sitting (bench-results/llm-lora-vs-pytorch.*);
# a half-finished install is finished rather than trusted.
if ! "$venv/bin/python" -c 'import torch, transformers, peft' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch==2.15.0 transformers==5.24.0 peft==0.21.2
fi
# PyTorch on as many threads as vramfit's rayon pool (all cores).
threads=$(nproc)

vramfit_run() { # LABEL BASE PRECISION ROUND
  local dir="$work/$1-$4"
  "$vramfit" train llm --shape tinyllama-1.1b --train lora:8 --base "$2" --precision "$3" \
    --set task.tokens=64 --batch-size 1 --steps "$steps" --set checkpoint_every=0 --out "$dir" >/dev/null
  python3 - "$dir/summary.json" "$1" >>"$work/runs.jsonl" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"label": sys.argv[2], "median_step_ms": s["median_step_ms"],
                  "deciding_peak_bytes": s["peak_memory_bytes"], "peak_at": s["peak_at"],
                  "peak_source": s["peak_memory_source"], "host_peak_bytes": s["host_peak_bytes"],
                  "final_loss": s["final_loss"], "device": s["device"]}))
PY
}
torch_run() { # LABEL DTYPE
  "$venv/bin/python" scripts/pytorch_llama_lora.py --dtype "$2" --steps "$steps" --threads "$threads" \
    2>>"$work/torch.log" \
    | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['label']='$1'; r['host_peak_bytes']=r['peak_rss_bytes']; print(json.dumps(r))" \
    >>"$work/runs.jsonl"
}
trap 'status=$?; [ -s "$work/torch.log" ] && [ $status -ne 0 ] && tail -20 "$work/torch.log" >&2; rm -rf "$work"' EXIT
for round in $(seq "$rounds"); do
  vramfit_run "vramfit f32" f32 f32 "$round"
  torch_run "PyTorch f32" f32
  vramfit_run "vramfit bf16" bf16 bf16 "$round"
  torch_run "PyTorch bf16" bf16
done

python3 - "$work/runs.jsonl" "$out" "$(git rev-parse --short HEAD)" "$rounds" "$steps" <<'PY'
import json, statistics, sys, platform, datetime
runs_file, out, commit, rounds, steps = sys.argv[1:6]
runs = [json.loads(l) for l in open(runs_file)]
def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
labels = ["vramfit f32", "PyTorch f32", "vramfit bf16", "PyTorch bf16"]
rows = {}
for label in labels:
    mine = [r for r in runs if r["label"] == label]
    rows[label] = {
        "median_step_ms": statistics.median(r["median_step_ms"] for r in mine),
        "step_ms_per_round": [r["median_step_ms"] for r in mine],
        "host_peak_bytes": statistics.median(r["host_peak_bytes"] for r in mine),
        "runs": mine,
    }
ratio = lambda a, b: rows[a]["median_step_ms"] / rows[b]["median_step_ms"]
result = {
    "what": "TinyLlama-1.1B LoRA rank 8 (q, k, v, o), 64 tokens, batch 1, AdamW, CPU",
    "commit": commit, "date": datetime.date.today().isoformat(), "rounds": int(rounds), "steps": int(steps),
    "cpu": cpu_model(), "cores": __import__("os").cpu_count(), "avx512_bf16": "avx512_bf16" in flags,
    "rows": rows,
    "step_ratio_f32": ratio("vramfit f32", "PyTorch f32"),
    "step_ratio_bf16": ratio("vramfit bf16", "PyTorch bf16"),
    "rss_ratio_bf16": rows["vramfit bf16"]["host_peak_bytes"] / rows["PyTorch bf16"]["host_peak_bytes"],
}
json.dump(result, open(out + ".json", "w"), indent=1)
gib = lambda b: b / 2**30
lines = [f"# TinyLlama-1.1B LoRA on the CPU: vramfit against PyTorch + PEFT ({result['date']}, {commit})", "",
         f"{result['cpu']}, {result['cores']} cores, AVX512_BF16: {result['avx512_bf16']}; "
         f"{rounds} rounds of {steps} steps each, interleaved; `scripts/llm-vs-pytorch.sh`.", "",
         "| run | step (median of rounds) | per round | deciding peak (where) | host resident set |",
         "|---|---|---|---|---|"]
for label in labels:
    r = rows[label]
    first = r["runs"][0]
    peak = f"{gib(first['deciding_peak_bytes']):.2f} GiB ({first['peak_at']})" if "deciding_peak_bytes" in first else "—"
    per = ", ".join(f"{v:,.0f}" for v in r["step_ms_per_round"])
    lines.append(f"| {label} | {r['median_step_ms']:,.0f} ms | {per} | {peak} | {gib(r['host_peak_bytes']):.2f} GiB |")
lines += ["", f"Step time, vramfit / PyTorch: f32 {result['step_ratio_f32']:.2f}×, bf16 {result['step_ratio_bf16']:.2f}×; "
          f"host resident set, bf16: {result['rss_ratio_bf16']:.2f}×."]
open(out + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
