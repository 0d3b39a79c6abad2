// Autocast rules of the forward operators on CUDA (see autocast.h).
#include "autocast.h"

TORCH_LIBRARY_IMPL(lltm, AutocastCUDA, m) {
  lltm::autocast_detail::register_autocast<c10::DeviceType::CUDA>(m);
}
