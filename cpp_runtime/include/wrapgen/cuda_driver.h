// The CUDA driver API for model libraries: one loader for the kernel launcher (cuda_kernels.h),
// CUDA graphs (cuda_graphs.h) and run-time kernel choice (kernel_choice.h).
//
// libcuda is opened with dlopen on first use, so a model library links against no CUDA
// library of its own and builds on machines without the toolkit; the few driver types used
// are declared here with the driver's own values (cuda.h). Every entry point is resolved
// once per library, thread-safely; a missing driver or symbol is a CudaError naming it.
#pragma once
#ifndef WRAPGEN_CUDA_DRIVER_H_
#define WRAPGEN_CUDA_DRIVER_H_

#include <dlfcn.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

namespace wrapgen {
namespace cuda {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;
using CUdeviceptr = unsigned long long;
constexpr CUresult kSuccess = 0;

class CudaError : public std::runtime_error {
 public:
  explicit CudaError(const std::string& message) : std::runtime_error(message) {}
};

// The driver entry points model libraries use.
struct Driver {
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  // kernels
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuFuncSetCacheConfig)(CUfunction, int) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**) = nullptr;
  // streams, events, graphs
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*cuStreamBeginCapture)(CUstream, int) = nullptr;  // cuStreamBeginCapture_v2
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
  // copies (a graph's copied inputs into their static buffers)
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;  // cuMemcpyDtoDAsync_v2

  std::string error_text(CUresult code) const {
    const char* text = nullptr;
    if (cuGetErrorString != nullptr) cuGetErrorString(code, &text);
    return text != nullptr ? std::string(text) : "CUDA error " + std::to_string(code);
  }

  void check(CUresult code, const char* what) const {
    if (code != kSuccess) throw CudaError(std::string(what) + " failed: " + error_text(code));
  }
};

template <typename F>
inline void resolve(void* library, const char* name, F& slot) {
  slot = reinterpret_cast<F>(dlsym(library, name));
  if (slot == nullptr) throw CudaError(std::string("libcuda.so.1 has no ") + name);
}

// The driver, or a CudaError saying why it cannot be had (no libcuda, missing symbol).
inline const Driver& driver() {
  static std::once_flag once;
  static Driver loaded;
  static std::string failure;
  std::call_once(once, [] {
    try {
      void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      if (library == nullptr) {
        const char* why = dlerror();
        throw CudaError(std::string("cannot open libcuda.so.1 (the NVIDIA driver): ") + (why ? why : "unknown"));
      }
      Driver& d = loaded;
      resolve(library, "cuGetErrorString", d.cuGetErrorString);
      resolve(library, "cuDeviceGet", d.cuDeviceGet);
      resolve(library, "cuDeviceGetAttribute", d.cuDeviceGetAttribute);
      resolve(library, "cuCtxGetCurrent", d.cuCtxGetCurrent);
      resolve(library, "cuCtxSetCurrent", d.cuCtxSetCurrent);
      resolve(library, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain);
      resolve(library, "cuModuleLoadData", d.cuModuleLoadData);
      resolve(library, "cuModuleGetFunction", d.cuModuleGetFunction);
      resolve(library, "cuFuncGetAttribute", d.cuFuncGetAttribute);
      resolve(library, "cuFuncSetAttribute", d.cuFuncSetAttribute);
      resolve(library, "cuFuncSetCacheConfig", d.cuFuncSetCacheConfig);
      resolve(library, "cuLaunchKernel", d.cuLaunchKernel);
      resolve(library, "cuStreamCreate", d.cuStreamCreate);
      resolve(library, "cuStreamSynchronize", d.cuStreamSynchronize);
      resolve(library, "cuStreamWaitEvent", d.cuStreamWaitEvent);
      resolve(library, "cuStreamBeginCapture_v2", d.cuStreamBeginCapture);
      resolve(library, "cuStreamEndCapture", d.cuStreamEndCapture);
      resolve(library, "cuEventCreate", d.cuEventCreate);
      resolve(library, "cuEventRecord", d.cuEventRecord);
      resolve(library, "cuGraphInstantiateWithFlags", d.cuGraphInstantiateWithFlags);
      resolve(library, "cuGraphLaunch", d.cuGraphLaunch);
      resolve(library, "cuGraphExecDestroy", d.cuGraphExecDestroy);
      resolve(library, "cuGraphDestroy", d.cuGraphDestroy);
      resolve(library, "cuMemcpyDtoDAsync_v2", d.cuMemcpyDtoDAsync);
    } catch (const CudaError& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw CudaError(failure);
  return loaded;
}

}  // namespace cuda
}  // namespace wrapgen

#endif  // WRAPGEN_CUDA_DRIVER_H_
