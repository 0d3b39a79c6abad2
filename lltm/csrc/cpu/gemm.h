// The GEMM of the fused CPU backend: a register-tile micro-kernel over
// at::vec, the packing that feeds it, and a plain blocked GEMM built on it
// (kernels.h: Gemm). Independent of the cell but for its gate count G (the
// packing of the step kernels' weights); step_kernels.h runs the cell's
// math on its tiles.
//
// The tile is MR rows x NR vectors of accumulators. Per k it loads NR
// vectors of a packed B panel (contiguous, zero past the matrix) and
// broadcasts MR scalars of A, MR x NR fused multiply-adds: with MR = 8 and
// NR = 3 on AVX-512 that is 24 accumulators + 3 B vectors + 1 broadcast of
// the 32 registers, FMA-bound (measured at 245 GFLOP/s on one core of the
// AMD EPYC of docs/benchmarks.md, against 95 for MKL's sgemm there). The
// plain GEMM's NR is 3 wherever the columns allow and less only for the last
// columns, with more rows; the forward step's is the cell's G (one vector
// per gate of a unit block), the backward step's 1 to 3 unit blocks.
//
// Included by the kernels_<capability>.cpp files only (see cell_math.h on
// the CPU_CAPABILITY namespace).
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cell_math.h"
#include "kernels.h"

namespace lltm {
namespace cpu {
inline namespace CPU_CAPABILITY {

// Rows of a tile of NR accumulator vectors: as many as the vector registers
// hold beside the tile's NR B vectors and one broadcast, at most 16, in
// powers of two (a batch of 16 rows is then two tiles of 8, not 12 + 3 + 1):
// AVX-512 (32 registers) 16, 8, 8, 4 rows for NR = 1 .. 4; AVX2 (16) 8, 4,
// 4, 2; at::vec's portable vectors (two SSE registers each, the compiler's
// choice) half the AVX2 rows.
constexpr int pow2_floor(int n) { return n < 2 ? 1 : 2 * pow2_floor(n / 2); }
constexpr int rows_for(int registers, int nr) {
  return pow2_floor(std::min(16, std::max(1, (registers - nr - 1) / nr)));
}
#if defined(CPU_CAPABILITY_AVX512)
template <int NR>
inline constexpr int kRows = rows_for(32, NR);
#elif defined(CPU_CAPABILITY_AVX2)
template <int NR>
inline constexpr int kRows = rows_for(16, NR);
#else
template <int NR>
inline constexpr int kRows = std::max(1, rows_for(16, NR) / 2);
#endif
static_assert(kRows<1> >= kRows<2> && kRows<2> >= kRows<3>, "the plain GEMM's row split unit is kRows<1>");
inline constexpr int kTileCols = 3;
// K per block of the plain GEMM: a B panel of kKc x 3 vectors (48 KiB of
// floats on AVX-512) stays in L1 / L2 while every row tile of A passes over
// it (256 against 128: backward of the layer T=50 16x32x128 3% faster).
inline constexpr int64_t kKc = 256;
// Rows of C from which the plain GEMM packs every panel of B (see gemm).
inline constexpr int64_t kPackRows = 64;

// v, held in a register from here on: GCC otherwise folds a B vector's load
// into each multiply-add that uses it, one load per row instead of one per
// tile (4 gates x 2 rows on AVX2: 10 loads for 8 multiply-adds, above the
// two a cycle the core serves).
template <typename T>
C10_ALWAYS_INLINE Vec<T> in_register(const Vec<T>& v) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<T, float>) {
#if defined(CPU_CAPABILITY_AVX512)
    __m512 r = v;
    asm("" : "+v"(r));
#else
    __m256 r = v;
    asm("" : "+x"(r));
#endif
    return Vec<T>(r);
  } else if constexpr (std::is_same_v<T, double>) {
#if defined(CPU_CAPABILITY_AVX512)
    __m512d r = v;
    asm("" : "+v"(r));
#else
    __m256d r = v;
    asm("" : "+x"(r));
#endif
    return Vec<T>(r);
  }
#endif
  return v;
}

// acc[r][n] += sum_{k < K} A(r, k) * P[k][n]: A(r, k) = a[r * rs + k * ks]
// (converted to opmath), P's rows ldp elements apart, vector n at n * width.
// Every loop over the tile is unrolled so that acc lives in registers (a
// loop over it left rolled makes GCC keep the array in memory and store it
// on every k).
template <int MR, int NR, typename a_t, typename T>
C10_ALWAYS_INLINE void mac_tile(Vec<T> (&acc)[MR][NR], const a_t* a, int64_t rs, int64_t ks, int64_t K,
                                const T* p, int64_t ldp) {
  constexpr int64_t V = Vec<T>::size();
  for (int64_t k = 0; k < K; ++k) {
    Vec<T> w[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) w[n] = in_register(Vec<T>::loadu(p + k * ldp + n * V));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const Vec<T> x(static_cast<T>(a[r * rs + k * ks]));
#pragma GCC unroll 4
      for (int n = 0; n < NR; ++n) acc[r][n] = at::vec::fmadd(x, w[n], acc[r][n]);
    }
  }
}

template <int MR, int NR, typename T>
C10_ALWAYS_INLINE void zero_tile(Vec<T> (&acc)[MR][NR]) {
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) acc[r][n] = Vec<T>(T(0));
  }
}

// Asks for the cache lines of the n elements at p ahead of their use (for
// writing: for ownership). The backward step's pointwise part reads the
// saved gates and cells of step t, rows far apart in memory that the
// hardware prefetchers do not follow; issued before the tile's K loop, the
// lines arrive while it runs (backward loop of the layer T=50 64x256x256:
// -14% on one thread, -21% on two). The forward step's rows were written one
// step earlier and are in cache: prefetching them cost 4%.
template <typename T>
C10_ALWAYS_INLINE void prefetch(const T* p, int64_t n) {
  const char* first = reinterpret_cast<const char*>(p);
  const char* last = first + n * static_cast<int64_t>(sizeof(T)) - 1;
  for (const char* q = first; q <= last; q += 64) __builtin_prefetch(q, 0, 3);
  __builtin_prefetch(last, 0, 3);
}
template <typename T>
C10_ALWAYS_INLINE void prefetch_for_write(T* p, int64_t n) {
  const char* first = reinterpret_cast<const char*>(p);
  const char* last = first + n * static_cast<int64_t>(sizeof(T)) - 1;
  for (const char* q = first; q <= last; q += 64) __builtin_prefetch(q, 1, 3);
  __builtin_prefetch(last, 1, 3);
}

// f.template operator()<M>(row) over rows [begin, end): tiles of MR rows,
// then the rest in tiles of MR / 2, MR / 4, ... (one each at most).
template <int MR, typename F>
C10_ALWAYS_INLINE void for_row_tiles(int64_t begin, int64_t end, const F& f) {
  int64_t r = begin;
  for (; r + MR <= end; r += MR) f.template operator()<MR>(r);
  if constexpr (MR > 1) {
    if (r < end) for_row_tiles<MR / 2>(r, end, f);
  }
}

// Rows [begin, end) of a (rows, cols) matrix in the type of `src` (rows ld
// apart), converted to T into `out` (rows `width` apart) starting at column
// `col`; columns past `cols` are 0.
template <typename T, typename src_t>
inline void copy_panel(const src_t* src, int64_t ld, int64_t rows, int64_t col, int64_t cols, int64_t width,
                       T* out) {
  const int64_t n = std::clamp<int64_t>(cols - col, 0, width);
  for (int64_t k = 0; k < rows; ++k) {
    const src_t* s = src + k * ld + col;
    T* o = out + k * width;
    for (int64_t j = 0; j < n; ++j) o[j] = static_cast<T>(s[j]);
    for (int64_t j = n; j < width; ++j) o[j] = T(0);
  }
}

// A range of unit blocks as panels of at most kTileCols blocks, of near
// equal sizes (8 blocks: 3 + 3 + 2; 4: 2 + 2), so that no tile runs on
// one vector where a wider one fits.
inline int64_t unit_panels(int64_t blocks) { return (blocks + kTileCols - 1) / kTileCols; }
inline std::pair<int64_t, int64_t> unit_panel(int64_t begin, int64_t end, int64_t q) {
  const int64_t n = end - begin, panels = unit_panels(n);
  return {begin + n * q / panels, begin + n * (q + 1) / panels};
}

// ---- plain GEMM (kernels.h: Gemm) --------------------------------------------

template <typename scalar_t>
void gemm(const Gemm& g, int64_t m_begin, int64_t m_end, int64_t n_begin, int64_t n_end) {
  using T = at::opmath_type<scalar_t>;
  constexpr int64_t V = Vec<T>::size();
  constexpr int64_t NW = kTileCols * V;  // columns per panel
  const auto* a = static_cast<const scalar_t*>(g.a);
  const auto* b = static_cast<const scalar_t*>(g.b);
  T* c = static_cast<T*>(g.c);
  if (m_begin >= m_end || n_begin >= n_end) return;
  if (g.k == 0) {
    if (!g.accumulate) {
      for (int64_t m = m_begin; m < m_end; ++m)
        std::fill(c + m * g.ldc + n_begin, c + m * g.ldc + n_end, T(0));
    }
    return;
  }
  const int64_t panels = (n_end - n_begin + NW - 1) / NW;
  // bfloat16 / half operands are converted once per block of K, not per
  // multiply-add: A's rows [m_begin, m_end) into [m][k] (a broadcast from
  // memory is then one instruction), B's panels as below.
  constexpr bool convert = !std::is_same_v<scalar_t, T>;
  std::vector<T> a_block(convert ? static_cast<size_t>((m_end - m_begin) * kKc) : 0);
  // A panel of B (kKc rows x NW columns) packed [k][NW], where B cannot be
  // read in place: converted, or columns that do not fill the panel's vectors.
  std::vector<T> packed;
  for (int64_t k0 = 0; k0 < g.k; k0 += kKc) {
    const int64_t kc = std::min(kKc, g.k - k0);
    const bool load_c = g.accumulate || k0 > 0;
    const T* a_base = nullptr;  // A(m, k0 + kk) at a_base[(m - m_begin) * a_rs + kk * a_ks]
    int64_t a_rs = g.a_rs, a_ks = g.a_ks;
    if constexpr (convert) {
      for (int64_t m = m_begin; m < m_end; ++m) {
        const scalar_t* src = a + m * g.a_rs + k0 * g.a_ks;
        T* dst = a_block.data() + (m - m_begin) * kc;
        for (int64_t kk = 0; kk < kc; ++kk) dst[kk] = static_cast<T>(src[kk * g.a_ks]);
      }
      a_base = a_block.data();
      a_rs = kc;
      a_ks = 1;
    } else {
      a_base = a + m_begin * g.a_rs + k0 * g.a_ks;
    }
    // One tile: rows [m0, m0 + M) x the NR vectors of the panel at column
    // col, B's rows at bp, ldp apart.
    const auto tile = [&]<int M, int NR>(int64_t m0, int64_t col, const T* bp, int64_t ldp) {
      Vec<T> acc[M][NR];
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) {
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
          const int64_t cnt = std::clamp<int64_t>(n_end - col - n * V, 0, V);
          acc[r][n] = load_c && cnt > 0 ? load(c + (m0 + r) * g.ldc + col + n * V, cnt) : Vec<T>(T(0));
        }
      }
      mac_tile<M, NR>(acc, a_base + (m0 - m_begin) * a_rs, a_rs, a_ks, kc, bp, ldp);
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) {
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
          const int64_t cnt = std::clamp<int64_t>(n_end - col - n * V, 0, V);
          if (cnt > 0) store(c + (m0 + r) * g.ldc + col + n * V, acc[r][n], cnt);
        }
      }
    };
    static_assert(kTileCols == 3, "the dispatch below covers tiles of 1 to 3 vectors");
    for (int64_t p = 0; p < panels; ++p) {
      // the last panel of a narrow C has fewer vectors: no multiply-adds on padding
      const int64_t col = n_begin + p * NW, cols = std::min(NW, n_end - col), vectors = (cols + V - 1) / V;
      const T* bp = nullptr;
      int64_t ldp = NW;
      if constexpr (!convert) {
        // B read in place where its rows fill the panel's vectors and few row
        // tiles pass over it. With many, a packed copy (rows NW apart) stays
        // in L1: B's own rows ldb apart, a power of two more often than not,
        // fall into a few cache sets and evict one another every tile
        // (dx = d_pre W_x over T*B = 3200 rows, ldb 512 floats: 2x the time
        // of the packed panel on a Zen 3 core).
        if (cols % V == 0 && m_end - m_begin < kPackRows) {
          bp = b + k0 * g.ldb + col;
          ldp = g.ldb;
        }
      }
      if (bp == nullptr) {
        packed.resize(static_cast<size_t>(kKc * NW));
        copy_panel(b + k0 * g.ldb, g.ldb, kc, col, n_end, NW, packed.data());
        bp = packed.data();
      }
      if (vectors == 3) {
        for_row_tiles<kRows<3>>(m_begin, m_end,
                                [&]<int M>(int64_t m0) { tile.template operator()<M, 3>(m0, col, bp, ldp); });
      } else if (vectors == 2) {
        for_row_tiles<kRows<2>>(m_begin, m_end,
                                [&]<int M>(int64_t m0) { tile.template operator()<M, 2>(m0, col, bp, ldp); });
      } else {
        for_row_tiles<kRows<1>>(m_begin, m_end,
                                [&]<int M>(int64_t m0) { tile.template operator()<M, 1>(m0, col, bp, ldp); });
      }
    }
  }
}

// ---- packing of the step kernels' weights (kernels.h) -------------------------

#if defined(CPU_CAPABILITY_AVX512)
// dst[k * ld_dst + u] = src[u * ld_src + k] for a 16 x 16 block of floats,
// in registers: pairs, then quads of rows interleaved (unpack), then the
// 128-bit lanes of four rows gathered (shuffle_f32x4). at::vec's runtime-size
// transpose spends more on its bookkeeping than on the shuffles.
inline void transpose_16x16(const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
  __m512 r[16], t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld_src);
  // t[2i], t[2i + 1]: rows 2i, 2i + 1 interleaved by 32-bit element
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + j]: rows 4i .. 4i + 3 at columns j, j + 4, j + 8, j + 12 (one per lane)
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // column j + 4L: lane L of r[j], r[4 + j], r[8 + j], r[12 + j]
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512 lo01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44),
                 hi01 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE);
    const __m512 lo23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44),
                 hi23 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
    _mm512_storeu_ps(dst + j * ld_dst, _mm512_shuffle_f32x4(lo01, lo23, 0x88));
    _mm512_storeu_ps(dst + (j + 4) * ld_dst, _mm512_shuffle_f32x4(lo01, lo23, 0xDD));
    _mm512_storeu_ps(dst + (j + 8) * ld_dst, _mm512_shuffle_f32x4(hi01, hi23, 0x88));
    _mm512_storeu_ps(dst + (j + 12) * ld_dst, _mm512_shuffle_f32x4(hi01, hi23, 0xDD));
  }
}
#endif

// dst[k * ld_dst + u] = src[u * ld_src + k] for u < rows, k < cols.
template <typename T, typename src_t>
inline void transpose_into(const src_t* src, int64_t ld_src, int64_t rows, int64_t cols, T* dst,
                           int64_t ld_dst) {
  int64_t k0 = 0;
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    if (rows == 16) {
      for (; k0 + 16 <= cols; k0 += 16) {
        if constexpr (std::is_same_v<src_t, float>) {
          transpose_16x16(src + k0, ld_src, dst + k0 * ld_dst, ld_dst);
        } else {  // bfloat16 / half: widened block by block
          float block[16 * 16];
          for (int64_t u = 0; u < 16; ++u) store(block + u * 16, load(src + u * ld_src + k0));
          transpose_16x16(block, 16, dst + k0 * ld_dst, ld_dst);
        }
      }
    }
  }
#elif defined(CPU_CAPABILITY_AVX2)
  // 8 x 8 blocks of floats by at::vec's in-register transpose (the element
  // loop below took ~3% of a layer's forward at 16 x 32 x 128)
  if constexpr (std::is_same_v<T, float>) {
    if (rows == 8) {
      for (; k0 + 8 <= cols; k0 += 8) {
        if constexpr (std::is_same_v<src_t, float>) {
          at::vec::transpose_mxn<float, 8, 8>(src + k0, ld_src, dst + k0 * ld_dst, ld_dst);
        } else {  // bfloat16 / half: widened block by block
          float block[8 * 8];
          for (int64_t u = 0; u < 8; ++u) store(block + u * 8, load(src + u * ld_src + k0));
          at::vec::transpose_mxn<float, 8, 8>(block, 8, dst + k0 * ld_dst, ld_dst);
        }
      }
    }
  }
#endif
  for (int64_t u = 0; u < rows; ++u) {
    for (int64_t k = k0; k < cols; ++k) dst[k * ld_dst + u] = static_cast<T>(src[u * ld_src + k]);
  }
}

// The forward step's weights (kernels.h: PackForwardFn) for a cell of G
// gates: unit block jb at jb * (S + I) * G * width is [k][gate][width], k < S
// from W_hh, then k < I from W_ih (both transposed, zero past S's units).
template <typename scalar_t, int G>
void pack_forward(const void* w_hh_in, int64_t ld_hh, const void* w_ih_in, int64_t ld_ih, int64_t state,
                  int64_t features, void* out_in, int64_t begin, int64_t end) {
  using T = at::opmath_type<scalar_t>;
  constexpr int64_t V = Vec<T>::size();
  const auto* w_hh = static_cast<const scalar_t*>(w_hh_in);
  const auto* w_ih = static_cast<const scalar_t*>(w_ih_in);
  T* out = static_cast<T*>(out_in);
  const int64_t K = state + features;
  for (int64_t jb = begin; jb < end; ++jb) {
    const int64_t j0 = jb * V, units = std::min(V, state - j0);
    T* block = out + jb * K * G * V;
    if (units < V) std::fill(block, block + K * G * V, T(0));
    for (int64_t gate = 0; gate < G; ++gate) {
      transpose_into(w_hh + (gate * state + j0) * ld_hh, ld_hh, units, state, block + gate * V, G * V);
      if (features > 0) {
        transpose_into(w_ih + (gate * state + j0) * ld_ih, ld_ih, units, features,
                       block + state * G * V + gate * V, G * V);
      }
    }
  }
}

// W_hh (G S, S), rows ld apart, for the backward step (kernels.h:
// PackBackwardFn): unit blocks [begin, end) grouped into panels
// (unit_panel); a panel of n blocks starting at block jb is [k][n * width]
// for k < G S, W_hh's columns of the panel's units (zero past S), at
// jb * G S * width.
template <typename scalar_t, int G>
void pack_backward(const void* w, int64_t ld, int64_t state, void* out, int64_t begin, int64_t end) {
  using T = at::opmath_type<scalar_t>;
  constexpr int64_t V = Vec<T>::size();
  const int64_t panels = unit_panels(end - begin);
  for (int64_t q = 0; q < panels; ++q) {
    const auto [j0, j1] = unit_panel(begin, end, q);
    copy_panel(static_cast<const scalar_t*>(w), ld, G * state, j0 * V, state, (j1 - j0) * V,
               static_cast<T*>(out) + j0 * G * state * V);
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace lltm
