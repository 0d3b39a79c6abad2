// "fused" backend on the CPU, sequence operators, written once for every
// cell of cells/registry.h: lltm::fused_<cell>_seq_forward / _backward
// (rnn.h) and LLTM's own lltm::fused_seq_forward / _backward (lltm.h), which
// pass views of LLTM's (3S, S + I) weights as W_hh and W_ih. The time loop
// runs in C++ over preallocated buffers, with the backend's own GEMM
// (kernels.h), whose speed does not depend on the BLAS torch links.
//
// Forward: W_hh and W_ih are packed once per call; each step is one fused
// GEMM + cell kernel per unit block: [h_{t-1} | x_t] [W_hh | W_ih]^T straight
// into the cell's math (the input projection rides in the same K loop, or a
// second one for cells that keep x W_ih^T and h W_hh^T apart, instead of a
// GEMM over T*B rows: the same multiply-adds, and no (T, B, G S) buffer of
// pre-activations written and read back).
//
// Backward: the states other than h are rebuilt from the saved values (the
// cell's recompute, in the forward's rounding), W_hh is packed once per
// call, and each reverse step is one fused GEMM + cell-backward kernel per
// panel of unit blocks: dh_t = dzh_{t+1} W_hh (+ the cell's direct term)
// into the cell's backward of step t, which writes dzx and dzh; the bias
// gradients are summed in the same kernel. After the loop, over all T*B
// rows (at::mm where it is the faster, see common.h: parameter_gemms_by_aten):
//   grad_input = dzx W_ih,  grad_W_ih = dzx^T x
//   grad_W_hh  = dzh_0^T h0 + dzh_{1:}^T output_{:-1}  (h_{t-1} is the previous
//                output on every row whose dzh is not 0)
//
// Threads: the unit blocks are split over a team that runs the whole time
// loop in one parallel region, each thread packing and keeping its own share
// of the weights in its caches, one barrier per step (common.h: run_team).
//
// Variable lengths: past its length a row gets zero saved values, keeps its
// states, outputs 0 and carries h (in two buffers beside the output, written
// in turn: a step reads every unit of h_{t-1} while the team writes h_t). In
// backward such a row has dzx = dzh = 0 and passes its carried gradients on.
#include "rnn_cpu.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "../lltm.h"
#include "../rnn.h"
#include "register.h"

namespace lltm {
namespace cpu {
namespace {
void register_seq(torch::Library& m) {
  m.impl("fused_seq_forward", &lltm_seq_forward_op<FusedCpu>);
  m.impl("fused_seq_backward", &lltm_seq_backward_op<FusedCpu>);
  cells::for_each_cell([&](auto cell) {
    using Cell = decltype(cell);
    if constexpr (!std::is_same_v<Cell, cells::LLTM>) {
      register_rnn_ops<FusedCpu, Cell>(m);
    }
  });
}

}  // namespace
}  // namespace cpu

// seq_cells for CPU tensors (seq_shared.cpp): LLTM's recompute, by the
// kernels of the capability the forwards run with (the fused kernels' and
// ATen's at::addcmul round c' = c + a i alike: one fused multiply-add in
// the AVX2 and AVX-512 builds, a product then a sum in the baseline one).
at::Tensor seq_cells_cpu(const at::Tensor& c0, const at::Tensor& gates) {
  const at::Tensor g = gates.contiguous();
  return cpu::recompute_states(cpu::kernels_for<cells::LLTM>(g), g, c0.contiguous().unsqueeze(0),
                               at::Tensor(), cells::LLTM::kStates)[0];
}

}  // namespace lltm

LLTM_REGISTER_CPU_KERNELS(lltm::cpu::register_seq)
