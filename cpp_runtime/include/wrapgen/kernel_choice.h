// wrapgen: run-time choice between kernels (the Wrapper IR's MultiKernelCall) for C++ models.
//
// A choice times each candidate once per key (a user kernel's autotune configs, or the
// persistent and looped variants of a reduction per size bucket) and caches the fastest.
// Timing runs on the call's real buffers: the buffers the choice writes are cloned first and
// copied back after each candidate (through the ABI-stable shim), so the winner, launched
// once after choosing, sees the caller's data. A candidate that throws loses; if all throw,
// the first error propagates. Choices are per model library (internal linkage).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "wrapgen/cuda_driver.h"
#include "wrapgen/runtime.h"

namespace wrapgen {

class KernelChoice {
 public:
  // The chosen candidate for `key`, or -1 when it has not been chosen yet.
  int find(const std::vector<int64_t>& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = chosen_.find(key);
    return it == chosen_.end() ? -1 : it->second;
  }

  // `serves[i]`: the only bucket of key[0] candidate i may run for (-1: any); empty: all run.
  int choose(const std::vector<int64_t>& key, int count, const std::function<void(int)>& launch,
             const std::function<void()>& sync, const std::vector<AtenTensorHandle>& writes,
             const std::vector<int64_t>& serves = {}) {
    std::vector<Tensor> saved;
    for (AtenTensorHandle w : writes) {
      AtenTensorHandle copy = nullptr;
      check(aoti_torch_clone(w, &copy), "aoti_torch_clone");
      saved.emplace_back(copy);
    }
    int best = -1;
    double best_seconds = std::numeric_limits<double>::infinity();
    std::exception_ptr first_error;
    for (int i = 0; i < count; ++i) {
      if (!serves.empty() && serves[i] >= 0 && (key.empty() || serves[i] != key[0])) continue;
      double seconds = std::numeric_limits<double>::infinity();
      try {
        seconds = time_candidate([&] { launch(i); }, sync);
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
      for (size_t j = 0; j < writes.size(); ++j) {
        check(aoti_torch_copy_(writes[j], saved[j].get(), 0), "aoti_torch_copy_");
      }
      if (seconds < best_seconds) {
        best_seconds = seconds;
        best = i;
      }
    }
    sync();
    if (best < 0) {
      if (first_error) std::rethrow_exception(first_error);
      throw Error(WG_RUNTIME_ERROR, "kernel choice: no candidate serves this key");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    chosen_[key] = best;
    ++benchmarks_;
    return best;
  }

  int64_t benchmarks() {
    std::lock_guard<std::mutex> lock(mutex_);
    return benchmarks_;
  }

 private:
  static double time_candidate(const std::function<void()>& launch, const std::function<void()>& sync) {
    using clock = std::chrono::steady_clock;
    launch();  // warm-up (first launch loads the module)
    sync();
    auto start = clock::now();
    launch();
    sync();
    const double estimate = std::max(std::chrono::duration<double>(clock::now() - start).count(), 1e-7);
    const int reps = static_cast<int>(std::min(std::max(0.003 / estimate, 3.0), 100.0));
    std::vector<double> rounds;
    for (int r = 0; r < 3; ++r) {
      auto begin = clock::now();
      for (int i = 0; i < reps; ++i) launch();
      sync();
      rounds.push_back(std::chrono::duration<double>(clock::now() - begin).count() / reps);
    }
    std::sort(rounds.begin(), rounds.end());
    return rounds[1];
  }

  std::mutex mutex_;
  std::map<std::vector<int64_t>, int> chosen_;
  int64_t benchmarks_ = 0;
};

// The power-of-two size bucket of a key value (MultiKernelCall.bucketed).
inline int64_t size_bucket(int64_t value) {
  int64_t b = 1;
  while (b < value) b <<= 1;
  return b;
}

// The choice named `name` in this model library (one per translation unit: internal linkage).
static inline KernelChoice& kernel_choice(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<KernelChoice>> choices;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = choices[name];
  if (!slot) slot = std::make_unique<KernelChoice>();
  return *slot;
}

// Wait for a CUDA stream through the driver API.
inline void cuda_stream_sync(void* stream) {
  const cuda::Driver& d = cuda::driver();
  d.check(d.cuStreamSynchronize(static_cast<cuda::CUstream>(stream)), "cuStreamSynchronize");
}

}  // namespace wrapgen
