#!/usr/bin/env bash
# Benchmarks on the H200 device machine, from the repository root, with the release binary and
# the Vulkan loader packages in .gl/ carried over (BENCHMARKS.md says how to get them): every
# figure BENCHMARKS.md records, PyTorch's included. OUT names the folder results go to.
set -u
for f in .gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=${B:-./target/release/rumus}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for mode in highest high medium; do
  $B bench --kernels --device gpu --matmul-precision $mode 2>&1 | tee $OUT/kernels-$mode.json
  for m in mlp gpt-small gpt-medium; do
    timeout 240 $B bench scripts/bench/$m.rms --device gpu --matmul-precision $mode --json 2>&1 \
      | tail -1 | tee $OUT/bench-$m-$mode.json
  done
done
# A second compile of the same model: pipelines now come from the on-disk pipeline cache.
$B bench scripts/bench/gpt-medium.rms --device gpu --json 2>&1 | tail -1 | tee $OUT/bench-gpt-medium-warm.json
for s in digits_mlp; do
  timeout 200 $B run scripts/$s.rms --device gpu 2>&1 | grep -v XDG | tail -12 | tee $OUT/run-$s.txt
done
# TORCH=0 leaves PyTorch out (when its figures of the same day stand and device time is short).
if [ "${TORCH:-1}" != 0 ]; then
  MODELS=mlp,gpt-small,gpt-medium python3 scripts/bench/torch_baselines.py eager eager-tf32 eager-bf16 2>&1 | tee $OUT/torch.txt
fi
