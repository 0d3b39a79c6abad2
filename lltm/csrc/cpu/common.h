// Pieces shared by the fused CPU operators (cell_cpu.cpp, rnn_cpu.cpp):
// tensor helpers, the team of threads that runs a layer's time loop, and the
// plain GEMM on torch's threads.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/Utils.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

#include "../cells/registry.h"
#include "kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace lltm {
namespace cpu {

// The index of Cell in cells::BuiltIn (the kernels' name for it, kernels.h).
template <typename Cell>
int cell_index() {
  int index = 0, found = -1;
  cells::for_each_cell([&](auto c) {
    if (std::is_same_v<decltype(c), Cell>) found = index;
    ++index;
  });
  return found;
}

// Where the operators of Cell find its kernels: for the built-in cells, the
// build of the CPU capability torch uses (kernels.h). A cell compiled on its
// own (lltm.cells.define) specialises this with the kernels of its source.
template <typename Cell>
struct CellKernels {
  static Kernels get(c10::ScalarType dtype) {
    static_assert(cells::is_built_in<Cell>(), "a cell outside cells::BuiltIn specialises CellKernels");
    return kernels_for_dtype(cell_index<Cell>(), dtype);
  }
};

// The kernels of Cell for `t`'s dtype.
template <typename Cell>
Kernels kernels_for(const at::Tensor& t) {
  const Kernels k = CellKernels<Cell>::get(t.scalar_type());
  TORCH_CHECK(k.forward != nullptr, "lltm: the fused CPU kernels have no build for dtype ", t.scalar_type());
  return k;
}

inline bool has(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// Whether the GEMMs of `t`'s dtype over all T*B rows (the gradients of the
// weights and of the input, after the time loop) go to at::mm rather than
// the backend's own GEMM:
// - bfloat16 where the CPU multiplies it natively (AVX512-BF16 or AMX) and
//   torch runs its AVX-512 kernels: oneDNN picks its kernels by instruction
//   set, not by vendor, and its bfloat16 dot products run at twice the rate
//   of an fp32 multiply-add kernel (one core of the AMD EPYC of
//   docs/benchmarks.md: 3200 x 768 x 256 in 2.7 ms, 12.4 ms through the
//   backend's own GEMM in fp32);
// - float and double where torch runs its AVX2 kernels: the own GEMM's
//   AVX2 tile (4 rows x 3 vectors) reached ~75% of MKL's rate there (Zen 3
//   core, T*B = 3200 rows, K and N 256 to 1024: ~25 against ~34 GFMA/s),
//   while its AVX-512 tile (8 x 3 zmm) ran at 2.5x MKL's on the Zen 5 of
//   docs/benchmarks.md, where MKL takes its AVX2 path on an AMD CPU;
// - float and double on an Intel CPU with AVX-512, where MKL runs its own
//   AVX-512 kernels: 150 GFLOP/s on one core of the Xeon of
//   docs/benchmarks-history.md section 20 (3200 x 1024 x 256), and the
//   LSTM's backward lost 1.3x to oneDNN's with the own GEMM there.
// The time loop's GEMMs stay the backend's own everywhere: their tiles feed
// the cell's math in registers.
inline bool intel_cpu() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  static const bool intel = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  return intel;
#else
  return false;
#endif
}

inline bool parameter_gemms_by_aten(const at::Tensor& t) {
  static const std::string capability = kernels_capability();
  static const bool avx512_bf16 = [] {
    if (capability != "avx512") return false;
    const auto caps = at::cpu::get_cpu_capabilities();
    const auto flag = [&](const char* name) {
      const auto it = caps.find(name);
      return it != caps.end() && it->second.isBool() && it->second.toBool();
    };
    return flag("avx512_bf16") || flag("amx_bf16");
  }();
  static const bool avx2 = capability == "avx2";
  static const bool avx512_intel = capability == "avx512" && intel_cpu();
  const auto dtype = t.scalar_type();
  return (avx512_bf16 && dtype == at::kBFloat16) ||
         ((avx2 || avx512_intel) && (dtype == at::kFloat || dtype == at::kDouble));
}

// A contiguous copy (or the tensor itself when already contiguous) of an
// optional tensor; undefined when absent.
inline at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return has(t) ? t->contiguous() : at::Tensor();
}

inline const void* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

// A tensor whose last dimension is contiguous (the kernels take row
// strides), copied only when it is not.
inline at::Tensor rows_contiguous(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// Step t of a contiguous (T, ...) tensor, as a pointer: cheaper than the
// view tensor[t] (an operator call) in a loop over the steps.
inline void* step_ptr(const at::Tensor& t, int64_t step) {
  return static_cast<char*>(t.data_ptr()) + step * t.stride(0) * static_cast<int64_t>(t.element_size());
}

// The opmath dtype of t (float for bfloat16 / half), the type of the
// kernels' accumulators and carried gradients.
inline at::ScalarType opmath(const at::Tensor& t) { return at::toOpMathType(t.scalar_type()); }

// ---- threads -------------------------------------------------------------------

// Fused multiply-adds below which a share of work does not pay for a second
// thread and, in a time loop, one barrier per step (~0.3 us of work). On the
// 2-core AMD EPYC of docs/benchmarks.md, layer forward T=50, 1 -> 2 threads:
// 74k multiply-adds a step (B=16, I=16, S=32) 74 -> 54 us, 147k 106 -> 66
// us, 983k 559 -> 300 us; at 16k-37k a step two threads gained nothing.
inline constexpr int64_t kMinFmaPerThread = 1 << 15;

// The packed W_hh up to which a sequence backward's workers split the batch
// rows rather than the units (rnn_cpu.h): each then reads all of it every
// step, from its own L2 (512 KiB: S <= 181 for 4 gates in float).
inline constexpr int64_t kRowSplitPackedBytes = int64_t(512) << 10;

// How many workers (at most torch's thread count, at most `parts`) to give
// `fma` multiply-adds of work that splits into `parts` independent parts.
inline int64_t team_size(int64_t fma, int64_t parts) {
  const int64_t by_work = std::max<int64_t>(1, fma / kMinFmaPerThread);
  return std::max<int64_t>(1, std::min({static_cast<int64_t>(at::get_num_threads()), parts, by_work}));
}

// Worker w's share [begin, end) of `parts` parts split over `workers`.
inline std::pair<int64_t, int64_t> share(int64_t parts, int64_t workers, int64_t w) {
  return {parts * w / workers, parts * (w + 1) / workers};
}

// A barrier for the participants of run_team: each arrives with the number
// of workers it runs and waits until every worker has arrived as often.
class TeamSync {
 public:
  TeamSync(std::atomic<int64_t>* arrived, int64_t workers, int64_t weight)
      : arrived_(arrived), workers_(workers), weight_(weight) {}

  void wait() {
    ++phase_;
    const int64_t target = phase_ * workers_;
    if (arrived_->fetch_add(weight_, std::memory_order_acq_rel) + weight_ >= target) return;
    // Spin (the other thread is normally a step's share of work away, a few
    // microseconds at most), then yield the core to whoever needs it.
    for (int spins = 0; arrived_->load(std::memory_order_acquire) < target; ++spins) {
      if (spins < 1024) {
#if defined(__x86_64__) || defined(_M_X64)
        _mm_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  std::atomic<int64_t>* arrived_;
  int64_t workers_, weight_, phase_ = 0;
};

// Splits `parts` independent parts of work over `workers` workers on
// torch's intra-op threads and runs body(part_begin, part_end, sync) for
// each participant, in ONE parallel region: a time loop calls sync.wait()
// between its steps instead of opening a region per step, and every
// participant must call it equally often. A participant runs a contiguous
// range of workers (all of them where torch gives no second thread, e.g.
// inside another parallel region); the participants of an OpenMP region run
// at the same time, which the barrier needs. Without OpenMP (ATen's native
// thread pool, whose tasks may run one after another) there is one
// participant.
template <typename F>
void run_team(int64_t parts, int64_t workers, const F& body) {
#if !AT_PARALLEL_OPENMP
  workers = 1;
#endif
  std::atomic<int64_t> arrived{0};
  if (workers <= 1) {
    TeamSync sync(&arrived, 1, 1);
    body(int64_t{0}, parts, sync);
    return;
  }
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    TeamSync sync(&arrived, workers, end - begin);
    body(share(parts, workers, begin).first, share(parts, workers, end - 1).second, sync);
  });
}

// g on torch's threads: rows or columns of C split, whichever gives more
// tiles, in whole tiles.
inline void parallel_gemm(const Kernels& k, const Gemm& g) {
  if (g.m == 0 || g.n == 0) return;
  const int64_t row_tiles = (g.m + k.tile_rows - 1) / k.tile_rows;
  const int64_t col_tiles = (g.n + k.tile_cols - 1) / k.tile_cols;
  const bool by_rows = row_tiles >= col_tiles;
  const int64_t workers = team_size(g.m * g.n * std::max<int64_t>(g.k, 1), by_rows ? row_tiles : col_tiles);
  if (workers <= 1) {
    k.gemm(g, 0, g.m, 0, g.n);
    return;
  }
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    if (by_rows) {
      const int64_t m0 = share(row_tiles, workers, begin).first * k.tile_rows;
      const int64_t m1 = std::min(g.m, share(row_tiles, workers, end - 1).second * k.tile_rows);
      k.gemm(g, m0, m1, 0, g.n);
    } else {
      const int64_t n0 = share(col_tiles, workers, begin).first * k.tile_cols;
      const int64_t n1 = std::min(g.n, share(col_tiles, workers, end - 1).second * k.tile_cols);
      k.gemm(g, 0, g.m, n0, n1);
    }
  });
}

// c (M, N) = A (M, K) B (K, N) (+ c when accumulate), on torch's threads:
// c is opmath with unit column stride (a column range of a wider matrix
// too); A and B as in Gemm.
inline void gemm_out(const Kernels& k, const at::Tensor& c, const void* a, int64_t a_rs, int64_t a_ks,
                     const void* b, int64_t ldb, int64_t kdim, bool accumulate = false) {
  TORCH_INTERNAL_ASSERT(c.dim() == 2 && c.stride(1) == 1 && c.scalar_type() == opmath(c));
  parallel_gemm(
      k, Gemm{a, a_rs, a_ks, b, ldb, c.data_ptr(), c.stride(0), c.size(0), c.size(1), kdim, accumulate});
}

}  // namespace cpu
}  // namespace lltm
