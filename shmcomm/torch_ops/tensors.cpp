// A plain tensor's pointer, element count and dtype in one C call, for the compiled core.
//
// The core reads a tensor given to a collective (src_cython/buffers.pxi): through Python that is
// six attribute reads (dtype, is_cpu, is_contiguous(), is_neg(), data_ptr(), numel()), ~0.36 us,
// as long as the whole 8-byte all_reduce of two ranks with a numpy array. Here it is one call of
// a few nanoseconds. shmcomm/torch_ops/native.py hands `shmcomm_read_tensor` to the core once the
// library is loaded; until then, and for every tensor this declines, the core reads through
// Python, which also names what is wrong with a tensor it cannot take.
#include "tensors.h"

#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstdint>
#include <string>

namespace shmcomm {
namespace {

// The core's dtype names (_core.DTYPE_NAMES) of the torch dtypes it takes by memory.
const std::pair<at::ScalarType, const char *> kDtypes[] = {
    {at::kBool, "bool"},       {at::kChar, "int8"},         {at::kByte, "uint8"},
    {at::kShort, "int16"},     {at::kUInt16, "uint16"},     {at::kInt, "int32"},
    {at::kUInt32, "uint32"},   {at::kLong, "int64"},        {at::kUInt64, "uint64"},
    {at::kHalf, "float16"},    {at::kBFloat16, "bfloat16"}, {at::kFloat, "float32"},
    {at::kDouble, "float64"},  {at::kComplexFloat, "complex64"}, {at::kComplexDouble, "complex128"},
};

using Table = std::array<int, 64>;  // at::ScalarType (below 64) -> the core's dtype code, or -1

// Filled once, under the GIL: the codes come from the core itself, so the two cannot disagree.
// A failure leaves every code -1 (every tensor then takes the Python path, which names the error).
const Table &table() {
  static Table *codes = nullptr;
  if (codes) return *codes;
  auto *t = new Table();
  t->fill(-1);
  PyObject *core = PyImport_ImportModule("shmcomm._core");
  PyObject *names = core ? PyObject_GetAttrString(core, "DTYPE_NAMES") : nullptr;
  if (names && PyTuple_Check(names)) {
    for (Py_ssize_t code = 0; code < PyTuple_GET_SIZE(names); ++code) {
      const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, code));
      for (const auto &[type, torch_name] : kDtypes)
        if (name && std::string(name) == torch_name) (*t)[static_cast<int>(type)] = static_cast<int>(code);
    }
  }
  PyErr_Clear();
  Py_XDECREF(names);
  Py_XDECREF(core);
  codes = t;
  return *t;
}

}  // namespace

int dtype_code(at::ScalarType type) {
  int index = static_cast<int>(type);
  return index >= 0 && index < 64 ? table()[index] : -1;
}

bool direct(const at::Tensor &t) {
  return t.device().is_cpu() && t.layout() == at::kStrided && t.has_storage() && t.is_contiguous() &&
         !t.is_neg() && !t.is_conj();
}

}  // namespace shmcomm

// What shmcomm_read_tensor fills; src_cython/buffers.pxi declares the same struct.
struct shmcomm_tensor_view {
  void *data;
  int64_t numel;
  int dtype;  // the core's dtype code
};

// 1, with `out` filled: `obj` is a torch.Tensor (exactly: subclasses may hold their data
// elsewhere) that the core takes by its memory as it is. 0: anything else; nothing is raised.
// Called by the core with the GIL held.
extern "C" int shmcomm_read_tensor(PyObject *obj, shmcomm_tensor_view *out) {
  if (!THPVariableClass || Py_TYPE(obj) != reinterpret_cast<PyTypeObject *>(THPVariableClass)) return 0;
  try {
    const at::Tensor &t = THPVariable_Unpack(obj);
    int code = shmcomm::dtype_code(t.scalar_type());
    if (code < 0 || !shmcomm::direct(t)) return 0;
    out->data = t.data_ptr();
    out->numel = t.numel();
    out->dtype = code;
    return 1;
  } catch (...) {  // an undefined tensor, a storage without data: the Python path says what
    return 0;
  }
}
