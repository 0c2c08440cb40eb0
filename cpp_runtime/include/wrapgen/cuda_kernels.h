// Loading and launching compiled GPU kernels (Triton's cubins) from C++ through the CUDA
// driver API, for models built with `target="cpp"` on CUDA.
//
// The driver comes from cuda_driver.h (libcuda opened with dlopen on first use, so a model
// library links against no CUDA library and builds without the toolkit). Each kernel's binary is embedded
// in the model library (the generated kernel table); it is loaded into a device's context
// the first time it launches there, once, thread-safely, and launched with the stream and
// grid the wrapper computes.
#pragma once
#ifndef WRAPGEN_CUDA_KERNELS_H_
#define WRAPGEN_CUDA_KERNELS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <stdexcept>
#include <string>

#include "wrapgen/abi.h"
#include "wrapgen/cuda_driver.h"

namespace wrapgen {
namespace cuda {

// The driver API's enum values used here (cuda.h).
constexpr int kFuncAttributeSharedSizeBytes = 1;          // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
constexpr int kFuncAttributeMaxDynamicSharedBytes = 8;    // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kDeviceAttributeMaxSharedPerBlockOptin = 97;  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
constexpr int kFuncCachePreferShared = 1;                 // CU_FUNC_CACHE_PREFER_SHARED
constexpr uint32_t kStaticSharedLimit = 48 * 1024;       // without opting in, a block gets at most this

constexpr int kMaxDevices = 64;

// One compiled kernel: its binary and what a launch needs. The binary is loaded into a
// device's context on the first launch there.
class Kernel {
 public:
  Kernel(const char* name, const char* function_name, const unsigned char* image, size_t image_size,
         uint32_t shared_bytes, uint32_t num_warps, uint32_t scratch_params)
      : name_(name),
        function_name_(function_name),
        image_(image),
        image_size_(image_size),
        shared_bytes_(shared_bytes),
        num_warps_(num_warps),
        scratch_params_(scratch_params) {
    for (auto& f : functions_) f.store(nullptr, std::memory_order_relaxed);
  }
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  // Launch on `stream` with `args` (pointers to each argument's value, in the kernel's
  // parameter order). An empty grid launches nothing, as in PyTorch.
  void launch(int device, int64_t gx, int64_t gy, int64_t gz, void* stream, std::initializer_list<void*> args) const {
    if (gx <= 0 || gy <= 0 || gz <= 0) return;
    if (gx > 0x7fffffffLL || gy > 65535 || gz > 65535) {
      throw CudaError(std::string("kernel ") + name_ + ": launch grid (" + std::to_string(gx) + ", " +
                      std::to_string(gy) + ", " + std::to_string(gz) + ") exceeds the device's limits");
    }
    CUfunction function = this->function(device);
    // Triton's kernels take trailing scratch pointers; the kernels wrapgen builds use no scratch.
    CUdeviceptr scratch = 0;
    void* params[kMaxParams];
    size_t n = 0;
    if (args.size() + scratch_params_ > kMaxParams) throw CudaError(std::string("kernel ") + name_ + ": too many arguments");
    for (void* a : args) params[n++] = a;
    for (uint32_t i = 0; i < scratch_params_; ++i) params[n++] = &scratch;
    const Driver& d = driver();
    const CUresult status = d.cuLaunchKernel(function, static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                                             static_cast<unsigned>(gz), 32 * num_warps_, 1, 1, shared_bytes_,
                                             static_cast<CUstream>(stream), params, nullptr);
    if (status != kSuccess) {  // the message is built only on failure: launches are the hot path
      throw CudaError(std::string("launching kernel ") + name_ + " failed: " + d.error_text(status));
    }
  }

  const char* name() const { return name_; }

 private:
  static constexpr size_t kMaxParams = 256;

  CUfunction function(int device) const {
    if (device < 0 || device >= kMaxDevices) throw CudaError("CUDA device index out of range: " + std::to_string(device));
    CUfunction f = functions_[device].load(std::memory_order_acquire);
    if (f != nullptr) return f;
    std::lock_guard<std::mutex> hold(load_lock_);
    f = functions_[device].load(std::memory_order_relaxed);
    if (f == nullptr) {
      f = load(device);
      functions_[device].store(f, std::memory_order_release);
    }
    return f;
  }

  CUfunction load(int device) const {
    const Driver& d = driver();
    CUcontext context = nullptr;
    d.check(d.cuCtxGetCurrent(&context), "cuCtxGetCurrent");
    if (context == nullptr) {  // a thread that never touched the device: use its primary context
      CUdevice dev = 0;
      d.check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
      d.check(d.cuDevicePrimaryCtxRetain(&context, dev), "cuDevicePrimaryCtxRetain");
      d.check(d.cuCtxSetCurrent(context), "cuCtxSetCurrent");
    }
    const std::string what = std::string("loading kernel ") + name_;
    if (image_size_ == 0) throw CudaError(what + ": the embedded binary is empty");
    CUmodule module = nullptr;
    d.check(d.cuModuleLoadData(&module, image_), what.c_str());
    CUfunction f = nullptr;
    d.check(d.cuModuleGetFunction(&f, module, function_name_), what.c_str());
    if (shared_bytes_ > kStaticSharedLimit) {  // opt in to more shared memory, as Triton's launcher does
      CUdevice dev = 0;
      int optin = 0, static_shared = 0;
      d.check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
      d.check(d.cuDeviceGetAttribute(&optin, kDeviceAttributeMaxSharedPerBlockOptin, dev), "cuDeviceGetAttribute");
      if (static_cast<uint32_t>(optin) < shared_bytes_) {
        throw CudaError(std::string("kernel ") + name_ + " needs " + std::to_string(shared_bytes_) +
                        " bytes of shared memory; the device allows " + std::to_string(optin));
      }
      d.check(d.cuFuncSetCacheConfig(f, kFuncCachePreferShared), what.c_str());
      d.check(d.cuFuncGetAttribute(&static_shared, kFuncAttributeSharedSizeBytes, f), what.c_str());
      d.check(d.cuFuncSetAttribute(f, kFuncAttributeMaxDynamicSharedBytes, optin - static_shared), what.c_str());
    }
    return f;
  }

  const char* name_;
  const char* function_name_;
  const unsigned char* image_;
  size_t image_size_;
  uint32_t shared_bytes_;
  uint32_t num_warps_;
  uint32_t scratch_params_;
  mutable std::array<std::atomic<CUfunction>, kMaxDevices> functions_;
  mutable std::mutex load_lock_;
};

// Whether a device pointer is 16-byte aligned (kernels compiled for aligned inputs need it).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace cuda
}  // namespace wrapgen

#endif  // WRAPGEN_CUDA_KERNELS_H_
