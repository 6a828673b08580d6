#!/usr/bin/env bash
# Data-parallel ranks on the CPU (issue 30): per-rank deciding peak and
# optimizer state for 1, 2 and 4 ranks with Adam's moments and the
# gradients sharded (ZeRO stage 2), the same global batch, against the
# planner's per-rank prediction (`plan … --ranks 4`, derived from one-rank
# probes), and the bytes a step hands the collectives.
#  1. `vramfit plan transformer … --budget 1GiB --ranks 4 --json`: the best
#     plan per rank count and its predicted per-rank peak;
#  2. each of those plans run for real (`train … --ranks N
#     --shard-moments`, N processes through mpirun), every rank's peak
#     (heap in use, the counting allocator), optimizer state, step time and
#     bytes handed to the collectives a step (`collective_bytes_per_step`);
#  3. two ranks of two micro-batches each, with and without sharding: what
#     summing the gradients onto their owners saves the accumulator.
# The transformer is shaped so that its state matters (width 256, vocab
# 4,096, 8 tokens, batch 4): sharding is about the moments. On this 2-core
# machine 4 ranks share 2 cores: step times say nothing about speed-up.
#   scripts/ranks-bench.sh [OUT_PREFIX]   (default bench-results/ranks-cpu)
# Needs a build with --features mpi (Open MPI and libclang; CI installs them);
# VRAMFIT=path/to/vramfit uses that build instead of building the release.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/ranks-cpu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
if [ -z "${VRAMFIT:-}" ]; then cargo build --release -p vramfit-cli --features mpi >/dev/null; fi
vramfit=${VRAMFIT:-target/release/vramfit}
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
# Not planned: two micro-batches a rank, unsharded and sharded (no prediction).
for shard in ("", " --shard-moments"):
    print(2, 0, f"--precision f32 --micro-batch 1 --accumulate 4 --checkpoint none --ranks 2{shard}")
PY
i=0
while read -r n predicted flags; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  "$vramfit" train transformer "${shape[@]}" --steps 20 --set profile_every=1 --set checkpoint_every=0 \
    $flags --out "$work/run-$i" >"$work/run-$i.log" 2>&1 </dev/null
  echo "$i $n $predicted $flags" >>"$work/done.txt"
done <"$work/runs.txt"
python3 - "$work" "$out" <<'PY'
import glob, json, os, sys
work, out = sys.argv[1], sys.argv[2]
mib = lambda b: b / 2**20
rows = []
for line in open(f"{work}/done.txt"):
    i, n, predicted, flags = line.split(" ", 3)
    n, predicted = int(n), int(predicted)
    d = f"{work}/run-{i}"
    ranks = []
    for r, x in enumerate([d] + sorted(glob.glob(f"{d}/ranks/rank-*"))):
        s, m = json.load(open(f"{x}/summary.json")), json.load(open(f"{x}/memory.json"))
        step = [rec for rec in m["records"] if rec["phase"] == "optimizer"][-1]
        ranks.append({"rank": r, "peak_bytes": s["peak_memory_bytes"], "peak_at": s.get("peak_at"),
                      "optimizer_state_bytes": step["categories"].get("optimizer_state", 0),
                      "step_peak_bytes": max(rec.get("peak_in_use") or 0 for rec in m["records"]
                                             if rec["phase"] != "finish"),
                      "median_step_ms": s["median_step_ms"],
                      "collective_bytes_per_step": s.get("collective_bytes_per_step")})
    largest = max(r["peak_bytes"] for r in ranks)
    rows.append({"ranks": n, "flags": flags.strip(), "predicted_peak_bytes": predicted or None,
                 "ranks_measured": ranks, "largest_peak_bytes": largest,
                 "error": largest / predicted - 1 if predicted else None})
md = ["Per rank: the deciding peak (heap in use, the counting allocator; measured) against the planner's",
      "prediction (derived from one-rank probes and the sharding's arithmetic), the optimizer state at the",
      "last optimizer phase, the largest in-use peak of the steps (the final files aside), the step time,",
      "and the bytes rank 0 handed the collectives in a step (measured: the buffers passed to MPI's",
      "all-reduces / reduces / broadcasts) with what a bandwidth-optimal engine would send from each rank",
      "for them (derived: 2(N-1)/N of the all-reduced bytes plus (N-1)/N of the reduced and broadcast ones).",
      "The last two rows (no prediction) give each rank two micro-batches, unsharded and sharded.", "",
      "| ranks | plan | predicted peak MiB | measured peak MiB per rank | error (largest) | optimizer state MiB per rank | steps' peak MiB per rank | median step ms per rank | handed a step MiB (all-reduce / reduce / broadcast) | sent a step MiB (derived) |",
      "|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    each = lambda key, f=mib: ", ".join(f"{f(x[key]):.1f}" for x in r["ranks_measured"])
    n, h = r["ranks"], r["ranks_measured"][0]["collective_bytes_per_step"]
    if h:
        handed = f'{mib(h["summed"]):.2f} / {mib(h["reduced"]):.2f} / {mib(h["broadcast"]):.2f}'
        sent = f'{mib(2 * (n - 1) / n * h["summed"] + (n - 1) / n * (h["reduced"] + h["broadcast"])):.2f}'
    else:
        handed, sent = "none (one process)", "0"
    predicted = "—" if r["predicted_peak_bytes"] is None else f'{mib(r["predicted_peak_bytes"]):.1f}'
    error = "—" if r["error"] is None else f'{r["error"]*100:+.1f} %'
    md.append(f'| {n} | `{r["flags"]}` | {predicted} | {each("peak_bytes")} | '
              f'{error} | {each("optimizer_state_bytes")} | {each("step_peak_bytes")} | '
              f'{each("median_step_ms", lambda v: v)} | {handed} | {sent} |')
text = "\n".join(md)
print(text)
json.dump({"bench": "ranks", "device": "cpu", "rows": rows,
           "measured": "heap bytes in use (counting allocator), per rank; predicted: vramfit plan --ranks (derived)"},
          open(f"{out}.json", "w"), indent=2)
import os
binary = os.environ.get("VRAMFIT")
command = f"VRAMFIT={binary} scripts/ranks-bench.sh" if binary else "scripts/ranks-bench.sh"
open(f"{out}.md", "w").write(f"Command: `{command}`\n\n{text}\n")
print(f"wrote {out}.json and {out}.md")
PY
