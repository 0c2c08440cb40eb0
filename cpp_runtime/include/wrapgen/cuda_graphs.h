// CUDA-graph regions of C++ models (the GraphBegin ... GraphEnd lines of the Wrapper IR):
// warm up, record with CUDA stream capture, replay with one graph launch.
//
// The generated wrapper holds one `Program` (per model library) and one `Region` per region,
// and runs each region through a `Call`:
//
//   Call call(program, region, device, first);
//   call.key({s0, s1}); call.input(t_x, false); call.input(t_w, true);
//   if (call.replay()) { t_out = call.output(0); }          // recorded: copy inputs in, launch
//   else { Tensor t_x = call.bind(0); ...; call.begin_body(); <lines>; call.end_body({&t_out}, {...}); }
//
// The first call with a key (the key symbols, and the strides of the inputs copied in) runs the
// lines eagerly on the capture stream (the warm-up); the second records them on that stream
// (PyTorch's current stream is switched to it, so library calls are recorded too) and launches
// the graph; later ones copy the copied inputs into the graph's static buffers and launch it.
// Inputs used in place (constants, parameters) are checked by address: a changed address (for
// example after a double-buffered weight update) records the graph again.
//
// Memory: the stable C shim has no access to PyTorch's graph memory pools, so every tensor the
// wrapper allocates while recording is held by the graph until it is dropped (at most
// kMaxGraphs per region), and freed tensors are held too (`release`). All recording happens on
// the program's own capture stream (made with the driver, never one of PyTorch's pooled
// streams, on which a destroyed torch.cuda.graph frees the stream's cuBLAS workspace from torch
// 2.13). That workspace belongs to PyTorch, which may still free it (`workspace_epoch`).
//
// Threads: runs of a model with graphs are serialized by the program's mutex (`RunGuard`, held
// for the whole run, since graph memory is shared by all runs), and a run on another stream than
// the previous run's waits for the work queued on that stream so far (an event recorded there as
// the new run starts), so static buffers are never written while a replay reads.
//
// The driver comes from cuda_driver.h (dlopen of libcuda): this header compiles without the CUDA
// toolkit; without USE_CUDA (a CPU model) a region always runs eagerly.
#pragma once
#ifndef WRAPGEN_CUDA_GRAPHS_H_
#define WRAPGEN_CUDA_GRAPHS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "wrapgen/cuda_driver.h"
#include "wrapgen/runtime.h"

namespace wrapgen {
namespace graphs {

constexpr size_t kMaxGraphs = 8;     // recorded graphs kept per region (least recently used dropped)
constexpr int kMaxRecords = 64;      // a region recorded more often runs eagerly from then on

using cuda::CUevent;
using cuda::CUresult;
using cuda::CUgraph;
using cuda::CUgraphExec;
using cuda::CUstream;
using cuda::Driver;
using cuda::driver;
constexpr unsigned kStreamNonBlocking = 1;      // CU_STREAM_NON_BLOCKING
constexpr int kCaptureModeRelaxed = 2;          // CU_STREAM_CAPTURE_MODE_RELAXED
constexpr unsigned kEventDisableTiming = 2;     // CU_EVENT_DISABLE_TIMING

// A tensor handle a graph holds: not counted in live_handles() (the per-call leak check).
inline AtenTensorHandle hold(Tensor&& t) { return t.release(); }
inline AtenTensorHandle hold_share(const Tensor& t) { return t.share().release(); }

// One recorded graph of a region.
struct Graph {
  std::vector<int64_t> key;
  std::vector<void*> pointers;               // addresses of the in-place inputs, in order
  std::vector<int> copy_input;               // input index of each copied input
  std::vector<AtenTensorHandle> copy_static; // the static buffer the graph reads (input's layout)
  std::vector<AtenTensorHandle> copy_flat;   // its storage span as a flat tensor (null: dense, copy elementwise)
  std::vector<int64_t> copy_span;
  // A copied input on the graph's own device is copied by one driver memcpy of its bytes (a
  // dispatcher copy costs 10-20 us of host time, several per decode step): the bytes (0: the
  // dispatcher's copy), the static buffer's address, and the dtype and sizes it was recorded
  // with (a source that differs in either takes the dispatcher's copy, which converts or fails).
  std::vector<size_t> copy_bytes;
  std::vector<void*> copy_address;
  std::vector<int32_t> copy_dtype;
  std::vector<std::vector<int64_t>> copy_sizes;
  std::vector<AtenTensorHandle> outputs;
  std::vector<AtenTensorHandle> keep;        // everything else the recording allocated
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  uint64_t generation = 0;
  uint64_t workspaces = 0;                   // workspace_epoch() when it was recorded

  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    try {
      const Driver& d = driver();
      if (exec != nullptr) d.cuGraphExecDestroy(exec);
      if (graph != nullptr) d.cuGraphDestroy(graph);
    } catch (...) {
    }
    for (auto* list : {&copy_static, &copy_flat, &outputs, &keep}) {
      for (AtenTensorHandle h : *list) {
        if (h != nullptr) aoti_torch_delete_tensor_object(h);
      }
    }
  }
};

// Per region: its recorded graphs (most recently used first) and the keys warmed up so far.
struct Region {
  std::vector<std::unique_ptr<Graph>> graphs;
  std::vector<std::vector<int64_t>> warm;
  int records = 0;
  bool eager = false;
};

// Counts the clears of PyTorch's cuBLAS workspaces this library was told of
// (`wg_workspaces_cleared`, called by wrapgen's Python side around each clear). A recorded
// matmul writes into the workspace its stream had when recorded; a clear frees it, so a graph
// recorded before the last clear is recorded again, never replayed into freed memory.
inline std::atomic<uint64_t>& workspace_epoch() {
  static std::atomic<uint64_t> epoch{0};
  return epoch;
}

// Per model library: the lock runs take, the capture stream, and the recording order.
struct Program {
  std::mutex mutex;
  CUstream capture_stream = nullptr;  // made on the first warm-up; warm-ups and recordings run on it
  CUevent done = nullptr;        // orders the capture stream and a new run's stream after earlier work
  CUstream done_on = nullptr;    // the stream the last run ran on ...
  bool done_on_known = false;    // ... once there was one (the default stream's handle is null too)
  uint64_t generation = 0;  // of the last graph recorded
  uint64_t last = 0;        // of the last graph replayed in the current run
};

// Held for a whole run of a model with graph regions (see the header comment).
class RunGuard {
 public:
  RunGuard(Program& program, int32_t device) : program_(program), lock_(program.mutex), device_(device) {
#ifdef USE_CUDA
    // Only a run on another stream than the last one's is ordered, and only then is an event
    // recorded on that stream: a run on the same stream (the usual case) queues nothing extra
    // between one run's graph launches and the next's.
    stream_ = static_cast<CUstream>(current_cuda_stream(device_));
    if (program_.done_on_known && program_.done_on != stream_) {
      const Driver& d = driver();
      if (program_.done == nullptr) d.check(d.cuEventCreate(&program_.done, kEventDisableTiming), "cuEventCreate");
      // A failed record means the last run's stream was destroyed meanwhile: nothing to wait for.
      if (d.cuEventRecord(program_.done, program_.done_on) == 0) {
        d.check(d.cuStreamWaitEvent(stream_, program_.done, 0), "cuStreamWaitEvent");
      }
    }
#endif
  }
  ~RunGuard() {
#ifdef USE_CUDA
    program_.done_on = stream_;
    program_.done_on_known = true;
#endif
  }
  RunGuard(const RunGuard&) = delete;
  RunGuard& operator=(const RunGuard&) = delete;

 private:
  Program& program_;
  std::lock_guard<std::mutex> lock_;
  int32_t device_;
#ifdef USE_CUDA
  CUstream stream_ = nullptr;
#endif
};

// One run of one region.
class Call {
 public:
  Call(Program& program, Region& region, int32_t device, bool first, bool cuda)
      : program_(program), region_(region), device_(device) {
    if (first) program_.last = 0;
#ifdef USE_CUDA
    can_capture_ = cuda && !region_.eager;
#else
    (void)cuda;
    can_capture_ = false;
#endif
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  ~Call() { abort(); }

  void key(std::initializer_list<int64_t> values) { key_.insert(key_.end(), values.begin(), values.end()); }

  // `t` is the wrapper's own variable, which outlives this Call (no new reference per call).
  void input(const Tensor& t, bool in_place) {
    inputs_.push_back(&t);
    in_place_.push_back(in_place);
    if (in_place) {
      pointers_.push_back(t.data_ptr());
      return;
    }
    const int64_t ndim = t.dim();
    key_.push_back(ndim);
    for (int64_t d = 0; d < ndim; ++d) key_.push_back(t.stride(d));
  }

  // Launches the recorded graph for this key (true), or says the lines must run (false).
  bool replay() {
    if (!can_capture_) return false;
#ifdef USE_CUDA
    auto& graphs = region_.graphs;
    for (size_t i = 0; i < graphs.size(); ++i) {
      Graph& g = *graphs[i];
      if (g.key != key_) continue;
      const bool freed_workspace = g.workspaces != workspace_epoch().load(std::memory_order_acquire);
      if (g.generation < program_.last || g.pointers != pointers_ || freed_workspace) {  // stale: record it again
        graphs.erase(graphs.begin() + static_cast<std::ptrdiff_t>(i));
        capturing_wanted_ = true;
        return false;
      }
      if (i != 0) std::rotate(graphs.begin(), graphs.begin() + static_cast<std::ptrdiff_t>(i), graphs.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      launch(*graphs.front());
      replayed_ = graphs.front().get();
      return true;
    }
    auto& warm = region_.warm;
    if (std::find(warm.begin(), warm.end(), key_) == warm.end()) {
      if (warm.size() > 4 * kMaxRecords) warm.clear();
      warm.push_back(key_);  // this run is the warm-up
      return false;
    }
    capturing_wanted_ = true;
#endif
    return false;
  }

  Tensor output(size_t i) const { return Tensor::borrow(replayed_->outputs.at(i)); }

  // The tensor the lines read for input i: its static buffer when recording, else the input.
  Tensor bind(size_t i) {
    if (!capturing_wanted_ || in_place_[i]) return inputs_[i]->share();
    if (!pending_) pending_ = std::make_unique<Graph>();
    const Tensor& t = *inputs_[i];
    const int64_t ndim = t.dim();
    std::vector<int64_t> sizes(static_cast<size_t>(ndim)), strides(static_cast<size_t>(ndim));
    int64_t span = 1, numel = 1;
    for (int64_t d = 0; d < ndim; ++d) {
      sizes[static_cast<size_t>(d)] = t.size(d);
      strides[static_cast<size_t>(d)] = t.stride(d);
      numel *= sizes[static_cast<size_t>(d)];
      span += (sizes[static_cast<size_t>(d)] - 1) * strides[static_cast<size_t>(d)];
    }
    // on the graph's device, whatever the input's (attention's philox seed and offset come from
    // the host in eager: the graph reads them from device memory, refreshed before each launch)
    int32_t dtype = 0;
    check(aoti_torch_get_dtype(t.get(), &dtype), "aoti_torch_get_dtype");
    const int32_t device_type = aoti_torch_device_type_cuda(), device_index = device_;
    AtenTensorHandle out = nullptr;
    Tensor flat;
    if (numel == 0 || span == numel) {
      check(aoti_torch_empty_strided(ndim, sizes.data(), strides.data(), dtype, device_type, device_index, &out), "aoti_torch_empty_strided");
      span = 0;
    } else {  // gaps or overlapping dims: copy the whole span the layout covers
      const int64_t one = 1;
      check(aoti_torch_empty_strided(1, &span, &one, dtype, device_type, device_index, &out), "aoti_torch_empty_strided");
      flat = Tensor(out);
      out = nullptr;
      check(aoti_torch__reinterpret_tensor(flat.get(), ndim, sizes.data(), strides.data(), 0, &out), "aoti_torch__reinterpret_tensor");
    }
    Tensor stat(out);
    if (numel != 0) copy_in(stat, flat, span, t);
    int32_t source_type = 0, source_index = 0;
    check(aoti_torch_get_device_type(t.get(), &source_type), "aoti_torch_get_device_type");
    check(aoti_torch_get_device_index(t.get(), &source_index), "aoti_torch_get_device_index");
    const bool same_device = source_type == device_type && source_index == device_index;
    pending_->copy_bytes.push_back(same_device && numel != 0 ? static_cast<size_t>(span == 0 ? numel : span) * aoti_torch_dtype_element_size(dtype) : 0);
    pending_->copy_address.push_back(stat.data_ptr());
    pending_->copy_dtype.push_back(dtype);
    pending_->copy_sizes.push_back(std::move(sizes));
    pending_->copy_input.push_back(static_cast<int>(i));
    pending_->copy_span.push_back(span);
    pending_->copy_flat.push_back(flat.defined() ? hold(std::move(flat)) : nullptr);
    pending_->copy_static.push_back(hold_share(stat));
    return stat;
  }

  // Starts recording (when this run records): the lines that follow are captured, not run. A
  // warm-up runs them on the capture stream too, so library calls make their per-stream state
  // (cuBLAS's 32 MiB workspace) for the stream that records, not also for the caller's.
  void begin_body() {
#ifdef USE_CUDA
    if (!capturing_wanted_) {
      if (can_capture_) {
        enter_capture_stream();
        warming_ = true;
      }
      return;
    }
    if (!pending_) pending_ = std::make_unique<Graph>();
    enter_capture_stream();
    pending_->workspaces = workspace_epoch().load(std::memory_order_acquire);  // before: a clear meanwhile makes it stale
    const Driver& d = driver();
    const CUresult began = d.cuStreamBeginCapture(program_.capture_stream, kCaptureModeRelaxed);
    if (began != 0) {
      drop_stream_guard();
      d.check(began, "cuStreamBeginCapture");
    }
    capturing_ = true;
#endif
  }

  // While recording, a freed tensor is held by the graph (its memory is the graph's).
  void release(Tensor& t) {
    if (capturing_ && t.defined()) {
      pending_->keep.push_back(hold(std::move(t)));
    } else {
      t.reset();
    }
  }
  void release(Value& v) {
    if (capturing_) keep_value(v);
    v = Value();
  }

  // Ends recording: `outputs` are the region's outputs, `live` the other tensors it defined.
  void end_body(std::initializer_list<Tensor*> outputs, std::initializer_list<Tensor*> live) {
    if (warming_) {
      warming_ = false;
      leave_capture_stream();
      return;
    }
    if (!capturing_) return;
#ifdef USE_CUDA
    const Driver& d = driver();
    capturing_ = false;
    CUgraph graph = nullptr;
    const CUresult ended = d.cuStreamEndCapture(program_.capture_stream, &graph);
    drop_stream_guard();
    pending_->graph = graph;
    const CUresult instantiated = ended != 0 ? ended : d.cuGraphInstantiateWithFlags(&pending_->exec, graph, 0);
    if (instantiated != 0) {  // this region runs eagerly from now on; this run fails with the reason
      pending_.reset();
      region_.eager = true;
      d.check(instantiated, ended != 0 ? "cuStreamEndCapture" : "cuGraphInstantiateWithFlags");
    }
    for (Tensor* t : outputs) pending_->outputs.push_back(t->defined() ? hold_share(*t) : nullptr);
    for (Tensor* t : live) {
      if (t->defined()) pending_->keep.push_back(hold_share(*t));
    }
    for (size_t i = 0; i < inputs_.size(); ++i) {  // the in-place inputs the graph reads stay alive with it
      if (in_place_[i]) pending_->keep.push_back(hold_share(*inputs_[i]));
    }
    pending_->key = key_;
    pending_->pointers = pointers_;
    pending_->generation = ++program_.generation;
    auto& graphs = region_.graphs;
    graphs.insert(graphs.begin(), std::move(pending_));
    if (graphs.size() > kMaxGraphs) graphs.pop_back();
    if (++region_.records > kMaxRecords) {  // addresses or sizes never settle: stop recording
      region_.eager = true;
    }
    launch(*graphs.front());  // recording ran nothing: run it now
#else
    (void)outputs;
    (void)live;
#endif
  }

 private:
  static void copy_in(const Tensor& stat, const Tensor& flat, int64_t span, const Tensor& source) {
    if (span == 0) {
      check(aoti_torch_copy_(stat.get(), source.get(), 0), "aoti_torch_copy_");
      return;
    }
    const int64_t one = 1;
    AtenTensorHandle view = nullptr;
    check(aoti_torch__reinterpret_tensor(source.get(), 1, &span, &one, 0, &view), "aoti_torch__reinterpret_tensor");
    Tensor source_flat(view);
    check(aoti_torch_copy_(flat.get(), source_flat.get(), 0), "aoti_torch_copy_");
  }

  void keep_value(Value& v) {
    if (v.tensor.defined()) pending_->keep.push_back(hold(std::move(v.tensor)));
    for (Value& item : v.items) keep_value(item);
  }

  // The source has the dtype and sizes its static buffer was recorded with (its strides are in the key).
  static bool same_layout(const Graph& g, size_t k, const Tensor& source) {
    int32_t dtype = 0;
    int64_t* sizes = nullptr;
    const auto& expected = g.copy_sizes[k];
    return aoti_torch_get_dtype(source.get(), &dtype) == AOTI_TORCH_SUCCESS && dtype == g.copy_dtype[k] &&
           source.dim() == static_cast<int64_t>(expected.size()) &&
           aoti_torch_get_sizes(source.get(), &sizes) == AOTI_TORCH_SUCCESS &&
           std::equal(expected.begin(), expected.end(), sizes);
  }

  void launch(Graph& g) {
#ifdef USE_CUDA
    const Driver& d = driver();
    const auto stream = static_cast<CUstream>(current_cuda_stream(device_));
    for (size_t k = 0; k < g.copy_input.size(); ++k) {
      const Tensor& source = *inputs_[static_cast<size_t>(g.copy_input[k])];
      if (g.copy_bytes[k] != 0 && same_layout(g, k, source)) {
        d.check(d.cuMemcpyDtoDAsync(reinterpret_cast<cuda::CUdeviceptr>(g.copy_address[k]),
                                    reinterpret_cast<cuda::CUdeviceptr>(source.data_ptr()), g.copy_bytes[k], stream),
                "cuMemcpyDtoDAsync");
      } else if (g.copy_span[k] == 0) {
        check(aoti_torch_copy_(g.copy_static[k], source.get(), 0), "aoti_torch_copy_");
      } else {
        const int64_t one = 1, span = g.copy_span[k];
        AtenTensorHandle view = nullptr;
        check(aoti_torch__reinterpret_tensor(source.get(), 1, &span, &one, 0, &view), "aoti_torch__reinterpret_tensor");
        Tensor source_flat(view);
        check(aoti_torch_copy_(g.copy_flat[k], source_flat.get(), 0), "aoti_torch_copy_");
      }
    }
    d.check(d.cuGraphLaunch(g.exec, stream), "cuGraphLaunch");
    program_.last = g.generation;
#else
    (void)g;
#endif
  }

  // PyTorch's current stream becomes the capture stream, after the caller's queued work (the
  // static buffers' copies, the inputs' producers).
  void enter_capture_stream() {
#ifdef USE_CUDA
    const Driver& d = driver();
    if (program_.done == nullptr) d.check(d.cuEventCreate(&program_.done, kEventDisableTiming), "cuEventCreate");
    if (program_.capture_stream == nullptr) d.check(d.cuStreamCreate(&program_.capture_stream, kStreamNonBlocking), "cuStreamCreate");
    try {
      caller_ = static_cast<CUstream>(current_cuda_stream(device_));
      d.check(d.cuEventRecord(program_.done, caller_), "cuEventRecord");
      d.check(d.cuStreamWaitEvent(program_.capture_stream, program_.done, 0), "cuStreamWaitEvent");
      check(aoti_torch_create_cuda_stream_guard(program_.capture_stream, device_, &stream_guard_), "aoti_torch_create_cuda_stream_guard");
    } catch (...) {
      drop_stream_guard();
      throw;
    }
#endif
  }

  // After a warm-up: the caller's stream again, its later work after what the warm-up queued.
  void leave_capture_stream() {
#ifdef USE_CUDA
    drop_stream_guard();
    const Driver& d = driver();
    const CUresult recorded = d.cuEventRecord(program_.done, program_.capture_stream);
    const CUresult waited = recorded != 0 ? recorded : d.cuStreamWaitEvent(caller_, program_.done, 0);
    d.check(waited, recorded != 0 ? "cuEventRecord" : "cuStreamWaitEvent");
#endif
  }

  void drop_stream_guard() {
#ifdef USE_CUDA
    if (stream_guard_ != nullptr) {
      aoti_torch_delete_cuda_stream_guard(stream_guard_);
      stream_guard_ = nullptr;
    }
#endif
  }

  // A recording cut short by an error: end the capture, keep nothing, run this region eagerly.
  void abort() noexcept {
    if (warming_) {  // a warm-up cut short: back on the caller's stream
      warming_ = false;
      try {
        leave_capture_stream();
      } catch (...) {
      }
      return;
    }
    if (!capturing_) return;
    capturing_ = false;
#ifdef USE_CUDA
    try {
      const Driver& d = driver();
      CUgraph graph = nullptr;
      d.cuStreamEndCapture(program_.capture_stream, &graph);
      if (graph != nullptr) d.cuGraphDestroy(graph);
    } catch (...) {
    }
    drop_stream_guard();
#endif
    pending_.reset();
    region_.eager = true;
  }

  Program& program_;
  Region& region_;
  int32_t device_;
  bool can_capture_ = false;
  bool capturing_wanted_ = false;
  bool capturing_ = false;
  bool warming_ = false;
  std::vector<int64_t> key_;
  std::vector<const Tensor*> inputs_;
  std::vector<bool> in_place_;
  std::vector<void*> pointers_;
  std::unique_ptr<Graph> pending_;
  Graph* replayed_ = nullptr;
#ifdef USE_CUDA
  CUstream caller_ = nullptr;
  CUDAStreamGuardHandle stream_guard_ = nullptr;
#endif
};

}  // namespace graphs
}  // namespace wrapgen

#endif  // WRAPGEN_CUDA_GRAPHS_H_
