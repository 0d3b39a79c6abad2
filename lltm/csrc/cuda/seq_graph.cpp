// CUDA graphs of the fused sequence ops' step loop (see seq_graph.h).
#include "seq_graph.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <c10/util/hash.h>

#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>

#include "../lltm.h"
#include "blas.h"

namespace lltm {
namespace cuda_detail {

namespace {

// Instantiated graphs kept (least recently used dropped first), and keys
// remembered as seen once. A training loop cycles through a few keys per
// layer (the caching allocator hands out a few sets of blocks in turn).
constexpr size_t kMaxGraphs = 128;
constexpr size_t kMaxSeen = 1024;

struct KeyHash {
  size_t operator()(const GraphKey& key) const { return c10::get_hash(key); }
};

// An LRU list of keys with a map into it.
template <typename Value>
class Lru {
 public:
  explicit Lru(size_t capacity) : capacity_(capacity) {}

  Value* find(const GraphKey& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);  // most recent first
    return &it->second->second;
  }

  // Inserts; returns the value dropped to make room, if any.
  bool insert(const GraphKey& key, Value value, Value* dropped) {
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    if (order_.size() <= capacity_) return false;
    *dropped = std::move(order_.back().second);
    index_.erase(order_.back().first);
    order_.pop_back();
    return true;
  }

 private:
  size_t capacity_;
  std::list<std::pair<GraphKey, Value>> order_;
  std::unordered_map<GraphKey, typename std::list<std::pair<GraphKey, Value>>::iterator, KeyHash> index_;
};

struct Cache {
  std::mutex mutex;
  Lru<cudaGraphExec_t> graphs{kMaxGraphs};
  Lru<bool> seen{kMaxSeen};
  GraphStats stats;
};

Cache& cache() {
  // Never destroyed: graphs may outlive the CUDA context at exit.
  static Cache* instance = new Cache();
  return *instance;
}

// Every use of lltm's cuBLAS workspace of a device (a replay, or a first
// run on lltm's handle) waits for the previous one, on whatever stream:
// they share the workspace. One event per device marks the last use.
class DeviceOrder {
 public:
  template <typename Fn>
  void run(const c10::cuda::CUDAStream& stream, Fn&& fn) {
    const std::lock_guard<std::mutex> lock(mutex_);
    cudaEvent_t& last = last_[stream.device_index()];
    if (last == nullptr) {
      C10_CUDA_CHECK(cudaEventCreateWithFlags(&last, cudaEventDisableTiming));
    } else {
      C10_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), last, 0));
    }
    fn();
    C10_CUDA_CHECK(cudaEventRecord(last, stream.stream()));
  }

 private:
  std::mutex mutex_;
  cudaEvent_t last_[64] = {};
};

DeviceOrder& device_order() {
  static DeviceOrder* instance = new DeviceOrder();  // never destroyed, like the graphs
  return *instance;
}

bool replay_enabled() {
  const char* flag = std::getenv("LLTM_SEQ_GRAPHS");
  return flag == nullptr || std::strcmp(flag, "0") != 0;
}

// Captures `enqueue` on a stream of the pool (a capture needs a stream that
// is not the legacy default one); nothing runs. The GEMMs go to lltm's own
// cuBLAS handle, which the key's first sighting has warmed up with the same
// shapes outside any capture.
cudaGraphExec_t capture(const std::function<void()>& enqueue, c10::DeviceIndex device) {
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
  const c10::cuda::CUDAStreamGuard guard(side);
  const OwnBlasHandle own_handle;
  C10_CUDA_CHECK(cudaStreamBeginCapture(side.stream(), cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    (void)cudaStreamEndCapture(side.stream(), &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  C10_CUDA_CHECK(cudaStreamEndCapture(side.stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  C10_CUDA_CHECK(status);
  return exec;
}

}  // namespace

void run_graphed(GraphKey key, const std::function<void()>& enqueue) {
  const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  if (capturing || !replay_enabled()) {
    enqueue();
    return;
  }
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
  key.push_back(stream.device_index());
  Cache& c = cache();
  std::unique_lock<std::mutex> lock(c.mutex);
  // Launches happen under the cache's lock: no other thread drops (and
  // destroys) the graph meanwhile.
  if (cudaGraphExec_t* exec = c.graphs.find(key)) {
    device_order().run(stream, [&] { C10_CUDA_CHECK(cudaGraphLaunch(*exec, stream.stream())); });
    ++c.stats.replays;
    return;
  }
  if (c.seen.find(key) == nullptr) {  // first sighting: run, no capture yet
    bool unused;
    c.seen.insert(key, true, &unused);
    ++c.stats.eager;
    lock.unlock();
    device_order().run(stream, [&] {
      const OwnBlasHandle own_handle;  // the handle a capture of this key will use
      enqueue();
    });
    return;
  }
  // Second sighting: capture, keep, and launch.
  const cudaGraphExec_t exec = capture(enqueue, stream.device_index());
  ++c.stats.captures;
  cudaGraphExec_t dropped = nullptr;
  if (c.graphs.insert(key, exec, &dropped)) (void)cudaGraphExecDestroy(dropped);  // freed once idle
  device_order().run(stream, [&] { C10_CUDA_CHECK(cudaGraphLaunch(exec, stream.stream())); });
}

GraphStats graph_stats() {
  Cache& c = cache();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

}  // namespace cuda_detail

std::vector<int64_t> fused_cuda_seq_graph_stats() {
  const cuda_detail::GraphStats s = cuda_detail::graph_stats();
  return {s.eager, s.captures, s.replays};
}

}  // namespace lltm
