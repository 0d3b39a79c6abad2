#!/usr/bin/env bash
# The fused CPU layers of every cell against torch's own modules (oneDNN's RNN on
# the CPU): lltm.LLTM, lltm.LSTM and lltm.GRU with backend="fused" beside
# nn.LSTM (for lltm and lstm) and nn.GRU (for gru), forward and backward,
# T = 50, at B x I x S = 16x32x128 and 64x256x256, with 1 and 2 threads.
# Prints each `lltm bench` table, then a summary of fused / torch (forward,
# backward, both; Timer medians). Run it on a quiet machine: it takes ~10
# minutes, and a loaded one makes the numbers meaningless.
#
#   scripts/cpu_cells_bench.sh                       # the whole grid
#   scripts/cpu_cells_bench.sh --dtype bfloat16      # extra arguments go to every `lltm bench`
#   CELLS="lstm gru" THREADS=1 scripts/cpu_cells_bench.sh
#   CELLS="lstm examples/cells/forget_lltm.py:define" scripts/cpu_cells_bench.sh   # a cell of your own
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
CELLS=${CELLS:-"lltm lstm gru"}
THREADS=${THREADS:-"1 2"}
SIZES=${SIZES:-"16x32x128 64x256x256"}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

lscpu 2>/dev/null | grep -E "^(Model name|Vendor ID|CPU\(s\)|L2 cache):" || true
echo "ISA: $(grep -o -w -E 'fma|avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ')"
"$PYTHON" -c "import torch, lltm; print('torch', torch.__version__, '| capability', torch.backends.cpu.get_cpu_capability(), '| lltm fused CPU build', torch.ops.lltm._fused_cpu_capability())"

for threads in $THREADS; do
  for size in $SIZES; do
    IFS=x read -r B I S <<<"$size"
    runs=20
    [ "$B" -ge 64 ] && runs=5
    for cell in $CELLS; do
      key=$(basename "${cell%%:*}" .py)  # a cell of lltm.cells.define: FILE.py:FUNCTION -> FILE
      peer=lstm
      [ "$cell" = gru ] && peer=gru
      echo
      echo "== cell $cell, T=50, ${B}x${I}x${S}, $threads thread(s): fused vs nn.${peer^^}"
      OMP_NUM_THREADS=$threads "$PYTHON" -m lltm bench --seq 50 -b "$B" -f "$I" -s "$S" -r "$runs" --rounds 3 \
        --cell "$cell" --rows "fused,$peer" --no-progress --json "$OUT/$key-$size-$threads.json" "$@"
    done
  done
done

echo
echo "Summary: fused / torch module, Timer medians (target: <= 1.00 for lstm and gru)"
"$PYTHON" - "$OUT" <<'EOF'
import glob, json, os, sys

print(f"{'cell':>11} {'B x I x S':>11} {'threads':>7} {'fused f+b us':>13} {'torch f+b us':>13} {'fwd x':>6} {'bwd x':>6} {'f+b x':>6}")
keyed = []
for path in glob.glob(os.path.join(sys.argv[1], "*.json")):
    data = json.load(open(path))
    cell, size, threads = os.path.basename(path)[:-5].split("-")
    rows = {r["name"]: r for r in data["results"]}
    keyed.append((["lltm", "lstm", "gru"].index(cell) if cell in ("lltm", "lstm", "gru") else 9, size, int(threads), cell, rows))
for _, size, threads, cell, rows in sorted(keyed):
    fused = rows.get("fused")
    if fused is None or fused.get("peer") is None:
        print(f"{cell:>11} {size:>11} {threads:>7}   (no fused or peer row: see the table above)")
        continue
    peer = rows[fused["peer"]]
    total = lambda r: r["timer_fwd_us"] + r["timer_bwd_us"]
    mark = "!" if fused.get("clocks_disagree") or peer.get("clocks_disagree") else ""
    print(f"{cell:>11} {size:>11} {threads:>7} {total(fused):13.1f} {total(peer):13.1f} {fused['peer_ratio_fwd']:6.2f} "
          f"{fused['peer_ratio_bwd']:6.2f} {fused['peer_ratio_total']:6.2f}{mark}")
print("(! : a row whose two clocks disagreed: rerun on a quieter machine)")
EOF
