// "aten" backend for the seam's built-in cells (cells/registry.h; LLTM keeps
// its own hand-written ATen code in seq_aten.cpp): the operators of
// rnn_aten.h, registered for every device.
#include "rnn_aten.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "../backends.h"
#include "../rnn.h"

TORCH_LIBRARY_IMPL(lltm, CompositeExplicitAutograd, m) {
  lltm::cells::for_each_cell([&](auto cell) {
    using Cell = decltype(cell);
    if constexpr (!std::is_same_v<Cell, lltm::cells::LLTM>) {
      lltm::register_rnn_ops<lltm::aten_rnn::Aten, Cell>(m);
    }
  });
}
