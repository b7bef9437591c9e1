// What the native code of shmcomm/torch_ops knows about tensors (tensors.cpp): the core's dtype
// code of a torch dtype, and which tensors the core takes by their memory as they are.
#pragma once

#include <ATen/core/Tensor.h>

namespace shmcomm {

// The core's dtype code (an index into _core.DTYPE_NAMES) of `type`, or -1 where the core does
// not take it by memory. The first call reads the names from shmcomm._core: it needs the GIL.
int dtype_code(at::ScalarType type);

// The tensors the core takes by their memory as they are (the rule of _core.tensor_is_direct).
bool direct(const at::Tensor &t);

}  // namespace shmcomm
