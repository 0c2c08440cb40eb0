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

// A kernel binary handed over at run time (the lazy variants below): what a launch needs.
// The image stays valid for the life of the process (the one who hands it keeps it).
struct KernelImage {
  const unsigned char* image;
  uint64_t size;
  const char* function_name;
  uint32_t shared_bytes;
  uint32_t num_warps;
  uint32_t scratch_params;
  uint32_t reserved;
};

// Compiles a kernel the library was built without (by its table name) into `out`; 0 on success,
// else nonzero with a message. A model built in-process leaves the variants for unaligned
// pointers to this (wrapgen's Python side attaches one through `wg_set_kernel_resolver`), so its
// cold build compiles each kernel once; an AOT package embeds every variant and needs none.
using KernelResolver = int32_t (*)(const char* kernel_name, KernelImage* out, char* message, int64_t message_size);

// The library's resolver (one per model library: the runtime's symbols are hidden).
inline std::atomic<KernelResolver>& kernel_resolver() {
  static std::atomic<KernelResolver> resolver{nullptr};
  return resolver;
}

// One compiled kernel: its binary and what a launch needs. The binary is loaded into a
// device's context on the first launch there.
class Kernel {
 public:
  // constexpr, with the binary as [image, image_end): a model's kernel table is then
  // constant-initialized data, no start-up code to compile or run (the loaded functions start
  // as null pointers).
  constexpr Kernel(const char* name, const char* function_name, const unsigned char* image,
                   const unsigned char* image_end, uint32_t shared_bytes, uint32_t num_warps, uint32_t scratch_params)
      : name_(name),
        function_name_(function_name),
        image_(image),
        image_end_(image_end),
        shared_bytes_(shared_bytes),
        num_warps_(num_warps),
        scratch_params_(scratch_params),
        functions_{} {}
  // A kernel whose binary the library lacks: kernel_resolver() compiles it on first launch.
  constexpr explicit Kernel(const char* name)
      : name_(name), function_name_(nullptr), image_(nullptr), image_end_(nullptr), shared_bytes_(0),
        num_warps_(0), scratch_params_(0), functions_{} {}
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  // Launch on `stream` with `args` (pointers to each argument's value, in the kernel's
  // parameter order). An empty grid launches nothing, as in PyTorch.
  void launch(int device, int64_t gx, int64_t gy, int64_t gz, void* stream, std::initializer_list<void*> args) const;

  const char* name() const { return name_; }

 private:
  static constexpr size_t kMaxParams = 1024;  // a fused update of every parameter passes hundreds

  CUfunction function(int device) const;

  CUfunction load(int device) const;

  // Fills a lazy kernel's binary and launch facts from kernel_resolver() (under load_lock_,
  // before its first function is published, so launches read them after the acquire).
  void resolve() const;

  const char* name_;
  // A lazy kernel's fields are written once, by resolve().
  mutable const char* function_name_;
  mutable const unsigned char* image_;
  mutable const unsigned char* image_end_;
  mutable uint32_t shared_bytes_;
  mutable uint32_t num_warps_;
  mutable uint32_t scratch_params_;
  mutable std::array<std::atomic<CUfunction>, kMaxDevices> functions_;
  mutable std::mutex load_lock_;
};

// Whether a device pointer is 16-byte aligned (kernels compiled for aligned inputs need it).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace cuda
}  // namespace wrapgen

// Launch and load are defined inline here, or once per cache in a model built with
// WRAPGEN_RUNTIME_LINKED (as runtime.h's helpers are).
#ifndef WRAPGEN_RUNTIME_LINKED
#include "wrapgen/cuda_kernels_impl.h"
#endif

#endif  // WRAPGEN_CUDA_KERNELS_H_
