// Header-only support code for generated wrapgen models. Everything here talks to tensors
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

inline std::string last_torch_error() {
#if WG_TORCH_FEATURE_VERSION >= WG_TORCH_VERSION(2, 13)
  const char* what = torch_exception_get_what_without_backtrace();
  return what ? std::string(what) : std::string();
#else
  return std::string();  // older libtorch prints the exception to stderr instead
#endif
}

inline void check(AOTITorchError err, const char* what) {
  if (err != AOTI_TORCH_SUCCESS) {
    std::string detail = last_torch_error();
    throw Error(WG_RUNTIME_ERROR, std::string(what) + " failed" + (detail.empty() ? "" : ": " + detail));
  }
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
  int64_t item_int64() const {
    int32_t dtype = 0;
    check(aoti_torch_get_dtype(get(), &dtype), "aoti_torch_get_dtype");
    if (dtype == aoti_torch_dtype_int64()) {
      int64_t v = 0;
      check(aoti_torch_item_int64(get(), &v), "aoti_torch_item_int64");
      return v;
    }
    if (dtype == aoti_torch_dtype_int32()) {
      int32_t v = 0;
      check(aoti_torch_item_int32(get(), &v), "aoti_torch_item_int32");
      return v;
    }
    if (dtype == aoti_torch_dtype_int16()) {
      int16_t v = 0;
      check(aoti_torch_item_int16(get(), &v), "aoti_torch_item_int16");
      return v;
    }
    if (dtype == aoti_torch_dtype_int8()) {
      int8_t v = 0;
      check(aoti_torch_item_int8(get(), &v), "aoti_torch_item_int8");
      return v;
    }
    if (dtype == aoti_torch_dtype_uint8()) {
      uint8_t v = 0;
      check(aoti_torch_item_uint8(get(), &v), "aoti_torch_item_uint8");
      return v;
    }
    if (dtype == aoti_torch_dtype_bool()) {
      bool v = false;
      check(aoti_torch_item_bool(get(), &v), "aoti_torch_item_bool");
      return v ? 1 : 0;
    }
    throw Error(WG_RUNTIME_ERROR, "item of a tensor that holds no integer");
  }
  // The one element of a float64/float32/bfloat16/float16 tensor (`.item()` of a float).
  double item_double() const {
    int32_t dtype = 0;
    check(aoti_torch_get_dtype(get(), &dtype), "aoti_torch_get_dtype");
    if (dtype == aoti_torch_dtype_float64()) {
      double v = 0;
      check(aoti_torch_item_float64(get(), &v), "aoti_torch_item_float64");
      return v;
    }
    if (dtype == aoti_torch_dtype_float32()) {
      float v = 0;
      check(aoti_torch_item_float32(get(), &v), "aoti_torch_item_float32");
      return v;
    }
    if (dtype == aoti_torch_dtype_bfloat16()) {
      c10::BFloat16 v;
      check(aoti_torch_item_bfloat16(get(), &v), "aoti_torch_item_bfloat16");
      return static_cast<float>(v);
    }
    if (dtype == aoti_torch_dtype_float16()) {
      c10::Half v;
      check(aoti_torch_item_float16(get(), &v), "aoti_torch_item_float16");
      return static_cast<float>(v);
    }
    throw Error(WG_RUNTIME_ERROR, "item of a tensor that is not float64, float32, bfloat16 or float16");
  }

 private:
  AtenTensorHandle handle_ = nullptr;
};

inline Tensor empty_strided(
    std::initializer_list<int64_t> sizes,
    std::initializer_list<int64_t> strides,
    int32_t dtype,
    int32_t device_type,
    int32_t device_index) {
  AtenTensorHandle out = nullptr;
  check(
      aoti_torch_empty_strided(
          static_cast<int64_t>(sizes.size()), sizes.begin(), strides.begin(), dtype, device_type, device_index, &out),
      "aoti_torch_empty_strided");
  return Tensor(out);
}

// Ask Linux to back the whole 2 MiB-aligned pages inside a fresh CPU buffer's storage with
// transparent huge pages before anything writes it: its first writes then fault in 2 MiB at a
// time instead of 4 KiB (wrapgen/backends/huge_pages.py says why). Advice only: an error (no
// THP in this kernel) leaves the buffer as it was.
inline void advise_huge_pages(const Tensor& buffer) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  int64_t nbytes = 0;
  check(aoti_torch_get_storage_size(buffer.get(), &nbytes), "aoti_torch_get_storage_size");
  if (nbytes < static_cast<int64_t>(kHugePage)) return;
  const uintptr_t start = reinterpret_cast<uintptr_t>(buffer.data_ptr());  // fresh: storage offset 0
  const uintptr_t first = (start + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (start + static_cast<uintptr_t>(nbytes)) & ~(kHugePage - 1);
  if (end > first) (void)madvise(reinterpret_cast<void*>(first), end - first, MADV_HUGEPAGE);
#else
  (void)buffer;
#endif
}

// A view of `source`'s storage; `offset` is relative to the source's storage offset.
inline Tensor reinterpret(
    const Tensor& source,
    std::initializer_list<int64_t> sizes,
    std::initializer_list<int64_t> strides,
    int64_t offset) {
  AtenTensorHandle out = nullptr;
  check(
      aoti_torch__reinterpret_tensor(
          source.get(), static_cast<int64_t>(sizes.size()), sizes.begin(), strides.begin(), offset, &out),
      "aoti_torch__reinterpret_tensor");
  return Tensor(out);
}

inline int64_t storage_offset(const Tensor& t) {
  int64_t v = 0;
  check(aoti_torch_get_storage_offset(t.get(), &v), "aoti_torch_get_storage_offset");
  return v;
}

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

inline std::string dtype_name(int32_t dtype) {
  struct Entry {
    int32_t (*code)();
    const char* name;
  };
  static const Entry entries[] = {
      {aoti_torch_dtype_float32, "torch.float32"}, {aoti_torch_dtype_float64, "torch.float64"},
      {aoti_torch_dtype_float16, "torch.float16"}, {aoti_torch_dtype_bfloat16, "torch.bfloat16"},
      {aoti_torch_dtype_int8, "torch.int8"},       {aoti_torch_dtype_int16, "torch.int16"},
      {aoti_torch_dtype_int32, "torch.int32"},     {aoti_torch_dtype_int64, "torch.int64"},
      {aoti_torch_dtype_uint8, "torch.uint8"},     {aoti_torch_dtype_bool, "torch.bool"},
      {aoti_torch_dtype_complex64, "torch.complex64"}, {aoti_torch_dtype_complex128, "torch.complex128"},
  };
  for (const auto& e : entries) {
    if (e.code() == dtype) return e.name;
  }
  return "dtype #" + std::to_string(dtype);
}

inline std::string device_name(int32_t type, int32_t index) {
  std::string name = type == aoti_torch_device_type_cpu()    ? "cpu"
                     : type == aoti_torch_device_type_cuda() ? "cuda"
                     : type == aoti_torch_device_type_meta() ? "meta"
                                                             : "device type #" + std::to_string(type);
  return index >= 0 && type != aoti_torch_device_type_cpu() ? name + ":" + std::to_string(index) : name;
}

// Plain string building (no iostreams: their locale machinery is the one part of libstdc++
// a model library would otherwise pull in on an error path).
inline std::string format_tuple(const std::vector<int64_t>& values, const std::vector<bool>* checked = nullptr) {
  std::string out = "(";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    const bool shown = checked == nullptr || (i < checked->size() && (*checked)[i]);
    out += shown ? std::to_string(values[i]) : std::string("*");
  }
  out += values.size() == 1 ? ",)" : ")";
  return out;
}

// dtype, device, shape and strides of an input, with an error naming the first property that
// differs (the same order and wording as the Python target). `strides` entries whose
// `stride_checked` is false are not compared; a device_type of -1 is not checked.
inline void check_input(
    const char* name,
    const Tensor& t,
    int32_t dtype,
    int32_t device_type,
    int32_t device_index,
    const std::vector<int64_t>& sizes,
    const std::vector<int64_t>& strides,
    const std::vector<bool>& stride_checked) {
  int32_t actual_dtype = 0, actual_type = 0, actual_index = 0;
  check(aoti_torch_get_dtype(t.get(), &actual_dtype), "aoti_torch_get_dtype");
  if (actual_dtype != dtype) {
    throw Error(WG_INPUT_MISMATCH, std::string("input ") + name + ": expected dtype " + dtype_name(dtype) + ", got " + dtype_name(actual_dtype));
  }
  check(aoti_torch_get_device_type(t.get(), &actual_type), "aoti_torch_get_device_type");
  check(aoti_torch_get_device_index(t.get(), &actual_index), "aoti_torch_get_device_index");
  if (device_type >= 0 && (actual_type != device_type || (device_index >= 0 && actual_index != device_index))) {
    throw Error(
        WG_INPUT_MISMATCH,
        std::string("input ") + name + ": expected device " + device_name(device_type, device_index) + ", got " +
            device_name(actual_type, actual_index));
  }
  const int64_t ndim = t.dim();
  std::vector<int64_t> actual_sizes(static_cast<size_t>(ndim)), actual_strides(static_cast<size_t>(ndim));
  for (int64_t d = 0; d < ndim; ++d) {
    actual_sizes[static_cast<size_t>(d)] = t.size(d);
    actual_strides[static_cast<size_t>(d)] = t.stride(d);
  }
  if (actual_sizes != sizes) {
    throw Error(WG_INPUT_MISMATCH, std::string("input ") + name + ": expected shape " + format_tuple(sizes) + ", got " + format_tuple(actual_sizes));
  }
  for (size_t d = 0; d < strides.size(); ++d) {
    if (stride_checked[d] && strides[d] != actual_strides[d]) {
      throw Error(
          WG_INPUT_MISMATCH,
          std::string("input ") + name + ": expected strides " + format_tuple(strides, &stride_checked) + ", got " +
              format_tuple(actual_strides));
    }
  }
}

inline void symbol_out_of_range(const char* symbol, int64_t value, int64_t low, int64_t high, bool bounded_below,
                                bool bounded_above) {
  throw Error(
      WG_INPUT_MISMATCH,
      std::string("size symbol ") + symbol + " = " + std::to_string(value) + " is outside [" +
          (bounded_below ? std::to_string(low) : std::string("-inf")) + ", " +
          (bounded_above ? std::to_string(high) : std::string("inf")) + "], the range the program was compiled for");
}

// A symbol solved from an observed size must be an integer (e.g. a size 2*s0 must be even).
inline int64_t exact_div(int64_t numerator, int64_t denominator, const char* symbol, const char* observed) {
  if (numerator % denominator != 0) {
    throw Error(
        WG_INPUT_MISMATCH,
        std::string("input size ") + observed + " does not fit the compiled program: " + symbol + " would be " +
            std::to_string(numerator) + "/" + std::to_string(denominator));
  }
  return numerator / denominator;
}

// ---------------------------------------------------------------------------------------------
// Calls through the dispatcher (aoti_torch_call_dispatcher): arguments as StableIValues.

class Stack {
 public:
  explicit Stack(size_t slots) : items_(slots, 0) {}
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  ~Stack() {
    if (!called_) {
      for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) release(*it);
    }
    // Returns nobody took (e.g. the `out` an out= op hands back) are released here.
    for (size_t i = 0; i < owned_returns_.size(); ++i) {
      if (owned_returns_[i]) {
        aoti_torch_delete_tensor_object(reinterpret_cast<AtenTensorHandle>(items_[i]));
        live_handles().fetch_sub(1, std::memory_order_relaxed);
      }
    }
  }

  static StableIValue bits(int64_t v) { return static_cast<StableIValue>(v); }
  StableIValue tensor(const Tensor& t) {
    AtenTensorHandle h = t.share().release();  // a new reference: the call takes it over
    owned_.push_back({kTensor, h});
    return reinterpret_cast<StableIValue>(h);
  }
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
  StableIValue some(StableIValue v) {
#if WG_TORCH_FEATURE_VERSION >= WG_TORCH_VERSION(2, 13)
    StableIValue* p = nullptr;
    check(torch_new_stable_ivalue(&p), "torch_new_stable_ivalue");
    *p = v;
    owned_.push_back({kBoxed, p});
#else
    StableIValue* p = new StableIValue(v);
    owned_.push_back({kBoxed, p});
#endif
    return reinterpret_cast<StableIValue>(p);
  }
#if WG_TORCH_FEATURE_VERSION >= WG_TORCH_VERSION(2, 10)
  StableIValue list(std::initializer_list<StableIValue> elements) {
    StableListHandle handle = nullptr;
    check(torch_new_list_reserve_size(elements.size(), &handle), "torch_new_list_reserve_size");
    owned_.push_back({kList, handle});
    for (StableIValue e : elements) check(torch_list_push_back(handle, e), "torch_list_push_back");
    return reinterpret_cast<StableIValue>(handle);
  }
  StableIValue str(const char* text) {
    StringHandle handle = nullptr;
    check(torch_new_string_handle(text, std::strlen(text), &handle), "torch_new_string_handle");
    owned_.push_back({kString, handle});
    return reinterpret_cast<StableIValue>(handle);
  }
#endif

  void push(StableIValue v) {
    if (next_ >= items_.size()) throw Error(WG_RUNTIME_ERROR, "too many dispatcher arguments");
    items_[next_++] = v;
  }

  // Calls the op; afterwards slots [0, returns) hold its results.
  void call(const char* op, const char* overload, size_t returns, const uint8_t* tensor_returns) {
    if (items_.size() < returns) items_.resize(returns, 0);
    called_ = true;  // libtorch owns (and frees) the arguments from here on, even on error
    check(aoti_torch_call_dispatcher(op, overload, items_.data()), op);
    owned_returns_.assign(returns, false);
    for (size_t i = 0; i < returns; ++i) {
      owned_returns_[i] = tensor_returns[i] != 0;
      if (owned_returns_[i]) live_handles().fetch_add(1, std::memory_order_relaxed);
    }
  }

  Tensor take_tensor(size_t i) {
    if (i >= owned_returns_.size() || !owned_returns_[i]) throw Error(WG_RUNTIME_ERROR, "no tensor result at that index");
    owned_returns_[i] = false;
    live_handles().fetch_sub(1, std::memory_order_relaxed);
    return Tensor(reinterpret_cast<AtenTensorHandle>(items_[i]));
  }
#if WG_TORCH_FEATURE_VERSION >= WG_TORCH_VERSION(2, 10)
  Value take_tensor_list(size_t i) {
    auto handle = reinterpret_cast<StableListHandle>(items_[i]);
    Value out;
    size_t n = 0;
    check(torch_list_size(handle, &n), "torch_list_size");
    for (size_t k = 0; k < n; ++k) {
      StableIValue e = 0;
      check(torch_list_get_item(handle, k, &e), "torch_list_get_item");
      out.items.emplace_back(Tensor(reinterpret_cast<AtenTensorHandle>(e)));
    }
    torch_delete_list(handle);
    return out;
  }
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
  static void release(const Owned& o) {
    switch (o.kind) {
      case kTensor:
        aoti_torch_delete_tensor_object(static_cast<AtenTensorHandle>(o.pointer));
        break;
      case kBoxed:
#if WG_TORCH_FEATURE_VERSION >= WG_TORCH_VERSION(2, 13)
        torch_delete_stable_ivalue(static_cast<StableIValue*>(o.pointer));
#else
        delete static_cast<StableIValue*>(o.pointer);
#endif
        break;
#if WG_TORCH_FEATURE_VERSION >= WG_TORCH_VERSION(2, 10)
      case kList:
        torch_delete_list(static_cast<StableListHandle>(o.pointer));
        break;
      case kString:
        torch_delete_string(static_cast<StringHandle>(o.pointer));
        break;
#endif
      default:
        break;
    }
  }
  std::vector<Owned> owned_;
  std::vector<bool> owned_returns_;
  size_t next_ = 0;
  bool called_ = false;
};

inline Tensor scalar_tensor_int64(int64_t v) {
  AtenTensorHandle out = nullptr;
  check(aoti_torch_scalar_to_tensor_int64(v, &out), "aoti_torch_scalar_to_tensor_int64");
  return Tensor(out);
}
inline Tensor scalar_tensor_float64(double v) {
  AtenTensorHandle out = nullptr;
  check(aoti_torch_scalar_to_tensor_float64(v, &out), "aoti_torch_scalar_to_tensor_float64");
  return Tensor(out);
}
inline Tensor scalar_tensor_float32(float v) {
  AtenTensorHandle out = nullptr;
  check(aoti_torch_scalar_to_tensor_float32(v, &out), "aoti_torch_scalar_to_tensor_float32");
  return Tensor(out);
}
inline Tensor scalar_tensor_bool(bool v) {
  AtenTensorHandle out = nullptr;
  check(aoti_torch_scalar_to_tensor_bool(v, &out), "aoti_torch_scalar_to_tensor_bool");
  return Tensor(out);
}

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

inline void write_message(char* buffer, int64_t size, const std::string& text) {
  if (buffer == nullptr || size <= 0) return;
  size_t n = std::min(static_cast<size_t>(size - 1), text.size());
  std::memcpy(buffer, text.data(), n);
  buffer[n] = '\0';
}

}  // namespace wrapgen

namespace wrapgen {

// Fails the call if a floating-point tensor holds NaN or Inf (the AssertFinite line).
inline void assert_finite(const char* name, const Tensor& t) {
  Tensor finite;
  {
    Stack st(1);
    st.push(st.tensor(t));
    static const uint8_t tensor_returns[] = {1};
    st.call("aten::isfinite", "", 1, tensor_returns);
    finite = st.take_tensor(0);
  }
  Tensor all;
  {
    Stack st(1);
    st.push(st.tensor(finite));
    static const uint8_t tensor_returns[] = {1};
    st.call("aten::all", "", 1, tensor_returns);
    all = st.take_tensor(0);
  }
  bool ok = false;
  check(aoti_torch_item_bool(all.get(), &ok), "aoti_torch_item_bool");
  if (!ok) throw Error(WG_NOT_FINITE, std::string("output ") + name + " contains NaN or Inf");
}

// A view of `source` with another dtype (same bytes): aten::view.dtype.
inline Tensor view_dtype(const Tensor& source, int32_t dtype) {
  Stack st(2);
  st.push(st.tensor(source));
  st.push(Stack::enum32(dtype));
  static const uint8_t tensor_returns[] = {1};
  st.call("aten::view", "dtype", 1, tensor_returns);
  return st.take_tensor(0);
}

// aten::arange on the CPU, filled on the host: its start/end/step are Scalars, which no stable
// shim route takes. Values are start + i*step computed in double (int64 exactly), as ATen does.
template <typename T>
inline void fill_range(void* data, int64_t n, double start, double step) {
  T* out = static_cast<T*>(data);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(start + static_cast<double>(i) * step);
}
inline Tensor arange_cpu_int(int64_t start, int64_t end, int64_t step, int32_t dtype) {
  if (step == 0) throw Error(WG_RUNTIME_ERROR, "arange: step must be nonzero");
  int64_t n = std::max<int64_t>(0, wg_ceildiv(end - start, step));
  Tensor out = empty_strided({n}, {1}, dtype, aoti_torch_device_type_cpu(), -1);
  if (dtype == aoti_torch_dtype_int64()) {
    int64_t* p = static_cast<int64_t*>(out.data_ptr());
    for (int64_t i = 0; i < n; ++i) p[i] = start + i * step;
  } else if (dtype == aoti_torch_dtype_int32()) {
    fill_range<int32_t>(out.data_ptr(), n, static_cast<double>(start), static_cast<double>(step));
  } else if (dtype == aoti_torch_dtype_float32()) {
    fill_range<float>(out.data_ptr(), n, static_cast<double>(start), static_cast<double>(step));
  } else if (dtype == aoti_torch_dtype_float64()) {
    fill_range<double>(out.data_ptr(), n, static_cast<double>(start), static_cast<double>(step));
  } else {
    throw Error(WG_RUNTIME_ERROR, "arange: unsupported dtype " + dtype_name(dtype));
  }
  return out;
}

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
inline void* current_cuda_stream(int32_t index) {
  void* stream = nullptr;
  check(aoti_torch_get_current_cuda_stream(index, &stream), "aoti_torch_get_current_cuda_stream");
  return stream;
}
#endif  // USE_CUDA

}  // namespace wrapgen

#endif  // WRAPGEN_RUNTIME_H_
