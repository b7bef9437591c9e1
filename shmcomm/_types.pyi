"""Type aliases of shmcomm's annotations and stubs (a stub-only module: nothing imports it at
runtime; annotations name it under ``typing.TYPE_CHECKING``)."""
from typing import Any, Protocol

import numpy as np
from typing_extensions import Buffer, TypeAlias

from shmcomm._core import ReduceOp

class TensorLike(Protocol):
    """What shmcomm reads of a torch CPU tensor: torch.Tensor matches it structurally, so
    type checking needs no torch."""
    def data_ptr(self) -> int: ...
    def element_size(self) -> int: ...
    def numel(self) -> int: ...
    def is_contiguous(self) -> bool: ...

# What every array argument takes: a numpy array, a torch CPU tensor, or any buffer-protocol
# object (memoryview, bytearray, array.array, ...). C-contiguity and, for outputs, writability
# are checked at run time. Unlike numpy.typing.ArrayLike, no lists or scalars.
Array: TypeAlias = np.ndarray[Any, Any] | Buffer | TensorLike

# A reduction: a ReduceOp, its name ("sum", "MAX") or its code (torch's ReduceOp works at run
# time too, through its name; typing it would need torch).
ReduceOpLike: TypeAlias = ReduceOp | str | int
