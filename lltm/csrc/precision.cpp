// lltm's float32 precision setting (precision.h): the functions behind the
// operators that set and read it (declared in ops.cpp).
#include "precision.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <string>

namespace lltm {
namespace {

std::atomic<int64_t> setting{-1};

}  // namespace

void set_fp32_precision(c10::string_view mode) {
  const std::string m(mode);
  int64_t value;
  if (m.empty()) {
    value = -1;
  } else if (m == "ieee") {
    value = static_cast<int64_t>(Fp32Mode::kIeee);
  } else if (m == "tf32") {
    value = static_cast<int64_t>(Fp32Mode::kTf32);
  } else if (m == "accurate") {
    value = static_cast<int64_t>(Fp32Mode::kAccurate);
  } else {
    TORCH_CHECK_VALUE(false, "lltm::_set_fp32_precision: mode '", m,
                      "' is not one of 'ieee', 'tf32', 'accurate' (or '' to follow torch)");
  }
  setting.store(value);
}

int64_t fp32_precision_setting() { return setting.load(); }

}  // namespace lltm
