#!/usr/bin/env bash
# The round trip outside vramfit (issue 59): a Llama checkpoint written by
# transformers, with a tokenizer trained on this repository's docs; vramfit
# fine-tunes LoRA adapters on those docs as a text corpus (--data); PEFT
# loads the adapters from the run folder onto the same checkpoint, and its
# logits on held-out text are compared with vramfit's; `vramfit export`'s
# merged checkpoint is compared with PEFT's merge_and_unload
# (crates/vramfit-models/tests/toolkit/peft.rs, `peft_reproduces_vramfits_logits`).
# PyTorch, transformers and PEFT come from a virtual environment (VENV,
# default /tmp/vramfit-torch-venv; installed here if missing), never CI.
#
#   scripts/peft-round-trip.sh [OUT_DIR]   (default: a temporary folder)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
mkdir -p "$out"
venv=${VENV:-/tmp/vramfit-torch-venv}
if ! "$venv/bin/python" -c 'import torch, transformers, peft' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch==2.15.0 transformers==5.24.0 peft==0.21.2
fi
# The corpus: the docs' prose, documents parted by blank lines.
cat docs/*.md docs/*/*.md >"$out/corpus.txt"
"$venv/bin/python" scripts/peft_round_trip.py base "$out"
cargo build --release -p vramfit-cli >/dev/null
rm -rf "$out/run"
target/release/vramfit train llm --weights "$out/base" --data "$out/corpus.txt" --train lora:8 \
  --steps "${STEPS:-40}" --batch-size 8 --set task.tokens=64 --set lr=1e-2 --out "$out/run" >"$out/train.txt"
head -3 "$out/train.txt"
rm -rf "$out/merged"
target/release/vramfit export "$out/run" --out "$out/merged" --dtype f32
"$venv/bin/python" scripts/peft_round_trip.py peft "$out"
VRAMFIT_ROUND_TRIP="$out" cargo test --release -p vramfit-models --test toolkit peft_reproduces_vramfits_logits \
  -- --ignored --nocapture 2>&1 | grep -E '^\{|test result|panicked'
