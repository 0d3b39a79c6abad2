// The built-in cells, listed once (lltm/cells.py lists the same names for
// Python). Operators, autograd and kernels are instantiated for each; adding
// a cell is its header in this folder and one entry here.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "gru.h"
#include "lltm.h"
#include "lstm.h"

namespace lltm {
namespace cells {

using BuiltIn = std::tuple<LLTM, LSTM, GRU>;

// Whether Cell is one of BuiltIn.
template <typename Cell>
constexpr bool is_built_in() {
  return std::apply([](auto... cell) { return (std::is_same_v<decltype(cell), Cell> || ...); }, BuiltIn{});
}

// Calls f(Cell{}) for every built-in cell.
template <typename F>
void for_each_cell(F&& f) {
  std::apply([&](auto... cell) { (f(cell), ...); }, BuiltIn{});
}

}  // namespace cells
}  // namespace lltm
