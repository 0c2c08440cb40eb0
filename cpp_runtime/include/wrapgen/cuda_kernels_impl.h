// Definitions of wrapgen::cuda::Kernel's launch and load (see cuda_kernels.h): inline unless
// WRAPGEN_RUNTIME_LINKED is defined, then compiled once per cache into the runtime object.
#pragma once
#ifndef WRAPGEN_CUDA_KERNELS_IMPL_H_
#define WRAPGEN_CUDA_KERNELS_IMPL_H_

#include "wrapgen/cuda_kernels.h"

#ifndef WG_RT_INLINE
#define WG_RT_INLINE inline
#endif

namespace wrapgen {
namespace cuda {

WG_RT_INLINE void Kernel::launch(int device, int64_t gx, int64_t gy, int64_t gz, void* stream, std::initializer_list<void*> args) const {
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

WG_RT_INLINE CUfunction Kernel::function(int device) const {
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

WG_RT_INLINE CUfunction Kernel::load(int device) const {
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
  if (image_ == nullptr) resolve();
  if (image_end_ <= image_) throw CudaError(what + ": the embedded binary is empty");
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

WG_RT_INLINE void Kernel::resolve() const {
  KernelResolver resolver = kernel_resolver().load(std::memory_order_acquire);
  if (resolver == nullptr) {
    throw CudaError(std::string("kernel ") + name_ +
                    " is not built into this library (it is compiled on first use, and no compiler is "
                    "attached to this process: build a package with wrapgen.aot_compile, which embeds every kernel)");
  }
  KernelImage out{};
  char message[2048] = {0};
  if (resolver(name_, &out, message, sizeof(message)) != 0 || out.image == nullptr || out.size == 0 ||
      out.function_name == nullptr) {
    throw CudaError(std::string("compiling kernel ") + name_ + " failed: " + message);
  }
  function_name_ = out.function_name;
  shared_bytes_ = out.shared_bytes;
  num_warps_ = out.num_warps;
  scratch_params_ = out.scratch_params;
  image_end_ = out.image + out.size;
  image_ = out.image;
}

}  // namespace cuda
}  // namespace wrapgen

#endif  // WRAPGEN_CUDA_KERNELS_IMPL_H_
