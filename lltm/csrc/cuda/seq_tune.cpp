// The measuring planner of the fused CUDA sequence ops (see seq_tune.h).
#include "seq_tune.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "../lltm.h"

namespace lltm {
namespace cuda_detail {
namespace {

thread_local const Plan* current_override = nullptr;

struct Measured {
  Plan plan;
  // The trials' lengths and "label time_us (trial times); ..." for the report; "read from FILE" for a file
  // entry.
  std::string times;
};

struct Store {
  std::mutex mutex;
  std::map<std::string, Measured> classes;
  std::set<std::string> one_plan;  // classes whose model leaves a single candidate: nothing to time
  std::map<std::string, std::string> file_labels;  // key -> label, from LLTM_SEQ_TUNE_CACHE
  std::string file_read;                           // the cache file read so far ("" none)
  int64_t timed = 0, from_file = 0, model_only = 0;
};
Store& store() {
  static Store* instance = new Store();  // never destroyed: plans may be asked for at exit
  return *instance;
}

bool timing_enabled() {
  const char* flag = std::getenv("LLTM_SEQ_TUNE");
  return flag == nullptr || std::strcmp(flag, "0") != 0;
}

// LLTM_SEQ_TUNE_ALL=1: every viable plan of a class is timed, and the
// report gives each one's split and model cost beside its time: the data
// that the model's constants are fitted to (python -m lltm.bench.plan_fit).
bool tune_all() {
  const char* flag = std::getenv("LLTM_SEQ_TUNE_ALL");
  return flag != nullptr && std::strcmp(flag, "1") == 0;
}

const char* cache_file() {
  const char* file = std::getenv("LLTM_SEQ_TUNE_CACHE");
  return file != nullptr && *file != '\0' ? file : nullptr;
}

// T's class: the power of two at or above it (a plan's cost grows with T
// alike for every path, but launch overheads weigh more at short T).
int64_t steps_class(int64_t steps) {
  int64_t c = 1;
  while (c < steps) c *= 2;
  return c;
}

// Everything that sets a class apart, the device by its name and SM count
// (a file may serve another machine of the same kind).
std::string class_key(const Problem& p, int device) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  std::ostringstream os;
  os << "v2|" << prop->name << "|sm" << prop->multiProcessorCount << "|" << p.cell << "|"
     << (p.backward ? "backward" : "forward") << "|elem" << p.elem << (p.is_double ? "d" : "") << "|tc"
     << p.tensor_cores << (p.tf32x3 ? "x3" : "") << "|B" << p.batch << "|S" << p.state << "|T"
     << steps_class(p.steps) << "|" << plan_environment() << (tune_all() ? "all" : "");
  std::string key = os.str();
  std::replace(key.begin(), key.end(), '\t', ' ');
  std::replace(key.begin(), key.end(), '\n', ' ');
  return key;
}

// Lines of the cache file not read yet: "key<TAB>label". Caller holds the lock.
void read_file(Store& s, const char* file) {
  if (s.file_read != file) {
    s.file_labels.clear();
    s.file_read = file;
  }
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    s.file_labels.emplace(line.substr(0, tab), line.substr(tab + 1));  // the first line of a key wins
  }
}

// An exclusive lock on the cache file while a class is looked up, timed and
// appended: processes that start together (torchrun ranks) time a class
// once, and every later process reads that choice.
class FileLock {
 public:
  explicit FileLock(const char* file) {
    if (file == nullptr) return;
    fd_ = ::open(file, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) {
      (void)::flock(fd_, LOCK_UN);
      ::close(fd_);
    }
  }
  void append(const std::string& line) const {
    if (fd_ < 0) return;
    const std::string text = line + "\n";
    (void)!::write(fd_, text.data(), text.size());  // one write: lines of several processes do not mix
  }

 private:
  int fd_ = -1;
};

const Plan* find_label(const std::vector<const Plan*>& plans, const std::string& label) {
  for (const Plan* p : plans) {
    if (plan_label(*p) == label) return p;
  }
  return nullptr;
}

// GPU time of `trial` (µs per run) on the current stream: two warm-up runs
// (the step loop's first sighting runs eagerly, its second captures the
// graph), then the best of three measurements of two runs each. Each
// measurement starts behind one more run, so the device is busy when the
// start event passes and the host's time to queue a run (the grid path's
// zeroed buffers, a graph's lookup) is not counted where the device hides it.
double time_trial(const std::function<void()>& trial) {
  trial();
  trial();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  cudaEvent_t start = nullptr, stop = nullptr;
  C10_CUDA_CHECK(cudaEventCreate(&start));
  C10_CUDA_CHECK(cudaEventCreate(&stop));
  float best = -1.0f;
  try {
    for (int i = 0; i < 3; ++i) {
      trial();
      C10_CUDA_CHECK(cudaEventRecord(start, stream));
      trial();
      trial();
      C10_CUDA_CHECK(cudaEventRecord(stop, stream));
      C10_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      C10_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (best < 0.0f || ms < best) best = ms;
    }
  } catch (...) {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    throw;
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return best * 1e3 / 2;
}

// Steps of the (longer) trial of a problem: its time loop's per-step buffer is B G S elements.
int64_t trial_steps(const Problem& p) { return tune_steps(p.steps, p.batch * p.gates * p.state * p.elem); }

// A plan's time over T steps from its times over `short_steps` and
// `long_steps` < T: the fixed cost of a launch plus a cost per step, both at
// least 0 (the machine's noise may make the two times close or inverted).
double extrapolate_us(double short_us, int64_t short_steps, double long_us, int64_t long_steps,
                      int64_t steps) {
  double per_step = (long_us - short_us) / static_cast<double>(long_steps - short_steps);
  per_step = std::clamp(per_step, 0.0, long_us / static_cast<double>(long_steps));
  return long_us + per_step * static_cast<double>(steps - long_steps);
}

}  // namespace

const Plan* plan_override() { return current_override; }

PlanOverride::PlanOverride(const Plan* plan) : previous_(current_override) { current_override = plan; }
PlanOverride::~PlanOverride() { current_override = previous_; }

std::string plan_label(const Plan& plan) {
  if (plan.path == SeqPath::kLoop) return "loop";
  const Split& s = plan.split;
  std::ostringstream os;
  os << path_name(plan.path) << ":" << s.group << ":" << dot_label(s) << ":nb" << s.per_thread << ":ks"
     << s.ks << ":t" << s.threads;
  if (s.multicast > 1) os << ":mc" << s.multicast;
  return os.str();
}

namespace {

// A plan's split and model cost as LLTM_SEQ_TUNE_ALL's report writes them
// ("{path=grid group=64 rows=8 ... model_us=2842}"): what the model reads.
std::string split_fields(const Plan& plan) {
  const Split& q = plan.split;
  std::ostringstream os;
  os << "{path=" << path_name(plan.path) << " group=" << q.group << " rows=" << q.rows
     << " rows_padded=" << q.rows_padded << " row=" << q.row << " nb=" << q.per_thread << " ks=" << q.ks
     << " threads=" << q.threads << " mma=" << q.mma << " wregs=" << q.w_regs << " mtiles=" << q.mtiles
     << " mstack=" << q.mstack << " ksplit=" << q.ksplit << " waves=" << q.waves << " mc=" << q.multicast
     << " model_us=" << plan.cost_us << "}";
  return os.str();
}

// The model's viable plans (the cheapest of each path, group and dot) within kTuneSpread of its
// cheapest, cheapest first (its own pick first among equals), kTuneCandidates at most: the cheapest
// of each kind, then the next cheapest. The kinds' fits err apart, so the cheapest plans of one kind
// must not crowd out another: at fp16, B = 16, S = 128 four MMA splits within 7% of each other
// hid an FMA split 9% above them whose forward ran 25% faster (docs/benchmarks-history.md,
// section 37), and in strict float32 at B = 64, S = 128 the FMA dot's grid splits hid a cluster
// split with W_h in registers, 12% faster forward and backward (section 38).
// Every viable plan, cheapest first, where `all` (LLTM_SEQ_TUNE_ALL=1).
std::vector<const Plan*> candidates(const Decision& decision, bool all) {
  std::vector<const Plan*> plans{&decision.chosen};
  for (const Plan& c : decision.alternatives) {
    if (c.why_not.empty() && plan_label(c) != plan_label(decision.chosen)) plans.push_back(&c);
  }
  const auto by_cost = [](const Plan* a, const Plan* b) { return a->cost_us < b->cost_us; };
  std::stable_sort(plans.begin(), plans.end(), by_cost);
  if (all) return plans;
  const double limit = plans.front()->cost_us * kTuneSpread;
  plans.erase(std::remove_if(plans.begin(), plans.end(), [&](const Plan* p) { return p->cost_us > limit; }),
              plans.end());
  if (plans.size() <= static_cast<size_t>(kTuneCandidates)) return plans;
  std::vector<const Plan*> picked;
  bool kind_in[kPlanKinds] = {};
  for (const Plan* p : plans) {  // the model's pick is the first: it is always timed
    if (picked.size() >= static_cast<size_t>(kTuneCandidates)) break;
    bool& in = kind_in[static_cast<int>(plan_kind(*p))];
    if (!in) picked.push_back(p), in = true;
  }
  for (const Plan* p : plans) {
    if (picked.size() >= static_cast<size_t>(kTuneCandidates)) break;
    if (std::find(picked.begin(), picked.end(), p) == picked.end()) picked.push_back(p);
  }
  std::stable_sort(picked.begin(), picked.end(), by_cost);
  return picked;
}

}  // namespace

const Plan* measured_plan(const Problem& problem, const Decision& decision, int device,
                          const TrialFactory& make_trial) {
  if (!timing_enabled()) return nullptr;
  // Every call: one lookup of its class; the candidates are weighed only on a class's first call.
  Store& s = store();
  const std::string key = class_key(problem, device);
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    const auto found = s.classes.find(key);
    if (found != s.classes.end()) return &found->second.plan;
    if (s.one_plan.count(key) != 0) return nullptr;
  }
  const bool all = tune_all();
  const std::vector<const Plan*> plans = candidates(decision, all);
  if (plans.size() < 2) {
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.one_plan.insert(key);
    return nullptr;
  }
  const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  if (capturing || at::globalContext().deterministicAlgorithms()) {
    const std::lock_guard<std::mutex> lock(s.mutex);
    ++s.model_only;
    return nullptr;
  }
  // One class is timed at a time in the process (and, with a cache file, on the machine).
  static std::mutex timing;
  const std::lock_guard<std::mutex> one_at_a_time(timing);
  const char* file = cache_file();
  const FileLock file_lock(file);
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    const auto found = s.classes.find(key);  // timed by another thread meanwhile
    if (found != s.classes.end()) return &found->second.plan;
    if (file != nullptr) {
      read_file(s, file);
      const auto entry = s.file_labels.find(key);
      const Plan* listed = entry == s.file_labels.end() ? nullptr : find_label(plans, entry->second);
      if (listed != nullptr) {
        ++s.from_file;
        return &s.classes.emplace(key, Measured{*listed, std::string("read from ") + file})
                    .first->second.plan;
      }
    }
  }
  // The trials: n steps, and n/2 where T is longer (the time at T extrapolated from both).
  const int64_t n = trial_steps(problem);
  const bool two = n < problem.steps && n >= 2;
  std::function<void()> trial_long, trial_short;
  try {
    trial_long = make_trial(n);
    if (two) trial_short = make_trial(n / 2);
  } catch (const c10::Error&) {  // no memory for the trial's copies: the model decides this call
    (void)cudaGetLastError();
    return nullptr;
  }
  std::vector<double> times, long_times, short_times;
  for (const Plan* p : plans) {
    const PlanOverride use(p);
    double us = -1.0, long_us = -1.0, short_us = -1.0;
    try {
      long_us = time_trial(trial_long);
      if (two) short_us = time_trial(trial_short);
      us = two ? extrapolate_us(short_us, n / 2, long_us, n, problem.steps) : long_us;
    } catch (const c10::Error&) {
      (void)cudaGetLastError();  // a plan that does not launch here is not a candidate
    }
    times.push_back(us);
    long_times.push_back(long_us);
    short_times.push_back(short_us);
  }
  // The fastest plan, unless the model's pick (the first) is within kTuneMargin of it.
  size_t best = 0;
  for (size_t i = 1; i < plans.size(); ++i) {
    if (times[i] >= 0 && (times[best] < 0 || times[i] < times[best])) best = i;
  }
  if (times[best] < 0) return nullptr;
  if (times[0] >= 0 && times[0] * (1.0 - kTuneMargin) <= times[best]) best = 0;
  std::ostringstream report;
  const auto us = [](double t) { return static_cast<int64_t>(t + 0.5); };
  report << "timed over " << (two ? std::to_string(n / 2) + " and " : std::string()) << n << " steps";
  if (two) report << ", at T=" << problem.steps;
  report << ": ";
  for (size_t i = 0; i < plans.size(); ++i) {
    report << (i ? "; " : "") << plan_label(*plans[i]) << " ";
    if (all) report << split_fields(*plans[i]) << " ";
    if (times[i] < 0) {
      report << "failed";
    } else {
      report << us(times[i]) << " us";
      if (two) report << " (" << us(short_times[i]) << ", " << us(long_times[i]) << ")";
    }
  }
  const std::lock_guard<std::mutex> lock(s.mutex);
  ++s.timed;
  file_lock.append(key + "\t" + plan_label(*plans[best]));
  return &s.classes.emplace(key, Measured{*plans[best], report.str()}).first->second.plan;
}

std::string measured_report(const Problem& problem, int device) {
  Store& s = store();
  const std::string key = class_key(problem, device);
  const std::lock_guard<std::mutex> lock(s.mutex);
  const auto found = s.classes.find(key);
  if (found == s.classes.end()) return "";
  return "\nmeasured: " + std::string(path_name(found->second.plan.path)) + " (" +
         plan_label(found->second.plan) + "; " + found->second.times + ")";
}

std::vector<int64_t> tune_stats() {
  Store& s = store();
  const std::lock_guard<std::mutex> lock(s.mutex);
  return {s.timed, s.from_file, s.model_only};
}

}  // namespace cuda_detail

std::vector<int64_t> fused_cuda_seq_tune_stats() { return cuda_detail::tune_stats(); }

}  // namespace lltm
