// torch.ops.shmcomm.all_reduce_ (and its copying twin all_reduce) as native kernels: the tensor's memory goes straight to the
// compiled core's C entry point (src_cython/torch_entry.pxi), with no Python call in between.
// It saves ~1 us a call over the Python kernel, a third of an 8 KiB all_reduce; tensor-parallel
// decoding makes ~100 such calls per token. Built on first use by shmcomm/torch_ops/native.py.
//
// Anything the entry point does not serve (a tensor to copy first, a group across nodes, an
// unknown op or dtype) goes to the Python kernel (shmcomm.torch_ops.kernels.all_reduce_), which
// serves it or raises the error that names the problem. Errors keep their Python type.
#include "tensors.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace {

using Entry = int (*)(const char *group, int op, void *data, int64_t count, int dtype);

struct Core {
  Entry entry = nullptr;
  PyObject *python_kernel = nullptr;             // kernels.all_reduce_ (kept for the process)
  std::vector<std::pair<std::string, int>> op_codes;  // reduce_op name -> op code (_core.torch_op_codes)
};

PyObject *attr_of(const char *module, const char *name) {
  PyObject *mod = PyImport_ImportModule(module);
  if (!mod) throw python_error();
  PyObject *value = PyObject_GetAttrString(mod, name);
  Py_DECREF(mod);
  if (!value) throw python_error();
  return value;
}

// Filled once, under the GIL, at the first call: the names and codes come from the core itself.
const Core &core() {
  static Core *loaded = nullptr;
  if (loaded) return *loaded;
  auto *c = new Core();
  PyObject *capsule = attr_of("shmcomm._core", "torch_all_reduce_entry");
  c->entry = reinterpret_cast<Entry>(PyCapsule_GetPointer(capsule, "shmcomm._core.torch_all_reduce"));
  Py_DECREF(capsule);
  if (!c->entry) throw python_error();
  // the names the core's direct path takes, from its one table (PREMUL_SUM is not there: it
  // needs a factor, and the Python kernel names the problem)
  PyObject *codes = attr_of("shmcomm._core", "torch_op_codes");
  PyObject *name, *code;
  Py_ssize_t pos = 0;
  while (PyDict_Next(codes, &pos, &name, &code)) {
    const char *text = PyUnicode_AsUTF8(name);
    if (text) c->op_codes.emplace_back(text, static_cast<int>(PyLong_AsLong(code)));
  }
  Py_DECREF(codes);
  PyErr_Clear();  // a name that is not text is left out: the Python kernel serves it
  c->python_kernel = attr_of("shmcomm.torch_ops.kernels", "all_reduce_");
  loaded = c;
  return *c;
}

int op_code(const Core &c, c10::string_view op) {
  for (const auto &[name, code] : c.op_codes)
    if (op == name) return code;
  return -1;
}

at::Tensor &all_reduce_(at::Tensor &input, c10::string_view reduce_op,
                        std::optional<c10::string_view> group_name) {
  pybind11::gil_scoped_acquire gil;  // the dispatcher let go of it
  const Core &c = core();
  std::string group = group_name ? std::string(*group_name) : std::string();
  int op = op_code(c, reduce_op);
  int dtype = shmcomm::dtype_code(input.scalar_type());
  if (op >= 0 && dtype >= 0 && shmcomm::direct(input)) {
    int rc = c.entry(group_name ? group.c_str() : nullptr, op, input.data_ptr(), input.numel(), dtype);
    if (rc < 0) throw python_error();
    if (rc == 0) return input;
  }
  PyObject *tensor = THPVariable_Wrap(input);
  if (!tensor) throw python_error();
  PyObject *op_name = PyUnicode_FromStringAndSize(reduce_op.data(), static_cast<Py_ssize_t>(reduce_op.size()));
  PyObject *name = group_name ? PyUnicode_FromString(group.c_str()) : (Py_INCREF(Py_None), Py_None);
  PyObject *result = (op_name && name) ? PyObject_CallFunctionObjArgs(c.python_kernel, tensor, op_name, name, nullptr)
                                       : nullptr;
  Py_XDECREF(op_name);
  Py_XDECREF(name);
  Py_DECREF(tensor);
  if (!result) throw python_error();
  Py_DECREF(result);
  return input;
}

// The copying twin, which compiled graphs call (functionalization takes no op whose output
// aliases its input): a contiguous copy, reduced in place.
at::Tensor all_reduce(const at::Tensor &input, c10::string_view reduce_op,
                      std::optional<c10::string_view> group_name) {
  at::Tensor out = input.clone(at::MemoryFormat::Contiguous);
  return all_reduce_(out, reduce_op, group_name);
}

}  // namespace

TORCH_LIBRARY_IMPL(shmcomm, CPU, m) {
  m.impl("all_reduce_", all_reduce_);
  m.impl("all_reduce", all_reduce);
}
