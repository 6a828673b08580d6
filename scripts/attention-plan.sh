#!/usr/bin/env bash
# The planner at a budget only the fused attention fits (issue 28): the
# transformer at 4,096 tokens (width 64, 2 heads, depth 2, batch 2, vocab
# 64) on the CPU. `vramfit plan transformer … --budget B` (probes, ranked
# plans, the winner verified), then `vramfit train transformer … --budget
# B` (plan, verify, run held to the budget). Records what the leanest plan
# with the standard attention needs (a probe: every block checkpointed,
# micro-batches of one), the winner, and the run's deciding peak.
#
#   scripts/attention-plan.sh [OUT_PREFIX]   (default bench-results/attention-plan-cpu)
#   BUDGET=200MiB STEPS=20 scripts/attention-plan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/attention-plan-cpu}
budget=${BUDGET:-200MiB}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
cargo build --release -p vramfit-cli >/dev/null
vramfit=target/release/vramfit
shape=(--set task.tokens=4096 --set model.context=4096 --set model.depth=2 --set model.heads=2
  --set model.width=64 --batch-size 2)
"$vramfit" plan transformer "${shape[@]}" --budget "$budget" --json "$work/plan.json" | tee "$work/plan.txt"
"$vramfit" train transformer "${shape[@]}" --steps "${STEPS:-20}" --budget "$budget" --out "$work/run" |
  tee "$work/train.txt"
python3 - "$work" "$out" "$budget" <<'PY'
import json, sys
work, out, budget = sys.argv[1:4]
plan = json.load(open(f"{work}/plan.json"))
lean = next(p for p in plan["calibration"]["probes"] if p["name"] == "leanest exact step")
winner = next(l for l in open(f"{work}/plan.txt") if l.startswith("winner:"))[len("winner:"):].strip()
summary = json.load(open(f"{work}/run/summary.json"))
run_plan = json.load(open(f"{work}/run/plan.json"))
mib = lambda b: b / 2**20
record = {
    "bench": "attention-plan", "device": plan["device"], "budget": budget, "budget_bytes": run_plan["budget_bytes"],
    "leanest_standard_probe": {"knobs": lean["knobs"], "measured_peak_bytes": lean["measured"]["peak_bytes"]},
    "plan_winner": winner, "plan_choice": plan["choice"], "plan_verified": plan["verified"],
    "run": {"techniques": summary["techniques"], "peak_memory_bytes": summary["peak_memory_bytes"],
            "peak_memory_source": summary["peak_memory_source"], "median_step_ms": summary["median_step_ms"],
            "steps": summary["steps"], "run_plan_why": run_plan["why"]},
    "measured": "heap bytes in use by the counting allocator (exact high-water); the leanest standard plan is a probe",
}
json.dump(record, open(f"{out}.json", "w"), indent=2)
text = f"""Command: `scripts/attention-plan.sh` (budget {budget}; CPU, release build)

The transformer at 4,096 tokens (width 64, 2 heads, depth 2, batch 2, vocab 64). Heap bytes in use, measured:

| what | peak MiB |
|---|---|
| the leanest exact step with the standard attention (its probe: every block checkpointed, micro-batches of 1) | {mib(lean["measured"]["peak_bytes"]):,.1f} |
| the budget | {mib(run_plan["budget_bytes"]):,.1f} |
| `vramfit plan`'s winner, verified by a probe | {mib(plan["verified"]["peak_bytes"]):,.1f} |
| `vramfit train --budget`, {summary["steps"]} steps ({summary["median_step_ms"]:,.0f} ms a step) | {mib(summary["peak_memory_bytes"]):,.1f} |

`vramfit plan`'s winner: {winner}
"""
open(f"{out}.md", "w").write(text)
print(text)
print(f"wrote {out}.json and {out}.md")
PY
