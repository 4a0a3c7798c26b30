// DLPack export (the protocol of torch.from_dlpack, cupy.from_dlpack, numpy.from_dlpack).
// The structs follow the DLPack ABI (dlpack.h v1.0), declared here so that the build
// needs no dlpack header. A capsule keeps the Python ManagedBuffer alive and counts as an
// export until the consumer calls the deleter.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "bindings.hpp"
#include "gpukeeper/core/errors.hpp"
#include "gpukeeper/memory/buffer_io.hpp"

namespace gpukeeper::py_bindings {

namespace {

struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  std::uint64_t flags;
  DLTensor dl_tensor;
};

enum : std::int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
enum : std::uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };

DLDataType dl_dtype(Precision p) {
  std::uint8_t bits = static_cast<std::uint8_t>(element_size(p) * 8);
  switch (p) {
    case Precision::fp64:
    case Precision::fp32:
    case Precision::fp16: return {kDLFloat, bits, 1};
    case Precision::bf16: return {kDLBfloat, bits, 1};
    case Precision::int64:
    case Precision::int32:
    case Precision::int16:
    case Precision::int8: return {kDLInt, bits, 1};
    case Precision::uint8: return {kDLUInt, bits, 1};
    case Precision::boolean: return {kDLBool, 8, 1};
  }
  return {kDLUInt, 8, 1};
}

DLDevice dl_device_of(const PyBuffer& b) {
  switch (b.kind) {
    case ResourceKind::host: return {kDLCPU, 0};
    case ResourceKind::pinned: return {kDLCUDAHost, 0};
    default: return {kDLCUDA, b.device};
  }
}

// Owns the shape and a reference to the exporting Python buffer.
struct ExportContext {
  std::int64_t shape[1];
  PyObject* owner;
};

void end_export(ExportContext* ctx) {
  if (!Py_IsInitialized()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (PyBuffer* buf = buffer_of(ctx->owner)) buf->end_export();
  Py_DECREF(ctx->owner);
  PyGILState_Release(gil);
  delete ctx;
}

void delete_legacy(DLManagedTensor* t) {
  end_export(static_cast<ExportContext*>(t->manager_ctx));
  delete t;
}

void delete_versioned(DLManagedTensorVersioned* t) {
  end_export(static_cast<ExportContext*>(t->manager_ctx));
  delete t;
}

// A capsule nobody consumed still owns its tensor.
void capsule_legacy(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (t && t->deleter) t->deleter(t);
  }
}

void capsule_versioned(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
    auto* t = static_cast<DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(capsule, "dltensor_versioned"));
    if (t && t->deleter) t->deleter(t);
  }
}

// The consumer's stream per the protocol: None means the legacy default stream, 1 and 2
// the legacy and per-thread defaults, -1 "do not synchronize", else a cudaStream_t.
void order_for_consumer(const PyBuffer& b, const py::object& stream) {
  if (b.kind == ResourceKind::host) {
    if (!stream.is_none()) {
      throw py::buffer_error("stream must be None for host memory");
    }
    return;
  }
  if (b.kind == ResourceKind::pinned && stream.is_none()) return;
  long long requested = 1;
  if (!stream.is_none()) {
    if (!PyLong_Check(stream.ptr())) throw py::buffer_error("stream must be an int or None");
    requested = stream.cast<long long>();
  }
  if (requested == -1) return;
  if (requested == 0) throw py::buffer_error("stream 0 is ambiguous in DLPack: use 1 or 2");
  stream_t consumer = requested == 1 ? 0 : requested == 2 ? stream_t{2} : static_cast<stream_t>(requested);
  order_streams(b.device, b.buffer.stream(), consumer);
}

}  // namespace

py::tuple dlpack_device(const PyBuffer& b) {
  DLDevice d = dl_device_of(b);
  return py::make_tuple(d.device_type, d.device_id);
}

py::object make_dlpack(py::object self, PyBuffer& b, py::object stream, py::object max_version,
                       py::object dl_device, py::object copy) {
  b.require_live("__dlpack__");
  if (!copy.is_none() && copy.cast<bool>()) {
    throw py::buffer_error("gpukeeper buffers are exported without copying (copy=True refused)");
  }
  DLDevice device = dl_device_of(b);
  if (!dl_device.is_none()) {
    auto wanted = dl_device.cast<std::pair<int, int>>();
    if (wanted.first != device.device_type || wanted.second != device.device_id) {
      throw py::buffer_error("the buffer lives on DLPack device (" +
                             std::to_string(device.device_type) + ", " +
                             std::to_string(device.device_id) + ") and is not copied elsewhere");
    }
  }
  order_for_consumer(b, stream);

  bool versioned = false;
  if (!max_version.is_none()) {
    auto version = max_version.cast<std::pair<int, int>>();
    versioned = version.first >= 1;
  }
  auto* ctx = new ExportContext{{static_cast<std::int64_t>(b.count)}, self.ptr()};
  DLTensor tensor{b.buffer.data(), device, 1, dl_dtype(b.precision), ctx->shape, nullptr, 0};

  Py_INCREF(self.ptr());
  ++b.exports;
  PyObject* capsule = nullptr;
  if (versioned) {
    auto* t = new DLManagedTensorVersioned{{1, 0}, ctx, delete_versioned, 0, tensor};
    capsule = PyCapsule_New(t, "dltensor_versioned", capsule_versioned);
    if (capsule == nullptr) delete_versioned(t);
  } else {
    auto* t = new DLManagedTensor{tensor, ctx, delete_legacy};
    capsule = PyCapsule_New(t, "dltensor", capsule_legacy);
    if (capsule == nullptr) delete_legacy(t);
  }
  if (capsule == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(capsule);
}

}  // namespace gpukeeper::py_bindings
