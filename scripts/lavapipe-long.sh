#!/usr/bin/env bash
# The wgpu test bodies too long for CI (.ci/run says why), on Mesa's
# software Vulkan: the planner's calibration and plans on the transformer
# and on the image fit, the advice's levers each lowering the reserved
# figure, the 300-step precision curves (the transformer's and the
# U-Net's), and every knob combination the planner may choose on wgpu
# (104 probes, about 90 s), the frozen base's search and the depth slice
# against 24 blocks on wgpu's pools (about 90 s), and three of the
# transformer's traced runs against lavapipe's pools (about 75 s). Over 35 minutes on 2 cores. Run it after a change to the
# planner, the advice, precision or the wgpu path, and record the date and
# result in docs/tests.md.
# Usage: scripts/lavapipe-long.sh [libtest arguments, e.g. --list]
# (Debian: mesa-vulkan-drivers libvulkan1,
# and for the build it shares with CI, libopenmpi-dev openmpi-bin libclang-dev)
set -euo pipefail
cd "$(dirname "$0")/.."
icd=$(ls /usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null | head -1)
[ -n "$icd" ] || { echo "error: lavapipe is not installed (apt-get install mesa-vulkan-drivers libvulkan1)" >&2; exit 1; }
export VK_ICD_FILENAMES="$icd"
# The same packages and features as CI's lavapipe line, so Burn's wgpu
# build is shared; other test targets rebuild vramfit-models (3-5 minutes).
# One invocation, the bodies named exactly: the planners' `calibration_wgpu` tests,
# the advice's and both precision curves on wgpu.
time cargo test -p vramfit-splat -p vramfit-models -p vramfit-scene -p vramfit-cli \
  --features vramfit-splat/wgpu,vramfit-models/wgpu,vramfit-scene/wgpu,vramfit-cli/wgpu,vramfit-cli/mpi \
  --test plan --test advice --test toolkit --test pools_trace -- "$@" --include-ignored --exact calibration_wgpu \
  every_advised_setting_lowers_the_deciding_figure::wgpu \
  transformer::low_precision_training_follows_the_f32_curve::wgpu unet::low_precision_training_follows_the_f32_curve::wgpu \
  every_knob_combination_runs_wgpu the_frozen_base_is_searched_wgpu slice_wgpu \
  more_transformer_ways_replayed_through_wgpus_pools
