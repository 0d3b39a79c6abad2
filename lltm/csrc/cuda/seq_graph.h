// The step loop of the fused CUDA sequence ops without its host cost: the
// launches of a whole time loop (2 per step) replayed from a CUDA graph.
//
// run_graphed(key, enqueue): `enqueue` queues asynchronous work on the
// current stream (kernels and cuBLAS GEMMs; no allocation, no host sync).
// The first time a key is seen it just runs; the second time its launches
// are captured into a graph, which that call and every later call with the
// same key replay with one cudaGraphLaunch. A key holds everything the
// launches bake in: pointers, sizes, flags, the device and the cuBLAS math
// mode; calls inside a training loop repeat them (the caching allocator
// hands out the same blocks), one-off calls pay nothing but the lookup.
// While the current stream is being captured (torch.cuda.graph,
// torch.compile mode="reduce-overhead"), the launches go straight into
// that capture. LLTM_SEQ_GRAPHS=0 turns replay off (benchmarks).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace lltm {
namespace cuda_detail {

using GraphKey = std::vector<int64_t>;

// Appends a pointer to a key.
inline void key_add(GraphKey& key, const void* p) {
  key.push_back(static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(p)));
}

void run_graphed(GraphKey key, const std::function<void()>& enqueue);

// What run_graphed did since the process started: calls run eagerly on a
// key's first sighting, captures, and replays.
struct GraphStats {
  int64_t eager = 0, captures = 0, replays = 0;
};
GraphStats graph_stats();

}  // namespace cuda_detail
}  // namespace lltm
