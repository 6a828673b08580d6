#!/usr/bin/env bash
# Attention's memory and speed, standard against fused (issue 28), on the
# CPU (Flex; the figure is heap bytes in use, the counting allocator):
#  1. the transformer (width 256, 8 heads, depth 2, batch 4, vocab 64) at
#     512, 1,024, 2,048 and 4,096 tokens, two steps each way: the
#     activations at the end of the forward and the run's deciding peak;
#  2. at 1,024 tokens (depth 4, batch 4, vocab 256), tokens per second and
#     peak resident set against the same model in PyTorch with
#     scaled_dot_product_attention and with explicit attention
#     (scripts/pytorch_gpt.py; PyTorch installed by this script into VENV,
#     default /tmp/vramfit-torch-venv, not by CI). Skip with NO_TORCH=1.
#
#   scripts/attention-bench.sh [OUT_PREFIX]   (default bench-results/attention-cpu)
#   TOKENS="512 1024" scripts/attention-bench.sh   fewer lengths
#   ONLY=memory | ONLY=speed scripts/attention-bench.sh   one part (speed
#   wants an otherwise idle machine; memory does not mind)
#   DEVICE=wgpu scripts/attention-bench.sh bench-results/attention-wgpu
#     the memory part on wgpu (the CubeCL kernels; the figure is the
#     allocator's reserved bytes; a debug build with --features wgpu; on
#     lavapipe set VK_ICD_FILENAMES). Its default shape is smaller (width
#     64, 2 heads, batch 2: software Vulkan is slow, and one buffer holds
#     at most 128 MiB there); SHAPE="WIDTH HEADS BATCH" sets it. A run that
#     fails (a score tensor over the buffer cap) is recorded with its error.
#   DEVICE=cuda VRAMFIT=.gpu/vramfit scripts/attention-bench.sh OUT_PREFIX
#     on a GPU machine (no cargo there: VRAMFIT names the binary of
#     `cargo build --release --features cuda -p vramfit-cli`; VRAMFIT works
#     for every device). Default shape width 512, 8 heads, batch 4 at
#     1,024 to 16,384 tokens, STEPS (default 5) steps a run, RUN_TIMEOUT
#     (default 120) seconds a run; each length also trains the same model
#     in PyTorch on CUDA (the machine's python3 with torch; explicit
#     attention and scaled_dot_product_attention), whose figure is the
#     caching allocator's peak reserved bytes. NO_TORCH=1 skips it.
#   PRECISION=bf16 (or f16) trains both at that precision (vramfit's
#     --precision; PyTorch under autocast to that type): the fused kernels
#     then read 16-bit Q, K and V, and SDPA takes its flash kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
device=${DEVICE:-cpu}
out=${1:-bench-results/attention-$device}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
vramfit="$work/vramfit"
steps=${STEPS:-2}
if [ -n "${VRAMFIT:-}" ]; then
  cp "$VRAMFIT" "$vramfit"
elif [ "$device" = cpu ]; then
  cargo build --release -p vramfit-cli >/dev/null
  cp target/release/vramfit "$vramfit"
else
  cargo build -p vramfit-cli --features "$device" >/dev/null
  cp target/debug/vramfit "$vramfit"
fi
tokens=${TOKENS:-512 1024 2048 4096}
if [ "$device" = cpu ]; then
  read -r width heads batch <<<"${SHAPE:-256 8 4}"
elif [ "$device" = cuda ]; then
  read -r width heads batch <<<"${SHAPE:-512 8 4}"
  tokens=${TOKENS:-1024 4096 16384}
  steps=${STEPS:-5}
  ONLY=memory
else
  read -r width heads batch <<<"${SHAPE:-64 2 2}"
  ONLY=memory
fi
only=${ONLY:-all}
run_timeout=${RUN_TIMEOUT:-120}
precision=${PRECISION:-f32}
case "$precision" in
  f32) amp=() ;;
  bf16) amp=(--amp bfloat16) ;;
  f16) amp=(--amp float16) ;;
  *) echo "PRECISION=$precision: say f32, bf16 or f16" >&2; exit 2 ;;
esac
[ "$only" = speed ] || for t in $tokens; do
  for a in standard fused; do
    echo "training: $t tokens, $a attention on $device" >&2
    timeout -k 5 "$run_timeout" "$vramfit" train transformer --device "$device" --attention "$a" --steps "$steps" \
      --precision "$precision" \
      --batch-size "$batch" --set model.width="$width" --set model.heads="$heads" --set model.depth=2 \
      --set model.context="$t" --set task.tokens="$t" --set checkpoint_every=0 --set profile_every=1 \
      --set log_every=1 --out "$work/run-$t-$a" >/dev/null 2>"$work/err-$t-$a" || echo "error: exit $? (timeout 124)" >>"$work/err-$t-$a"
  done
  if [ "$device" = cuda ] && [ -z "${NO_TORCH:-}" ]; then
    for sdpa in "" --sdpa; do
      echo "PyTorch on cuda: $t tokens ${sdpa:-explicit}" >&2
      timeout -k 5 "$run_timeout" python3 scripts/pytorch_gpt.py --device cuda --width "$width" --heads "$heads" --depth 2 \
        --vocab 64 --tokens "$t" --batch "$batch" --steps 8 $sdpa "${amp[@]}" >>"$work/torch-cuda.jsonl" 2>>"$work/torch-err" || true
    done
  fi
done
speed_args=(--set model.width=256 --set model.heads=8 --set model.depth=4 --set model.vocab=256
  --set model.context=1024 --set task.tokens=1024 --batch-size 4 --steps 8 --set checkpoint_every=0)
[ "$only" = memory ] || for a in standard fused; do
  echo "speed: 1,024 tokens, $a attention" >&2
  /usr/bin/time -f %M -o "$work/rss-$a" "$vramfit" train transformer --device cpu --attention "$a" --precision "$precision" \
    "${speed_args[@]}" --out "$work/speed-$a" >/dev/null
done
if [ -z "${NO_TORCH:-}" ] && [ "$only" != memory ]; then
  venv=${VENV:-/tmp/vramfit-torch-venv}
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet torch
  fi
  for sdpa in "" --sdpa; do
    "$venv/bin/python" scripts/pytorch_gpt.py --depth 4 --tokens 1024 --batch 4 --steps 8 $sdpa "${amp[@]}" >>"$work/torch.jsonl"
  done
fi
python3 - "$work" "$out" "$tokens" "$device" "$width $heads $batch" "$steps" "$precision" <<'PY'
import json, os, sys, platform
work, out, lengths = sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split()]
device, (width, heads, batch) = sys.argv[4], [int(x) for x in sys.argv[5].split()]
steps, precision = int(sys.argv[6]), sys.argv[7]
lengths = [t for t in lengths if os.path.exists(f"{work}/err-{t}-fused")]
mib = lambda b: b / 2**20
rows = []
for t in lengths:
    for a in ("standard", "fused"):
        d = f"{work}/run-{t}-{a}"
        if not os.path.exists(f"{d}/summary.json"):
            err = [l.strip() for l in open(f"{work}/err-{t}-{a}")
                   if l.startswith("error:") and "XDG_RUNTIME_DIR" not in l]
            rows.append({"tokens": t, "attention": a, "error": err[0] if err else "failed (no summary)"})
            continue
        mem = json.load(open(f"{d}/memory.json"))
        s = json.load(open(f"{d}/summary.json"))
        fwd = [r for r in mem["records"] if r["phase"] == "forward"]
        rows.append({"tokens": t, "attention": a,
                     "forward_activations_bytes": max(r["categories"]["activations"] for r in fwd),
                     "peak_bytes": mem["peak_bytes"], "peak_figure": mem["headline"]["figure"],
                     "peak_at": f'step {mem["headline"]["step"]}, {mem["headline"]["phase"]}',
                     "median_step_ms": s["median_step_ms"]})
speed = []
for a in ("standard", "fused") if os.path.exists(f"{work}/speed-standard") else ():
    s = json.load(open(f"{work}/speed-{a}/summary.json"))
    rss = int(open(f"{work}/rss-{a}").read().split()[-1]) * 1024
    speed.append({"who": f"vramfit, {a} attention", "median_step_ms": s["median_step_ms"],
                  "tokens_per_second": s["tokens_per_second"], "peak_rss_bytes": rss,
                  "heap_peak_bytes": s["peak_memory_bytes"]})
if os.path.exists(f"{work}/torch.jsonl"):
    for line in open(f"{work}/torch.jsonl"):
        p = json.loads(line)
        speed.append({"who": f'PyTorch {p["torch"]}, {p["attention"]}', "median_step_ms": p["median_step_ms"],
                      "tokens_per_second": p["tokens_per_second"], "peak_rss_bytes": p["peak_rss_bytes"]})
figure = "heap in use" if device == "cpu" else "allocator reserved"
torch_cuda = []
if os.path.exists(f"{work}/torch-cuda.jsonl"):
    torch_cuda = [json.loads(l) for l in open(f"{work}/torch-cuda.jsonl") if l.startswith("{")]
md = [f"On {device}: width {width}, {heads} heads, depth 2, batch {batch}, vocab 64, {steps} steps each, "
      f"precision {precision}.", "",
      f"| tokens | attention | activations after the forward MiB | deciding peak MiB ({figure}) | median step ms |",
      "|---|---|---|---|---|"]
for r in rows:
    if "error" in r:
        md.append(f'| {r["tokens"]:,} | {r["attention"]} | did not run: {r["error"]} | | |')
        continue
    md.append(f'| {r["tokens"]:,} | {r["attention"]} | {mib(r["forward_activations_bytes"]):,.1f} | '
              f'{mib(r["peak_bytes"]):,.1f} | {r["median_step_ms"]:,.1f} |')
if torch_cuda:
    md += ["", "The same model in PyTorch on CUDA (8 steps, the median of the last 5; the caching allocator's peaks):", "",
           "| tokens | attention | reserved peak MiB (deciding) | allocated peak MiB | median step ms |", "|---|---|---|---|---|"]
for p in torch_cuda:
    if "error" in p:
        md.append(f'| {p["tokens"]:,} | {p["attention"]} | did not run: {p["error"]} | | |')
    else:
        md.append(f'| {p["tokens"]:,} | {p["attention"]} | {mib(p["cuda_max_reserved_bytes"]):,.1f} | '
                  f'{mib(p["cuda_max_allocated_bytes"]):,.1f} | {p["median_step_ms"]:,.1f} |')
if speed:
    md += ["", "At 1,024 tokens (width 256, depth 4, 8 heads, batch 4, vocab 256; 2 threads):", "",
           "| run | median step ms | tokens/s | peak resident set MiB |", "|---|---|---|---|"]
for s in speed:
    md.append(f'| {s["who"]} | {s["median_step_ms"]:,.0f} | {s["tokens_per_second"]:,.0f} | {mib(s["peak_rss_bytes"]):,.0f} |')
text = "\n".join(md)
print(text)
record = {"bench": "attention", "device": device, "cpu": platform.machine(), "shape": {"width": width, "heads": heads,
          "depth": 2, "batch": batch}, "steps": steps, "precision": precision, "memory": rows, "speed": speed, "pytorch_cuda": torch_cuda,
          "measured": ("heap bytes in use by the counting allocator" if device == "cpu" else
                       "the CubeCL allocator's reserved bytes") + " (activations at the forward's end, the run's "
                      "peak); median step time; peak resident set from /usr/bin/time or getrusage"}
json.dump(record, open(f"{out}.json", "w"), indent=2)
command = "scripts/attention-bench.sh" if device == "cpu" else f"DEVICE={device} scripts/attention-bench.sh {out}"
if precision != "f32":
    command = f"PRECISION={precision} {command}"
open(f"{out}.md", "w").write(f"Command: `{command}`\n\n{text}\n")
print(f"wrote {out}.json and {out}.md")
PY
