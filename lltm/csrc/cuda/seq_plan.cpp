// The time-loop planner of the fused CUDA sequence ops (see seq_plan.h).
//
// The cost model, per step of one direction, in cycles of one SM (the
// constants were fitted to the measuring planner's trial times on an H200:
// see Model below and docs/benchmarks-history.md, section 40):
//
//   persistent (cluster, grid):
//     dot      max(issue, smem): a thread group's dot products over its k
//              range, `issue` = instructions per thread (16-byte shared
//              loads, conversions, FMAs) x warps per scheduler, `smem` =
//              bytes the CTA reads from shared memory / 128 per cycle
//     reduce   a shuffle butterfly over the KS lanes of a group
//     exchange cluster: stores to C CTAs + the wait on an mbarrier;
//              grid: one global store, the group's arrival counter, and the
//              reload of all exchanged rows from L2 (shared by a multicast
//              cluster)
//     fixed    the cell math and the step's loads, a constant per path
//   loop: one GEMM and one pointwise kernel per step from a CUDA graph:
//     the GEMM's FLOPs at a share of the device's rate, the pointwise
//     kernel's bytes at a rate or its fixed cost, whichever is larger.
//
// A persistent plan's time is waves x (launch + steps x step); the loop's
// steps x step. The planner needs no precision from the model where one
// path wins by far (most of the grid); where two are close the choice costs
// little either way.
#include "seq_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>

namespace lltm {
namespace cuda_detail {

namespace {

constexpr int kMaxThreads = 256;  // the persistent kernels' __launch_bounds__

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------- choices

struct Allowed {
  bool cluster = true, grid = true, loop = true;
  // LLTM_SEQ_DOT: the persistent kernels' dot (FMA with W_h in registers or
  // in shared memory, or MMA with A in registers where it fits, or always
  // from shared memory: mma_smem, never the planner's own choice)
  bool fma_regs = true, fma_smem = true, mma = true, mma_smem = false;
  bool forced = false;   // exactly one path named: it must run
  int cluster_size = 0;  // LLTM_SEQ_CLUSTER, 0: the planner's choice
  int grid_group = 0;    // LLTM_SEQ_GROUP, 0: the planner's choice
  int multicast = 0;     // LLTM_SEQ_MULTICAST, 0: the planner's choice
};

int read_size(const char* name, int lo, int hi) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  TORCH_CHECK(*end == '\0' && n >= lo && n <= hi, name, "=", text, " must be a whole number from ", lo,
              " to ", hi);
  return static_cast<int>(n);
}

Allowed read_environment() {
  Allowed a;
  a.cluster_size = read_size("LLTM_SEQ_CLUSTER", 1, 16);
  a.grid_group = read_size("LLTM_SEQ_GROUP", 1, 1 << 16);
  a.multicast = read_size("LLTM_SEQ_MULTICAST", 1, 8);
  // Used by the step loop's backward (loop_dh_splits), checked on every plan:
  // a wrong value is an error whichever path then runs.
  (void)read_size("LLTM_SEQ_LOOP_SPLITS", 1, 8);
  TORCH_CHECK((a.multicast & (a.multicast - 1)) == 0, "LLTM_SEQ_MULTICAST=", a.multicast,
              " is not a cluster size of the grid path's multicast reload: use 1 (none), 2, 4 or 8, or "
              "leave it unset");
  const char* dot = std::getenv("LLTM_SEQ_DOT");
  if (dot != nullptr && *dot != '\0') {
    const std::string d(dot);
    TORCH_CHECK(d == "fma" || d == "fma-regs" || d == "fma-smem" || d == "mma" || d == "mma-smem",
                "LLTM_SEQ_DOT=", dot,
                " is not a dot of the persistent kernels: use fma (CUDA cores; fma-regs / fma-smem: "
                "W_h in registers / in shared memory) or mma (tensor cores; mma-smem: W_h's tiles read "
                "from shared memory every step, never held in registers), or leave it unset");
    a.fma_regs = d == "fma" || d == "fma-regs";
    a.fma_smem = d == "fma" || d == "fma-smem";
    a.mma = d == "mma";
    a.mma_smem = d == "mma-smem";
  }
  const char* text = std::getenv("LLTM_SEQ_PATH");
  if (text == nullptr || *text == '\0') return a;
  a.cluster = a.grid = a.loop = false;
  int named = 0;
  std::string list(text);
  std::stringstream items(list);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item == "cluster" || item == "persistent") {
      a.cluster = true;
    } else if (item == "grid") {
      a.grid = true;
    } else if (item == "loop") {
      a.loop = true;
    } else {
      TORCH_CHECK(false, "LLTM_SEQ_PATH=", text,
                  " is not a sequence path: use cluster, grid, loop, a comma-separated subset "
                  "(e.g. grid,loop), or leave it unset");
    }
    ++named;
  }
  TORCH_CHECK(named > 0, "LLTM_SEQ_PATH=", text, " names no sequence path");
  a.forced = (a.cluster + a.grid + a.loop) == 1;
  return a;
}

// ------------------------------------------------------------------ split

// A persistent split's dot: FMA with W_h's slice in registers or in shared
// memory, or tensor-core MMA with A held in registers where it fits
// (mma_holds_a) or read from shared memory every step (kMmaSmem:
// LLTM_SEQ_DOT=mma-smem).
enum class Dot { kFmaRegs, kFmaSmem, kMma, kMmaSmem };

// The MMA dot's k step (m16n8k16 for half types, m16n8k8 for TF32), and the
// k steps of one step's products (backward: G segments, one per gate).
int64_t mma_kstep(const Problem& p) { return p.elem == 2 ? 16 : 8; }
int64_t mma_ksteps(const Problem& p) { return (p.backward ? p.gates : 1) * ceil_div(p.state, mma_kstep(p)); }

// The k segments of one step's products (the backward's G gate segments)
// and each task's k steps in each (its slice's share; kernels walk the
// backward's segment by segment, persistent_dots.cuh's kSegMajor).
int64_t mma_segments(const Problem& p) { return p.backward ? p.gates : 1; }
int64_t mma_seg_steps(const Problem& p, const Split& s) {
  return ceil_div(mma_ksteps(p) / mma_segments(p), s.ksplit);
}

// The k steps of each segment's share a task of mstack tiles holds (the
// first of every segment): all of them where the all-held kernels' fragments
// (mma_reg_fragments) cover them, else the part-held kernels' share.
int64_t mma_held_steps(const Problem& p, const Split& s) {
  const int segments = static_cast<int>(mma_segments(p));
  const int64_t all = mma_reg_fragments(segments, false) / (s.mstack * segments);
  return all >= mma_seg_steps(p, s) ? all : mma_reg_fragments(segments, true) / (s.mstack * segments);
}

// Whether each warp of an MMA split holds A fragments in registers
// (persistent_dots.cuh's hold_a): half types with one B tile and one row
// a thread group (the kernels built for it), at most one task a warp (of
// mstack tiles: the kernels' task_tiles, as split_for never plans more
// than mma_stack_max) and a k step of every segment held. The
// same MMAs in the same order as from shared memory.
bool mma_holds_a(const Problem& p, const Split& s) {
  const int64_t tasks = s.mtiles / s.mstack * s.ksplit;
  return p.elem == 2 && s.rows_padded == 8 && s.per_thread == 1 && tasks <= s.threads / 32 &&
         mma_held_steps(p, s) >= 1;
}

// The share of a task's k steps whose A fragments it holds.
double mma_held_share(const Problem& p, const Split& s) {
  if (!s.mma || !s.w_regs) return 0.0;
  return std::min(1.0, double(mma_held_steps(p, s)) / double(mma_seg_steps(p, s)));
}

// The split with `group` CTAs per chunk, `rows` batch rows per chunk and
// the dot, or nothing where one CTA's threads, registers (W_h's chunks of a
// lane) or shared memory cannot hold it.
std::optional<Split> split_for(const Problem& p, SeqPath path, int group, int64_t rows, size_t smem_limit,
                               Dot dot) {
  const bool mma = dot == Dot::kMma || dot == Dot::kMmaSmem;
  const int V = 16 / p.elem;  // elements per 16-byte chunk
  int64_t units = ceil_div(p.state, group);
  // The cluster exchange moves 4-byte words: a CTA's columns start at a
  // whole word for 2-byte types.
  if (path == SeqPath::kCluster && p.elem == 2) units += units % 2;
  Split s;
  s.group = static_cast<int>(ceil_div(p.state, units));  // no idle CTA
  s.units = static_cast<int>(units);
  const int64_t k_chunks = ceil_div(p.state, V);
  int nb = rows >= 4 ? 4 : (rows >= 2 ? 2 : 1);
  int64_t padded = ceil_div(rows, nb) * nb;
  if (mma) {
    // The MMA needs no lanes for k: as few rows per thread as the threads
    // allow (a thread's rows run the cell math one after the other). B (the
    // exchanged rows) comes in 1, 2, 4 or 8 tiles of 8 batch rows: pad to them.
    nb = 1;
    while (nb < 4 && units * ceil_div(rows, nb) > kMaxThreads) nb *= 2;
    padded = 8;
    while (padded < rows) padded *= 2;
    if (padded > kMaxMmaRows) return std::nullopt;
  }
  const int64_t pairs = units * ceil_div(rows, nb);
  // One (unit, rows) pair per thread group: its state lives in registers.
  if (pairs > kMaxThreads) return std::nullopt;
  int ks = 32;
  while (ks > 1 && (pairs * ks > kMaxThreads || ks > k_chunks)) ks /= 2;
  // W_h in registers: a lane holds chunks ks, ks + KS, ... of its unit's rows.
  if (dot == Dot::kFmaRegs && ceil_div(k_chunks, ks) > reg_chunks(p.gates)) return std::nullopt;
  int64_t row;  // a whole number of 16-byte chunks either way (the kernels stage rows 16 bytes at a time)
  if (mma) {
    // k padded to the MMA's k step; a row stride of 4 words mod 8 puts the 8
    // rows x 4 words of a fragment load on 32 different banks.
    const int64_t kstep = mma_kstep(p);
    row = ceil_div(p.state, kstep) * kstep + kstep / 2;
  } else {
    // Rows a multiple of 8 chunks apart put the KS lanes of 8 / KS groups on
    // one bank set: offset the stride by KS chunks (mod 8) instead.
    int64_t row_chunks = k_chunks;
    if (ks < 8) {
      while (row_chunks % 8 != ks) ++row_chunks;
    }
    row = row_chunks * V;
  }
  // Exchanged rows: h_t (one per batch row) forward, dzh_t (G) backward;
  // clusters keep both parities on chip, the grid path reloads one.
  const int64_t exchanged = (p.backward ? p.gates : 1) * padded * row * (path == SeqPath::kCluster ? 2 : 1);
  const int threads = mma ? kMaxThreads
                          : static_cast<int>(std::min<int64_t>(
                                kMaxThreads, std::max<int64_t>(32, ceil_div(pairs * ks, 32) * 32)));
  int64_t w_rows = dot == Dot::kFmaRegs ? 0 : p.gates * units;
  // MMA: the float tile of partial sums, [ksplit][mtiles 16][padded + 1]
  auto smem_of = [&](int64_t ksplit) {
    const int64_t scratch = mma ? ksplit * 16 * s.mtiles * (padded + 1) * 4 : 0;
    return kHeaderBytes + ceil_div((w_rows * row + exchanged) * p.elem, 16) * 16 + scratch;
  };
  if (mma) {
    // A: forward the G J rows of W_hh, backward J rows (columns of W_hh) in
    // G k segments J rows apart; the last tile may read past them.
    s.mtiles = static_cast<int>(ceil_div(p.backward ? units : p.gates * units, 16));
    s.mma = mma;
    w_rows = std::max<int64_t>(w_rows, (p.backward ? (p.gates - 1) * units : 0) + 16 * s.mtiles);
    // Tasks of several tiles share their B fragments: the most tiles
    // mma_stack_max allows that divide mtiles, and the warps split k among
    // the task rows. More k slices need a larger tile of partial sums: where
    // it does not fit, one tile a task.
    auto split_k = [&] {
      const int64_t task_rows = s.mtiles / s.mstack;
      s.ksplit = static_cast<int>(std::clamp<int64_t>(threads / 32 / task_rows, 1, mma_ksteps(p)));
    };
    s.mstack = std::min(s.mtiles, mma_stack_max(static_cast<int>(padded / 8)));
    while (s.mtiles % s.mstack != 0) --s.mstack;
    split_k();
    if (s.mstack > 1 && smem_of(s.ksplit) > static_cast<int64_t>(smem_limit)) {
      s.mstack = 1;
      split_k();
    }
  }
  const int64_t smem = smem_of(s.ksplit);
  if (smem > static_cast<int64_t>(smem_limit)) return std::nullopt;
  s.rows = static_cast<int>(rows);
  s.rows_padded = static_cast<int>(padded);
  s.chunks = static_cast<int>(ceil_div(p.batch, rows));
  s.per_thread = nb;
  s.ks = ks;
  s.threads = threads;
  s.w_regs = dot == Dot::kFmaRegs || (dot == Dot::kMma && mma_holds_a(p, s));
  s.w_part = s.w_regs && mma && mma_held_share(p, s) < 1.0;
  s.row = static_cast<int>(row);
  s.w_rows = static_cast<int>(w_rows);
  s.smem = static_cast<size_t>(smem);
  return s;
}

// From this state size on, the grid path's MMA kernels share each reload
// in clusters of 2 (sm_90). Measured side by side in one process (H200,
// docs/benchmarks-history.md section 23): steps 4-12% shorter, forward and
// backward, for the LSTM, LLTM and GRU at S = 768 and 1024 (B = 16 and
// 64, fp16 and bf16, groups of 32 to 128 CTAs); within 2-5% either way at
// S = 128 and 512, so not there. Clusters of 4: the GPCs of a 132-SM
// H100 or H200 hold 30 of them (120 CTAs), so 4 chunks of 32 CTAs become
// 3 wider ones (splits), and every point measured ran 5-13% slower than
// with clusters of 2 (section 26). The FMA dot has no multicast kernels:
// its steps are longer, and fp32 at S = 1024 gained 5%.
constexpr int64_t kMulticastState = 768;

// The grid path's CTAs per multicast cluster for an MMA split:
// LLTM_SEQ_MULTICAST where set, else 2 from kMulticastState on; 1 where the
// device or build has no multicast kernels or the size does not divide the group.
int grid_multicast(const Allowed& a, const DeviceLimits& d, const Problem& p, int group) {
  const int m = a.multicast > 0 ? a.multicast : p.state >= kMulticastState ? 2 : 1;
  return d.multicast && group % m == 0 ? m : 1;
}

// The candidate splits of `group` CTAs per chunk: from as many chunks as
// the SMs suggest (or fewer rows per chunk, where those do not fit), to as
// many rows per chunk as one wave needs (more rows need more shared memory),
// each with its waves.
std::vector<Split> splits(const Problem& p, SeqPath path, int group, Dot dot, const DeviceLimits& d,
                          const Allowed& allowed, const ResidentChunks& resident, std::string& why) {
  const bool mma = dot == Dot::kMma || dot == Dot::kMmaSmem;
  std::vector<Split> out;
  int64_t rows = ceil_div(p.batch, std::max<int64_t>(1, d.sms / std::max(1, group)));
  // Fewer rows per chunk (in more waves) where the guess does not fit.
  while (rows > 1 && !split_for(p, path, group, rows, d.smem_per_block, dot)) rows = ceil_div(rows, 2);
  why = dot == Dot::kFmaRegs ? "W_h's slice does not fit in the registers of one CTA (LLTM_SEQ_DOT=fma-regs)"
                             : "W_h's slice and the exchanged rows do not fit in one CTA";
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::optional<Split> s = split_for(p, path, group, rows, d.smem_per_block, dot);
    if (!s) break;
    // The grid's MMA kernels in multicast clusters: the clusters the GPCs
    // hold bound the chunks of a wave; where not one chunk's fit, none.
    if (path == SeqPath::kGrid && s->mma) s->multicast = grid_multicast(allowed, d, p, s->group);
    int fit = resident(path, *s);
    if (fit <= 0 && s->multicast > 1) {
      s->multicast = 1;
      fit = resident(path, *s);
    }
    if (fit <= 0) {
      why = "the launch shape cannot be scheduled";
      break;
    }
    s->per_wave = std::min(s->chunks, fit);
    s->waves = static_cast<int>(ceil_div(s->chunks, fit));
    out.push_back(*s);
    // Fewer waves with more rows per chunk, if the runtime's answer for
    // the launch shape (GPC sizes, shared memory) allows.
    int64_t wider = ceil_div(p.batch, fit);
    if (mma) wider = std::min<int64_t>(wider, kMaxMmaRows);
    if (s->waves == 1 || wider <= rows) break;
    rows = wider;
  }
  return out;
}

// ------------------------------------------------------------- the model

// Fitted constants (cycles unless said; see the file comment). The
// measuring planner's trial times are the data: every viable plan of a
// class timed (up to 14 a class), on an H200 (sm_90, multicast reloads,
// the per-gate mbarriers of the backward's reload), for the LLTM, LSTM and
// GRU, forward and backward, in fp16, TF32 and strict float32, over the
// T = 100 grid (B 16..512 x S 128..1024), at FlashRNN's point (fp16,
// T = 1024, B = 16, S = 768) and at T = 1000, B = 16, S = 128: 300
// classes. A least-squares fit of log time (plans within 1.5x of a
// class's fastest weighted most), then a local search on the picks: the
// sum over classes of log(time of the model's pick / the fastest time).
// Against the constants before (fitted on an H100 before multicast), the
// model's pick is more than 10% slower than the fastest timed plan in 15
// classes instead of 74, and the sum of log ratios falls from 23.2 to 4.3
// (docs/benchmarks-history.md, section 40). The three terms added with it:
// the FMA dot from registers at 0.71 of its modelled cycles, the cluster
// MMA dot at 1.34x (its DSMEM stores meet the dot's shared-memory reads),
// and a multicast cluster of M CTAs dividing the reload's L2 time by
// sqrt(M). The loop's GEMM floors went to 0 (a step's fixed cost is the
// pointwise term's). To refit after a kernel changes: `python -m
// lltm.bench.plan_fit collect` on the GPU (LLTM_SEQ_TUNE_ALL=1), then `fit`
// anywhere; its copy of this model must change with it (it checks).
struct Model {
  double cluster_fixed = 1280;             // cell math, the step's loads, stores and exchange
  double cluster_per_cta = 92.8;           // each CTA a slice goes to (DSMEM stores)
  double grid_fixed = 3230;                // the same with the arrival counter
  double grid_per_cta = 13.7;              // each CTA of the group at the counter
  double grid_l2_bytes_per_cycle = 26.4;   // exchanged rows reloaded from L2, per SM (one CTA a cluster)
  double issue_factor = 2.26;              // issue and dependency stalls per instruction
  double backward_factor = 0.965;          // the backward's step against the forward's of the same split
  double launch_us = 29.7;                 // one persistent launch with its W_h load
  double loop_pointwise_us = 7.96;         // a step's pointwise kernel and graph-node gaps
  double loop_gemm_floor_us = 0;           // a small GEMM on the FMA units
  double loop_gemm_floor_tc_us = 0;        // the same on tensor cores
  double loop_gemm_efficiency = 0.698;     // of the FMA rate
  double loop_gemm_efficiency_tc = 0.435;  // of the tensor-core rate
  double loop_bytes_per_us = 5.41e6;       // the pointwise kernel's traffic
  double loop_half_factor = 0.742;         // bf16 / fp16 steps against the model
  int loop_gemm_tile_rows = 64;            // GEMM tiles pad the batch to this many rows
  // The MMA dot (mma_dot_cycles).
  double mma_chain = 72.5;           // a k step's fragment loads and MMA, on the same accumulators
  double mma_pipe = 3.99;            // a tensor core busy per m16n8k8 TF32 / m16n8k16 half MMA
  double mma_step_offset = 327;      // the tile's round trip through shared memory
  double mma_3xtf32_chain = 1.29;    // a k step's chain as 3xTF32, of TF32's (history section 52's probe)
  double cell_row_cycles = 1100;     // one more batch row per thread: its cell math, exchange, stores
  double fma_regs_factor = 0.712;    // the FMA dot with W_h in registers, of its modelled cycles
  double cluster_mma_factor = 1.34;  // the cluster kernels' MMA dot, of its modelled cycles
};

const Model kModel;

// Cycles of one step's recurrent products with the MMA dot: per k step a
// task loads mstack A fragments (4 words a lane; float also rounds them to
// TF32) and per B tile 2 words, then mstack MMAs per B tile; two chains of
// k steps are in flight per task. The bound is the slowest of the warps'
// chains, the tensor cores (4 per SM) and the shared-memory port (one
// 128-byte warp load a cycle: A is read once, B once per row of tasks);
// then the tile's round trip through shared memory (see
// Model::mma_step_offset). A held in registers (w_regs) is not loaded or
// read each step: mma_held_share of it.
double mma_dot_cycles(const Problem& p, const Split& s) {
  const double ksteps = static_cast<double>(mma_ksteps(p));
  const double nt = s.rows_padded / 8.0;
  const double warps = s.threads / 32.0;
  const double task_rows = s.mtiles / s.mstack;
  const double tasks = std::ceil(task_rows * s.ksplit / warps);  // (tiles, k slice) tasks per warp
  const double per_task = std::ceil(ksteps / s.ksplit);
  const double a_loads = 4.0 * (1.0 - mma_held_share(p, s));
  const double loads = a_loads * s.mstack + 2 * nt;  // per k step of a task
  // 3xTF32: three MMAs a tile, each word split (cvt; sub, cvt), and the
  // float32 adds of the tile's two results (d += big + small).
  const double mmas = p.tf32x3 ? 3.0 : 1.0;
  const double round = p.elem == 4 ? (p.tf32x3 ? 3.0 : 1.0) * loads : 0;  // cvt.rna.tf32 per word
  const double adds = p.tf32x3 ? 8.0 * s.mstack * nt : 0.0;
  const double issue = kModel.issue_factor * (loads + round + mmas * s.mstack * nt + adds);
  const double chain = kModel.mma_chain * (p.tf32x3 ? kModel.mma_3xtf32_chain : 1.0);
  const double chains = tasks * per_task * std::max(chain / 2, issue);
  const double tensor = mmas * s.mtiles * ksteps * nt * kModel.mma_pipe / 4;
  const double smem = ksteps * (a_loads * s.mtiles + 2 * nt * task_rows);  // A once, B once per task row
  return std::max({chains, tensor, smem}) + kModel.mma_step_offset;
}

double persistent_step_cycles(const Problem& p, SeqPath path, const Split& s) {
  const int V = 16 / p.elem;
  const double iters = std::ceil(std::ceil(double(p.state) / V) / s.ks);
  const int nb = s.per_thread;
  const double convert = p.elem == 2 ? 1.0 : 0.0;  // half types widen every element
  // Per thread: forward reads G W chunks + NB h chunks per k chunk and does G NB V FMAs;
  // backward, per gate, 1 W chunk + NB dzh chunks and NB V FMAs. W_hh's
  // chunks in registers need no loads (half types still widen them).
  const double w_chunks = p.gates * iters;
  const double x_chunks = (p.backward ? p.gates : 1.0) * iters * nb;
  const double loads = (s.w_regs ? 0.0 : w_chunks) + x_chunks;
  const double fmas = p.gates * iters * V * nb;
  const double instr = loads + convert * V * (w_chunks + x_chunks) + fmas * (p.is_double ? 2.0 : 1.0);
  const double warps_per_scheduler = std::ceil(s.threads / 32.0 / 4.0);
  const double issue = kModel.issue_factor * instr * warps_per_scheduler;
  const double smem = s.threads * loads * 16.0 / 128.0;
  const double reduce = std::log2(double(s.ks)) * (p.backward ? nb : p.gates * nb) * 8.0;
  // The FMA constants were fitted over splits whose rows per thread followed
  // the batch; the MMA splits take as few as the threads allow, and pay for
  // each further row's cell math, run one after the other.
  double dot =
      s.mma ? mma_dot_cycles(p, s) + (nb - 1) * kModel.cell_row_cycles : std::max(issue, smem) + reduce;
  if (s.w_regs && !s.mma) dot *= kModel.fma_regs_factor;
  if (s.mma && path == SeqPath::kCluster) dot *= kModel.cluster_mma_factor;
  double exchange;
  if (path == SeqPath::kCluster) {
    exchange = kModel.cluster_fixed + kModel.cluster_per_cta * s.group;
  } else {
    const double bytes = (p.backward ? p.gates : 1.0) * s.rows_padded * s.row * p.elem;
    // A multicast cluster's CTAs share each reload: one copy from L2 lands in all of them.
    exchange = kModel.grid_fixed + kModel.grid_per_cta * s.group +
               bytes / (kModel.grid_l2_bytes_per_cycle * std::sqrt(static_cast<double>(s.multicast)));
  }
  return (dot + exchange) * (p.backward ? kModel.backward_factor : 1.0);
}

double loop_step_us(const Problem& p, const DeviceLimits& d) {
  // FLOPs per cycle per SM: FMA units (fp32 128 lanes, fp64 half of that),
  // or tensor cores (8x for TF32 / half types on sm_80+, a conservative mean).
  double per_sm = p.is_double ? 128.0 : 256.0;
  const double efficiency = p.tensor_cores ? kModel.loop_gemm_efficiency_tc : kModel.loop_gemm_efficiency;
  if (p.tensor_cores) per_sm *= 8.0;
  const double rate = per_sm * d.sms * d.clock_ghz * 1e3 * efficiency;  // FLOP / us
  const double rows = std::max<double>(p.batch, kModel.loop_gemm_tile_rows);
  const double flops = 2.0 * rows * p.gates * p.state * p.state;
  const double floor = p.tensor_cores ? kModel.loop_gemm_floor_tc_us : kModel.loop_gemm_floor_us;
  const double gemm = std::max(floor, flops / rate);
  const double bytes = double(p.batch) * p.state * p.elem * (p.backward ? 10 : 8);
  const double pointwise = std::max(kModel.loop_pointwise_us, bytes / kModel.loop_bytes_per_us);
  return (gemm + pointwise) * (p.elem == 2 ? kModel.loop_half_factor : 1.0);
}

void set_cost(const Problem& p, const DeviceLimits& d, Plan& plan) {
  if (plan.path == SeqPath::kLoop) {
    plan.cost_us = p.steps * loop_step_us(p, d);
  } else {
    const double step_us = persistent_step_cycles(p, plan.path, plan.split) / (d.clock_ghz * 1e3);
    plan.cost_us = plan.split.waves * (kModel.launch_us + p.steps * step_us);
  }
}

}  // namespace

std::string plan_environment() {
  std::string env;
  for (const char* name : {"LLTM_SEQ_PATH", "LLTM_SEQ_CLUSTER", "LLTM_SEQ_GROUP", "LLTM_SEQ_DOT",
                           "LLTM_SEQ_MULTICAST", "LLTM_SEQ_LOOP_SPLITS"}) {
    const char* v = std::getenv(name);
    env += std::string(v == nullptr ? "" : v) + ";";
  }
  return env;
}

int loop_dh_splits(int64_t batch, int64_t state, int64_t k, int sms, bool k_major, bool fma) {
  int splits = read_size("LLTM_SEQ_LOOP_SPLITS", 1, 8);
  if (splits == 0) {
    const int64_t tiles = ceil_div(batch, 64) * ceil_div(state, 64);
    splits = 1;
    if (fma) {
      // cuBLAS's FFMA kernels: 2 parts ran 1-24% slower than one GEMM at every
      // strict point measured (LSTM and LLTM, B = 64 to 512, S = 512 and 1024);
      // 4 parts 2-4% faster where their tiles make half a wave to two waves of
      // the SMs (256x512, 512x512), and within 1% of one GEMM at 256x1024
      // (docs/benchmarks-history.md section 37)
      if (tiles * 8 >= sms && tiles * 4 <= 2 * int64_t(sms) && k / 4 >= 256) splits = 4;
    } else {
      // K-major TF32 parts gain past one wave: 4 parts at 512x1024 take 4% off the
      // LLTM's forward + backward (docs/benchmarks-history.md section 31)
      while (splits < 4 && (k_major || tiles * splits * 2 <= sms) && k / (splits * 2) >= 256) splits *= 2;
    }
  }
  while (splits > 1 && k % splits != 0) --splits;
  return splits;
}

bool held_split_fits(const Split& s, bool backward, int gates, int64_t state, int elem) {
  if (!s.mma || !s.w_regs) return true;
  // The planner's own tests (mma_holds_a, mma_held_share), on tile counts it would have made.
  if (s.mstack < 1 || s.mstack > mma_stack_max(1) || s.ksplit < 1 || s.mtiles % s.mstack != 0) return false;
  Problem p;
  p.backward = backward;
  p.gates = gates;
  p.state = state;
  p.elem = elem;
  return mma_holds_a(p, s) && (s.w_part || mma_held_share(p, s) >= 1.0);
}

const char* path_name(SeqPath path) {
  switch (path) {
    case SeqPath::kCluster:
      return "cluster";
    case SeqPath::kGrid:
      return "grid";
    default:
      return "loop";
  }
}

Decision plan_time_loop(const Problem& p, const DeviceLimits& d, const ResidentChunks& resident) {
  const Allowed allowed = read_environment();
  Decision out;
  // The cheapest split of `group` CTAs per chunk, or why there is none.
  // Dots: FMA, and MMA where the dtype, device and build have it.
  std::vector<Dot> dots;
  // W_h in registers for float32 only (seq_plan.h).
  if (allowed.fma_regs && p.elem == 4) dots.push_back(Dot::kFmaRegs);
  if (allowed.fma_smem) dots.push_back(Dot::kFmaSmem);
  if ((allowed.mma || allowed.mma_smem) && p.mma_dot() && d.mma_kernels)
    dots.push_back(allowed.mma ? Dot::kMma : Dot::kMmaSmem);
  // Why a persistent path has no split when no dot is left (LLTM_SEQ_DOT=mma,
  // mma-smem or fma-regs), naming the setting as given.
  const std::string mma_setting = std::string("LLTM_SEQ_DOT=") + (allowed.mma_smem ? "mma-smem" : "mma");
  const std::string no_dot =
      allowed.fma_regs ? "LLTM_SEQ_DOT=fma-regs: W_h in registers for float32 only"
      : p.is_double    ? mma_setting + ": no tensor-core dot for float64"
      : !p.mma_dot()
          ? mma_setting +
                ": float32 runs on tensor cores only with TF32 allowed "
                "(torch.backends.cuda.matmul.allow_tf32 = True, or lltm.set_fp32_precision "
                "'tf32') or, in the backward, as 3xTF32 (lltm.set_fp32_precision 'accurate', whose "
                "forward keeps its step products strict)"
          : mma_setting + ": no tensor-core MMA kernels for this device or build (sm_80+)";
  auto add_persistent = [&](SeqPath path, int group) {
    Plan best;
    best.path = path;
    best.split.group = group;
    best.why_not = no_dot;  // splits() replaces it with its own reason
    for (const Dot dot : dots) {
      Plan best_of_dot;
      for (const Split& s : splits(p, path, group, dot, d, allowed, resident, best.why_not)) {
        Plan plan;
        plan.path = path;
        plan.split = s;
        set_cost(p, d, plan);
        if (best.split.waves == 0 || plan.cost_us < best.cost_us) best = plan;
        if (best_of_dot.split.waves == 0 || plan.cost_us < best_of_dot.cost_us) best_of_dot = plan;
      }
      if (best_of_dot.split.waves > 0) out.alternatives.push_back(best_of_dot);
    }
    if (best.split.waves > 0) best.why_not.clear();
    out.candidates.push_back(best);
  };
  if (allowed.cluster) {
    if (!d.cluster_kernels) {
      Plan plan;
      plan.path = SeqPath::kCluster;
      plan.why_not =
          "this device or build has no thread-block cluster kernels (compute capability 9.0+, built for it)";
      out.candidates.push_back(plan);
    } else if (allowed.cluster_size > 0) {
      add_persistent(SeqPath::kCluster, static_cast<int>(std::min<int64_t>(allowed.cluster_size, p.state)));
    } else {
      for (int64_t c : {4, 8, 16}) {
        if (c == 4 || c <= p.state) add_persistent(SeqPath::kCluster, static_cast<int>(std::min(c, p.state)));
      }
    }
  }
  if (allowed.grid) {
    if (!d.grid_kernels) {
      Plan plan;
      plan.path = SeqPath::kGrid;
      plan.why_not = "this device or build cannot run the cooperative grid kernels";
      out.candidates.push_back(plan);
    } else if (allowed.grid_group > 0) {
      add_persistent(SeqPath::kGrid, static_cast<int>(std::min<int64_t>(allowed.grid_group, p.state)));
    } else {
      // Groups from 1 CTA to one CTA per 8 units (or per unit below S = 8).
      for (int64_t g = 1; g <= std::max<int64_t>(1, p.state / 8) && g <= d.sms; g *= 2) {
        add_persistent(SeqPath::kGrid, static_cast<int>(g));
      }
    }
  }
  if (allowed.loop) {
    Plan plan;
    plan.path = SeqPath::kLoop;
    set_cost(p, d, plan);
    out.candidates.push_back(plan);
    out.alternatives.push_back(plan);
  }
  const Plan* best = nullptr;
  for (const Plan& c : out.candidates) {
    if (c.why_not.empty() && (best == nullptr || c.cost_us < best->cost_us)) best = &c;
  }
  if (best == nullptr) {
    std::string reasons;
    for (const Plan& c : out.candidates)
      reasons += std::string(" ") + path_name(c.path) + ": " + c.why_not + ";";
    TORCH_CHECK(false, "lltm::fused (CUDA): LLTM_SEQ_PATH=", std::getenv("LLTM_SEQ_PATH"),
                " allows no time loop that can run here:", reasons);
  }
  out.chosen = *best;
  return out;
}

std::string describe(const Problem& p, const Decision& decision) {
  std::ostringstream os;
  os << p.cell << " " << (p.backward ? "backward" : "forward") << " T=" << p.steps << " B=" << p.batch
     << " S=" << p.state << " elem=" << p.elem << ": " << path_name(decision.chosen.path);
  for (const Plan& c : decision.candidates) {
    os << "\n  " << path_name(c.path);
    if (c.path != SeqPath::kLoop) os << " group=" << c.split.group;
    if (!c.why_not.empty()) {
      os << " cannot run: " << c.why_not;
      continue;
    }
    if (c.path != SeqPath::kLoop) {
      const Split& s = c.split;
      os << " units=" << s.units << " rows=" << s.rows << " chunks=" << s.chunks << " waves=" << s.waves
         << " nb=" << s.per_thread << " ks=" << s.ks << " threads=" << s.threads << " smem=" << s.smem
         << " dot="
         << (s.mma      ? (s.w_part   ? "mma w=regs+smem"
                           : s.w_regs ? "mma w=regs"
                                      : "mma")
             : s.w_regs ? "fma w=regs"
                        : "fma w=smem");
      if (s.mma && p.tf32x3) os << " 3xtf32";
      if (s.mma) os << " mtiles=" << s.mtiles << " mstack=" << s.mstack << " ksplit=" << s.ksplit;
      if (c.path == SeqPath::kGrid) os << " multicast=" << s.multicast;
    }
    os << " model_us=" << c.cost_us;
  }
  // The cheapest viable plan of each kind (the alternatives hold the cheapest
  // split of every path, group and dot), as the measuring planner sees them.
  const Plan* cheapest[kPlanKinds] = {};
  for (const Plan& c : decision.alternatives) {
    const Plan*& best = cheapest[static_cast<int>(plan_kind(c))];
    if (c.why_not.empty() && (best == nullptr || c.cost_us < best->cost_us)) best = &c;
  }
  os << "\n  cheapest of each kind:";
  for (int k = 0; k < kPlanKinds; ++k) {
    if (cheapest[k] != nullptr) {
      os << " " << plan_kind_name(*cheapest[k]) << " " << cheapest[k]->cost_us << " us;";
    }
  }
  return os.str();
}

std::string plan_kind_name(const Plan& p) {
  if (p.path == SeqPath::kLoop) return "loop";
  return std::string(path_name(p.path)) + "-" + dot_label(p.split);
}

}  // namespace cuda_detail
}  // namespace lltm
