#!/usr/bin/env bash
# The readers' fuzz test (crates/vramfit-cli/tests/readers_fuzz.rs) run
# longer than CI runs it: CASES mutations per target, for each of SEEDS.
# Usage: CASES=200000 SEEDS="1 2 3" scripts/fuzz-readers.sh
set -euo pipefail
cases=${CASES:-100000}
for seed in ${SEEDS:-1 2 3 4 5}; do
  echo "seed $seed, $cases cases per target"
  VRAMFIT_FUZZ_CASES=$cases VRAMFIT_FUZZ_SEED=$seed cargo test -q -p vramfit-cli --test readers_fuzz
done
