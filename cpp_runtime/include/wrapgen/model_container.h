// ModelContainer: a loaded model library plus its constants (weights), callable from many
// threads at once, with double-buffered weight updates:
//
//   * two constant sets; runs read the active one under a shared lock on that set;
//   * update_constants() (one at a time) takes the inactive set's exclusive lock, which waits
//     for runs still reading it from before the previous switch, copies the new values in,
//     then switches the active index under the update mutex.
//
// A run therefore sees either the old or the new weights in full, never a mix, and runs never
// wait for an update's copy (only for the pointer switch).
#pragma once
#ifndef WRAPGEN_MODEL_CONTAINER_H_
#define WRAPGEN_MODEL_CONTAINER_H_

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "wrapgen/arrayref.h"
#include "wrapgen/runtime.h"
#include "wrapgen/tensor_file.h"

namespace wrapgen {

// The exported functions of one model library (dlopen'ed once, closed with the object).
class ModelLibrary {
 public:
  explicit ModelLibrary(const std::string& path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* why = dlerror();
      throw Error(WG_RUNTIME_ERROR, "cannot load model " + path + ": " + (why ? why : "unknown error"));
    }
    abi_version = symbol<WgAbiVersionFn>("wg_abi_version");
    if (abi_version() != WG_MODEL_ABI_VERSION) {
      throw Error(
          WG_RUNTIME_ERROR,
          path + " uses model ABI " + std::to_string(abi_version()) + "; this runtime expects " + std::to_string(WG_MODEL_ABI_VERSION));
    }
    metadata = symbol<WgMetadataFn>("wg_metadata");
    run = symbol<WgRunFn>("wg_run");
    live_handles = symbol<WgLiveHandlesFn>("wg_live_handles");
    num_inputs = symbol<WgCountFn>("wg_num_inputs")();
    num_outputs = symbol<WgCountFn>("wg_num_outputs")();
    auto num_constants_fn = symbol<WgCountFn>("wg_num_constants");
    auto name_fn = symbol<WgConstantNameFn>("wg_constant_name");
    for (int64_t i = 0; i < num_constants_fn(); ++i) constant_names.emplace_back(name_fn(i));
    constant_device = reinterpret_cast<WgConstantDeviceFn>(dlsym(handle_, "wg_constant_device"));
    run_arrayref = reinterpret_cast<WgRunArrayRefFn>(dlsym(handle_, "wg_run_arrayref"));
    arrayref_output = reinterpret_cast<WgArrayRefOutputFn>(dlsym(handle_, "wg_arrayref_output"));
    arrayref_bind = reinterpret_cast<WgArrayRefBindFn>(dlsym(handle_, "wg_arrayref_bind"));
    arrayref_unbind = reinterpret_cast<WgArrayRefUnbindFn>(dlsym(handle_, "wg_arrayref_unbind"));
    run_arrayref_bound = reinterpret_cast<WgRunArrayRefBoundFn>(dlsym(handle_, "wg_run_arrayref_bound"));
  }
  ModelLibrary(const ModelLibrary&) = delete;
  ModelLibrary& operator=(const ModelLibrary&) = delete;
  ~ModelLibrary() {
    if (handle_ != nullptr) dlclose(handle_);
  }

  WgAbiVersionFn abi_version = nullptr;
  WgMetadataFn metadata = nullptr;
  WgRunFn run = nullptr;
  WgLiveHandlesFn live_handles = nullptr;
  int64_t num_inputs = 0;
  int64_t num_outputs = 0;
  std::vector<std::string> constant_names;
  WgConstantDeviceFn constant_device = nullptr;  // null: a library from before devices were recorded
  WgRunArrayRefFn run_arrayref = nullptr;  // null: a package built without arrayref=True
  WgArrayRefOutputFn arrayref_output = nullptr;
  // null: a package from before constants could be bound (its calls go through run_arrayref)
  WgArrayRefBindFn arrayref_bind = nullptr;
  WgArrayRefUnbindFn arrayref_unbind = nullptr;
  WgRunArrayRefBoundFn run_arrayref_bound = nullptr;

 private:
  template <typename Fn>
  Fn symbol(const char* name) {
    void* p = dlsym(handle_, name);
    if (p == nullptr) throw Error(WG_RUNTIME_ERROR, std::string("model library lacks ") + name);
    return reinterpret_cast<Fn>(p);
  }
  void* handle_ = nullptr;
};

class ModelContainer {
 public:
  // `constants`: one tensor per constant name of the library (extra names are an error).
  ModelContainer(const std::string& library_path, std::vector<NamedTensor> constants) : library_(library_path) {
    std::map<std::string, Tensor> by_name;
    for (auto& c : constants) by_name[c.name] = std::move(c.tensor);
    for (size_t i = 0; i < library_.constant_names.size(); ++i) {
      const auto& name = library_.constant_names[i];
      auto it = by_name.find(name);
      if (it == by_name.end()) throw Error(WG_RUNTIME_ERROR, "no value for constant " + name);
      Tensor value = it->second.share();
      if (library_.constant_device != nullptr) {  // weights read from a file sit on the CPU
        int32_t type = 0, index = 0;
        library_.constant_device(static_cast<int64_t>(i), &type, &index);
        if (!on_device(value, type, index)) value = clone(value, type, index);
      }
      sets_[1].tensors.push_back(clone(value));  // the second buffer: its own storage
      sets_[0].tensors.push_back(std::move(value));
    }
    for (auto& set : sets_) {
      for (auto& t : set.tensors) set.handles.push_back(t.get());
    }
    // Each set bound once: weight updates copy into the same memory, so the binding stays valid.
    if (library_.arrayref_bind != nullptr && library_.run_arrayref_bound != nullptr && library_.arrayref_unbind != nullptr) {
      for (auto& set : sets_) {
        char message[1024] = {0};
        const int32_t status = library_.arrayref_bind(reinterpret_cast<void* const*>(set.handles.data()),
                                                      static_cast<int64_t>(set.handles.size()), &set.bound, message, sizeof(message));
        if (status != WG_OK) {
          unbind();
          throw Error(status, message);
        }
      }
    }
  }
  ModelContainer(const ModelContainer&) = delete;
  ModelContainer& operator=(const ModelContainer&) = delete;
  ~ModelContainer() { unbind(); }

  const ModelLibrary& library() const { return library_; }
  int64_t num_inputs() const { return library_.num_inputs; }
  int64_t num_outputs() const { return library_.num_outputs; }
  const std::vector<std::string>& constant_names() const { return library_.constant_names; }

  // Runs on `inputs` (tensor handles in it are taken over). Returns outputs whose tensor handles
  // the caller owns. Throws Error (kind WG_INPUT_MISMATCH for bad inputs).
  std::vector<WgValue> run(std::vector<WgValue>& inputs) {
    std::vector<WgValue> outputs(static_cast<size_t>(std::max<int64_t>(library_.num_outputs, 1)));
    char message[4096] = {0};
    int32_t status;
    {
      ConstantSet& set = acquire();
      std::shared_lock<std::shared_mutex> reading(set.in_use, std::adopt_lock);
      status = library_.run(
          set.handles.data(), static_cast<int64_t>(set.handles.size()), inputs.data(), static_cast<int64_t>(inputs.size()),
          outputs.data(), library_.num_outputs, message, sizeof(message));
    }
    if (status != WG_OK) throw Error(status, message);
    outputs.resize(static_cast<size_t>(library_.num_outputs));
    return outputs;
  }

  // Runs the array-ref entry: outputs are written into the caller's memory. Throws Error (kind
  // WG_INPUT_MISMATCH for a descriptor that does not match, naming it).
  void run_arrayref(const WgArray* inputs, int64_t num_inputs, const WgArray* outputs, int64_t num_outputs) {
    if (library_.run_arrayref == nullptr) throw Error(WG_RUNTIME_ERROR, "the package has no array-ref entry (aot_compile(..., arrayref=True))");
    char message[1024];
    message[0] = 0;
    int32_t status;
    {
      ConstantSet& set = acquire();
      std::shared_lock<std::shared_mutex> reading(set.in_use, std::adopt_lock);
      if (set.bound != nullptr) {
        status = library_.run_arrayref_bound(set.bound, inputs, num_inputs, outputs, num_outputs, message, sizeof(message));
      } else {
        status = library_.run_arrayref(reinterpret_cast<void* const*>(set.handles.data()), static_cast<int64_t>(set.handles.size()),
                                       inputs, num_inputs, outputs, num_outputs, message, sizeof(message));
      }
    }
    if (status != WG_OK) throw Error(status, message);
  }

  // Double-buffered weight update: values (by constant name) are copied into the inactive set,
  // which then becomes active. Names not given keep their current values.
  void update_constants(const std::map<std::string, const Tensor*>& values) {
    for (const auto& entry : values) {
      const auto& names = library_.constant_names;
      if (std::find(names.begin(), names.end(), entry.first) == names.end()) {
        throw Error(WG_RUNTIME_ERROR, "the model has no constant named " + entry.first);
      }
    }
    std::lock_guard<std::mutex> one_update(update_mutex_);
    const int active = active_.load();
    ConstantSet& target = sets_[1 - active];
    {
      std::unique_lock<std::shared_mutex> writing(target.in_use);  // waits for runs from before the last switch
      const ConstantSet& current = sets_[active];
      for (size_t i = 0; i < library_.constant_names.size(); ++i) {
        auto it = values.find(library_.constant_names[i]);
        const Tensor& source = it != values.end() ? *it->second : current.tensors[i];
        check(aoti_torch_copy_(target.tensors[i].get(), source.get(), 0), "aoti_torch_copy_");
      }
    }
    active_.store(1 - active);  // the switch, under update_mutex_
    swaps_.fetch_add(1);
  }

  int64_t swaps() const { return swaps_.load(); }
  int64_t live_handles() const { return library_.live_handles(); }

 private:
  struct ConstantSet {
    std::vector<Tensor> tensors;
    std::vector<AtenTensorHandle> handles;
    std::shared_mutex in_use;
    void* bound = nullptr;  // the array-ref entry's binding of `handles` (wg_arrayref_bind)
  };

  void unbind() {
    for (auto& set : sets_) {
      if (set.bound != nullptr) library_.arrayref_unbind(set.bound);
      set.bound = nullptr;
    }
  }

  // The active set, shared-locked (and still active once locked).
  ConstantSet& acquire() {
    for (;;) {
      const int index = active_.load();
      ConstantSet& set = sets_[index];
      set.in_use.lock_shared();
      if (active_.load() == index) return set;
      set.in_use.unlock_shared();
    }
  }

  static bool on_device(const Tensor& t, int32_t type, int32_t index) {
    int32_t actual_type = 0, actual_index = 0;
    check(aoti_torch_get_device_type(t.get(), &actual_type), "aoti_torch_get_device_type");
    check(aoti_torch_get_device_index(t.get(), &actual_index), "aoti_torch_get_device_index");
    return actual_type == type && (index < 0 || actual_index == index);
  }

  // A copy of `t` with its own storage, on `t`'s device or on (device_type, device_index).
  static Tensor clone(const Tensor& t, int32_t to_type = -1, int32_t to_index = -1) {
    const int64_t ndim = t.dim();
    std::vector<int64_t> sizes(static_cast<size_t>(ndim)), strides(static_cast<size_t>(ndim));
    for (int64_t d = 0; d < ndim; ++d) {
      sizes[static_cast<size_t>(d)] = t.size(d);
      strides[static_cast<size_t>(d)] = t.stride(d);
    }
    int32_t dtype = 0, device_type = 0, device_index = 0;
    check(aoti_torch_get_dtype(t.get(), &dtype), "aoti_torch_get_dtype");
    check(aoti_torch_get_device_type(t.get(), &device_type), "aoti_torch_get_device_type");
    check(aoti_torch_get_device_index(t.get(), &device_index), "aoti_torch_get_device_index");
    if (to_type >= 0) {
      device_type = to_type;
      device_index = to_index;
    }
    AtenTensorHandle out = nullptr;
    check(aoti_torch_empty_strided(ndim, sizes.data(), strides.data(), dtype, device_type, device_index, &out), "aoti_torch_empty_strided");
    Tensor copy(out);
    check(aoti_torch_copy_(copy.get(), t.get(), 0), "aoti_torch_copy_");
    return copy;
  }

  ModelLibrary library_;
  std::array<ConstantSet, 2> sets_;
  std::atomic<int> active_{0};
  std::mutex update_mutex_;
  std::atomic<int64_t> swaps_{0};
};

}  // namespace wrapgen

#endif  // WRAPGEN_MODEL_CONTAINER_H_
