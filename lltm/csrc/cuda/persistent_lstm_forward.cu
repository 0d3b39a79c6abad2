// The forward persistent kernels of the LSTM cell (persistent_launch.cuh).
#include "persistent_launch.cuh"

LLTM_PERSISTENT_FORWARD(lltm::cells::LSTM)
