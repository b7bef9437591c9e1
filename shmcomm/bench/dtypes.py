"""The bench's dtypes: every dtype shmcomm's kernels reduce (bool, the integers, the floats with
float16 and bfloat16, the complex types), their command-line aliases, the numpy arrays that hold
them, and exact values converted into and out of those arrays (for fills and ``--check``).

bfloat16 is not a numpy type: with ``ml_dtypes`` installed the arrays are ``ml_dtypes.bfloat16``;
without it but with torch they hold the raw 16-bit patterns (``uint16``) and the workers hand
torch ``bfloat16`` views of them to the libraries, which is how shmcomm accepts bfloat16 too.

Example::

    >>> dt = bench_dtype("int16"); dt.kind, dt.itemsize
    ('int', 2)
    >>> dt.decode(dt.encode(np.array([-3, 4]))).tolist()
    [-3, 4]
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from shmcomm._core import DTYPE_NAMES

from .common import BenchError

# Every dtype of the kernels' table (src_cython/shm_dtypes.h), in its order.
NAMES = DTYPE_NAMES
ALIASES = {"bool": ("bool_",), "int8": ("char",), "uint8": ("byte",), "int16": ("short",),
           "int32": ("int",), "int64": ("long",), "float16": ("half", "fp16"), "bfloat16": ("bf16",),
           "float32": ("float", "fp32"), "float64": ("double", "fp64"), "complex64": ("cfloat",),
           "complex128": ("cdouble",)}


def kind(name: str) -> str:
    """``bool``, ``int``, ``uint``, ``float`` or ``complex``.

    Example::

        >>> kind("uint16"), kind("bfloat16"), kind("clongdouble")
        ('uint', 'float', 'complex')
    """
    if name == "bool":
        return "bool"
    if name.startswith("uint"):
        return "uint"
    if name.startswith("int"):
        return "int"
    if name.startswith(("complex", "clong")):
        return "complex"
    return "float"


def itemsize(name: str) -> int:
    """Bytes per element, without importing anything optional (sizes are planned in the parent)."""
    return 2 if name == "bfloat16" else np.dtype(name).itemsize


def canonical(text: str) -> str | None:
    """The dtype name ``text`` spells (a name or an alias, any case), or None."""
    text = text.strip().lower()
    return next((n for n in NAMES if text == n or text in ALIASES.get(n, ())), None)


def unavailable(name: str) -> str | None:
    """Why this Python cannot hold ``name`` in arrays, or None (only bfloat16 needs a package)."""
    if name == "bfloat16" and not (importlib.util.find_spec("ml_dtypes") or importlib.util.find_spec("torch")):
        return "bfloat16 needs ml_dtypes or torch (pip install ml_dtypes)"
    return None


@dataclass(frozen=True)
class BenchDtype:
    """How the bench holds one dtype: ``storage`` is the numpy dtype of its arrays; ``bits16``
    means bfloat16 held as raw ``uint16`` patterns (no ml_dtypes)."""

    name: str
    storage: np.dtype
    bits16: bool = False

    @property
    def kind(self) -> str:
        return kind(self.name)

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize

    def exact(self) -> np.dtype:
        """Where references are computed: integers wrap in their own type (as the library's
        must); floats and complex numbers are exact in double precision and rounded once."""
        return {"float": np.dtype(np.float64), "complex": np.dtype(np.complex128)}.get(self.kind, self.storage)

    def encode(self, values) -> np.ndarray:
        """``values`` (exact numbers) as an array of this dtype, rounded to nearest even."""
        values = np.asarray(values)
        if not self.bits16:
            with np.errstate(over="ignore", invalid="ignore"):
                return values.astype(self.storage)
        bits = values.astype(np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)

    def decode(self, array: np.ndarray) -> np.ndarray:
        """An array of this dtype as exact numbers (``exact()``'s dtype), for comparisons."""
        if self.bits16:
            return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return array.astype(self.exact())


@lru_cache(maxsize=None)
def bench_dtype(name: str) -> BenchDtype:
    """The ``BenchDtype`` of a canonical name; BenchError (with the reason) if it cannot be held.

    Example::

        >>> bench_dtype("float32").storage
        dtype('float32')
    """
    if name not in NAMES:
        raise BenchError(f"unknown dtype {name!r}")
    why = unavailable(name)
    if why:
        raise BenchError(why)
    if name != "bfloat16":
        return BenchDtype(name, np.dtype(name))
    if importlib.util.find_spec("ml_dtypes"):
        import ml_dtypes

        return BenchDtype(name, np.dtype(ml_dtypes.bfloat16))
    return BenchDtype(name, np.dtype(np.uint16), bits16=True)
