// The measuring planner of the fused CUDA sequence ops: on the first call
// of a problem class (device, cell, element size: bf16 and fp16 share one,
// direction, precision, B, S and T's power-of-two class), the cost model's
// few cheapest plans
// (seq_plan.h) are timed once on trial copies of the call's data, and the
// fastest is kept for the process and used by every later call of the class.
//
//   - What is timed: the time loop alone (the persistent launch, or the
//     graph-replayed step loop after its warm-up), over the first
//     n = min(T, kTuneSteps) steps (fewer where a step's buffers are large:
//     tune_steps), on scratch tensors: the call's own outputs are written
//     once, by the chosen plan, after the timing. Where the scratch
//     tensors cannot be allocated, the model decides.
//   - Where T > n, each plan is also timed over n/2 steps, and its time at
//     T is extrapolated from the two (a launch's fixed cost plus a cost per
//     step): a persistent launch's fixed cost is large beside n short steps
//     and small beside T of them, so n steps alone favour the step loop.
//   - Candidates: at most kTuneCandidates viable plans of the model (the
//     cheapest split of each path, group and dot: the MMA and FMA dots
//     compete too), each within kTuneSpread of the cheapest's model cost:
//     the cheapest of each kind (the step loop; the cluster and grid
//     kernels with the MMA dot, the FMA dot from registers and from shared
//     memory: seq_plan.h's PlanKind), then the next cheapest, timed
//     cheapest first.
//     The fastest is kept, unless the model's pick is within kTuneMargin of
//     it, so that close calls do not flip with the machine's noise. (At 5%
//     the model's backward at FlashRNN's point, groups of 64, stood against
//     groups of 32 measured 4.6% faster: docs/benchmarks-history.md, section 44.)
//   - Never during CUDA graph capture (the model's choice, or a choice
//     measured before), nor under torch.use_deterministic_algorithms(True)
//     (every process then runs the same, modelled plan).
//   - LLTM_SEQ_TUNE=0 turns timing off (model only). LLTM_SEQ_TUNE_CACHE=FILE
//     keeps the choices in FILE (one line each, appended; read on first
//     use), so a later process, a restarted run, reuses them.
//   - LLTM_SEQ_TUNE_ALL=1 times every viable plan of a class (no spread, no
//     cap) and writes each one's split and model cost into the report: the
//     data of the model's fit (python -m lltm.bench.plan_fit).
//   - Forced paths (LLTM_SEQ_PATH=one name, LLTM_SEQ_CLUSTER, ...) are part of
//     the class: where they leave one candidate, nothing is timed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "seq_plan.h"

namespace lltm {
namespace cuda_detail {

constexpr int64_t kTuneSteps = 32;
// Bytes of one (steps, B, G S) trial buffer at most: fewer steps where B G S is large.
constexpr int64_t kTuneBytes = int64_t(64) << 20;

// Steps of a trial for a layer of T steps whose per-step buffer holds `step_bytes`.
inline int64_t tune_steps(int64_t steps, int64_t step_bytes) {
  const int64_t fit = step_bytes > 0 ? kTuneBytes / step_bytes : kTuneSteps;
  return std::max<int64_t>(1, std::min({steps, kTuneSteps, fit}));
}
constexpr int kTuneCandidates = 6;
constexpr double kTuneSpread = 2.0;
constexpr double kTuneMargin = 0.03;

// The plan every persistent launch of this thread takes while set (a trial
// of the measuring planner, or its choice for the running call); nullptr:
// each launch asks the model.
const Plan* plan_override();

class PlanOverride {
 public:
  explicit PlanOverride(const Plan* plan);
  ~PlanOverride();
  PlanOverride(const PlanOverride&) = delete;
  PlanOverride& operator=(const PlanOverride&) = delete;

 private:
  const Plan* previous_;
};

// A plan's name in reports and in the file cache, e.g. "cluster:8:fma-regs:nb1:ks8" or "loop".
std::string plan_label(const Plan& plan);

// Builds the trial of one time loop over the first (forward) or last
// (backward) `steps` steps of the call, on scratch tensors of the call's
// shapes, and returns the callable that runs it once; asked only when timing.
using TrialFactory = std::function<std::function<void()>(int64_t steps)>;

// The plan this call's time loop runs: the measured choice of its class
// (timing the candidates now when the class is new and timing is possible),
// or nullptr for the model's choice.
const Plan* measured_plan(const Problem& problem, const Decision& decision, int device,
                          const TrialFactory& make_trial);

// The measured choice of a class and every candidate's time, as lines for
// the planner's report ("" when the class has none).
std::string measured_report(const Problem& problem, int device);

// Classes timed, classes read from LLTM_SEQ_TUNE_CACHE, and calls that took
// the model because timing was not possible then (capture, deterministic
// mode), since the process started (lltm::_fused_cuda_seq_tune_stats).
std::vector<int64_t> tune_stats();

}  // namespace cuda_detail
}  // namespace lltm
