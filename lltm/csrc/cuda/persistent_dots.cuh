// The persistent kernels' dot products: the tensor-core MMA tiles (mma.sync,
// sm_80+) and the lane-group sums of the FMA dot.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

#include "seq_plan.h"

namespace lltm {
namespace cuda_detail {

// ------------------------------------------------------ the tensor-core dot
//
// One step's recurrent products of a CTA as warp-level MMAs (mma.sync,
// sm_80+), fp32 accumulators: D = A B with A = rows of W_h's slice in
// shared memory (row-major, `row` elements a row) and B = the exchanged
// rows (batch row n is B's column n, contiguous in k). K comes in
// `segments` segments: segment s of A starts `seg_rows` rows further down,
// of B `b_seg` elements further (backward: gate s of dzh_t); B's batch rows
// lie `b_stride` elements apart. A task is mstack 16-row tiles of A against
// all NT 8-row tiles of B over one k slice; warp w takes tasks w, w +
// warps, ... and writes tile[slice][m][n] (ld = 8 NT + 1 floats); readers
// add the slices in order, so no result depends on timing. Padding: A's and
// B's k past S is zero in shared memory; rows of A past the CTA's units and
// columns of B past its batch rows give D entries nobody reads.
//
// Fragments come from shared memory by ldmatrix (8 x 16-byte rows a
// matrix): one k step is 32 bytes of a row for every type (16 half
// elements, or 8 floats: a float fragment is the b16 matrices' words), so
// an A fragment is one ldmatrix.x4 and two B tiles one more. Rows 16-byte
// aligned, a row stride of 4 words mod 8: a matrix's 8 rows x 4 words fall
// on 32 banks.

constexpr int kKstepBytes = 32;  // one MMA k step of a shared-memory row
constexpr int kMaxKsplit = 8;    // k slices of a task: at most the CTA's warps (kMaxThreads / 32)

// The MMA dot's forms: the dtype's own (TF32 for float32, m16n8k16 for the
// half types), or Tf32x3 on float32 rows (the accurate mode's backward,
// precision.h):
// each operand split into hi = tf32(x) and lo = tf32(x - hi), and per k
// step lo_a hi_b + hi_a lo_b and hi_a hi_b as MMAs from a zero accumulator,
// added to the step's sum in float32 outside the tensor cores. Chained
// through the accumulator, mma.sync's truncated internal sums put a K =
// 1024 dot at 12.5x the FMA dot's error; from zero each k step, at 0.4-0.6x
// (docs/benchmarks-history.md, section 52). lo_a lo_b (2^-22 of a product)
// is left out. (Its errors still lean one way: in the LLTM's forward they
// add up in the cell state, 2.4x strict fp32's output error at T = 1000,
// section 53.)
struct Tf32x3 {};

// The element type of the rows a form reads.
template <typename Form>
struct MmaStorage {
  using type = Form;
};
template <>
struct MmaStorage<Tf32x3> {
  using type = float;
};
template <typename Form>
using mma_storage_t = typename MmaStorage<Form>::type;

__device__ __forceinline__ uint32_t to_tf32(uint32_t x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(x)));
  return r;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
#endif
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(address));
#endif
}

// cvt.rna.tf32.f32's rounding (to nearest, ties away from zero, 10 bits)
// in integer arithmetic, for 3xTF32's splits: the compiler merges these
// where one fragment meets several tiles, which it does not do for the
// asm. (A NaN whose payload lies in the 13 bits dropped becomes an
// infinity; its rest, x - hi, is NaN, so the product is NaN either way.)
__device__ __forceinline__ uint32_t tf32_hi(uint32_t x) { return (x + 0x1000u) & 0xffffe000u; }

// The rest of a float32 word past its TF32 rounding `hi`, rounded to TF32.
__device__ __forceinline__ uint32_t tf32_lo(uint32_t x, uint32_t hi) {
  return tf32_hi(__float_as_uint(__uint_as_float(x) - __uint_as_float(hi)));
}

// d += a b for one 16 x 8 tile: m16n8k8 TF32 for float (a, b rounded to
// TF32 by the loads) and Tf32x3 (a, b float32 words), m16n8k16 for half types.
template <typename Form>
__device__ __forceinline__ void mma_tile(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<Form, float>) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else if constexpr (std::is_same_v<Form, Tf32x3>) {
    uint32_t ah[4], al[4], bh[2], bl[2];
#pragma unroll
    for (int q = 0; q < 4; ++q) ah[q] = tf32_hi(a[q]), al[q] = tf32_lo(a[q], ah[q]);
#pragma unroll
    for (int q = 0; q < 2; ++q) bh[q] = tf32_hi(b[q]), bl[q] = tf32_lo(b[q], bh[q]);
    float small[4] = {0.f, 0.f, 0.f, 0.f}, big[4] = {0.f, 0.f, 0.f, 0.f};
    mma_tile<float>(small, al, bh);
    mma_tile<float>(small, ah, bl);
    mma_tile<float>(big, ah, bh);
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] += big[i] + small[i];
  } else if constexpr (std::is_same_v<Form, at::BFloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    static_assert(std::is_same_v<Form, at::Half>, "MMA for float (TF32, 3xTF32), bfloat16 and half only");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// The shared-memory layout of the products, in bytes, as FragmentWalk takes it.
struct MmaOperands {
  uint32_t a, b;  // shared addresses of A's row 0 and B's batch row 0
  int row_bytes, b_stride_bytes, seg_a_bytes, seg_b_bytes;
};

template <typename scalar_t>
__device__ __forceinline__ MmaOperands mma_operands(const scalar_t* a, const scalar_t* b, int seg_rows,
                                                    int b_stride, int b_seg, int row) {
  constexpr int e = sizeof(scalar_t);
  return {static_cast<uint32_t>(__cvta_generic_to_shared(a)),
          static_cast<uint32_t>(__cvta_generic_to_shared(b)),
          row * e,
          b_stride * e,
          seg_rows * row * e,
          b_seg * e};
}

// Where this lane's fragments of one k step lie in shared memory, and how
// they move from one k step to the next.
struct FragmentWalk {
  uint32_t a, b;       // this lane's ldmatrix row address for A's tile m0 and B's tile 0
  uint32_t a_tile;     // bytes from one A tile to the next (16 rows)
  uint32_t b_pair;     // bytes from one pair of B tiles to the next (16 rows)
  int a_wrap, b_wrap;  // bytes added past a segment's last k step
  int ksteps, kin;     // k steps per segment, and this walk's k step in its segment

  // ldmatrix.x4 of A: lanes 8i..8i+7 address matrix i, rows 0-7 / 8-15
  // (i odd) at k bytes 0 / 16 (i >= 2): registers a0..a3 of the MMA. B in
  // pairs of tiles: matrix i is tile i / 2, k bytes 16 (i % 2); .x2 (one
  // tile) reads lanes 0..15's addresses.
  __device__ static FragmentWalk make(const MmaOperands& o, int ksteps, int k, int m0) {
    const int seg = k / ksteps;
    return at(o, ksteps, seg, k - seg * ksteps, m0);
  }
  // The same at k step kin of segment seg (no division).
  __device__ static FragmentWalk at(const MmaOperands& o, int ksteps, int seg, int kin, int m0) {
    const int lane = threadIdx.x & 31, i = lane >> 3, r = lane & 7;
    FragmentWalk w;
    w.a = o.a + (m0 * 16 + r + (i & 1) * 8) * o.row_bytes + (i >> 1) * 16 + seg * o.seg_a_bytes +
          kin * kKstepBytes;
    w.b =
        o.b + ((i >> 1) * 8 + r) * o.b_stride_bytes + (i & 1) * 16 + seg * o.seg_b_bytes + kin * kKstepBytes;
    w.a_tile = 16 * o.row_bytes;
    w.b_pair = 16 * o.b_stride_bytes;
    w.a_wrap = o.seg_a_bytes - ksteps * kKstepBytes;
    w.b_wrap = o.seg_b_bytes - ksteps * kKstepBytes;
    w.ksteps = ksteps;
    w.kin = kin;
    return w;
  }

  __device__ __forceinline__ void next() {
    a += kKstepBytes;
    b += kKstepBytes;
    if (++kin == ksteps) kin = 0, a += a_wrap, b += b_wrap;
  }

  template <typename scalar_t>
  __device__ __forceinline__ void load_a(uint32_t (&af)[4], int m) const {
    ldmatrix_x4(af, a + m * a_tile);
    if constexpr (std::is_same_v<scalar_t, float>) {
#pragma unroll
      for (int q = 0; q < 4; ++q) af[q] = to_tf32(af[q]);
    }
  }

  template <typename scalar_t, int NT>
  __device__ __forceinline__ void load_b(uint32_t (&bf)[NT][2]) const {
    if constexpr (NT == 1) {
      ldmatrix_x2(bf[0], b);
    } else {
#pragma unroll
      for (int q = 0; q < NT / 2; ++q) {
        uint32_t r[4];
        ldmatrix_x4(r, b + q * b_pair);
        bf[2 * q][0] = r[0], bf[2 * q][1] = r[1], bf[2 * q + 1][0] = r[2], bf[2 * q + 1][1] = r[3];
      }
    }
    if constexpr (std::is_same_v<scalar_t, float>) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) bf[nt][0] = to_tf32(bf[nt][0]), bf[nt][1] = to_tf32(bf[nt][1]);
    }
  }
};

// Where task `task` of a plan's dot lies: its first tile, its k slice and
// that slice's k range (tasks of `ms` tiles, `mgroups` of them per slice,
// `total` k steps over `ksplit` slices).
struct TaskPlace {
  int m0, slice, k0, k1;
};

__device__ __forceinline__ TaskPlace task_place(int task, int mgroups, int ms, int total, int ksplit) {
  const int slice = task / mgroups;
  return {(task % mgroups) * ms, slice, slice * total / ksplit, (slice + 1) * total / ksplit};
}

// A warp's first task (task = warp), placed once per launch, with the
// segment and k step its slice starts at. Each step's dot takes it from
// here: the divisions that place a task (by the plan's runtime tile and
// slice counts) make a chain of ~100 dependent instructions, which at the
// start of every step's dot would sit on the step's critical path. Later
// tasks of a warp (plans with more tasks than warps) are placed as they come.
struct WarpTask {
  TaskPlace at;
  int seg, kin;
  int lo, hi;  // segment-major walks: the slice's k steps within every segment
};

// The k steps [lo, hi) of each segment that slice `slice` of a
// segment-major walk takes.
__device__ __forceinline__ int slice_start(int slice, int ksteps, int ksplit) {
  return slice * ksteps / ksplit;
}

// What a dot does before the first k step of a segment: nothing, or (a
// kernel whose exchange reloads its gate blocks one by one) wait for that
// block.
struct NoWait {
  __device__ void operator()(int /*segment*/) const {}
};

// The tiles a task of mma_dot_nt takes with `mstack` and `ntiles` (it
// falls back to one where mma_stack_max(ntiles) allows fewer).
__device__ __forceinline__ int task_tiles(int mstack, int ntiles) {
  return mstack >= 2 && mstack <= 4 && mstack <= mma_stack_max(ntiles) ? mstack : 1;
}

// The k steps (32 bytes each) of a row of `state` elements (of form Form's rows).
template <typename Form>
__device__ __forceinline__ int mma_ksteps(int state) {
  constexpr int kStep = kKstepBytes / static_cast<int>(sizeof(mma_storage_t<Form>));
  return (state + kStep - 1) / kStep;
}

template <typename scalar_t>
__device__ __forceinline__ WarpTask warp_task(int segments, int state, int mtiles, int mstack, int ntiles,
                                              int ksplit) {
  const int ksteps = mma_ksteps<scalar_t>(state), total = segments * ksteps;
  const int ms = task_tiles(mstack, ntiles);
  WarpTask w;
  w.at = task_place(threadIdx.x >> 5, mtiles / ms, ms, total, ksplit);
  w.seg = w.at.k0 / ksteps;
  w.kin = w.at.k0 - w.seg * ksteps;
  w.lo = slice_start(w.at.slice, ksteps, ksplit);
  w.hi = slice_start(w.at.slice + 1, ksteps, ksplit);
  return w;
}

// Task `task` of this warp and its fragment walk: the first from `first`,
// a later one placed here.
__device__ __forceinline__ TaskPlace place_task(const WarpTask& first, int task, int mgroups, int ms,
                                                int total, int ksplit, const MmaOperands& o, int ksteps,
                                                FragmentWalk& walk) {
  if (task == (threadIdx.x >> 5)) {
    walk = FragmentWalk::at(o, ksteps, first.seg, first.kin, first.at.m0);
    return first.at;
  }
  const TaskPlace at = task_place(task, mgroups, ms, total, ksplit);
  walk = FragmentWalk::make(o, ksteps, at.k0, at.m0);
  return at;
}

// Runs a task's k steps through range(from, to), `walk` placed at `from`:
// one range of the segments laid end to end (place_task's), or with
// kSegMajor the slice's share [lo, hi) of each segment in turn,
// before(segment) first (`mine`: the warp's first task, whose share
// warp_task placed).
template <bool kSegMajor, typename Range, typename Before>
__device__ __forceinline__ void walk_task(const MmaOperands& o, int segments, int ksteps, int ksplit,
                                          const WarpTask& first, bool mine, const TaskPlace& at,
                                          FragmentWalk& walk, const Range& range, const Before& before) {
  if constexpr (kSegMajor) {
    const int lo = mine ? first.lo : slice_start(at.slice, ksteps, ksplit);
    const int hi = mine ? first.hi : slice_start(at.slice + 1, ksteps, ksplit);
    for (int seg = 0; seg < segments; ++seg) {
      before(seg);
      walk = FragmentWalk::at(o, ksteps, seg, lo, at.m0);
      range(lo, hi);
    }
  } else {
    range(at.k0, at.k1);
  }
}

// D fragment: rows g and g + 8, columns 2t and 2t + 1 of each B tile.
template <int NT>
__device__ __forceinline__ void store_tile(float* tile, int slice, int mtiles, int m,
                                           const float (&acc)[NT][4]) {
  constexpr int ld = NT * 8 + 1;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float* out = tile + (slice * mtiles * 16 + m * 16 + g) * ld + 2 * t;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    out[nt * 8] = acc[nt][0];
    out[nt * 8 + 1] = acc[nt][1];
    out[8 * ld + nt * 8] = acc[nt][2];
    out[8 * ld + nt * 8 + 1] = acc[nt][3];
  }
}

// Tasks of one tile (mstack = 1). The k steps of a task go round kSets sets
// of accumulators, so kSets MMA chains are in flight (one chain would wait
// out every MMA's latency and its fragments' loads): four where B is narrow
// (the small-batch splits, whose long k slices are latency-bound), two
// where NT tiles already give the warp independent MMAs; the sets are added
// at the end in a fixed order. 3xTF32 takes half as many: its three MMAs a
// tile do not wait for the accumulator (only its float32 adds do), and its
// split fragments need the registers.
//
// kSegMajor: a task's slice is its share of every segment (k steps [lo, hi)
// of each), walked segment by segment with before(segment) first, instead
// of one range of the segments laid end to end: every warp then starts on
// the first segment, and the last is needed only at the end of its walk.
template <typename scalar_t, int NT, bool kSegMajor, typename Before>
__device__ __forceinline__ void mma_dot_tiles(const MmaOperands& o, int segments, int ksteps, int mtiles,
                                              int ksplit, const WarpTask& first, float* tile,
                                              const Before& before) {
  constexpr int kSets = (NT <= 2 ? 4 : 2) / (std::is_same_v<scalar_t, Tf32x3> ? 2 : 1);
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int total = segments * ksteps;
  for (int task = warp; task < mtiles * ksplit; task += warps) {
    FragmentWalk walk;
    const TaskPlace at = place_task(first, task, mtiles, 1, total, ksplit, o, ksteps, walk);
    float acc[kSets][NT][4];
#pragma unroll
    for (int h = 0; h < kSets; ++h) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[h][nt][0] = acc[h][nt][1] = acc[h][nt][2] = acc[h][nt][3] = 0.f;
    }
    auto step = [&](float (&d)[NT][4]) {
      uint32_t af[4], bf[NT][2];
      walk.load_a<scalar_t>(af, 0);
      walk.load_b<scalar_t, NT>(bf);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_tile<scalar_t>(d[nt], af, bf[nt]);
      walk.next();
    };
    auto range = [&](int from, int to) {  // k steps from..to of the walk, round the sets
      int k = from;
      for (; k + kSets <= to; k += kSets) {
#pragma unroll
        for (int h = 0; h < kSets; ++h) step(acc[h]);
      }
#pragma unroll
      for (int h = 0; h < kSets - 1; ++h) {
        if (k + h < to) step(acc[h]);
      }
    };
    walk_task<kSegMajor>(o, segments, ksteps, ksplit, first, task == warp, at, walk, range, before);
#pragma unroll
    for (int h = 1; h < kSets; ++h) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[0][nt][i] += acc[h][nt][i];
      }
    }
    store_tile<NT>(tile, at.slice, mtiles, at.m0, acc[0]);
  }
}

// Tasks of MS tiles (mstack = MS, a divisor of mtiles): B's fragments are
// loaded once per k step for all of them, and the MS NT MMAs of a k step
// are independent chains. Where A has a few tiles and B one or two (the
// forward of a small batch) every warp gets a k slice of all the tiles, and
// B is read from shared memory once per slice, not once per tile.
// kSegMajor and before: as mma_dot_tiles'.
template <typename scalar_t, int NT, int MS, bool kSegMajor, typename Before>
__device__ __forceinline__ void mma_dot_stacked(const MmaOperands& o, int segments, int ksteps, int mtiles,
                                                int ksplit, const WarpTask& first, float* tile,
                                                const Before& before) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int total = segments * ksteps;
  const int mgroups = mtiles / MS;
  // Two k steps a pass, one for 3xTF32 (its splits would hold twice the
  // fragments' registers: spills at four rows a thread group).
  constexpr int kUnroll = std::is_same_v<scalar_t, Tf32x3> ? 1 : 2;
  for (int task = warp; task < mgroups * ksplit; task += warps) {
    FragmentWalk walk;
    const TaskPlace at = place_task(first, task, mgroups, MS, total, ksplit, o, ksteps, walk);
    float acc[MS][NT][4];
#pragma unroll
    for (int m = 0; m < MS; ++m) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[m][nt][0] = acc[m][nt][1] = acc[m][nt][2] = acc[m][nt][3] = 0.f;
    }
    auto range = [&](int from, int to) {
#pragma unroll(kUnroll)
      for (int k = from; k < to; ++k) {
        uint32_t af[MS][4], bf[NT][2];
        walk.load_b<scalar_t, NT>(bf);
#pragma unroll
        for (int m = 0; m < MS; ++m) walk.load_a<scalar_t>(af[m], m);
#pragma unroll
        for (int m = 0; m < MS; ++m) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_tile<scalar_t>(acc[m][nt], af[m], bf[nt]);
        }
        walk.next();
      }
    };
    walk_task<kSegMajor>(o, segments, ksteps, ksplit, first, task == warp, at, walk, range, before);
#pragma unroll
    for (int m = 0; m < MS; ++m) store_tile<NT>(tile, at.slice, mtiles, at.m0 + m, acc[m]);
  }
}

// The tasks with NT tiles of B: mstack tiles of A each where mma_stack_max(NT)
// allows it (2 to 4), else one (a task of one tile covers every tile of any
// plan's [ksplit][mtiles] layout, only more slowly).
template <typename scalar_t, int NT, bool kSegMajor, typename Before>
__device__ __forceinline__ void mma_dot_nt(const MmaOperands& o, int segments, int ksteps, int mtiles,
                                           int mstack, int ksplit, const WarpTask& first, float* tile,
                                           const Before& before) {
  // task_tiles(mstack, NT) in branches (warp_task placed `first` by it).
  if constexpr (mma_stack_max(NT) >= 2) {
    if (mstack == 2)
      return mma_dot_stacked<scalar_t, NT, 2, kSegMajor>(o, segments, ksteps, mtiles, ksplit, first, tile,
                                                         before);
  }
  if constexpr (mma_stack_max(NT) >= 3) {
    if (mstack == 3)
      return mma_dot_stacked<scalar_t, NT, 3, kSegMajor>(o, segments, ksteps, mtiles, ksplit, first, tile,
                                                         before);
  }
  if constexpr (mma_stack_max(NT) >= 4) {
    if (mstack == 4)
      return mma_dot_stacked<scalar_t, NT, 4, kSegMajor>(o, segments, ksteps, mtiles, ksplit, first, tile,
                                                         before);
  }
  mma_dot_tiles<scalar_t, NT, kSegMajor>(o, segments, ksteps, mtiles, ksplit, first, tile, before);
}

// One step's products of the CTA, as the plan splits them (seq_plan.h's
// Split: ntiles tiles of B, tasks of mstack tiles of A), `first` this
// warp's warp_task of the same plan. A k step is 32 bytes of a row of S.
// (Branches, not a switch: its jump table is a constant-bank load on the
// step's critical path.) kSegMajor / before: mma_dot_tiles'.
template <typename scalar_t, bool kSegMajor = false, typename Before = NoWait>
__device__ __forceinline__ void mma_dot(const mma_storage_t<scalar_t>* a, const mma_storage_t<scalar_t>* b,
                                        int segments, int seg_rows, int b_stride, int b_seg, int row,
                                        int state, int mtiles, int mstack, int ntiles, int ksplit,
                                        const WarpTask& first, float* tile, const Before& before = Before{}) {
  const int ksteps = mma_ksteps<scalar_t>(state);
  const MmaOperands o = mma_operands(a, b, seg_rows, b_stride, b_seg, row);
  if (ntiles == 1) {
    mma_dot_nt<scalar_t, 1, kSegMajor>(o, segments, ksteps, mtiles, mstack, ksplit, first, tile, before);
  } else if (ntiles == 2) {
    mma_dot_nt<scalar_t, 2, kSegMajor>(o, segments, ksteps, mtiles, mstack, ksplit, first, tile, before);
  } else if (ntiles == 4) {
    mma_dot_nt<scalar_t, 4, kSegMajor>(o, segments, ksteps, mtiles, mstack, ksplit, first, tile, before);
  } else {
    mma_dot_nt<scalar_t, 8, kSegMajor>(o, segments, ksteps, mtiles, mstack, ksplit, first, tile, before);
  }
}

// ---------------------------------------------------- A held in registers
//
// The dot with one B tile (a chunk of at most 8 batch rows) where every
// warp has at most one task (seq_plan.h; the planner's Split::w_regs with
// the MMA dot): each warp loads the A fragments of its task's first k steps
// once per launch (hold_a), and a step reads from shared memory only B and
// the A fragments of the k steps past them, not the CTA's whole slice of
// W_hh (74 KB a step at FlashRNN's point, all of it held, where the port's
// 128 bytes a cycle bound the dot). The forward's products are one segment
// (G = 1); the backward's are G gate segments, walked segment by segment
// (mma_dot_tiles' kSegMajor: k steps [lo, hi) of each, before(segment)
// first, so every warp starts on the first gate block of the reload), and
// a warp holds the first KS = mma_reg_fragments(G, kPart) / (MS G) k steps
// of its share of every segment (kPart: the part-held kernels). The MMAs
// and their order are those of mma_dot_tiles (one tile a task: four sets
// round the k steps, restarting at each segment) and mma_dot_stacked (MS
// tiles): the same results bit for bit.
template <int G, bool kPart>
using HeldA = uint32_t[mma_reg_fragments(G, kPart)][4];

// The number of tasks of the held dot's plan (one B tile).
__device__ __forceinline__ int held_tasks(int mtiles, int mstack, int ksplit) {
  return mtiles / task_tiles(mstack, 1) * ksplit;
}

// The k steps of each segment's share a task of MS tiles holds.
template <int MS, int G, bool kPart>
constexpr int held_steps() {
  return mma_reg_fragments(G, kPart) / (MS * G);
}

// Fragment (segment, tile m, k step kk of the segment's share).
template <int MS, int G, bool kPart>
constexpr int held_index(int seg, int m, int kk) {
  return (seg * MS + m) * held_steps<MS, G, kPart>() + kk;
}

template <typename scalar_t, int MS, int G, bool kPart>
__device__ __forceinline__ void hold_a_ms(const MmaOperands& o, int ksteps, const WarpTask& first,
                                          HeldA<G, kPart>& held) {
  static_assert(held_steps<MS, G, kPart>() >= 1, "a task of MS tiles holds no k step of each of G segments");
  constexpr int KS = held_steps<MS, G, kPart>();
  const int nk = first.hi - first.lo;
#pragma unroll
  for (int seg = 0; seg < G; ++seg) {
    FragmentWalk walk = FragmentWalk::at(o, ksteps, seg, first.lo, first.at.m0);
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      if (kk >= nk) break;
#pragma unroll
      for (int m = 0; m < MS; ++m) walk.load_a<scalar_t>(held[held_index<MS, G, kPart>(seg, m, kk)], m);
      walk.next();
    }
  }
}

// Calls run(std::integral_constant<int, n>) where n is in [I, N] and says
// whether it did: a run of n k steps, unrolled, with no exit test between
// them, chosen once by a few branches.
template <int N, int I = 1, typename Run>
__device__ __forceinline__ bool run_of(int n, const Run& run) {
  if constexpr (I <= N) {
    if (n == I) {
      run(std::integral_constant<int, I>{});
      return true;
    }
    return run_of<N, I + 1>(n, run);
  }
  return false;
}

// kPart: the task may have k steps past the held ones (a kernel of its
// own: with that code in its path, the all-held dot ran 3% slower at
// FlashRNN's point, even where every k step was held).
template <typename scalar_t, int MS, int G, bool kPart, typename Before>
__device__ __forceinline__ void mma_dot_held_ms(const MmaOperands& o, int ksteps, int mtiles,
                                                const WarpTask& first, const HeldA<G, kPart>& held,
                                                float* tile, const Before& before) {
  constexpr int KS = held_steps<MS, G, kPart>();
  constexpr int kSets = MS == 1 ? 4 : 1;
  const int nk = first.hi - first.lo;
  float acc[kSets][MS][1][4];  // [set][tile][the one B tile][fragment]
#pragma unroll
  for (int h = 0; h < kSets; ++h) {
#pragma unroll
    for (int m = 0; m < MS; ++m) acc[h][m][0][0] = acc[h][m][0][1] = acc[h][m][0][2] = acc[h][m][0][3] = 0.f;
  }
#pragma unroll
  for (int seg = 0; seg < G; ++seg) {
    before(seg);
    FragmentWalk walk = FragmentWalk::at(o, ksteps, seg, first.lo, first.at.m0);
    auto held_step = [&](int kk) {  // kk a constant once unrolled
      uint32_t bf[1][2];
      walk.load_b<scalar_t, 1>(bf);
#pragma unroll
      for (int m = 0; m < MS; ++m)
        mma_tile<scalar_t>(acc[kk % kSets][m][0], held[held_index<MS, G, kPart>(seg, m, kk)], bf[0]);
      walk.next();
    };
    auto held_run = [&](auto n) {
#pragma unroll
      for (int kk = 0; kk < decltype(n)::value; ++kk) held_step(kk);
    };
    if (nk == KS) {
      // Every held k step (the planner's usual split): no exit test between
      // them, so the B loads of all of them issue ahead of their MMAs. With
      // the test each step's loads waited for it and the MMAs for the loads
      // (a probe's one-tile backward step at FlashRNN's point: products 950
      // against 488 cycles; docs/benchmarks-history.md, section 59).
      held_run(std::integral_constant<int, KS>{});
    } else if (!kPart || nk < KS) {
      if constexpr (mma_reg_fragments(G, kPart) > kMmaRegFragments) {
        // Fewer k steps than held, in the kernels that hold more than
        // kMmaRegFragments (the LSTM's all-held backward: 6 of each gate
        // segment): a run of nk, so the shares that 18 held exactly (4 a
        // segment) keep their loads ahead of their MMAs. The other kernels
        // keep the loop, their shares being those 18 were sized for: with
        // these runs in its kernels too, the LLTM's backward at FlashRNN's
        // point read 2,901-2,915 µs against 2,816 without them, though they
        // never ran there (docs/benchmarks-history.md, section 62).
        run_of<KS - 1>(nk, held_run);
      } else {
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
          if (kk >= nk) break;
          held_step(kk);
        }
      }
    } else if constexpr (kPart) {
      held_run(std::integral_constant<int, KS>{});
      // The k steps past the held ones, A from shared memory; k step kk still
      // goes to set kk % kSets, which is (KS + h) % kSets here. Fewer than
      // kSets of them (the LSTM's backward at S = 896 in groups of 56: 3
      // past the 4 held of each gate segment) run as a run of fixed length,
      // so no k step's loads wait for an exit test of its own; more keep the
      // loop (unrolled runs of kSets took ptxas to 255 registers and spills).
      auto smem_step = [&](int h) {  // h a constant once unrolled
        uint32_t af[MS][4], bf[1][2];
        walk.load_b<scalar_t, 1>(bf);
#pragma unroll
        for (int m = 0; m < MS; ++m) walk.load_a<scalar_t>(af[m], m);
#pragma unroll
        for (int m = 0; m < MS; ++m) mma_tile<scalar_t>(acc[(KS + h) % kSets][m][0], af[m], bf[0]);
        walk.next();
      };
      auto smem_run = [&](auto n) {
#pragma unroll
        for (int h = 0; h < decltype(n)::value; ++h) smem_step(h);
      };
      if (!run_of<kSets - 1>(nk - KS, smem_run)) {
        for (int kk = KS; kk < nk; kk += kSets) {
#pragma unroll
          for (int h = 0; h < kSets; ++h) {
            if (kk + h >= nk) break;
            smem_step(h);
          }
        }
      }
    }
  }
#pragma unroll
  for (int h = 1; h < kSets; ++h) {
#pragma unroll
    for (int m = 0; m < MS; ++m) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][m][0][i] += acc[h][m][0][i];
    }
  }
#pragma unroll
  for (int m = 0; m < MS; ++m) store_tile<1>(tile, first.at.slice, mtiles, first.at.m0 + m, acc[0][m]);
}

// Whether this warp has a task of the held dot: the warps past the plan's
// tasks hold nothing and skip the dot (known once per launch).
__device__ __forceinline__ bool holds_task(int mtiles, int mstack, int ksplit) {
  return (threadIdx.x >> 5) < held_tasks(mtiles, mstack, ksplit);
}

// Loads this warp's A fragments of W_hh's slice `a` once per launch: G
// segments of `seg_rows` rows (forward: one), rows `row` elements apart,
// k = state; only warps that hold a task call it. Task tiles with no k step
// of each segment to hold are never planned (seq_plan.cpp's mma_holds_a).
template <typename scalar_t, int G, bool kPart>
__device__ __forceinline__ void hold_a(const scalar_t* a, int seg_rows, int row, int state, int mstack,
                                       const WarpTask& first, HeldA<G, kPart>& held) {
  const int ksteps = mma_ksteps<scalar_t>(state);
  const MmaOperands o = mma_operands(a, a, seg_rows, row, 0, row);
  const int ms = task_tiles(mstack, 1);
  if constexpr (held_steps<4, G, kPart>() >= 1) {
    if (ms == 4) return hold_a_ms<scalar_t, 4, G, kPart>(o, ksteps, first, held);
  }
  if constexpr (held_steps<3, G, kPart>() >= 1) {
    if (ms == 3) return hold_a_ms<scalar_t, 3, G, kPart>(o, ksteps, first, held);
  }
  if constexpr (held_steps<2, G, kPart>() >= 1) {
    if (ms == 2) return hold_a_ms<scalar_t, 2, G, kPart>(o, ksteps, first, held);
  }
  hold_a_ms<scalar_t, 1, G, kPart>(o, ksteps, first, held);
}

// One step's products of the held fragments and of W_hh's slice `a` past
// them against B = the exchanged rows `b` (G blocks `b_seg` elements apart,
// rows `row` elements apart), into `tile` as mma_dot writes it; only warps
// that hold a task call it. (Branches, not a switch: see mma_dot.)
template <typename scalar_t, int G, bool kPart, typename Before = NoWait>
__device__ __forceinline__ void mma_dot_held(const scalar_t* a, const scalar_t* b, int seg_rows, int b_seg,
                                             int row, int state, int mtiles, int mstack,
                                             const WarpTask& first, const HeldA<G, kPart>& held, float* tile,
                                             const Before& before = Before{}) {
  const int ksteps = mma_ksteps<scalar_t>(state);
  const MmaOperands o = mma_operands(a, b, seg_rows, row, b_seg, row);
  const int ms = task_tiles(mstack, 1);
  if constexpr (held_steps<3, G, kPart>() >= 1) {
    if (ms == 3) return mma_dot_held_ms<scalar_t, 3, G, kPart>(o, ksteps, mtiles, first, held, tile, before);
  }
  if constexpr (held_steps<2, G, kPart>() >= 1) {
    if (ms == 2) return mma_dot_held_ms<scalar_t, 2, G, kPart>(o, ksteps, mtiles, first, held, tile, before);
  }
  if constexpr (held_steps<4, G, kPart>() >= 1) {
    if (ms == 4) return mma_dot_held_ms<scalar_t, 4, G, kPart>(o, ksteps, mtiles, first, held, tile, before);
  }
  mma_dot_held_ms<scalar_t, 1, G, kPart>(o, ksteps, mtiles, first, held, tile, before);
}

// D[m][n] of mma_dot: its k slices added in order. Every slice's value is
// loaded before the first add (a chain of dependent loads would cost a
// shared-memory round trip per slice).
__device__ __forceinline__ float tile_sum(const float* tile, int m, int n, int mtiles, int ntiles,
                                          int ksplit) {
  const int ld = ntiles * 8 + 1, slice = mtiles * 16 * ld;
  const float* p = tile + m * ld + n;
  float v[kMaxKsplit];
#pragma unroll
  for (int s = 0; s < kMaxKsplit; ++s) v[s] = s < ksplit ? p[s * slice] : 0.f;
  float sum = v[0];
#pragma unroll
  for (int s = 1; s < kMaxKsplit; ++s) sum += v[s];
  return sum;
}

// The sums over each KS-lane group of a warp (KS divides 32: the xor
// offsets stay inside a group). Every lane of the warp takes part: with a
// full mask the shuffles need no convergence checks.
template <int N, typename acc_t>
__device__ __forceinline__ void group_sum(acc_t (&v)[N], int ks) {
  for (int offset = ks >> 1; offset > 0; offset >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], offset);
  }
}

}  // namespace cuda_detail
}  // namespace lltm
