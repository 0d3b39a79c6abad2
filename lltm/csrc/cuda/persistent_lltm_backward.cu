// The backward persistent kernels of the LLTM cell (persistent_launch.cuh).
#include "persistent_launch.cuh"

LLTM_PERSISTENT_BACKWARD(lltm::cells::LLTM)
