#!/usr/bin/env bash
# Data-parallel ranks on the CPU (issue 30): per-rank deciding peak and
# optimizer state for 1, 2 and 4 ranks with Adam's moments sharded (ZeRO
# stage 1), the same global batch, against the planner's per-rank
# prediction (`plan … --ranks 4`, derived from one-rank probes).
#  1. `vramfit plan transformer … --budget 1GiB --ranks 4 --json`: the best
#     plan per rank count and its predicted per-rank peak;
#  2. each of those plans run for real (`train … --ranks N
#     --shard-moments`, N processes through mpirun), every rank's peak
#     (heap in use, the counting allocator), optimizer state and step time.
# The transformer is shaped so that its state matters (width 256, vocab
# 4,096, 8 tokens, batch 4): sharding is about the moments. On this 2-core
# machine 4 ranks share 2 cores: step times say nothing about speed-up.
#   scripts/ranks-bench.sh [OUT_PREFIX]   (default bench-results/ranks-cpu)
# Needs a build with --features mpi (Open MPI and libclang; CI installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/ranks-cpu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
cargo build --release -p vramfit-cli --features mpi >/dev/null
vramfit=target/release/vramfit
shape=(--batch-size 4 --set model.width=256 --set model.heads=4 --set model.depth=2 --set model.vocab=4096
  --set model.context=8 --set task.tokens=8)
"$vramfit" plan transformer "${shape[@]}" --budget "${BUDGET:-1GiB}" --ranks 4 --json "$work/plan.json" >"$work/plan.log"
python3 - "$work" "${shape[*]}" <<'PY' >"$work/runs.txt"
import json, sys
work, shape = sys.argv[1], sys.argv[2]
plan = json.load(open(f"{work}/plan.json"))
for row in plan["ranks"]["rows"]:
    if "plan" not in row:
        continue
    k, n = row["plan"]["setting"], row["ranks"]
    batch = 4
    flags = [f"--precision {k['precision'].lower()}", f"--micro-batch {k['micro_batch']}",
             f"--accumulate {batch // k['micro_batch']}"]
    marks = [str(i) for i, c in enumerate(k["checkpointed"]) if c]
    flags.append("--checkpoint " + ("none" if not marks else "list:" + ",".join(marks)))
    if k.get("low_moments"):
        flags.append("--moments bf16")
    if k.get("cleanup"):
        flags.append("--allocator-cleanup step")
    if k.get("fused_attention"):
        flags.append("--attention fused")
    if k.get("low_storage"):
        continue  # storage groups by name: not needed at this budget
    if n > 1:
        flags.append(f"--ranks {n} --shard-moments")
    print(n, row["plan"]["peak_bytes"], " ".join(flags))
PY
while read -r n predicted flags; do
  # shellcheck disable=SC2086
  "$vramfit" train transformer "${shape[@]}" --steps 20 --set profile_every=1 --set checkpoint_every=0 \
    $flags --out "$work/run-$n" >"$work/run-$n.log" 2>&1 </dev/null
  echo "$n $predicted $flags" >>"$work/done.txt"
done <"$work/runs.txt"
python3 - "$work" "$out" <<'PY'
import glob, json, os, sys
work, out = sys.argv[1], sys.argv[2]
mib = lambda b: b / 2**20
rows = []
for line in open(f"{work}/done.txt"):
    n, predicted, flags = line.split(" ", 2)
    n, predicted = int(n), int(predicted)
    d = f"{work}/run-{n}"
    ranks = []
    for r, x in enumerate([d] + sorted(glob.glob(f"{d}/ranks/rank-*"))):
        s, m = json.load(open(f"{x}/summary.json")), json.load(open(f"{x}/memory.json"))
        step = [rec for rec in m["records"] if rec["phase"] == "optimizer"][-1]
        ranks.append({"rank": r, "peak_bytes": s["peak_memory_bytes"], "peak_at": s.get("peak_at"),
                      "optimizer_state_bytes": step["categories"].get("optimizer_state", 0),
                      "step_peak_bytes": max(rec.get("peak_in_use") or 0 for rec in m["records"]
                                             if rec["phase"] != "finish"),
                      "median_step_ms": s["median_step_ms"]})
    largest = max(r["peak_bytes"] for r in ranks)
    rows.append({"ranks": n, "flags": flags.strip(), "predicted_peak_bytes": predicted, "ranks_measured": ranks,
                 "largest_peak_bytes": largest, "error": largest / predicted - 1})
md = ["Per rank: the deciding peak (heap in use, the counting allocator; measured) against the planner's",
      "prediction (derived from one-rank probes and the sharding's arithmetic), the optimizer state at the",
      "last optimizer phase, the largest in-use peak of the steps (the final files aside), and the step time.", "",
      "| ranks | plan | predicted peak MiB | measured peak MiB per rank | error (largest) | optimizer state MiB per rank | steps' peak MiB per rank | median step ms per rank |",
      "|---|---|---|---|---|---|---|---|"]
for r in rows:
    each = lambda key, f=mib: ", ".join(f"{f(x[key]):.1f}" for x in r["ranks_measured"])
    md.append(f'| {r["ranks"]} | `{r["flags"]}` | {mib(r["predicted_peak_bytes"]):.1f} | {each("peak_bytes")} | '
              f'{r["error"]*100:+.1f} % | {each("optimizer_state_bytes")} | {each("step_peak_bytes")} | '
              f'{each("median_step_ms", lambda v: v)} |')
text = "\n".join(md)
print(text)
json.dump({"bench": "ranks", "device": "cpu", "rows": rows,
           "measured": "heap bytes in use (counting allocator), per rank; predicted: vramfit plan --ranks (derived)"},
          open(f"{out}.json", "w"), indent=2)
open(f"{out}.md", "w").write(f"Command: `scripts/ranks-bench.sh`\n\n{text}\n")
print(f"wrote {out}.json and {out}.md")
PY
