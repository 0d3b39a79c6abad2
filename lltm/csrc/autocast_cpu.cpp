// Autocast rules of the forward operators on the CPU (see autocast.h):
// under torch.autocast("cpu", dtype=torch.bfloat16) the cell and the layer
// run in bfloat16, so they take the bfloat16 activations of the layers
// around them instead of rejecting a dtype mix with their float32 weights.
#include "autocast.h"

TORCH_LIBRARY_IMPL(lltm, AutocastCPU, m) {
  lltm::autocast_detail::register_autocast<c10::DeviceType::CPU>(m);
}
