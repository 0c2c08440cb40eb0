// Definitions of the runtime helpers runtime.h declares (see there). Included by runtime.h
// (inline) unless WRAPGEN_RUNTIME_LINKED is defined; the model build compiles it once per
// cache with WG_RT_INLINE defined empty (out-of-line, hidden) and links that object.
#pragma once
#ifndef WRAPGEN_RUNTIME_IMPL_H_
#define WRAPGEN_RUNTIME_IMPL_H_

#include <algorithm>

#include "wrapgen/runtime.h"

#ifndef WG_RT_INLINE
#define WG_RT_INLINE inline
#endif

namespace wrapgen {

WG_RT_INLINE std::string last_torch_error() {
#if WG_TORCH_FEATURE_VERSION >= WG_TORCH_VERSION(2, 13)
  const char* what = torch_exception_get_what_without_backtrace();
  return what ? std::string(what) : std::string();
#else
  return std::string();  // older libtorch prints the exception to stderr instead
#endif
}

WG_RT_INLINE void check_failed(const char* what) {
  std::string detail = last_torch_error();
  throw Error(WG_RUNTIME_ERROR, std::string(what) + " failed" + (detail.empty() ? "" : ": " + detail));
}

WG_RT_INLINE int64_t Tensor::item_int64() const {
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
WG_RT_INLINE double Tensor::item_double() const {
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

WG_RT_INLINE Tensor empty_strided(
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
WG_RT_INLINE void advise_huge_pages(const Tensor& buffer) {
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
WG_RT_INLINE Tensor reinterpret(
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

WG_RT_INLINE int64_t storage_offset(const Tensor& t) {
  int64_t v = 0;
  check(aoti_torch_get_storage_offset(t.get(), &v), "aoti_torch_get_storage_offset");
  return v;
}

WG_RT_INLINE std::string dtype_name(int32_t dtype) {
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

WG_RT_INLINE std::string device_name(int32_t type, int32_t index) {
  std::string name = type == aoti_torch_device_type_cpu()    ? "cpu"
                     : type == aoti_torch_device_type_cuda() ? "cuda"
                     : type == aoti_torch_device_type_meta() ? "meta"
                                                             : "device type #" + std::to_string(type);
  return index >= 0 && type != aoti_torch_device_type_cpu() ? name + ":" + std::to_string(index) : name;
}

// Plain string building (no iostreams: their locale machinery is the one part of libstdc++
// a model library would otherwise pull in on an error path).
WG_RT_INLINE std::string format_tuple(const std::vector<int64_t>& values, const std::vector<bool>* checked) {
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
WG_RT_INLINE void check_input(
    const char* name,
    const Tensor& t,
    int32_t dtype,
    int32_t device_type,
    int32_t device_index,
    std::initializer_list<int64_t> sizes,
    std::initializer_list<int64_t> strides,
    std::initializer_list<bool> stride_checked) {
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
  int64_t* actual_sizes = nullptr;
  int64_t* actual_strides = nullptr;
  check(aoti_torch_get_sizes(t.get(), &actual_sizes), "aoti_torch_get_sizes");
  check(aoti_torch_get_strides(t.get(), &actual_strides), "aoti_torch_get_strides");
  if (static_cast<size_t>(ndim) != sizes.size() || !std::equal(sizes.begin(), sizes.end(), actual_sizes)) {
    throw Error(
        WG_INPUT_MISMATCH,
        std::string("input ") + name + ": expected shape " + format_tuple(std::vector<int64_t>(sizes)) + ", got " +
            format_tuple(std::vector<int64_t>(actual_sizes, actual_sizes + ndim)));
  }
  const bool* checked = stride_checked.begin();
  const int64_t* expected = strides.begin();
  for (size_t d = 0; d < strides.size(); ++d) {
    if (checked[d] && expected[d] != actual_strides[d]) {
      const std::vector<bool> which(stride_checked);
      throw Error(
          WG_INPUT_MISMATCH,
          std::string("input ") + name + ": expected strides " + format_tuple(std::vector<int64_t>(strides), &which) +
              ", got " + format_tuple(std::vector<int64_t>(actual_strides, actual_strides + ndim)));
    }
  }
}

WG_RT_INLINE void symbol_out_of_range(const char* symbol, int64_t value, int64_t low, int64_t high, bool bounded_below,
                                bool bounded_above) {
  throw Error(
      WG_INPUT_MISMATCH,
      std::string("size symbol ") + symbol + " = " + std::to_string(value) + " is outside [" +
          (bounded_below ? std::to_string(low) : std::string("-inf")) + ", " +
          (bounded_above ? std::to_string(high) : std::string("inf")) + "], the range the program was compiled for");
}

// A symbol solved from an observed size must be an integer (e.g. a size 2*s0 must be even).
WG_RT_INLINE int64_t exact_div(int64_t numerator, int64_t denominator, const char* symbol, const char* observed) {
  if (numerator % denominator != 0) {
    throw Error(
        WG_INPUT_MISMATCH,
        std::string("input size ") + observed + " does not fit the compiled program: " + symbol + " would be " +
            std::to_string(numerator) + "/" + std::to_string(denominator));
  }
  return numerator / denominator;
}

WG_RT_INLINE Stack::~Stack() {
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

WG_RT_INLINE StableIValue Stack::tensor(const Tensor& t) {
  AtenTensorHandle h = t.share().release();  // a new reference: the call takes it over
  owned_.push_back({kTensor, h});
  return reinterpret_cast<StableIValue>(h);
}

WG_RT_INLINE StableIValue Stack::some(StableIValue v) {
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
WG_RT_INLINE StableIValue Stack::list(std::initializer_list<StableIValue> elements) {
  StableListHandle handle = nullptr;
  check(torch_new_list_reserve_size(elements.size(), &handle), "torch_new_list_reserve_size");
  owned_.push_back({kList, handle});
  for (StableIValue e : elements) check(torch_list_push_back(handle, e), "torch_list_push_back");
  return reinterpret_cast<StableIValue>(handle);
}
WG_RT_INLINE StableIValue Stack::str(const char* text) {
  StringHandle handle = nullptr;
  check(torch_new_string_handle(text, std::strlen(text), &handle), "torch_new_string_handle");
  owned_.push_back({kString, handle});
  return reinterpret_cast<StableIValue>(handle);
}
#endif

WG_RT_INLINE void Stack::push(StableIValue v) {
  if (next_ >= items_.size()) throw Error(WG_RUNTIME_ERROR, "too many dispatcher arguments");
  items_[next_++] = v;
}

WG_RT_INLINE void Stack::call(const char* op, const char* overload, size_t returns, const uint8_t* tensor_returns) {
  if (items_.size() < returns) items_.resize(returns, 0);
  called_ = true;  // libtorch owns (and frees) the arguments from here on, even on error
  check(aoti_torch_call_dispatcher(op, overload, items_.data()), op);
  owned_returns_.assign(returns, false);
  for (size_t i = 0; i < returns; ++i) {
    owned_returns_[i] = tensor_returns[i] != 0;
    if (owned_returns_[i]) live_handles().fetch_add(1, std::memory_order_relaxed);
  }
}

WG_RT_INLINE Tensor Stack::take_tensor(size_t i) {
  if (i >= owned_returns_.size() || !owned_returns_[i]) throw Error(WG_RUNTIME_ERROR, "no tensor result at that index");
  owned_returns_[i] = false;
  live_handles().fetch_sub(1, std::memory_order_relaxed);
  return Tensor(reinterpret_cast<AtenTensorHandle>(items_[i]));
}

#if WG_TORCH_FEATURE_VERSION >= WG_TORCH_VERSION(2, 10)
WG_RT_INLINE Value Stack::take_tensor_list(size_t i) {
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

WG_RT_INLINE void Stack::release(const Owned& o) {
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

WG_RT_INLINE Tensor scalar_tensor_int64(int64_t v) {
  AtenTensorHandle out = nullptr;
  check(aoti_torch_scalar_to_tensor_int64(v, &out), "aoti_torch_scalar_to_tensor_int64");
  return Tensor(out);
}
WG_RT_INLINE Tensor scalar_tensor_float64(double v) {
  AtenTensorHandle out = nullptr;
  check(aoti_torch_scalar_to_tensor_float64(v, &out), "aoti_torch_scalar_to_tensor_float64");
  return Tensor(out);
}
WG_RT_INLINE Tensor scalar_tensor_float32(float v) {
  AtenTensorHandle out = nullptr;
  check(aoti_torch_scalar_to_tensor_float32(v, &out), "aoti_torch_scalar_to_tensor_float32");
  return Tensor(out);
}
WG_RT_INLINE Tensor scalar_tensor_bool(bool v) {
  AtenTensorHandle out = nullptr;
  check(aoti_torch_scalar_to_tensor_bool(v, &out), "aoti_torch_scalar_to_tensor_bool");
  return Tensor(out);
}

WG_RT_INLINE void write_message(char* buffer, int64_t size, const std::string& text) {
  if (buffer == nullptr || size <= 0) return;
  size_t n = std::min(static_cast<size_t>(size - 1), text.size());
  std::memcpy(buffer, text.data(), n);
  buffer[n] = '\0';
}

WG_RT_INLINE void assert_finite(const char* name, const Tensor& t) {
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
WG_RT_INLINE Tensor view_dtype(const Tensor& source, int32_t dtype) {
  Stack st(2);
  st.push(st.tensor(source));
  st.push(Stack::enum32(dtype));
  static const uint8_t tensor_returns[] = {1};
  st.call("aten::view", "dtype", 1, tensor_returns);
  return st.take_tensor(0);
}

WG_RT_INLINE Tensor arange_cpu_int(int64_t start, int64_t end, int64_t step, int32_t dtype) {
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
WG_RT_INLINE void* current_cuda_stream(int32_t index) {
  void* stream = nullptr;
  check(aoti_torch_get_current_cuda_stream(index, &stream), "aoti_torch_get_current_cuda_stream");
  return stream;
}
#endif  // USE_CUDA

}  // namespace wrapgen

#endif  // WRAPGEN_RUNTIME_IMPL_H_
