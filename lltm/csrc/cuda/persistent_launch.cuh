// How the persistent kernels are launched (the host side of
// seq_persistent.h): the kernel instance for a plan, the device's limits for
// the planner, the plan cache, and the launch of one plan in waves. A
// template over the cell, instantiated once per cell and direction by the
// persistent_<cell>_<direction>.cu files (LLTM_PERSISTENT_FORWARD / _BACKWARD).
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "../lltm.h"
#include "../precision.h"
#include "launch_utils.h"
#include "persistent_kernels.cuh"
#include "seq_persistent.h"
#include "seq_plan.h"
#include "seq_tune.h"

namespace lltm {
namespace cuda_detail {

namespace {

// ------------------------------------------------------------------ host

template <typename Params>
using Kernel = void (*)(Params);

template <typename Cell, typename scalar_t, bool kBackward, int NB, DotKind kDot, int kRegW,
          template <typename> class Exchange>
constexpr auto kernel_instance() {
  if constexpr (kBackward) {
    return &seq_backward_persistent_kernel<Cell, scalar_t, NB, kDot, kRegW, Exchange>;
  } else {
    return &seq_forward_persistent_kernel<Cell, scalar_t, NB, kDot, kRegW, Exchange>;
  }
}

template <typename Cell, typename scalar_t, bool kBackward, DotKind kDot, int kRegW,
          template <typename> class Exchange>
auto kernel_for_rows(int per_thread) {
  switch (per_thread) {
    case 4:
      return kernel_instance<Cell, scalar_t, kBackward, 4, kDot, kRegW, Exchange>();
    case 2:
      return kernel_instance<Cell, scalar_t, kBackward, 2, kDot, kRegW, Exchange>();
    default:
      return kernel_instance<Cell, scalar_t, kBackward, 1, kDot, kRegW, Exchange>();
  }
}

// The grid path's multicast kernels exist for the MMA dot only (its steps
// are short enough for the reload to weigh; seq_plan.cpp's grid_multicast).
template <typename Cell, typename scalar_t, bool kBackward, DotKind kDot, int kRegW>
auto kernel_for_dot(SeqPath path, int per_thread, bool multicast) {
  if (path == SeqPath::kCluster)
    return kernel_for_rows<Cell, scalar_t, kBackward, kDot, kRegW, ClusterExchange>(per_thread);
  if constexpr (kDot != DotKind::kFma) {
    if (multicast)
      return kernel_for_rows<Cell, scalar_t, kBackward, kDot, kRegW, MulticastExchange>(per_thread);
  }
  return kernel_for_rows<Cell, scalar_t, kBackward, kDot, kRegW, GridExchange>(per_thread);
}

// The MMA kernels with A held in registers: one row a thread group, half
// types (seq_plan.cpp's mma_holds_a); the backward's hold a k step of each
// gate segment at least.
template <typename Cell, typename scalar_t, bool kBackward>
constexpr bool kHasHeldA = sizeof(scalar_t) == 2 && (!kBackward || Cell::kGates <= kMmaRegFragments);

template <typename Cell, typename scalar_t, bool kBackward, int kHeld>
auto held_kernel(SeqPath path, bool multicast) {
  constexpr DotKind kMma = DotKind::kMma;
  if (path == SeqPath::kCluster)
    return kernel_instance<Cell, scalar_t, kBackward, 1, kMma, kHeld, ClusterExchange>();
  return multicast ? kernel_instance<Cell, scalar_t, kBackward, 1, kMma, kHeld, MulticastExchange>()
                   : kernel_instance<Cell, scalar_t, kBackward, 1, kMma, kHeld, GridExchange>();
}

// The instantiation for a path, NB batch rows per thread group, the dot,
// W_hh's place (seq_plan.h's w_place: 0 shared memory, 1 registers, 2 the
// MMA dot's first k steps in registers) and the grid's multicast (double
// has no MMA kernels; W_hh in registers: the FMA dot's chunks for float,
// the MMA dot's A fragments where kHasHeldA).
template <typename Cell, typename scalar_t, bool kBackward>
auto kernel_for(SeqPath path, int per_thread, DotKind dot, int place, bool multicast = false) {
  const bool mma = dot != DotKind::kFma;
  if constexpr (kHasHeldA<Cell, scalar_t, kBackward>) {
    if (mma && place != 0) {
      TORCH_CHECK(per_thread == 1, "lltm: internal error: A held in registers is a plan of one row a thread");
      return place == 2 ? held_kernel<Cell, scalar_t, kBackward, 2>(path, multicast)
                        : held_kernel<Cell, scalar_t, kBackward, 1>(path, multicast);
    }
  }
  // 3xTF32: float32's backward only (precision.h's split_tf32_steps).
  if constexpr (std::is_same_v<scalar_t, float> && kBackward) {
    if (dot == DotKind::kMma3xTf32)
      return kernel_for_dot<Cell, scalar_t, kBackward, DotKind::kMma3xTf32, 0>(path, per_thread, multicast);
  }
  TORCH_CHECK(dot != DotKind::kMma3xTf32,
              "lltm: internal error: a plan of the 3xTF32 dot outside float32's backward");
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (mma) return kernel_for_dot<Cell, scalar_t, kBackward, DotKind::kMma, 0>(path, per_thread, multicast);
  }
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (place != 0)
      return kernel_for_dot<Cell, scalar_t, kBackward, DotKind::kFma, 1>(path, per_thread, false);
  }
  return kernel_for_dot<Cell, scalar_t, kBackward, DotKind::kFma, 0>(path, per_thread, false);
}

// A split's dot for a problem, as the kernels take it.
inline DotKind dot_of(const Problem& p, const Split& s) {
  return !s.mma ? DotKind::kFma : p.tf32x3 ? DotKind::kMma3xTf32 : DotKind::kMma;
}

// The virtual architecture the running device's code of `kernel` was
// compiled for (ptxVersion: 90 for a body built for sm_90 or JIT-compiled
// from compute_90 PTX, 80 for compute_80 PTX run on a newer GPU), 0 when
// the build has no code for this device. Asked once per kernel and device.
int code_arch(const void* kernel, int device) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(kernel, device);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  cudaFuncAttributes attr{};
  int arch = 0;
  if (cudaFuncGetAttributes(&attr, kernel) == cudaSuccess) {
    arch = attr.ptxVersion;
  } else {
    (void)cudaGetLastError();
  }
  cache.emplace(key, arch);
  return arch;
}

// The launch configuration of a split (`attr` holds its cluster shape or
// the cooperative flag).
cudaLaunchConfig_t launch_config(SeqPath path, const Split& split, cudaStream_t stream,
                                 cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid_size(int64_t(split.group) * split.per_wave));
  config.blockDim = dim3(split.threads);
  config.dynamicSmemBytes = split.smem;
  config.stream = stream;
  if (path == SeqPath::kCluster) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = split.group;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
  } else {
    // Co-residency of every CTA: a group spins on its arrival counter.
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
  }
  config.attrs = &attr;
  config.numAttrs = 1;
  return config;
}

// The configuration of one wave of the grid path in clusters of
// `multicast` CTAs (MulticastExchange's shared reload), cooperative as without
// them; `attrs` holds its two attributes.
cudaLaunchConfig_t multicast_config(const Split& wave, int multicast, cudaStream_t stream,
                                    cudaLaunchAttribute (&attrs)[2]) {
  cudaLaunchConfig_t config = launch_config(SeqPath::kGrid, wave, stream, attrs[0]);
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = static_cast<unsigned>(multicast);
  attrs[1].val.clusterDim.y = 1;
  attrs[1].val.clusterDim.z = 1;
  config.attrs = attrs;
  config.numAttrs = 2;
  return config;
}

// How many clusters of `multicast` CTAs of this shape the device holds at
// once (0 where the query fails); a wave of the grid path needs all of its
// CTAs resident. GPCs hold whole clusters: 66 of 2 fit a 132-SM H100 or
// H200, but 30 of 4 (docs/benchmarks-history.md, section 26); the planner
// asks this (decide) and plans fewer chunks a wave.
// Asked once per kernel, device and shape.
template <typename Params>
int multicast_room(Kernel<Params> kernel, const Split& split, int multicast, int device, size_t smem_limit) {
  using Key = std::tuple<const void*, int, unsigned, size_t, int>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  const Key key{reinterpret_cast<const void*>(kernel), device, static_cast<unsigned>(split.threads),
                split.smem, multicast};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  Split one = split;  // one cluster, clusters only: the occupancy query's shape
  one.group = multicast;
  one.per_wave = 1;
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t config = multicast_config(one, multicast, nullptr, attrs);
  config.attrs = attrs + 1;
  config.numAttrs = 1;
  int clusters = 0;
  // The kernel's dynamic shared memory limit raised as for the plain kernels (resident_chunks).
  const bool asked = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem_limit)) == cudaSuccess &&
                     cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) == cudaSuccess;
  if (!asked) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  cache.emplace(key, clusters);
  return clusters;
}

// How many batch chunks of this launch shape run at once on the device (0:
// none); asked once per kernel, device and shape.
template <typename Params>
int resident_chunks(Kernel<Params> kernel, SeqPath path, const Split& split, int device, size_t smem_limit,
                    int sms) {
  using Key = std::tuple<const void*, int, int, unsigned, size_t>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  const Key key{reinterpret_cast<const void*>(kernel), device, split.group,
                static_cast<unsigned>(split.threads), split.smem};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  int chunks = 0;
  // The dynamic shared memory limit is raised to the device's maximum once,
  // so every split of this kernel can launch.
  bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem_limit)) == cudaSuccess;
  if (ok && path == SeqPath::kCluster) {
    ok = split.group <= 8 ||
         cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
    Split one = split;  // the shape of one cluster
    one.per_wave = 1;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t config = launch_config(path, one, nullptr, attr);
    ok = ok && cudaOccupancyMaxActiveClusters(&chunks, kernel, &config) == cudaSuccess;
  } else if (ok) {
    int per_sm = 0;
    ok = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, split.threads, split.smem) ==
         cudaSuccess;
    chunks = per_sm * sms / split.group;
  }
  if (!ok) {
    (void)cudaGetLastError();
    chunks = 0;
  }
  cache.emplace(key, chunks);
  return chunks;
}

// Clusters of `multicast` CTAs of the grid path's multicast kernel for this
// split that the device holds at once (the MMA dot's kernels only).
template <typename Cell, typename scalar_t, bool kBackward>
int grid_multicast_room(const Problem& problem, const Split& split, int multicast, int device,
                        size_t smem_limit) {
  return multicast_room(kernel_for<Cell, scalar_t, kBackward>(SeqPath::kGrid, split.per_thread,
                                                              dot_of(problem, split), w_place(split), true),
                        split, multicast, device, smem_limit);
}

// The planner's view of the device and of this build's code for it.
template <typename Cell, typename scalar_t, bool kBackward>
DeviceLimits device_limits(int device) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  DeviceLimits d;
  d.sms = prop->multiProcessorCount;
  d.smem_per_block = prop->sharedMemPerBlockOptin;
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) == cudaSuccess && khz > 0) {
    d.clock_ghz = khz * 1e-6;
  } else {
    (void)cudaGetLastError();
  }
  auto arch = [&](SeqPath path, bool mma, bool multicast = false) {
    const DotKind dot = mma ? DotKind::kMma : DotKind::kFma;
    return code_arch(
        reinterpret_cast<const void*>(kernel_for<Cell, scalar_t, kBackward>(path, 1, dot, 0, multicast)),
        device);
  };
  d.cluster_kernels = prop->major >= 9 && arch(SeqPath::kCluster, false) >= 90;
  d.grid_kernels = prop->cooperativeLaunch != 0 && arch(SeqPath::kGrid, false) > 0;
  d.mma_kernels = !std::is_same_v<scalar_t, double> && prop->major >= 8 && arch(SeqPath::kGrid, true) >= 80;
  // Hopper only: ptxas advises that later architectures run sm_90's multicast copies slowly.
  d.multicast = d.mma_kernels && prop->major == 9 && arch(SeqPath::kGrid, true, true) >= 90;
  return d;
}

// The decision for one problem on one device, made once per problem and
// setting (the environment's overrides and the pass's float32 products, TF32 or 3xTF32, are in the key;
// each cell, dtype and direction has a cache of its own).
template <typename Cell, typename scalar_t, bool kBackward>
const Decision& decide(const Problem& problem, int device) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool, bool, std::string>;
  static std::mutex mutex;
  static std::map<Key, Decision> cache;
  const Key key{problem.steps,        problem.batch,  problem.state,     device,
                problem.tensor_cores, problem.tf32x3, plan_environment()};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = cache.find(key);
    if (found != cache.end()) return found->second;
  }
  const DeviceLimits limits = device_limits<Cell, scalar_t, kBackward>(device);
  // Multicast clusters: GPCs hold whole clusters, so fewer CTAs may fit
  // than without them (30 clusters of 4 of a 132-SM H100's grid kernels).
  const ResidentChunks resident = [&](SeqPath path, const Split& split) {
    const int plain = resident_chunks(
        kernel_for<Cell, scalar_t, kBackward>(path, split.per_thread, dot_of(problem, split), w_place(split)),
        path, split, device, limits.smem_per_block, limits.sms);
    if (path != SeqPath::kGrid || split.multicast <= 1) return plain;
    const int room = grid_multicast_room<Cell, scalar_t, kBackward>(problem, split, split.multicast, device,
                                                                    limits.smem_per_block);
    return std::min(plain, room * split.multicast / split.group);
  };
  Decision decision = plan_time_loop(problem, limits, resident);
  const std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() > 4096) cache.clear();  // many distinct shapes: start over
  return cache.emplace(key, std::move(decision)).first->second;
}

template <typename Cell, typename scalar_t>
Problem problem_of(bool backward, int64_t steps, int64_t batch, int64_t state) {
  Problem p;
  p.cell = Cell::kName;
  p.gates = Cell::kGates;
  p.backward = backward;
  p.steps = steps;
  p.batch = batch;
  p.state = state;
  p.elem = sizeof(scalar_t);
  p.is_double = std::is_same_v<scalar_t, double>;
  // float32 on tensor cores where lltm's mode allows TF32 in this pass, or
  // the MMA dot as 3xTF32 in the accurate mode (precision.h)
  p.tensor_cores = sizeof(scalar_t) == 2 || (std::is_same_v<scalar_t, float> && tf32_products(backward));
  p.tf32x3 = std::is_same_v<scalar_t, float> && split_tf32_steps(backward);
  return p;
}

// Launches the persistent kernel of the decided plan; false when the plan is
// the step loop.
template <typename Cell, typename scalar_t, bool kBackward, typename Params>
bool launch(const Params& base, const at::Tensor& like) {
  const int device = like.get_device();
  const Problem problem = problem_of<Cell, scalar_t>(kBackward, base.steps, base.batch, base.state);
  // The measuring planner's choice for this call, or a trial of it (seq_tune.h); else the model's.
  const Plan* measured = plan_override();
  const Plan& plan =
      measured != nullptr ? *measured : decide<Cell, scalar_t, kBackward>(problem, device).chosen;
  if (plan.path == SeqPath::kLoop) return false;
  const Split& split = plan.split;
  TORCH_CHECK(held_split_fits(split, kBackward, Cell::kGates, base.state, int(sizeof(scalar_t))),
              "lltm: internal error: a plan holds A fragments the held kernels cannot run (",
              path_name(plan.path), " group ", split.group, ", rows ", split.rows_padded, ", ", split.mtiles,
              " tiles in tasks of ", split.mstack, ", k in ", split.ksplit, " slices, ", split.threads,
              " threads); LLTM_SEQ_DOT=mma-smem runs the same products from shared memory");
  Params params = base;
  params.group = split.group;
  params.units = split.units;
  params.rows = split.rows;
  params.rows_padded = split.rows_padded;
  params.ks = split.ks;
  params.row = split.row;
  params.mtiles = split.mtiles;
  params.mstack = split.mstack;
  params.ksplit = split.ksplit;
  params.w_rows = split.w_rows;
  at::Tensor workspace;
  if (plan.path == SeqPath::kGrid) {
    // The exchange's buffers (2, rows_per B, row) and one arrival counter a
    // chunk, in one allocation zeroed by one fill (a launch less on the
    // stream): padding past S is read as 0, and the counters start at 0.
    const int64_t rows_per = kBackward ? Cell::kGates : 1;
    const int64_t buffer_bytes = 2 * rows_per * base.batch * split.row * int64_t(sizeof(scalar_t));
    const int64_t counters_at = ceil_div(buffer_bytes, 16) * 16;  // the counters 16-byte aligned
    workspace =
        at::zeros({counters_at + split.chunks * int64_t(sizeof(unsigned))}, like.options().dtype(at::kByte));
    unsigned char* bytes = workspace.mutable_data_ptr<unsigned char>();
    params.exchange = reinterpret_cast<scalar_t*>(bytes);
    params.arrivals = reinterpret_cast<unsigned*>(bytes + counters_at);
  }
  // The grid's multicast clusters where the device places them all (else
  // the plain kernel, each CTA copying its own rows: the same results). The
  // planner asked the device already (decide); this guards plans made
  // elsewhere.
  params.multicast = plan.path == SeqPath::kGrid ? split.multicast : 1;
  const int ctas = split.group * split.per_wave;
  const size_t smem_limit = at::cuda::getDeviceProperties(device)->sharedMemPerBlockOptin;
  auto room_for = [&](int m) {
    return grid_multicast_room<Cell, scalar_t, kBackward>(problem, split, m, device, smem_limit);
  };
  if (params.multicast > 1 && int64_t(room_for(params.multicast)) * params.multicast < ctas)
    params.multicast = 1;
  const Kernel<Params> kernel = kernel_for<Cell, scalar_t, kBackward>(
      plan.path, split.per_thread, dot_of(problem, split), w_place(split), params.multicast > 1);
  const char* asked = std::getenv("LLTM_SEQ_MULTICAST");
  const int asked_m = asked != nullptr && *asked != '\0' ? std::atoi(asked) : 0;
  // (The setting is the MMA kernels'; the FMA dot's plans, which the tuner
  // may try beside them, have none to run.)
  if (plan.path == SeqPath::kGrid && split.mma && asked_m > 0 && asked_m != params.multicast) {
    const bool clusters = asked_m > 1 && split.group % asked_m == 0;
    TORCH_WARN_ONCE("lltm: LLTM_SEQ_MULTICAST=", asked,
                    " cannot run here; the grid path runs with clusters of ", params.multicast,
                    " (multicast needs sm_90 code, a size that divides the group of ", split.group,
                    " CTAs, and room for all ", ctas, " CTAs of a wave in such clusters at once",
                    clusters ? "; the device holds " + std::to_string(room_for(asked_m)) + " clusters of " +
                                   std::to_string(asked_m) + " of this kernel (" +
                                   std::to_string(split.smem) + " bytes of shared memory a CTA) at once"
                             : std::string(),
                    ")");
  }
  // One launch per wave of chunks, in turn on the stream (chunks are
  // independent; every CTA of a launch is resident at once).
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  for (int64_t chunk0 = 0; chunk0 < split.chunks; chunk0 += split.per_wave) {
    Split wave = split;
    wave.per_wave = static_cast<int>(std::min<int64_t>(split.per_wave, split.chunks - chunk0));
    params.chunk0 = chunk0;
    cudaLaunchAttribute attrs[2];
    const cudaLaunchConfig_t config = params.multicast > 1
                                          ? multicast_config(wave, params.multicast, stream, attrs)
                                          : launch_config(plan.path, wave, stream, attrs[0]);
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params));
  }
  return true;
}

// A tensor's data, or null when undefined.
template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}
template <typename T>
T* mutable_or_null(const at::Tensor& t) {
  return t.defined() ? t.mutable_data_ptr<T>() : nullptr;
}

}  // namespace

// One dtype's part of a cell's persistent entry points in one direction: the
// launch of its plan and the planner's report. Defined out of the class so
// that a build may instantiate each dtype in a file of its own (a cell of
// lltm.cells.define: LLTM_PERSISTENT_DTYPE below) and declare the others
// extern where the entry points dispatch on the dtype.
template <typename Cell, typename scalar_t, bool kBackward>
struct PersistentOf {
  using Params = std::conditional_t<kBackward, BackwardParams<scalar_t>, ForwardParams<scalar_t>>;
  static bool launch(const Params& params, const at::Tensor& like);
  static std::string plan(int64_t steps, int64_t batch, int64_t state, int device);
  static ModelDecision decision(int64_t steps, int64_t batch, int64_t state, int device);
};

template <typename Cell, typename scalar_t, bool kBackward>
bool PersistentOf<Cell, scalar_t, kBackward>::launch(const Params& params, const at::Tensor& like) {
  return cuda_detail::launch<Cell, scalar_t, kBackward>(params, like);
}

template <typename Cell, typename scalar_t, bool kBackward>
std::string PersistentOf<Cell, scalar_t, kBackward>::plan(int64_t steps, int64_t batch, int64_t state,
                                                          int device) {
  const Problem problem = problem_of<Cell, scalar_t>(kBackward, steps, batch, state);
  return describe(problem, decide<Cell, scalar_t, kBackward>(problem, device)) +
         measured_report(problem, device);
}

template <typename Cell, typename scalar_t, bool kBackward>
ModelDecision PersistentOf<Cell, scalar_t, kBackward>::decision(int64_t steps, int64_t batch, int64_t state,
                                                                int device) {
  const Problem problem = problem_of<Cell, scalar_t>(kBackward, steps, batch, state);
  return {problem, decide<Cell, scalar_t, kBackward>(problem, device)};
}

template <typename Cell>
bool rnn_forward_persistent(const at::Tensor& zx, const at::Tensor& saved, const RowMajor& w_hh,
                            const at::Tensor& b_ih, const at::Tensor& b_hh,
                            const std::vector<RowMajor>& state0, const at::Tensor& lengths,
                            const at::Tensor& output, const std::vector<at::Tensor>& state_n) {
  const int64_t steps = zx.size(0), batch = zx.size(1), state = output.size(2);
  bool launched = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, zx.scalar_type(), "lltm_rnn_forward_persistent",
                                  [&] {
                                    ForwardParams<scalar_t> p{};
                                    p.zx = zx.const_data_ptr<scalar_t>();
                                    p.saved = saved.mutable_data_ptr<scalar_t>();
                                    p.w = w_hh.data<scalar_t>();
                                    p.w_ld = w_hh.ld;
                                    p.b_ih = data_or_null<scalar_t>(b_ih);
                                    p.b_hh = data_or_null<scalar_t>(b_hh);
                                    for (int k = 0; k < Cell::kStates; ++k) {
                                      p.state0[k] = state0[k].data<scalar_t>();
                                      p.state0_ld[k] = state0[k].ld;
                                      p.state_n[k] = state_n[k].mutable_data_ptr<scalar_t>();
                                    }
                                    p.lengths = data_or_null<int64_t>(lengths);
                                    p.output = output.mutable_data_ptr<scalar_t>();
                                    p.steps = steps;
                                    p.batch = batch;
                                    p.state = static_cast<int>(state);
                                    launched = PersistentOf<Cell, scalar_t, false>::launch(p, zx);
                                  });
  return launched;
}

template <typename Cell>
bool rnn_backward_persistent(const at::Tensor& grad_output, const std::vector<at::Tensor>& grad_state_n,
                             const RowMajor& w_hh, const at::Tensor& saved, const at::Tensor& output,
                             const at::Tensor& states, const std::vector<RowMajor>& state0,
                             const at::Tensor& lengths, const at::Tensor& dzx, const at::Tensor& dzh,
                             const std::vector<at::Tensor>& grad_state0, const at::Tensor& bias_rows) {
  const int64_t steps = output.size(0), batch = output.size(1), state = output.size(2);
  bool launched = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, output.scalar_type(), "lltm_rnn_backward_persistent", [&] {
        BackwardParams<scalar_t> p{};
        p.grad_output = data_or_null<scalar_t>(grad_output);
        for (int k = 0; k < Cell::kStates; ++k) {
          p.grad_state_n[k] = data_or_null<scalar_t>(grad_state_n[k]);
          p.state0[k] = state0[k].data<scalar_t>();
          p.state0_ld[k] = state0[k].ld;
          p.grad_state0[k] = mutable_or_null<scalar_t>(grad_state0[k]);
        }
        p.w = w_hh.data<scalar_t>();
        p.w_ld = w_hh.ld;
        p.saved = saved.const_data_ptr<scalar_t>();
        p.output = output.const_data_ptr<scalar_t>();
        p.states = data_or_null<scalar_t>(states);
        p.lengths = data_or_null<int64_t>(lengths);
        p.dzx = dzx.mutable_data_ptr<scalar_t>();
        p.dzh = mutable_or_null<scalar_t>(dzh);
        using acc_t = at::opmath_type<scalar_t>;
        for (int64_t q = 0; bias_rows.defined() && q < bias_rows.size(0); ++q) {
          p.bias_rows[q] = bias_rows.mutable_data_ptr<acc_t>() + q * bias_rows.stride(0);
        }
        p.steps = steps;
        p.batch = batch;
        p.state = static_cast<int>(state);
        launched = PersistentOf<Cell, scalar_t, true>::launch(p, output);
      });
  return launched;
}

template <typename Cell, bool kBackward>
std::string rnn_plan(int64_t steps, int64_t batch, int64_t state, c10::ScalarType dtype, int device) {
  std::string report;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "lltm_fused_cuda_seq_plan", [&] {
    report = PersistentOf<Cell, scalar_t, kBackward>::plan(steps, batch, state, device);
  });
  return report;
}

template <typename Cell, bool kBackward>
ModelDecision rnn_decision(int64_t steps, int64_t batch, int64_t state, c10::ScalarType dtype, int device) {
  ModelDecision out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "lltm_fused_cuda_seq_decision", [&] {
    out = PersistentOf<Cell, scalar_t, kBackward>::decision(steps, batch, state, device);
  });
  return out;
}

}  // namespace cuda_detail
}  // namespace lltm

// One explicit instantiation of a cell's persistent entry points per
// direction, each in a file of its own (persistent_<cell>_<direction>.cu), so
// that the cells' and directions' kernels compile in parallel.
#define LLTM_PERSISTENT_FORWARD(Cell)                                                                \
  namespace lltm::cuda_detail {                                                                      \
  template bool rnn_forward_persistent<Cell>(const at::Tensor&, const at::Tensor&, const RowMajor&,  \
                                             const at::Tensor&, const at::Tensor&,                   \
                                             const std::vector<RowMajor>&, const at::Tensor&,        \
                                             const at::Tensor&, const std::vector<at::Tensor>&);     \
  template std::string rnn_plan<Cell, false>(int64_t, int64_t, int64_t, c10::ScalarType, int);       \
  template ModelDecision rnn_decision<Cell, false>(int64_t, int64_t, int64_t, c10::ScalarType, int); \
  }
#define LLTM_PERSISTENT_BACKWARD(Cell)                                                                 \
  namespace lltm::cuda_detail {                                                                        \
  template bool rnn_backward_persistent<Cell>(const at::Tensor&, const std::vector<at::Tensor>&,       \
                                              const RowMajor&, const at::Tensor&, const at::Tensor&,   \
                                              const at::Tensor&, const std::vector<RowMajor>&,         \
                                              const at::Tensor&, const at::Tensor&, const at::Tensor&, \
                                              const std::vector<at::Tensor>&, const at::Tensor&);      \
  template std::string rnn_plan<Cell, true>(int64_t, int64_t, int64_t, c10::ScalarType, int);          \
  template ModelDecision rnn_decision<Cell, true>(int64_t, int64_t, int64_t, c10::ScalarType, int);    \
  }

// A build that splits a cell's persistent kernels by dtype (a cell of
// lltm.cells.define): LLTM_PERSISTENT_EXTERN(Cell) before the entry points
// (LLTM_PERSISTENT_FORWARD / _BACKWARD, which then dispatch only), and
// LLTM_PERSISTENT_DTYPE(Cell, backward, scalar_t) in a file per direction
// and dtype, compiled in parallel.
#define LLTM_PERSISTENT_DTYPE(Cell, kBackward, scalar_t) \
  template struct lltm::cuda_detail::PersistentOf<Cell, scalar_t, kBackward>;
#define LLTM_PERSISTENT_EXTERN_ONE(Cell, kBackward)                                   \
  extern template struct lltm::cuda_detail::PersistentOf<Cell, double, kBackward>;    \
  extern template struct lltm::cuda_detail::PersistentOf<Cell, float, kBackward>;     \
  extern template struct lltm::cuda_detail::PersistentOf<Cell, c10::Half, kBackward>; \
  extern template struct lltm::cuda_detail::PersistentOf<Cell, c10::BFloat16, kBackward>;
#define LLTM_PERSISTENT_EXTERN(Cell)      \
  LLTM_PERSISTENT_EXTERN_ONE(Cell, false) \
  LLTM_PERSISTENT_EXTERN_ONE(Cell, true)
