#!/usr/bin/env bash
# Data-parallel training on two GPUs of one machine (the device kind `nvidia-h200-x2`), from the
# repository root, with a release binary built with `--features mpi` (B), the Vulkan loader
# packages in .gl/ and, for a machine without OpenMPI, OpenMPI's Debian packages in .mpi/
# carried over (BENCHMARKS.md says how to get them; the H200 machines have Ubuntu's OpenMPI 4.1,
# whose libmpi.so.40 the binary uses as it is, and unpacking Debian's over it breaks mpirun). For each precision mode: gpt-medium's step on one GPU, then on two ranks under
# mpirun at the same per-GPU batch, and the ratio of their samples per second (with ALSO_STAGED
# set, a third run with the host-staged exchange). OUT names the folder results go to.
set -u
for f in .gl/*.deb; do dpkg -x "$f" / ; done
command -v mpirun >/dev/null || for f in .mpi/*.deb; do dpkg -x "$f" / ; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One machine: ranks start by fork, but OpenMPI wants an rsh agent to exist.
command -v ssh >/dev/null || export OMPI_MCA_plm_rsh_agent=/bin/false
B=${B:-./target/release/rumus}
MPIRUN=${MPIRUN:-mpirun.openmpi}  # MPIARGS: more mpirun options
STEPS=${STEPS:-30}
MODELS=${MODELS:-gpt-medium}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
{ df -h /dev/shm /tmp; ipcs -l; ulimit -l; nvidia-smi topo -m; } > $OUT/machine.txt 2>&1
for m in $MODELS; do
  for mode in ${MODES:-high highest}; do
    args="scripts/bench/$m.rms --device gpu --matmul-precision $mode --steps $STEPS --json"
    timeout 240 $B bench $args 2>/dev/null | tail -1 | tee $OUT/one-$m-$mode.json
    timeout 300 $MPIRUN -np 2 --bind-to none ${MPIARGS:-} $B bench $args 2>$OUT/two-$m-$mode.err | tail -1 \
      > $OUT/two-$m-$mode.json
    if ! grep -q samples_per_s $OUT/two-$m-$mode.json; then
      # Containers often forbid the cross-process copies of the shared-memory transport, and
      # mixed PMIx installations crash in its `preg` framework without an explicit component.
      tail -5 $OUT/two-$m-$mode.err
      PMIX_MCA_preg=native timeout 300 $MPIRUN -np 2 --bind-to none \
        --mca btl_vader_single_copy_mechanism none \
        $B bench $args 2>>$OUT/two-$m-$mode.err | tail -1 > $OUT/two-$m-$mode.json
    fi
    if ! grep -q '"exchange":"host-shared"' $OUT/two-$m-$mode.json; then
      # The GPUs import the MPI window's pages; OpenMPI's default `mmap` component may back
      # them with a file the driver cannot pin. SysV shared memory is anonymous.
      grep -h "^note: rank" $OUT/two-$m-$mode.err
      mv $OUT/two-$m-$mode.json $OUT/two-$m-$mode-first.json
      timeout 300 $MPIRUN -np 2 --bind-to none --mca shmem sysv ${MPIARGS:-} $B bench $args \
        2>$OUT/two-$m-$mode-sysv.err | tail -1 > $OUT/two-$m-$mode.json
      grep -h "^note: rank" $OUT/two-$m-$mode-sysv.err
    fi
    cat $OUT/two-$m-$mode.json
    if [ -n "${ALSO_STAGED:-}" ]; then
      # The host-staged exchange on the same machine, for comparison (`RUMUS_EXCHANGE=staged`).
      timeout 300 $MPIRUN -np 2 --bind-to none -x RUMUS_EXCHANGE=staged ${MPIARGS:-} $B bench $args \
        2>$OUT/staged-$m-$mode.err | tail -1 > $OUT/staged-$m-$mode.json
      cat $OUT/staged-$m-$mode.json
    fi
    python3 - "$OUT/one-$m-$mode.json" "$OUT/two-$m-$mode.json" <<'PY'
import json, sys
one, two = (json.load(open(p)) for p in sys.argv[1:3])
r = two["samples_per_s"] / one["samples_per_s"]
share = two["all_reduce_ms"] / two["step_ms_median"]
print(json.dumps({"model": one["model"], "matmul_precision": one["matmul_precision"],
    "one_gpu_samples_per_s": one["samples_per_s"], "two_gpus_samples_per_s": two["samples_per_s"],
    "speedup": r, "one_gpu_step_ms": one["step_ms_median"], "two_gpus_step_ms": two["step_ms_per_rank"],
    "all_reduce_ms": two["all_reduce_ms"], "staging_wait_ms": two["exchange_wait_ms"],
    "staging_read_ms": two["exchange_read_ms"], "write_back_ms": two["exchange_write_ms"],
    "exchange": two.get("exchange"), "means_tail_ms": two.get("exchange_tail_ms"),
    "all_reduce_share": share}))
PY
  done
done
