#!/usr/bin/env bash
# Multi-GPU checks of `lltm train` on one machine with 4 (or 2) GPUs, in one go, in under 9 minutes:
#
#   scripts/multigpu_check.sh            (OUT=folder for the results; default ./multigpu_check_out)
#
#   build    python3 setup.py build_ext --inplace (sm_90, the system compilers)
#   tests    pytest tests/test_ddp.py -m cuda, in five parallel groups (they check results, not
#            speed): DDP on NCCL with 2 and 4 ranks against one process (every CUDA backend,
#            float32 and bfloat16 autocast, SGD and Adam; and at the issue's size, charlm hidden
#            512, global batch 256, 4 Adam steps, on 2 ranks); a SIGKILLed rank and a rank killed
#            mid-checkpoint under torchrun --max-restarts; a hung rank; two c10d launchers;
#            CUDA checkpoints across rank counts 4 -> 2 -> 1
#   scaling  python -m lltm.bench.ddp_scaling run on 1, 2 and 4 ranks (hidden 512 and 1024,
#            sequence 128, per-rank batch 64 and 256, global batch 1024; on 4 ranks the DDP
#            options too), one after the other with nothing else on the GPUs
#   train    torchrun --nproc_per_node 4 -m lltm train (charlm, hidden 512, global batch 1024):
#            the per-rank throughput and the scaling it printed
#
# Results in $OUT: summary.md (ready to paste: device, torch, date, each stage's status, the tests'
# measured differences and bounds, the scaling tables), one log per stage, scaling.jsonl, and
# logs.tgz holding all of them.
# Stages that need 4 GPUs skip with 2. A failed stage does not stop the script; every stage has
# its own time limit and none starts or runs past DEADLINE seconds (default 530) from the start.
# Environment: PYTHON (python3), DEADLINE, BUILD_LIMIT, TESTS_LIMIT, SCALING_LIMIT, TRAIN_LIMIT,
# SKIP_BUILD=1 (lltm._C already built).
set -uo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/multigpu_check_out}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
DEADLINE=${DEADLINE:-530}
# NVLink multicast (NVLS) off in NCCL, torch's symmetric memory and NVSHMEM, for every process
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SUMMARY=$OUT/summary.md
STAGES=$OUT/stages.txt
: >"$STAGES"
status=0

left() { echo $((DEADLINE - SECONDS)); }

# run_stage NAME LIMIT CMD...: the command under `timeout`, its output in $OUT/NAME.log
run_stage() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(($(left) - 5))
  if [ "$l" -lt 15 ]; then
    echo "| $name | skipped: the ${DEADLINE} s deadline was reached | 0 |" >>"$STAGES"
    status=1
    return 1
  fi
  [ "$limit" -gt "$l" ] && limit=$l
  local t0=$SECONDS
  echo "== $name (limit ${limit} s): $*" >>"$OUT/$name.log"
  timeout --kill-after=10 "$limit" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  local what=$rc
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && what="$rc (time limit ${limit} s)"
  echo "| $name | $what | $((SECONDS - t0)) |" >>"$STAGES"
  echo "$name: rc=$what in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || status=1
  return $rc
}

GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
{
  echo "multigpu_check $(date -u +%FT%TZ) on $(hostname), $GPUS GPU(s)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  nvidia-smi topo -m 2>/dev/null | head -n $((GPUS + 1))
  "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda, "| NCCL", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "")'
  "$PYTHON" -c 'import pytest, tqdm; print("pytest", pytest.__version__, "| tqdm", tqdm.__version__)' 2>&1 | tail -1
} | tee "$OUT/header.txt"

# --- build ----------------------------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  run_stage build "${BUILD_LIMIT:-240}" env CC=/usr/bin/gcc CXX=/usr/bin/g++ TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=32 \
    "$PYTHON" setup.py -q build_ext --inplace
fi
"$PYTHON" -m lltm info >>"$OUT/build.log" 2>&1
grep -E "build mode|backends on cuda" "$OUT/build.log" | tee -a "$OUT/header.txt"

# --- tests: four groups at once (results, not timings) -----------------------------------------
REPORT=$OUT/ddp_report.md
: >"$REPORT"
tests_limit=${TESTS_LIMIT:-180}
groups=(
  "ddp_ and nccl-2 and not h512"
  "ddp_ and nccl-4"
  "ddp_ and h512"
  "(killed or resume_across or hung or two_launchers) and nccl-2"
  "cuda_checkpoints"
)
names=(ddp2 ddp4 h512 faults ckpt)
pids=()
for i in "${!groups[@]}"; do
  run_stage "tests_${names[$i]}" "$tests_limit" env LLTM_DDP_REPORT="$REPORT" \
    "$PYTHON" -m pytest tests/test_ddp.py -m cuda -k "${groups[$i]}" -q -rfEs -p no:cacheprovider &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || status=1; done

# --- scaling: one rank count at a time, nothing else on the GPUs -------------------------------
JSON=$OUT/scaling.jsonl
: >"$JSON"
SCALE_ARGS=(--hidden 512,1024 --seq-len 128 --per-rank-batch 64,256 --global-batch 1024 --json "$JSON"
  --warmup 5 --steps 20 --phase-steps 5)
VARIANTS="default;bucket_cap_mb=1;bucket_cap_mb=100;gradient_as_bucket_view;static_graph;rebuilt_buckets;accumulate=4"
run_stage scaling_1 "${SCALING_LIMIT:-90}" env CUDA_VISIBLE_DEVICES=0 \
  "$PYTHON" -m lltm.bench.ddp_scaling run --device cuda "${SCALE_ARGS[@]}"
two_variants=()
[ "$GPUS" -lt 4 ] && two_variants=(--variants "$VARIANTS" --variants-at 512,256)
run_stage scaling_2 "${SCALING_LIMIT:-90}" \
  "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 2 -m lltm.bench.ddp_scaling run \
  --device cuda "${SCALE_ARGS[@]}" "${two_variants[@]}"
if [ "$GPUS" -ge 4 ]; then
  run_stage scaling_4 "${SCALING_LIMIT:-90}" \
    "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 4 -m lltm.bench.ddp_scaling run \
    --device cuda "${SCALE_ARGS[@]}" --variants "$VARIANTS"
else
  echo "| scaling_4 | skipped: $GPUS GPU(s) | 0 |" >>"$STAGES"
fi
"$PYTHON" -m lltm.bench.ddp_scaling table "$JSON" >"$OUT/scaling_table.md" 2>>"$OUT/scaling_1.log"

# --- lltm train on every GPU: what it prints about its own scaling ------------------------------
ranks=$([ "$GPUS" -ge 4 ] && echo 4 || echo 2)
run_stage train "${TRAIN_LIMIT:-75}" "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$ranks" \
  -m lltm train --task charlm --device cuda --hidden 512 --batch 1024 --seq-len 128 --steps 60 --eval-every 60 \
  --warmup-steps 10 --scaling-probe 10 --no-plot --quiet --out "$OUT/train"

# --- summary.md ----------------------------------------------------------------------------------
{
  echo "## Multi-GPU check ($(date -u +%F))"
  echo
  echo '```'
  cat "$OUT/header.txt"
  echo '```'
  echo
  echo "| stage | exit status | seconds |"
  echo "|---|---|---|"
  cat "$STAGES"
  echo
  echo "### GPU tests (tests/test_ddp.py -m cuda)"
  echo
  echo '```'
  for n in "${names[@]}"; do
    echo "$n: $(grep -E "passed|failed|skipped|error" "$OUT/tests_$n.log" 2>/dev/null | tail -n 1)"
    grep -E "^(FAILED|ERROR)" "$OUT/tests_$n.log" 2>/dev/null
  done
  echo '```'
  echo
  echo "Measured differences and their bounds:"
  echo
  sed 's/^/- /' "$REPORT"
  echo
  echo "### Scaling (python -m lltm.bench.ddp_scaling)"
  echo
  cat "$OUT/scaling_table.md"
  echo
  echo "### lltm train on $ranks GPUs (charlm, hidden 512, global batch 1024, seq 128)"
  echo
  echo '```'
  grep -E "^(per-rank throughput|scaling seen|\| lltm)" "$OUT/train.log" 2>/dev/null
  echo '```'
} >"$SUMMARY"
cat "$SUMMARY"
# Every log and result in one archive beside the summary: a runner that returns only a few files
# from $OUT (a device tool, a CI artifact limit) still brings back all of it.
archive=$(mktemp "${TMPDIR:-/tmp}/multigpu_logs.XXXXXX") && tar czf "$archive" -C "$OUT" --exclude=logs.tgz . &&
  mv "$archive" "$OUT/logs.tgz"
exit $status
