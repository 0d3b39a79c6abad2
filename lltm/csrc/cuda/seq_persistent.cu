// Persistent recurrent kernels of the fused CUDA sequence operators.
//
// One launch runs the whole time loop of one direction. The grid is made of
// groups of CTAs: a group owns a chunk of batch rows, and CTA r of the group
// owns the state units [r J, (r + 1) J). Chunks are independent, so groups
// never wait on each other; inside a group:
//
//   forward, step t: each CTA computes the G gate rows of its units for
//   its batch rows from W_hh's rows (resident for all T steps in its shared
//   memory, or, with the FMA dot in float32, spread over its lanes'
//   registers) and h_{t-1} (a full copy in its shared memory), finishes the
//   cell's math for its units itself (the states other than h stay in
//   registers in float), writes the output and the saved values, and
//   publishes its slice of h_t to the other CTAs; one group barrier per
//   step, during which the next step's input projection loads.
//
//   backward, step t (reverse time): each CTA turns the carried state
//   gradients of its units into dzx_t and dzh_t (the gradients of the gates'
//   input and recurrent parts; one and the same for most cells) through the
//   cell's backward, publishes its slice of dzh_t, waits at the group
//   barrier, and computes d h_{t-1} for its units from W_hh's columns
//   (resident, as W_hh^T rows) and all of dzh_t; the carried gradients stay
//   in registers in float, and the next step's saved values and states load
//   during the barrier. Each thread also adds the dzx_t (and dzh_t) it
//   stores into its rows' bias sums, written once after the last step.
//
// How a slice reaches the other CTAs is the exchange policy, the one
// difference between the two kernels of each direction:
//   ClusterExchange  a thread-block cluster (sm_90+): every CTA writes its
//                    slice into its own shared memory, then pushes it into
//                    every other CTA's (DSMEM, st.async), each store
//                    counting its bytes on the receiver's mbarrier; a CTA
//                    waits only for its own mbarrier to complete (no
//                    cluster barrier, no sender waiting for its stores).
//                    Both parities of the buffer live on chip.
//   GridExchange     any group of co-resident CTAs (a cooperative launch):
//                    slices go to a global buffer (L2), the group meets at
//                    an arrival counter, and each CTA reloads the whole step
//                    into its shared memory.
// Exchanged values travel in the tensor dtype (what the per-step cuBLAS path
// reads too); every product accumulates in float (double for double). The
// dot products run one of two ways (the split's dot, seq_plan.h): FMA
// chains (float32 strict fp32) or tensor-core MMA tiles (half types, and
// float32 as TF32 where the user allowed it). Exchange buffers are
// double-buffered by step parity, so one synchronisation per step
// suffices: a CTA writes parity p again only after every CTA has published
// the step after its last read of parity p.
//
// The cell is a template parameter (its traits, cells/cell.h), and the code
// is split by job: parameters and thread layout (persistent_params.cuh), the
// exchanges (persistent_exchange.cuh), the dots (persistent_dots.cuh), the
// kernels (persistent_kernels.cuh), the launch of a plan
// (persistent_launch.cuh), instantiated per cell and direction
// (persistent_<cell>_<direction>.cu). The plan (which kernel, which split)
// is seq_plan.cpp's. This file answers lltm::_fused_cuda_seq_plan.
#include <c10/cuda/CUDAGuard.h>

#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "../lltm.h"
#include "seq_persistent.h"

namespace lltm {
namespace cuda_detail {
namespace {

// The planners of the cells registered at run time, by name.
struct CellPlans {
  std::mutex mutex;
  std::map<std::string, CellPlan, std::less<>> plans;
};
CellPlans& cell_plans() {
  static CellPlans plans;
  return plans;
}

}  // namespace

void register_cell_plan(const std::string& cell, CellPlan plan) {
  CellPlans& all = cell_plans();
  const std::lock_guard<std::mutex> lock(all.mutex);
  all.plans[cell] = plan;
}

}  // namespace cuda_detail

std::string fused_cuda_seq_plan(bool backward, int64_t steps, int64_t batch, int64_t state,
                                c10::ScalarType dtype, int64_t device, c10::string_view cell) {
  using namespace cuda_detail;
  TORCH_CHECK(steps >= 0 && batch >= 0 && state >= 1,
              "lltm::_fused_cuda_seq_plan: expected steps >= 0, "
              "batch >= 0 and state >= 1, got ",
              steps, ", ", batch, ", ", state);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  std::string report;
  bool known = false;
  cells::for_each_cell([&](auto c) {
    using Cell = decltype(c);
    if (cell == Cell::kName) {
      known = true;
      report = backward ? rnn_plan<Cell, true>(steps, batch, state, dtype, static_cast<int>(device))
                        : rnn_plan<Cell, false>(steps, batch, state, dtype, static_cast<int>(device));
    }
  });
  if (!known) {
    CellPlan plan = nullptr;
    {
      CellPlans& all = cell_plans();
      const std::lock_guard<std::mutex> lock(all.mutex);
      const auto found = all.plans.find(std::string_view(cell.data(), cell.size()));
      if (found != all.plans.end()) plan = found->second;
    }
    TORCH_CHECK_VALUE(plan != nullptr, "lltm::_fused_cuda_seq_plan: unknown cell '", cell, "'");
    report = plan(backward, steps, batch, state, dtype, static_cast<int>(device));
  }
  return report;
}

}  // namespace lltm
