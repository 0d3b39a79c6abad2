#!/usr/bin/env bash
# Everything the fused CUDA backend needs checked on a GPU machine, in one go:
#
#   scripts/gpu_check.sh [STAGE ...]     (default: all stages, in this order)
#
#   build     setup.py build_ext --inplace for sm_90 (TORCH_CUDA_ARCH_LIST)
#   oldbuild  (not in the default list) the same for the tree in $OLD_TREE (a `git archive` of an
#             earlier commit, e.g. the landed kernels), for side-by-side timings (regress)
#   test      pytest tests/test_cuda.py (the fused CUDA backend)
#   cells     pytest tests/test_cells.py on CUDA: LSTM and GRU on every backend and time loop
#   regress   (not in the default list; after build and oldbuild) the planner's pick of the fused
#             LLTM layer over the seq_sweep grid in this tree and in $OLD_TREE, the two runs
#             alternating per dtype (REGRESS_DTYPES), compared point by point (lbench.compare_sweeps)
#   sanitizecells  compute-sanitizer memcheck and racecheck over the cells' CUDA time loops
#   resources (not in the default list) registers / stack / local memory of every persistent kernel
#   cellsweep (not in the default list) seq_sweep of lltm.LSTM and lltm.GRU against nn.LSTM / nn.GRU
#             (CELLSWEEP_CELLS, CELLSWEEP_DTYPES, CELLSWEEP_ARGS)
#   seq       pytest of the sequence operators, their CUDA time loops and the
#             layer on CUDA (tests/test_seq.py, tests/test_seq_paths.py,
#             tests/test_layer.py, -k cuda)
#   testall   pytest on every other test, the GPU-parametrised ones included
#   sanitize  compute-sanitizer memcheck over a subset of tests/test_cuda.py,
#             with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that out-of-bounds
#             accesses cannot hide in the caching allocator's slack
#   profile   python -m lltm.bench.cuda_profile: host cost per call, GPU time per kernel
#   sweep     python -m lltm.bench.cuda_path_sweep: small vs cuBLAS path, GEMM floor
#   seqsweep  python -m lltm.bench.seq_sweep: the sequence ops' time loops over the
#             grid B 16..512 x S 128..1024 (each path forced, the planner's pick,
#             nn.LSTM with and without TF32), float32 and bfloat16; JSON in $OUT
#   train     lltm train charlm, LLTM vs nn.LSTM at equal parameter count (hidden 512,
#             batch 256, seq 128), float32 and bfloat16: tokens/s of both
#   check     lltm info; lltm check --device cuda
#   bench     lltm bench --device cuda at the issue's sizes, float32 and bfloat16
#   benchseq  lltm bench --seq T --device cuda at the layer targets' sizes
#   memory    python -m lltm.bench.conv_bn_memory --device cuda (fused Conv2d+BatchNorm2d)
#   phases    (not in the default list) a profiling build (LLTM_STEP_CLOCKS=1), then
#             python -m lltm.bench.step_phases at T=1000 in float32, TF32 and bfloat16:
#             cycles per phase of a persistent kernel's step; rebuilds without the clocks after
#   probe     (not in the default list; needs no build) scripts/grid_exchange_probe.cu compiled for
#             sm_90 and run: the grid's and the cluster's exchange protocols alone and the cluster
#             design's whole LLTM step at FlashRNN's point (ns a step; every reload checked);
#             scripts/grid_step_probe.cu: the grid path's whole step there, one part against two
#             and with the kernels' features one at a time (every gate sum at two steps checked);
#             then scripts/tf32_split_probe.cu: the float32 tile dot's error, lean and cost in five forms
#   compile   lltm train --compile against eager (charlm, hidden 256, batch 64, seq 128):
#             python -m lltm.bench.train_step (steady steps interleaved, the modes' costliest
#             ops), then two real runs whose summaries give warm-up and steady state apart
#
# Logs go to $OUT (default ./gpu_check_out): summary.txt, printed last (summaries.txt keeps
# those of every run into the same $OUT), and logs-<time>-<pid>.tar.gz with one log per
# stage (and JSON results). Stages do not stop the script
# when they fail; the exit code is non-zero if any did.
# Environment: PYTHON, TORCH_CUDA_ARCH_LIST (default 9.0), MAX_JOBS, BENCH_DEVICE,
# BENCH_SIZES (e.g. "16x32x128 4096x1024x1024"), BENCH_DTYPES, BENCH_ARGS,
# PYTEST_ARGS, PYTEST_WORKERS (0: no xdist; default 4, testall up to 14), SANITIZE_K, SANITIZE_SEQ_K, SANITIZE_SEQ_RACE_K, SANITIZE_CELLS_K,
# SANITIZE_CELLS_RACE_K (pytest -k expressions of the sanitizers' subsets),
# BUILD_LIMIT / TEST_LIMIT / TESTALL_LIMIT / SANITIZE_LIMIT / RACECHECK_LIMIT (seconds per stage), DEADLINE
# (seconds from the start after which no stage runs or keeps running), CC / CXX
# (the host compilers of the build and of nvcc's -ccbin; printed in the header).
set -uo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
SUMMARY=$OUT/summary.txt
SANITIZER=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test cells seq testall sanitize check benchseq seqsweep profile sweep bench memory train compile)
status=0

note() { echo "$*" | tee -a "$SUMMARY"; }

# The part of a stage's log after its last "== " header: that run's output alone, so a run cut
# short by its limit does not show the lines of the run before it.
last_run() { awk '/^== /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$1"; }

# Stage $1: memcheck over the tests of file $2 that pytest -k "$3" selects, then racecheck over
# -k "$4", each with nvjet (cuBLAS's own GEMMs) left out; each run's summary lines into $SUMMARY.
memcheck_and_racecheck() {
  local stage=$1 file=$2 tool k limit
  for tool in memcheck racecheck; do
    k=$3
    [ "$tool" = racecheck ] && k=$4
    limit=${SANITIZE_LIMIT:-420}
    [ "$tool" = racecheck ] && limit=${RACECHECK_LIMIT:-600}
    run_stage "$stage" "$limit" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
      "$SANITIZER" --tool "$tool" --kernel-name-exclude kns=nvjet --error-exitcode 3 --print-limit 20 \
      "$PYTHON" -m pytest "$file" -q -p no:cacheprovider -k "$k"
    last_run "$OUT/$stage.log" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" | tail -n 2 \
      | sed "s/^/          $tool: /" | tee -a "$SUMMARY"
  done
}

run_stage() {  # name, limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  # DEADLINE: seconds from the start by which every stage must be done.
  local left=$((${DEADLINE:-1000000} - SECONDS - 5))
  if [ "$left" -lt 20 ]; then
    note "$(printf '%-9s skipped: DEADLINE reached' "$name")"
    status=1
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  echo "== $name: $*" >>"$OUT/$name.log"
  timeout --kill-after=10 "$limit" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-9s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$OUT/$name.log")"
  [ $rc -eq 0 ] || status=1
  return $rc
}

{
  echo "gpu_check $(date -u +%FT%TZ) on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null
  "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda, "|", torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'
  nvcc --version 2>/dev/null | tail -1
  echo "host compiler: $(command -v "${CXX:-c++}") ($("${CXX:-c++}" --version 2>/dev/null | head -1)); CC=${CC:-unset}"
} | tee "$SUMMARY"

for stage in "${stages[@]}"; do
  case "$stage" in
    build)
      run_stage build "${BUILD_LIMIT:-480}" "$PYTHON" setup.py build_ext --inplace
      "$PYTHON" -c 'import lltm._C' >>"$OUT/build.log" 2>&1 || { note "build: import lltm._C failed"; status=1; }
      ;;
    oldbuild)
      (cd "${OLD_TREE:?set OLD_TREE to the earlier tree}" && run_stage oldbuild "${BUILD_LIMIT:-480}" "$PYTHON" setup.py build_ext --inplace)
      ;;
    cells)
      if [ "${PYTEST_WORKERS:-4}" = 0 ]; then xdist=(-p no:xdist); else xdist=(-n "${PYTEST_WORKERS:-4}"); fi
      run_stage cells "${TEST_LIMIT:-420}" "$PYTHON" -m pytest tests/test_cells.py -q -rfEs -p no:cacheprovider \
        -k "cuda" "${xdist[@]}" ${PYTEST_ARGS:-}
      tail -n 1 "$OUT/cells.log" | sed 's/^/          /' | tee -a "$SUMMARY"
      grep -E "^(FAILED|ERROR)" "$OUT/cells.log" | head -n 20 | sed 's/^/          /' | tee -a "$SUMMARY"
      ;;
    test)
      run_stage test "${TEST_LIMIT:-420}" "$PYTHON" -m pytest tests/test_cuda.py -q -rfEs -p no:cacheprovider ${PYTEST_ARGS:-}
      tail -n 1 "$OUT/test.log" | sed 's/^/          /' | tee -a "$SUMMARY"
      ;;
    seq)
      run_stage seq "${TEST_LIMIT:-420}" "$PYTHON" -m pytest tests/test_seq.py tests/test_seq_paths.py \
        tests/test_layer.py -q -rfEs -p no:cacheprovider -k "cuda or paths" ${PYTEST_ARGS:-}
      tail -n 1 "$OUT/seq.log" | sed 's/^/          /' | tee -a "$SUMMARY"
      grep -E "^(FAILED|ERROR)" "$OUT/seq.log" | head -n 20 | sed 's/^/          /' | tee -a "$SUMMARY"
      # the aten backend's float32 error at T = 3000 against the python backend's
      grep -A5 "^T=3000 float32 on cuda" "$OUT/seq.log" >>"$SUMMARY"
      ;;
    testall)
      # every other test, the GPU-parametrised ones included; xdist keeps a
      # crashing test from taking the rest down with it. CPU-bound tests and
      # the user cells' CUDA builds (~60 s each alone on 16 cores, 160-170 s
      # when 14 workers share them) set the time: on an H200 machine (16
      # cores) the whole suite took ~1,000 s with 14 workers (two parts, 377 s
      # and over 588 s, 2026-12-01; ~300 s when it was smaller), hence up to 14
      # workers by default and 1,800 s.
      workers=${PYTEST_WORKERS:-$(($(nproc) < 14 ? $(nproc) : 14))}
      if [ "$workers" = 0 ]; then xdist=(-p no:xdist); else xdist=(-n "$workers" --dist loadfile); fi
      run_stage testall "${TESTALL_LIMIT:-1800}" "$PYTHON" -X faulthandler -m pytest tests --ignore=tests/test_cuda.py \
        -q -rfEs -p no:cacheprovider "${xdist[@]}" ${PYTEST_ARGS:-}
      grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/testall.log" | tail -n 30 | sed 's/^/          /' | tee -a "$SUMMARY"
      ;;
    sanitize)
      k=${SANITIZE_K:-"(test_parity and (16x32x128 or 3x5x7 or 300x40x64) and (float32 or bfloat16)) or test_non_contiguous or test_batch_zero or test_gates_output"}
      run_stage sanitize "${SANITIZE_LIMIT:-420}" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
        "$SANITIZER" --tool memcheck --error-exitcode 3 --print-limit 20 \
        "$PYTHON" -m pytest tests/test_cuda.py -q -p no:cacheprovider -k "$k"
      grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitize.log" | tail -n 3 | sed 's/^/          /' | tee -a "$SUMMARY"
      # the sequence kernels (every time loop, the multicast reloads, held A fragments in clusters):
      # memcheck and racecheck. cuBLAS's own nvjet GEMMs are left out: racecheck reports hazards in
      # their split-k kernels of the half types (docs/benchmarks-history.md, section 25), not ours.
      # racecheck runs its own, smaller selection: it takes 2-3 s over a 7x5x3x17 case and 20-65 s
      # over a 6x33x8x70 one (H200), so memcheck's 139 tests would need half an hour under it.
      kseq=${SANITIZE_SEQ_K:-"(test_paths_match_reference and not 1024 and not 300x) or test_cluster_sizes or test_grid_group_sizes or test_paths_write_every_output or test_loop_replays_its_graph or (test_grid_multicast and not bad) or (holds_w and cluster)"}
      # The held kernels' racecheck: their kernels-only cases (no input, no weight gradients: no cuBLAS
      # GEMM on the GPU, whose sm_90 kernels stop racecheck with a hardware exception;
      # docs/benchmarks-history.md, section 64).
      krace=${SANITIZE_SEQ_RACE_K:-"(test_paths_match_reference and 7x5x3x17) or test_cluster_sizes or (test_grid_multicast and not bad) or (holds_w and kernels-only and not bfloat16)"}
      memcheck_and_racecheck sanitize tests/test_seq_paths.py "$kseq" "$krace"
      ;;
    regress)
      for dtype in ${REGRESS_DTYPES:-float32 bfloat16}; do
        (cd "${OLD_TREE:?set OLD_TREE}" && run_stage regress "${SWEEP_LIMIT:-300}" "$PYTHON" -m lltm.bench.seq_sweep \
          --dtype "$dtype" --paths "" --json "$OUT/regress_old_$dtype.json" ${REGRESS_ARGS:-})
        run_stage regress "${SWEEP_LIMIT:-300}" "$PYTHON" -m lltm.bench.seq_sweep --dtype "$dtype" --paths "" \
          --json "$OUT/regress_new_$dtype.json" ${REGRESS_ARGS:-}
        "$PYTHON" -m lltm.bench.compare_sweeps "$OUT/regress_old_$dtype.json" "$OUT/regress_new_$dtype.json" \
          | tee -a "$OUT/regress.log" | grep -E "^(auto|float|bfloat|half)" >>"$SUMMARY"
      done
      ;;
    cellsweep)
      for cell in ${CELLSWEEP_CELLS:-lstm gru}; do
        for dtype in ${CELLSWEEP_DTYPES:-float32 bfloat16}; do
          run_stage cellsweep "${SWEEP_LIMIT:-300}" "$PYTHON" -m lltm.bench.seq_sweep --cell "$cell" --dtype "$dtype" \
            --json "$OUT/cellsweep_${cell}_$dtype.json" ${CELLSWEEP_ARGS:-}
        done
      done
      grep -E "^(\||fused|auto)" "$OUT/cellsweep.log" >>"$SUMMARY"
      ;;
    sanitizecells)
      # the seam's cells in every CUDA time loop: memcheck and racecheck. racecheck stops with "failed
      # to handle a hardware exception" wherever cuBLAS runs one of its sm_90 GEMMs of some shapes
      # (plain torch GEMMs too, even with a --kernel-name filter that checks no kernel:
      # scripts/racecheck_cublas_repro.py; docs/benchmarks-history.md, section 64):
      # the held kernels are racechecked in their kernels-only cases, which call no cuBLAS GEMM on
      # the GPU; bf16's too with SANITIZE_CELLS_RACE_K. racecheck leaves out the 5x33x8x70 cases (as
      # the sanitize stage, for its pace): it takes ~12 s a held case (H200).
      kcells=${SANITIZE_CELLS_K:-"test_cuda_paths_match_reference and (7x5x3x17 or 3x1x4x1 or 5x33x8x70)"}
      kcellsrace=${SANITIZE_CELLS_RACE_K:-"(test_cuda_paths_match_reference and (7x5x3x17 or 3x1x4x1)) or (holds_w and kernels-only and not bfloat16)"}
      memcheck_and_racecheck sanitizecells tests/test_cells.py "$kcells" "$kcellsrace"
      ;;
    resources)
      # registers, stack and spills of every persistent kernel (this build, and $OLD_TREE's if set)
      for tree in . ${OLD_TREE:-}; do
        cuobjdump --dump-resource-usage "$tree"/lltm/_C*.so 2>/dev/null | grep -A1 "persistent_kernel" \
          >"$OUT/resources_$(basename "$(cd "$tree" && pwd)").txt"
      done
      ;;
    profile)
      run_stage profile 240 "$PYTHON" -m lltm.bench.cuda_profile
      ;;
    sweep)
      run_stage sweep 300 "$PYTHON" -m lltm.bench.cuda_path_sweep --json "$OUT/sweep.json"
      run_stage sweep 200 "$PYTHON" -m lltm.bench.cuda_path_sweep --dtype bfloat16 \
        --sizes 16x32x128,64x1024x128,256x512x512,4096x1024x1024
      ;;
    seqsweep)
      for dtype in ${SWEEP_DTYPES:-float32 bfloat16}; do
        run_stage seqsweep "${SWEEP_LIMIT:-400}" "$PYTHON" -m lltm.bench.seq_sweep --dtype "$dtype" \
          --json "$OUT/sweep_$dtype.json" ${SWEEP_ARGS:-}
      done
      grep -E "^(\||fused)" "$OUT/seqsweep.log" >>"$SUMMARY"
      ;;
    train)
      for dtype in ${TRAIN_DTYPES:-float32 bfloat16}; do
        run_stage train "${TRAIN_LIMIT:-240}" "$PYTHON" -m lltm train --task charlm --device cuda --compare \
          --match-params --hidden 512 --batch 256 --seq-len 128 --dtype "$dtype" --no-plot --quiet \
          --out "$OUT/train_$dtype"
      done
      grep -E "^\|" "$OUT/train.log" >>"$SUMMARY"
      ;;
    check)
      run_stage check 120 "$PYTHON" -X faulthandler -c "import torch, lltm._C; print(torch._C._dispatch_dump('lltm::_build_info')); print(torch._C._dispatch_dump('lltm::fused_cell_forward'))"
      run_stage check 120 "$PYTHON" -X faulthandler -m lltm info
      run_stage check 300 "$PYTHON" -m lltm check --device cuda
      run_stage check 300 "$PYTHON" -m lltm check --device cuda -b 16 -f 32 -s 128
      ;;
    bench)
      for dtype in ${BENCH_DTYPES:-float32 bfloat16}; do
        for size in ${BENCH_SIZES:-16x32x128 64x1024x128 256x512x512 4096x1024x1024}; do
          IFS=x read -r B I S <<<"$size"
          run_stage bench 300 "$PYTHON" -m lltm bench --device "${BENCH_DEVICE:-cuda}" --dtype "$dtype" \
            -b "$B" -f "$I" -s "$S" --no-progress ${BENCH_ARGS:-} \
            --json "$OUT/bench_${size}_${dtype}.json"
        done
      done
      # one JSON with every table (at most 8 files come back from $OUT)
      "$PYTHON" - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
tables = []
for path in sorted(glob.glob(os.path.join(out, "bench_*.json"))):
    with open(path) as f:
        tables.append(json.load(f))
    os.remove(path)
with open(os.path.join(out, "bench.json"), "w") as f:
    json.dump(tables, f, indent=1)
EOF
      grep -E "^LLTM (cell|sequence)|^ *(python|aten|fused|compile|compile-ro|lstm|lstm-notf32|gemm) \||^time / |^skipped" "$OUT/bench.log" >>"$SUMMARY"
      ;;
    benchseq)
      # the layer targets: T x BxIxS, float32 and bfloat16
      for dtype in ${BENCH_DTYPES:-float32 bfloat16}; do
        for case in ${BENCH_SEQ_CASES:-100x16x32x128 1000x16x32x128 100x64x256x256 100x64x1024x1024}; do
          IFS=x read -r T B I S <<<"$case"
          run_stage benchseq 300 "$PYTHON" -m lltm bench --device "${BENCH_DEVICE:-cuda}" --dtype "$dtype" \
            --seq "$T" -b "$B" -f "$I" -s "$S" -r 20 --rounds 3 --no-progress ${BENCH_ARGS:-}
        done
      done
      grep -E "^LLTM (cell|sequence)|^ *(python|aten|fused|compile|compile-ro|lstm|lstm-notf32) \||^time / |^skipped|saved|peak" \
        "$OUT/benchseq.log" >>"$SUMMARY"
      ;;
    memory)
      run_stage memory 300 "$PYTHON" -m lltm.bench.conv_bn_memory --device cuda --markdown
      tail -n 25 "$OUT/memory.log" >>"$SUMMARY"
      ;;
    compile)
      run_stage compile 420 "$PYTHON" -m lltm.bench.train_step --device cuda --hidden 256 --batch 64 --seq-len 128 \
        --modes eager,default,reduce-overhead --profile
      for compile in "" "--compile"; do
        run_stage compile 420 "$PYTHON" -m lltm train --task charlm --hidden 256 --batch 64 --seq-len 128 \
          --steps 300 --eval-every 300 --device cuda --no-plot --quiet --out "$OUT/train${compile:+-compile}" $compile
      done
      grep -E "^lltm train step|^ +(mode|eager|default|reduce-overhead) \||^\| lltm" "$OUT/compile.log" >>"$SUMMARY"
      ;;
    probe)
      for probe in grid_exchange_probe grid_step_probe tf32_split_probe; do
        run_stage probe 240 bash -c "nvcc -arch=sm_90 -O3 -std=c++17 -o '$OUT/$probe' scripts/$probe.cu && '$OUT/$probe'"
        rm -f "$OUT/$probe"
      done
      grep -E "wrong|no progress|needs a GPU" "$OUT/probe.log" | grep -vE " 0 wrong" | head -n 5 | sed 's/^/          /' | tee -a "$SUMMARY"
      grep -E "^LLTM step|^(forward|backward) |relative error" "$OUT/probe.log" | sed 's/^/          /' | tee -a "$SUMMARY"
      ;;
    phases)
      LLTM_STEP_CLOCKS=1 run_stage phases "${BUILD_LIMIT:-480}" "$PYTHON" setup.py -q build_ext --inplace
      for args in "" "--tf32" "--dtype bfloat16"; do
        run_stage phases 180 "$PYTHON" -m lltm.bench.step_phases --steps 1000 \
          --sizes "${PHASE_SIZES:-16x32x128,64x256,256x128}" --paths "${PHASE_PATHS:-auto,cluster-fma,grid}" $args
      done
      grep -E "^step phases|total" "$OUT/phases.log" | grep -v "^lltm step" >>"$SUMMARY"
      run_stage phases "${BUILD_LIMIT:-480}" "$PYTHON" setup.py -q build_ext --inplace
      ;;
    *)
      echo "gpu_check: unknown stage $stage" | tee -a "$SUMMARY"
      status=1
      ;;
  esac
done

# Few files come back from a device machine: pack this run's logs into one archive (a
# later run in the same $OUT adds one of its own) and keep the summaries of every run.
ARCHIVE=logs-$(date -u +%H%M%S)-$$.tar.gz
(cd "$OUT" && ls -p | grep -v -e '/$' -e '^summary' -e '^logs.*\.tar\.gz$' >"$OUT/.files" \
  && tar czf "$ARCHIVE" -T .files && xargs rm -f <.files; rm -f .files) 2>/dev/null
cat "$SUMMARY" >>"$OUT/summaries.txt"
echo "================ summary ================"
cat "$SUMMARY"
exit $status
