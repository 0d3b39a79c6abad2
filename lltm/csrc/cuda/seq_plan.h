// The plan of a fused CUDA sequence op's time loop: which implementation runs
// it, with which work split, chosen by a written cost model (whose few best
// plans the measuring planner, seq_tune.h, then times once). Host code only:
// the kernels (persistent_kernels.cuh, rnn_pointwise.cuh) know
// nothing of it, and it knows of the kernels only what the caller tells it
// (which have a body for the device, how many CTAs of a launch shape fit).
//
//   cluster  a persistent kernel over thread-block clusters (sm_90+): a
//            cluster of C CTAs owns a chunk of batch rows, each CTA a slice
//            of the state units with its rows of W_h in shared memory for
//            all T steps; h_t (backward: d_pre_t) goes to every CTA of the
//            cluster through distributed shared memory, each store counted
//            on the receiver's mbarrier (a CTA waits only for its own).
//   grid     the same split over the whole GPU without clusters (a
//            cooperative launch, sm_80+): a group of U CTAs owns a chunk of
//            batch rows; h_t goes through L2 (a global buffer), and the
//            group meets at one arrival counter per step.
//   loop     per step one cuBLAS GEMM and one pointwise kernel, replayed
//            from a CUDA graph (seq_graph.h) where the same call repeats.
//
// A persistent launch is one wave: every CTA of it is resident for the whole
// loop (the group barrier needs it). Where the batch needs more chunks than
// one wave holds, chunks run in waves, one launch each after the other (the
// model counts waves x T steps); where W_h does not fit in the shared memory
// of one group, only the loop remains.
//
// The persistent kernels compute the recurrent products one of two ways
// (the dot of a split): FMA chains on the CUDA cores, each thread group
// reducing its k range with shuffles (every dtype; float32 stays strict
// fp32), with W_h's slice in registers (each lane holds its k chunks of its
// unit's rows for the whole loop, where they fit: at most kRegChunks chunks
// a lane) or in shared memory, or warp-level tensor-core MMA (mma.sync, sm_80+) into a small
// shared-memory tile: bf16 / fp16 inputs, and float32 on TF32 where lltm's
// mode allows it (precision.h: torch's TF32 switch, or
// lltm.set_fp32_precision "tf32"), or as 3xTF32 in the backward of the
// "accurate" mode (persistent_dots.cuh's Tf32x3: three MMAs a k step from a
// zero accumulator, added in float32; about the FMA dot's accuracy); accumulation is
// float in every case; in the forward of a small chunk in half types each
// warp holds its A fragments in registers (all, or the first k steps:
// mma_reg_fragments).
//
// LLTM_SEQ_PATH restricts the choice (tests, benchmarks, and the path a GPU
// without clusters takes: "grid,loop"): a comma-separated subset of
// cluster, grid, loop; a single name forces that path and is an error where
// it cannot run. LLTM_SEQ_CLUSTER=N (1..16) fixes the cluster size,
// LLTM_SEQ_GROUP=N the CTAs per grid group, and LLTM_SEQ_DOT the persistent
// kernels' dot: fma (either place of W_h), fma-regs, fma-smem, mma (A in
// registers where it fits) or mma-smem (A read from shared memory every step).
// LLTM_SEQ_MULTICAST=M (1, 2, 4 or 8) sets the clusters of CTAs that share
// each reload of the grid path's MMA kernels (sm_90; 1: none; unset: the
// planner's choice).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lltm {
namespace cuda_detail {

enum class SeqPath { kCluster, kGrid, kLoop };

// Batch rows of one chunk with the MMA dot: 8 tiles of 8 rows, the
// kernels' accumulators per warp.
constexpr int kMaxMmaRows = 64;

// 16-byte chunks of W_hh's rows one lane of the FMA dot holds in registers:
// G gates x 4 words x reg_chunks(G) registers, 96 at most, the kernels'
// compile-time bound (8 chunks for 3 gates, 6 for 4).
// The planner offers W_h in registers for float32 only: half types would
// widen twice as many floats into registers, and float64 (the tests'
// dtype) gains little from it for another set of kernels to build.
constexpr int reg_chunks(int gates) { return 24 / gates; }

// A fragments (4 words a lane each) of W_h's slice one warp of the MMA dot
// holds in registers for the whole loop (Split::w_regs with the MMA dot: a
// chunk of at most 8 batch rows in half types, one task a warp; its first
// ones where it has more, w_part; the backward's the first of each gate
// segment): 18, 72 registers, all of FlashRNN's point's share (forward 3
// tiles x 6 k steps at S = 768, groups of 64 CTAs; the LLTM's and GRU's
// backward 1 tile x 3 segments x 6 k steps). A backward of four gate
// segments (the LSTM's) holds 24 where that is all of its share (4 x 6 at
// FlashRNN's point): with 18 it read 2 of each segment's 6 k steps from
// shared memory every step. Its part-held kernels keep 18: their k steps
// past the held ones need the registers (docs/benchmarks-history.md,
// sections 49 and 62).
constexpr int kMmaRegFragments = 18;
constexpr int mma_reg_fragments(int segments, bool part) {
  return segments == 4 && !part ? 24 : kMmaRegFragments;
}

// Bytes at the start of a persistent kernel's dynamic shared memory that
// hold the cluster exchange's two mbarriers (one per buffer parity), or the
// grid exchange's kReloadBars (its bulk reload, sm_90: one per gate block
// of the backward's rows, so that the dot starts on the first gates while
// the last still travel); the split's smem counts them.
constexpr int kReloadBars = 4;
constexpr int kHeaderBytes = 8 * kReloadBars;

const char* path_name(SeqPath path);

// The work split of one persistent launch (same fields for both kernels and
// both directions). Thread group q (`ks` lanes) of a CTA owns one unit and
// `per_thread` batch rows for the whole loop and keeps their state in
// registers; its lanes split the k range of the dot products.
struct Split {
  int group = 0;        // CTAs per batch chunk (cluster size or grid group)
  int units = 0;        // J: state units per CTA (the last CTA may own fewer)
  int rows = 0;         // batch rows per chunk (the last chunk may own fewer)
  int rows_padded = 0;  // rows rounded up to a multiple of per_thread
  int chunks = 0;       // batch chunks
  int per_wave = 0;     // chunks per launch: a launch has group * per_wave CTAs,
  int waves = 0;        //   all resident at once; waves launches run in turn
  int per_thread = 0;   // NB: batch rows of one thread group (1, 2 or 4)
  int ks = 0;           // lanes splitting one dot product (1..32)
  int threads = 0;      // per CTA
  int row = 0;          // padded length (elements) of a shared-memory row of S
  size_t smem = 0;      // dynamic shared memory per CTA, bytes
  // The dot: FMA, or tensor-core MMA. MMA tiles: A = W_h's rows of the
  // CTA's units (forward, 3 J rows) or its columns (backward, J rows, three
  // k segments), 16 rows a tile; B = the exchanged rows, 8 batch rows a tile.
  bool mma = false;
  // W_h's slice in registers for the whole loop: the FMA dot's chunks
  // (w_rows = 0), or each warp's A fragments of the MMA dot (loaded once from
  // the staged rows; mma_reg_fragments), not read from shared memory each step
  bool w_regs = false;
  bool w_part = false;  // MMA: only a task's first k steps held, the rest read from shared memory
  int mtiles = 0;       // 16-row tiles of A
  int mstack = 1;       // tiles of A one warp's task takes (sharing its B fragments)
  int ksplit = 0;       // k slices of each task's tiles (partial sums added in order)
  int w_rows = 0;       // rows of W_h's slice in shared memory (past 3 J: read by the last tile, unused)
  // Grid with the MMA dot, sm_90: CTAs of a cluster that share each step's
  // reload from L2 by one multicast copy (1: each CTA copies its own; a
  // divisor of group).
  int multicast = 1;
};

// Where a split keeps W_h (the kernels' kRegW): 0 shared memory, 1
// registers, 2 the MMA dot's first k steps of each task in registers.
inline int w_place(const Split& s) { return !s.w_regs ? 0 : s.w_part ? 2 : 1; }

// Whether a split that holds the MMA dot's A fragments (w_place 1 or 2 with
// the MMA dot) is one the held kernels can run (persistent_dots.cuh's
// hold_a / mma_dot_held): one B tile, one row a thread group, at most one
// task a warp, a k step of each of the `gates` segments held (backward)
// and, where all of it is held, no task with more k steps than its
// fragments (the all-held kernel never reads A from shared memory, so any
// step past them would be left out). The planner makes no other; the
// launch checks it (against a plan from elsewhere: a trial, a cache).
bool held_split_fits(const Split& s, bool backward, int gates, int64_t state, int elem);

// The most tiles of A one MMA task takes with `ntiles` tiles of B (the
// task's accumulators are 4 mstack ntiles floats a lane).
constexpr int mma_stack_max(int ntiles) { return ntiles <= 2 ? 4 : ntiles == 4 ? 2 : 1; }

struct Plan {
  SeqPath path = SeqPath::kLoop;
  Split split;          // persistent paths only
  double cost_us = 0;   // the model's time for the whole time loop
  std::string why_not;  // set on candidates that cannot run
};

// The kinds of time loop whose costs the model fits apart: the step loop,
// and the persistent kernels by path (cluster, grid) and dot (MMA; FMA with
// W_h's slice in registers or in shared memory). The measuring planner times
// the cheapest of each kind (seq_tune.h); the plan report lists them.
enum class PlanKind {
  kLoop,
  kClusterMma,
  kClusterFmaRegs,
  kClusterFmaSmem,
  kGridMma,
  kGridFmaRegs,
  kGridFmaSmem
};
constexpr int kPlanKinds = 7;
inline PlanKind plan_kind(const Plan& p) {
  if (p.path == SeqPath::kLoop) return PlanKind::kLoop;
  const int dot = p.split.mma ? 0 : p.split.w_regs ? 1 : 2;
  return static_cast<PlanKind>((p.path == SeqPath::kCluster ? 1 : 4) + dot);
}
// A persistent split's dot as plan labels and kind names write it: "mma",
// "fma-regs" or "fma-smem".
inline const char* dot_label(const Split& s) { return s.mma ? "mma" : s.w_regs ? "fma-regs" : "fma-smem"; }
// The kind of `p` as the plan report names it: "loop", or path and dot
// ("cluster-mma", "grid-fma-regs", ...).
std::string plan_kind_name(const Plan& p);

// The problem: one direction of one layer.
struct Problem {
  const char* cell = "lltm";  // the cell (cells/registry.h)
  int gates = 3;              // its G: W_hh has G S rows
  bool backward = false;
  int64_t steps = 0, batch = 0, state = 0;
  int elem = 4;  // bytes per element of the tensor dtype
  bool is_double = false;
  bool tensor_cores = false;  // cuBLAS may use tensor cores (half types, or TF32 allowed in this pass)
  bool tf32x3 = false;        // float32's MMA dot as 3xTF32 (the accurate mode's backward; precision.h)
  // The persistent kernels may use their tensor-core dot: half types, and
  // float32 where TF32 is allowed or as 3xTF32.
  bool mma_dot() const { return !is_double && (elem == 2 || tensor_cores || tf32x3); }
};

// What the planner needs of the device and the build.
struct DeviceLimits {
  int sms = 0;
  size_t smem_per_block = 0;  // opt-in maximum of dynamic shared memory
  double clock_ghz = 1.5;
  bool cluster_kernels = false;  // clusters exist and the cluster kernels have a body here
  bool grid_kernels = false;     // cooperative launch works and the grid kernels have a body here
  bool mma_kernels = false;      // sm_80+ and the MMA kernels have a body here
  bool multicast = false;        // Hopper, and the grid MMA kernels' multicast code is sm_90's
};

// How many batch chunks of `split` run at once on the device (the one
// wave): co-resident clusters for the cluster path, co-resident CTAs / group
// for the grid path; 0 when the launch shape cannot run. The caller asks the
// CUDA runtime with the real kernel.
using ResidentChunks = std::function<int(SeqPath, const Split&)>;

struct Decision {
  Plan chosen;
  std::vector<Plan> candidates;  // every path weighed, in the order tried
  // The cheapest split of every (path, group, dot) that can run, and the
  // loop: what the measuring planner (seq_tune.h) picks its trials from.
  std::vector<Plan> alternatives;
};

// Chooses the path of one direction's time loop (the cheapest candidate the
// environment allows), or raises where a forced path cannot run.
Decision plan_time_loop(const Problem& problem, const DeviceLimits& device, const ResidentChunks& resident);

// The choice, one line per candidate with the model's numbers, and the
// cheapest plan of each kind ("cheapest of each kind: loop C us; grid-mma C us; ...").
std::string describe(const Problem& problem, const Decision& decision);

// The values of the settings above that change a plan (LLTM_SEQ_PATH,
// _CLUSTER, _GROUP, _DOT, _MULTICAST and _LOOP_SPLITS, each followed by
// ';'): part of every cache key of a plan, in the process and in the
// tuner's file.
std::string plan_environment();

// The parts of k in the backward step loop's GEMM of a step, d h_{t-1} =
// dzh_t W_hh ((B, S) = (B, k) (k, S), k = G S): each part's product lands
// apart in float and the next step's pointwise kernel adds them (rnn_cuda.cuh's
// backward_loop), where cuBLAS would split k itself and reduce with a kernel
// of its own, a launch a step. LLTM_SEQ_LOOP_SPLITS=N where set (1: one GEMM
// accumulating into dh, as cuBLAS chooses); else as many parts as keep
// 64 x 64 tiles of (B, S) times the parts within one wave of the `sms` SMs,
// up to 4, each part at least 256 long; with W_hh^T (`k_major`: TF32's
// K-major operands) up to 4 whatever the waves. On the FMA units (`fma`:
// strict float32) 4 parts where their tiles make half a wave to two waves of
// the SMs, else one GEMM. Always a divisor of k.
int loop_dh_splits(int64_t batch, int64_t state, int64_t k, int sms, bool k_major, bool fma);

}  // namespace cuda_detail
}  // namespace lltm
