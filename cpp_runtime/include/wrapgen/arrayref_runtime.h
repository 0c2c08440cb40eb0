// Helpers of the generated array-ref entry (wrapgen/backends/cpp/arrayref.py): descriptor checks
// that name the argument, non-owning tensors over arrays for library calls, the per-thread arena.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "wrapgen/arrayref.h"
#include "wrapgen/runtime.h"

namespace wrapgen {

// What the program expects of one argument: dtype, rank and sizes (`sizes` points at `rank` values).
struct ArraySpec {
  const char* name;
  int32_t dtype;
  int32_t rank;
  const int64_t* sizes;
};

inline std::string array_label(const char* what, int64_t i, const char* name) {
  return std::string(what) + " " + std::to_string(i) + " (" + name + ")";
}

// Throws WG_INPUT_MISMATCH naming the first argument that is not what the program was compiled for.
inline void check_arrays(const char* what, const WgArray* arrays, int64_t count, const ArraySpec* specs, int64_t expected) {
  if (count != expected) {
    throw Error(WG_INPUT_MISMATCH, std::string("expected ") + std::to_string(expected) + " " + what + "s, got " + std::to_string(count));
  }
  if (expected > 0 && arrays == nullptr) throw Error(WG_INPUT_MISMATCH, std::string("the ") + what + " array is null");
  for (int64_t i = 0; i < expected; ++i) {
    const WgArray& a = arrays[i];
    const ArraySpec& s = specs[i];
    int64_t numel = 1;
    for (int32_t d = 0; d < s.rank; ++d) numel *= s.sizes[d];
    if (a.data == nullptr && numel > 0) throw Error(WG_INPUT_MISMATCH, array_label(what, i, s.name) + ": null data pointer");
    if (a.dtype != s.dtype) {
      throw Error(WG_INPUT_MISMATCH, array_label(what, i, s.name) + ": expected dtype " + dtype_name(s.dtype) + ", got " + dtype_name(a.dtype));
    }
    if (a.rank != s.rank) {
      throw Error(WG_INPUT_MISMATCH, array_label(what, i, s.name) + ": expected rank " + std::to_string(s.rank) + ", got " + std::to_string(a.rank));
    }
    if (s.rank > 0 && a.sizes == nullptr) throw Error(WG_INPUT_MISMATCH, array_label(what, i, s.name) + ": null sizes");
    int64_t contiguous = 1;
    for (int32_t d = s.rank; d-- > 0;) {
      if (a.sizes[d] != s.sizes[d]) {
        throw Error(WG_INPUT_MISMATCH, array_label(what, i, s.name) + ": expected size " + std::to_string(s.sizes[d]) + " in dimension " +
                                           std::to_string(d) + ", got " + std::to_string(a.sizes[d]));
      }
      if (a.strides != nullptr && s.sizes[d] > 1 && a.strides[d] != contiguous) {
        throw Error(WG_INPUT_MISMATCH, array_label(what, i, s.name) + ": not contiguous (stride " + std::to_string(a.strides[d]) +
                                           " in dimension " + std::to_string(d) + ", expected " + std::to_string(contiguous) + ")");
      }
      contiguous *= s.sizes[d];
    }
  }
}

// What the program expects of one constant: it reads the memory in exactly this layout.
struct ConstantSpec {
  const char* name;
  int32_t dtype;
  int32_t rank;
  const int64_t* sizes;
  const int64_t* strides;
};

// Throws WG_INPUT_MISMATCH naming constant i when its handle is null or its tensor is not what
// the program was compiled for (dtype, sizes, strides, the CPU).
inline void check_constant(int64_t i, AtenTensorHandle handle, const ConstantSpec& s) {
  const std::string label = array_label("constant", i, s.name);
  if (handle == nullptr) throw Error(WG_INPUT_MISMATCH, label + ": null handle");
  int32_t dtype = 0, device_type = 0;
  int64_t rank = 0;
  check(aoti_torch_get_dtype(handle, &dtype), "aoti_torch_get_dtype");
  check(aoti_torch_get_dim(handle, &rank), "aoti_torch_get_dim");
  check(aoti_torch_get_device_type(handle, &device_type), "aoti_torch_get_device_type");
  if (device_type != aoti_torch_device_type_cpu()) throw Error(WG_INPUT_MISMATCH, label + ": not on the CPU");
  if (dtype != s.dtype) throw Error(WG_INPUT_MISMATCH, label + ": expected dtype " + dtype_name(s.dtype) + ", got " + dtype_name(dtype));
  if (rank != s.rank) throw Error(WG_INPUT_MISMATCH, label + ": expected rank " + std::to_string(s.rank) + ", got " + std::to_string(rank));
  for (int32_t d = 0; d < s.rank; ++d) {
    int64_t size = 0, stride = 0;
    check(aoti_torch_get_size(handle, d, &size), "aoti_torch_get_size");
    check(aoti_torch_get_stride(handle, d, &stride), "aoti_torch_get_stride");
    if (size != s.sizes[d]) {
      throw Error(WG_INPUT_MISMATCH, label + ": expected size " + std::to_string(s.sizes[d]) + " in dimension " + std::to_string(d) +
                                         ", got " + std::to_string(size));
    }
    if (size > 1 && stride != s.strides[d]) {
      throw Error(WG_INPUT_MISMATCH, label + ": expected stride " + std::to_string(s.strides[d]) + " in dimension " + std::to_string(d) +
                                         ", got " + std::to_string(stride));
    }
  }
}

// Runs `body`, turning what it throws into the entry's error code and message.
template <typename Body>
int32_t guarded(char* message, int64_t message_size, Body&& body) {
  try {
    body();
    return WG_OK;
  } catch (const Error& e) {
    write_message(message, message_size, e.what());
    return e.kind();
  } catch (const std::exception& e) {
    write_message(message, message_size, e.what());
    return WG_RUNTIME_ERROR;
  } catch (...) {
    write_message(message, message_size, "unknown C++ exception");
    return WG_RUNTIME_ERROR;
  }
}

// A tensor over memory the model does not own (an input, an arena slot, the caller's output),
// made only for a library call that needs one.
inline Tensor wrap_array(void* data, std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides, int32_t dtype) {
  AtenTensorHandle out = nullptr;
  check(aoti_torch_create_tensor_from_blob(data, static_cast<int64_t>(sizes.size()), sizes.begin(), strides.begin(), 0, dtype,
                                           aoti_torch_device_type_cpu(), 0, &out),
        "aoti_torch_create_tensor_from_blob");
  return Tensor(out);
}

inline char* data_of(AtenTensorHandle handle) {
  void* p = nullptr;
  check(aoti_torch_get_data_ptr(handle, &p), "aoti_torch_get_data_ptr");
  return static_cast<char*>(p);
}

// This thread's arena for programs whose temporaries are too large for the stack: grown once,
// kept between calls (64-byte aligned).
inline char* thread_arena(size_t bytes) {
  thread_local std::unique_ptr<char[]> storage;
  thread_local size_t capacity = 0;
  if (capacity < bytes) {
    storage.reset(new char[bytes + 64]);
    capacity = bytes;
  }
  auto address = reinterpret_cast<uintptr_t>(storage.get());
  return reinterpret_cast<char*>((address + 63) & ~static_cast<uintptr_t>(63));
}

}  // namespace wrapgen
