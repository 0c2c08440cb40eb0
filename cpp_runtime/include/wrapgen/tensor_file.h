// The package's tensor file (weights.bin; the runner's inputs and outputs use it too):
//
//   "WGT1"  u32 count
//   per tensor: u32 name length, name bytes, i32 dtype (shim code = c10::ScalarType),
//               u32 ndim, i64 sizes[ndim], i64 strides[ndim], u64 nbytes, bytes
//
// The bytes are the storage span the strides cover (from the first element), so a tensor
// comes back with exactly the layout it was saved with. CPU tensors only; little-endian.
#pragma once
#ifndef WRAPGEN_TENSOR_FILE_H_
#define WRAPGEN_TENSOR_FILE_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "wrapgen/runtime.h"

namespace wrapgen {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

inline int64_t dtype_itemsize(int32_t dtype) {
  if (dtype == aoti_torch_dtype_float64() || dtype == aoti_torch_dtype_int64() || dtype == aoti_torch_dtype_complex64()) return 8;
  if (dtype == aoti_torch_dtype_float32() || dtype == aoti_torch_dtype_int32()) return 4;
  if (dtype == aoti_torch_dtype_float16() || dtype == aoti_torch_dtype_bfloat16() || dtype == aoti_torch_dtype_int16()) return 2;
  if (dtype == aoti_torch_dtype_complex128()) return 16;
  return 1;  // int8, uint8, bool
}

inline int64_t span_bytes(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int32_t dtype) {
  int64_t elements = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return 0;
    elements += (sizes[d] - 1) * strides[d];
  }
  return elements * dtype_itemsize(dtype);
}

inline std::vector<NamedTensor> read_tensor_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(WG_RUNTIME_ERROR, "cannot open tensor file " + path);
  auto read = [&](void* dst, size_t n) {
    in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in) throw Error(WG_RUNTIME_ERROR, "tensor file " + path + " is truncated");
  };
  char magic[4];
  read(magic, 4);
  if (std::memcmp(magic, "WGT1", 4) != 0) throw Error(WG_RUNTIME_ERROR, path + " is not a wrapgen tensor file");
  uint32_t count = 0;
  read(&count, 4);
  std::vector<NamedTensor> out;
  for (uint32_t k = 0; k < count; ++k) {
    uint32_t name_len = 0, ndim = 0;
    int32_t dtype = 0;
    read(&name_len, 4);
    std::string name(name_len, '\0');
    read(name.data(), name_len);
    read(&dtype, 4);
    read(&ndim, 4);
    std::vector<int64_t> sizes(ndim), strides(ndim);
    read(sizes.data(), 8 * ndim);
    read(strides.data(), 8 * ndim);
    uint64_t nbytes = 0;
    read(&nbytes, 8);
    if (static_cast<int64_t>(nbytes) != span_bytes(sizes, strides, dtype)) {
      throw Error(WG_RUNTIME_ERROR, "tensor " + name + " in " + path + " has the wrong byte count");
    }
    AtenTensorHandle handle = nullptr;
    check(
        aoti_torch_empty_strided(ndim, sizes.data(), strides.data(), dtype, aoti_torch_device_type_cpu(), -1, &handle),
        "aoti_torch_empty_strided");
    Tensor t(handle);
    if (nbytes > 0) read(t.data_ptr(), nbytes);
    out.push_back({std::move(name), std::move(t)});
  }
  return out;
}

inline void write_tensor_file(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error(WG_RUNTIME_ERROR, "cannot write " + path);
  auto write = [&](const void* src, size_t n) { out.write(static_cast<const char*>(src), static_cast<std::streamsize>(n)); };
  write("WGT1", 4);
  uint32_t count = static_cast<uint32_t>(tensors.size());
  write(&count, 4);
  for (const auto& [name, t] : tensors) {
    uint32_t name_len = static_cast<uint32_t>(name.size());
    write(&name_len, 4);
    write(name.data(), name_len);
    int32_t dtype = 0;
    check(aoti_torch_get_dtype(t->get(), &dtype), "aoti_torch_get_dtype");
    write(&dtype, 4);
    uint32_t ndim = static_cast<uint32_t>(t->dim());
    write(&ndim, 4);
    std::vector<int64_t> sizes(ndim), strides(ndim);
    for (uint32_t d = 0; d < ndim; ++d) {
      sizes[d] = t->size(d);
      strides[d] = t->stride(d);
    }
    write(sizes.data(), 8 * ndim);
    write(strides.data(), 8 * ndim);
    uint64_t nbytes = static_cast<uint64_t>(span_bytes(sizes, strides, dtype));
    write(&nbytes, 8);
    if (nbytes > 0) write(t->data_ptr(), nbytes);
  }
}

}  // namespace wrapgen

#endif  // WRAPGEN_TENSOR_FILE_H_
