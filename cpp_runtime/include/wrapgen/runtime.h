// Support code for generated wrapgen models (inline, or compiled once: see the end). It talks to tensors
// through torch's ABI-stable C shim only (aoti_torch_* / torch_*), so a built model keeps
// working across libtorch upgrades that keep those functions.
//
//   Tensor   owning RAII handle (no copies; share() makes a second reference)
//   Value    a tree of tensors: the result of an op returning a tuple or a list
//   Stack    arguments of one aoti_torch_call_dispatcher call; frees what it created if the
//            call never happens, hands everything over to libtorch when it does
//   check_*  call-time checks that raise Error(WG_INPUT_MISMATCH, ...) naming the input
#pragma once
#ifndef WRAPGEN_RUNTIME_H_
#define WRAPGEN_RUNTIME_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#if __has_include(<torch/csrc/stable/c/shim.h>)
#include <torch/csrc/stable/c/shim.h>
#endif

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#ifdef USE_CUDA
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#endif
#if __has_include(<torch/csrc/inductor/aoti_torch/generated/c_shim_aten.h>)
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_aten.h>
#endif

#include "wrapgen/abi.h"

// The stable-ABI feature level these headers provide (0 before torch 2.10 had the macro).
#ifdef TORCH_FEATURE_VERSION
#define WG_TORCH_FEATURE_VERSION TORCH_FEATURE_VERSION
#else
#define WG_TORCH_FEATURE_VERSION 0ULL
#endif
#define WG_TORCH_VERSION(major, minor) (((0ULL + (major)) << 56) | ((0ULL + (minor)) << 48))

namespace wrapgen {

// ---------------------------------------------------------------------------------------------
// Errors

class Error : public std::runtime_error {
 public:
  Error(int32_t kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  int32_t kind() const { return kind_; }

 private:
  int32_t kind_;
};

std::string last_torch_error();
[[noreturn]] void check_failed(const char* what);

inline void check(AOTITorchError err, const char* what) {
  if (err != AOTI_TORCH_SUCCESS) check_failed(what);  // out of line: the message
}

// Count of tensor handles this library owns right now; zero between calls unless one leaked.
inline std::atomic<int64_t>& live_handles() {
  static std::atomic<int64_t> count{0};
  return count;
}

// ---------------------------------------------------------------------------------------------
// Index arithmetic with Python's semantics (floor division and modulo round toward -inf).

inline int64_t wg_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return ((a % b) != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
inline int64_t wg_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
inline int64_t wg_ceildiv(int64_t a, int64_t b) { return -wg_floordiv(-a, b); }

// ---------------------------------------------------------------------------------------------
// Tensors

class Tensor {
 public:
  Tensor() = default;
  // Takes ownership of a new reference.
  explicit Tensor(AtenTensorHandle handle) : handle_(handle) {
    if (handle_ != nullptr) live_handles().fetch_add(1, std::memory_order_relaxed);
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Tensor& operator=(Tensor&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~Tensor() { reset(); }

  // A new reference to a tensor someone else owns.
  static Tensor borrow(AtenTensorHandle handle) {
    AtenTensorHandle out = nullptr;
    check(aoti_torch_new_tensor_handle(handle, &out), "aoti_torch_new_tensor_handle");
    return Tensor(out);
  }
  Tensor share() const { return borrow(get()); }

  void reset() noexcept {
    if (handle_ != nullptr) {
      aoti_torch_delete_tensor_object(handle_);
      live_handles().fetch_sub(1, std::memory_order_relaxed);
      handle_ = nullptr;
    }
  }
  // Gives the reference away (to libtorch or to the caller).
  AtenTensorHandle release() {
    if (handle_ != nullptr) live_handles().fetch_sub(1, std::memory_order_relaxed);
    return std::exchange(handle_, nullptr);
  }
  AtenTensorHandle get() const {
    if (handle_ == nullptr) throw Error(WG_RUNTIME_ERROR, "use of a freed or undefined tensor");
    return handle_;
  }
  bool defined() const { return handle_ != nullptr; }

  int64_t dim() const {
    int64_t d = 0;
    check(aoti_torch_get_dim(get(), &d), "aoti_torch_get_dim");
    return d;
  }
  int64_t size(int64_t d) const {
    int64_t v = 0;
    check(aoti_torch_get_size(get(), d, &v), "aoti_torch_get_size");
    return v;
  }
  int64_t stride(int64_t d) const {
    int64_t v = 0;
    check(aoti_torch_get_stride(get(), d, &v), "aoti_torch_get_stride");
    return v;
  }
  void* data_ptr() const {
    void* p = nullptr;
    check(aoti_torch_get_data_ptr(get(), &p), "aoti_torch_get_data_ptr");
    return p;
  }
  int64_t storage_offset() const {
    int64_t v = 0;
    check(aoti_torch_get_storage_offset(get(), &v), "aoti_torch_get_storage_offset");
    return v;
  }
  // The one element of an integer or bool tensor (`.item()`), read through the shim (a CUDA
  // tensor is copied to the host, as `.item()` does).
  int64_t item_int64() const;
  // The one element of a float64/float32/bfloat16/float16 tensor (`.item()` of a float).
  double item_double() const;

 private:
  AtenTensorHandle handle_ = nullptr;
};

Tensor empty_strided(std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides, int32_t dtype,
                     int32_t device_type, int32_t device_index);

// Ask Linux to back the whole 2 MiB-aligned pages inside a fresh CPU buffer's storage with
// transparent huge pages before anything writes it: its first writes then fault in 2 MiB at a
// time instead of 4 KiB (wrapgen/backends/huge_pages.py says why). Advice only: an error (no
// THP in this kernel) leaves the buffer as it was.
void advise_huge_pages(const Tensor& buffer);

// A view of `source`'s storage; `offset` is relative to the source's storage offset.
Tensor reinterpret(const Tensor& source, std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides,
                   int64_t offset);

int64_t storage_offset(const Tensor& t);

// A tuple or list of tensors an op returned (nested for tuples holding lists).
struct Value {
  Tensor tensor;
  std::vector<Value> items;

  Value() = default;
  explicit Value(Tensor t) : tensor(std::move(t)) {}
  const Value& at(std::initializer_list<int64_t> path) const {
    const Value* v = this;
    for (int64_t i : path) {
      if (i < 0 || static_cast<size_t>(i) >= v->items.size()) throw Error(WG_RUNTIME_ERROR, "result index out of range");
      v = &v->items[static_cast<size_t>(i)];
    }
    return *v;
  }
};

// ---------------------------------------------------------------------------------------------
// Input checks

std::string dtype_name(int32_t dtype);
std::string device_name(int32_t type, int32_t index);

// Plain string building (no iostreams: their locale machinery is the one part of libstdc++
// a model library would otherwise pull in on an error path).
std::string format_tuple(const std::vector<int64_t>& values, const std::vector<bool>* checked = nullptr);

// dtype, device, shape and strides of an input, with an error naming the first property that
// differs (the same order and wording as the Python target). `strides` entries whose
// `stride_checked` is false are not compared; a device_type of -1 is not checked.
// The lists are the call's own (no allocation: a compiled optimizer step checks 740 inputs).
void check_input(const char* name, const Tensor& t, int32_t dtype, int32_t device_type, int32_t device_index,
                 std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides,
                 std::initializer_list<bool> stride_checked);

[[noreturn]] void symbol_out_of_range(const char* symbol, int64_t value, int64_t low, int64_t high, bool bounded_below,
                                      bool bounded_above);

// A symbol solved from an observed size must be an integer (e.g. a size 2*s0 must be even).
int64_t exact_div(int64_t numerator, int64_t denominator, const char* symbol, const char* observed);

// ---------------------------------------------------------------------------------------------
// Calls through the dispatcher (aoti_torch_call_dispatcher): arguments as StableIValues.

class Stack {
 public:
  explicit Stack(size_t slots) : items_(slots, 0) {}
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  ~Stack();

  static StableIValue bits(int64_t v) { return static_cast<StableIValue>(v); }
  StableIValue tensor(const Tensor& t);
  static StableIValue int64(int64_t v) { return bits(v); }
  static StableIValue f64(double v) {
    StableIValue out = 0;
    std::memcpy(&out, &v, sizeof(v));
    return out;
  }
  static StableIValue boolean(bool v) {
    StableIValue out = 0;
    std::memcpy(&out, &v, sizeof(v));
    return out;
  }
  static StableIValue enum32(int32_t v) {
    StableIValue out = 0;
    std::memcpy(&out, &v, sizeof(v));
    return out;
  }
  static StableIValue device(int32_t type, int32_t index) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(type)) << 32) | static_cast<uint64_t>(static_cast<uint32_t>(index));
  }
  static StableIValue none() { return 0; }
  // `T?` holding a value: a heap StableIValue the callee frees.
  StableIValue some(StableIValue v);
#if WG_TORCH_FEATURE_VERSION >= WG_TORCH_VERSION(2, 10)
  StableIValue list(std::initializer_list<StableIValue> elements);
  StableIValue str(const char* text);
#endif

  void push(StableIValue v);

  // Calls the op; afterwards slots [0, returns) hold its results.
  void call(const char* op, const char* overload, size_t returns, const uint8_t* tensor_returns);

  Tensor take_tensor(size_t i);
#if WG_TORCH_FEATURE_VERSION >= WG_TORCH_VERSION(2, 10)
  Value take_tensor_list(size_t i);
#endif
  int64_t take_int(size_t i) const { return static_cast<int64_t>(items_[i]); }

 private:
  std::vector<StableIValue> items_;
  // What the stack created and must free if the call never happens.
  enum OwnedKind : uint8_t { kTensor, kBoxed, kList, kString };
  struct Owned {
    OwnedKind kind;
    void* pointer;
  };
  static void release(const Owned& o);
  std::vector<Owned> owned_;
  std::vector<bool> owned_returns_;
  size_t next_ = 0;
  bool called_ = false;
};

Tensor scalar_tensor_int64(int64_t v);
Tensor scalar_tensor_float64(double v);
Tensor scalar_tensor_float32(float v);
Tensor scalar_tensor_bool(bool v);

// ---------------------------------------------------------------------------------------------
// Outputs

inline void set_tensor(WgValue& out, Tensor t) {
  out.kind = WG_TENSOR;
  out.t = t.release();
}
inline void set_int(WgValue& out, int64_t v) {
  out.kind = WG_INT;
  out.i = v;
}
inline void set_float(WgValue& out, double v) {
  out.kind = WG_FLOAT;
  out.f = v;
}
inline void set_bool(WgValue& out, bool v) {
  out.kind = WG_BOOL;
  out.i = v ? 1 : 0;
}
inline void set_none(WgValue& out) { out.kind = WG_NONE; }

void write_message(char* buffer, int64_t size, const std::string& text);

}  // namespace wrapgen

namespace wrapgen {

// Fails the call if a floating-point tensor holds NaN or Inf (the AssertFinite line).
void assert_finite(const char* name, const Tensor& t);

// A view of `source` with another dtype (same bytes): aten::view.dtype.
Tensor view_dtype(const Tensor& source, int32_t dtype);

// aten::arange on the CPU, filled on the host: its start/end/step are Scalars, which no stable
// shim route takes. Values are start + i*step computed in double (int64 exactly), as ATen does.
template <typename T>
inline void fill_range(void* data, int64_t n, double start, double step) {
  T* out = static_cast<T*>(data);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(start + static_cast<double>(i) * step);
}
Tensor arange_cpu_int(int64_t start, int64_t end, int64_t step, int32_t dtype);

#ifdef USE_CUDA
// Makes a CUDA device current for the rest of a run (restored on the way out).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int32_t index) { check(aoti_torch_create_cuda_guard(index, &guard_), "aoti_torch_create_cuda_guard"); }
  ~CudaDeviceGuard() {
    if (guard_ != nullptr) aoti_torch_delete_cuda_guard(guard_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  CUDAGuardHandle guard_ = nullptr;
};

// The stream PyTorch would use on `index` now: kernels go where the caller's ops go.
void* current_cuda_stream(int32_t index);
#endif  // USE_CUDA

}  // namespace wrapgen

// The definitions of the helpers declared above: inline here (header-only use: the Python
// module, the standalone runner), or, in a generated model built with WRAPGEN_RUNTIME_LINKED,
// compiled once per compiler cache into an object every model links (wrapgen/backends/cpp/build.py):
// a model's wrapper then compiles only its own code.
#ifndef WRAPGEN_RUNTIME_LINKED
#include "wrapgen/runtime_impl.h"
#endif

#endif  // WRAPGEN_RUNTIME_H_
