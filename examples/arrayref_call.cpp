// Call a wrapgen package through both entries, without Python, and time them.
//
//   g++ -O2 -std=c++17 -Icpp_runtime/include -I$TORCH/include examples/arrayref_call.cpp \
//       -L$TORCH/lib -Wl,-rpath,$TORCH/lib -ltorch_cpu -lc10 -ldl -o arrayref_call
//   ./arrayref_call PACKAGE_DIR INPUTS.bin [CALLS] [ROUNDS]
//
// The package comes from wrapgen.aot_compile(model, inputs, PACKAGE_DIR, arrayref=True); INPUTS.bin
// is a tensor file of the inputs (wrapgen.packaging.write_tensor_file). Both entries run on the same
// inputs; the outputs must agree exactly. Rounds alternate the entries; each prints its median
// time per call over the rounds. The array-ref entry (wrapgen/arrayref.h) takes plain
// descriptors: the caller's arrays in, the caller's memory out, no tensor handle per call.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "wrapgen/arrayref.h"
#include "wrapgen/model_container.h"
#include "wrapgen/package_check.h"
#include "wrapgen/tensor_file.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: arrayref_call PACKAGE_DIR INPUTS.bin [CALLS] [ROUNDS]\n");
    return 2;
  }
  const std::string package = argv[1];
  const int calls = argc > 3 ? std::atoi(argv[3]) : 10000;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 7;
  try {
    wrapgen::verify_package(package);
    wrapgen::ModelContainer model(package + "/model.so", wrapgen::read_tensor_file(package + "/weights.bin"));
    auto inputs = wrapgen::read_tensor_file(argv[2]);
    const auto& library = model.library();
    if (library.run_arrayref == nullptr) {
      std::fprintf(stderr, "%s has no array-ref entry: build it with aot_compile(..., arrayref=True)\n", package.c_str());
      return 2;
    }
    // Array-ref descriptors: inputs point at the tensors read from the file, outputs at plain buffers.
    std::vector<std::vector<int64_t>> in_sizes(inputs.size());
    std::vector<WgArray> in(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const wrapgen::Tensor& t = inputs[i].tensor;
      for (int64_t d = 0; d < t.dim(); ++d) in_sizes[i].push_back(t.size(d));
      int32_t dtype = 0;
      wrapgen::check(aoti_torch_get_dtype(t.get(), &dtype), "aoti_torch_get_dtype");
      in[i] = WgArray{t.data_ptr(), dtype, static_cast<int32_t>(t.dim()), in_sizes[i].data(), nullptr};
    }
    const auto n_out = static_cast<size_t>(model.num_outputs());
    std::vector<std::vector<float>> buffers(n_out);
    std::vector<WgArray> out(n_out);
    for (size_t i = 0; i < n_out; ++i) {
      int32_t dtype = 0, rank = 0;
      const int64_t* sizes = nullptr;
      library.arrayref_output(static_cast<int64_t>(i), &dtype, &rank, &sizes);
      if (dtype != WG_DTYPE_FLOAT32) throw wrapgen::Error(WG_RUNTIME_ERROR, "this example reads float32 outputs only");
      int64_t numel = 1;
      for (int32_t d = 0; d < rank; ++d) numel *= sizes[d];
      buffers[i].assign(static_cast<size_t>(numel), NAN);
      out[i] = WgArray{buffers[i].data(), dtype, rank, sizes, nullptr};
    }
    auto run_arrayref = [&] { model.run_arrayref(in.data(), static_cast<int64_t>(in.size()), out.data(), static_cast<int64_t>(out.size())); };
    std::vector<WgValue> last;
    auto run_handle = [&] {
      std::vector<WgValue> values(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        values[i].kind = WG_TENSOR;
        values[i].t = inputs[i].tensor.share().release();  // taken over by the model
      }
      last = model.run(values);
      for (auto& v : last) {
        if (v.kind == WG_TENSOR) wrapgen::Tensor owned(v.t);  // released: a caller would use it here
      }
    };
    // The two entries must agree.
    run_arrayref();
    std::vector<WgValue> values(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) values[i] = WgValue{WG_TENSOR, 0, 0, 0.0, inputs[i].tensor.share().release()};
    auto results = model.run(values);
    double worst = 0;
    for (size_t i = 0; i < n_out; ++i) {
      wrapgen::Tensor t(results[i].t);
      const float* expected = static_cast<const float*>(t.data_ptr());
      for (size_t k = 0; k < buffers[i].size(); ++k) worst = std::max(worst, static_cast<double>(std::fabs(expected[k] - buffers[i][k])));
    }
    std::printf("max |handle - arrayref|: %g\n", worst);
    for (int w = 0; w < std::max(1, calls / 10); ++w) {
      run_handle();
      run_arrayref();
    }
    std::vector<double> handle_us, arrayref_us;
    for (int r = 0; r < rounds; ++r) {  // interleaved by round
      auto start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) run_handle();
      handle_us.push_back(seconds_since(start) / calls * 1e6);
      start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) run_arrayref();
      arrayref_us.push_back(seconds_since(start) / calls * 1e6);
    }
    const double h = median(handle_us), a = median(arrayref_us);
    std::printf("handle entry:    %.2f us/call (median of %d rounds of %d calls)\n", h, rounds, calls);
    std::printf("array-ref entry: %.2f us/call (%.2fx the handle entry)\n", a, a / h);
    return worst == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arrayref_call: %s\n", e.what());
    return 1;
  }
}
