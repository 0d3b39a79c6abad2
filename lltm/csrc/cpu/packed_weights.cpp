// The cell's packed weights, kept between calls (see packed_weights.h): a
// few entries, most recently used first, bounded in number and in bytes;
// entries whose tensor has died are dropped at every lookup.
#include "packed_weights.h"

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>

#include <array>
#include <list>
#include <mutex>

#include "common.h"

namespace lltm {
namespace cpu {
namespace {

// Enough for the cells of a model (each direction and layer of a stack
// called step by step) without holding much memory for long.
constexpr size_t kMaxEntries = 8;
constexpr int64_t kMaxBytes = int64_t{64} << 20;

struct Entry {
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  int64_t version;
  const void* data;
  std::array<int64_t, 4> sizes_strides;
  PackGatesFn pack;  // names the dtype and the build (layout)
  at::Tensor packed;
};

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}

std::list<Entry>& cache() {
  static std::list<Entry> entries;
  return entries;
}

bool matches(const Entry& e, const at::Tensor& w, int64_t version, const std::array<int64_t, 4>& shape,
             PackGatesFn pack) {
  if (e.version != version || e.data != w.const_data_ptr() || e.sizes_strides != shape || e.pack != pack) return false;
  const c10::intrusive_ptr<c10::TensorImpl> alive = e.tensor.lock();
  return alive.get() == w.unsafeGetTensorImpl();
}

}  // namespace

at::Tensor packed_gates(const Kernels& kernels, const at::Tensor& weights, int64_t state, int64_t features,
                        int64_t workers) {
  const int64_t K = state + features, blocks = kernels.gate_blocks(state);
  const auto pack = [&] {
    const at::Tensor w = rows_contiguous(weights);
    at::Tensor packed = at::empty({kernels.gates_packed_size(state, K)},
                                  weights.options().dtype(opmath(weights)));
    run_team(blocks, workers, [&](int64_t j0, int64_t j1, TeamSync&) {
      kernels.pack_gates(w.const_data_ptr(), w.stride(0), state, K, packed.data_ptr(), j0, j1);
    });
    return packed;
  };
  // not cached: a tensor without a version counter, or one whose rows are
  // strided (the operator packs from a contiguous copy made for this call)
  if (weights.is_inference() || weights.stride(1) != 1) return pack();
  const int64_t version = weights._version();
  const std::array<int64_t, 4> shape{weights.size(0), weights.size(1), weights.stride(0), weights.stride(1)};
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& entries = cache();
  for (auto it = entries.begin(); it != entries.end();) {
    if (it->tensor.expired()) {
      it = entries.erase(it);
    } else if (matches(*it, weights, version, shape, kernels.pack_gates)) {
      entries.splice(entries.begin(), entries, it);  // most recently used first
      return entries.front().packed;
    } else {
      ++it;
    }
  }
  at::Tensor packed = pack();
  entries.push_front({c10::weak_intrusive_ptr<c10::TensorImpl>(weights.getIntrusivePtr()), version,
                      weights.const_data_ptr(), shape, kernels.pack_gates, packed});
  int64_t bytes = 0;
  for (const Entry& e : entries) bytes += static_cast<int64_t>(e.packed.nbytes());
  while (entries.size() > kMaxEntries || (bytes > kMaxBytes && entries.size() > 1)) {
    bytes -= static_cast<int64_t>(entries.back().packed.nbytes());
    entries.pop_back();
  }
  return packed;
}

void clear_packed_weights() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  cache().clear();
}

}  // namespace cpu
}  // namespace lltm

// Drops the fused CPU cell's packed copies of weights (tests; memory).
TORCH_LIBRARY_FRAGMENT(lltm, m) {
  m.def("_fused_cpu_clear_weight_cache() -> ()", [] { lltm::cpu::clear_packed_weights(); });
}
