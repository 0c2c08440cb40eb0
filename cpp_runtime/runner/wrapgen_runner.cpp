// wrapgen_runner: run an AOT package with libtorch and no Python.
//
//   wrapgen_runner PACKAGE_DIR INPUTS.bin [OUTPUTS.bin] [--repeat N] [--arrayref]
//
// PACKAGE_DIR holds model.so, weights.bin, metadata.json and SHA256SUMS (wrapgen.aot_compile
// writes them); every file is checked against the sizes and SHA-256s in SHA256SUMS before
// model.so is loaded, and a damaged package exits with code 1 and the message
// wrapgen.load_package gives. The runner does not read metadata.json.
// INPUTS.bin is a tensor file (tensor_file.h) with the inputs in order. Prints every output (dtype, shape,
// values) and writes them to OUTPUTS.bin when given. --repeat N runs N times (a leak check:
// the model must hold no tensor handle afterwards; exit code 3 if it does). --arrayref calls the
// package's array-ref entry (wrapgen/arrayref.h) instead: outputs allocated here, written in place.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "wrapgen/model_container.h"
#include "wrapgen/package_check.h"
#include "wrapgen/tensor_file.h"

namespace {

template <typename T>
void print_values(const void* data, int64_t n, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  // Values in logical (row-major) order, whatever the strides.
  const T* p = static_cast<const T*>(data);
  std::vector<int64_t> index(sizes.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t offset = 0;
    for (size_t d = 0; d < sizes.size(); ++d) offset += index[d] * strides[d];
    std::printf(k ? " %.9g" : "%.9g", static_cast<double>(p[offset]));
    for (size_t d = sizes.size(); d-- > 0;) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
  std::printf("\n");
}

void print_tensor(size_t i, const wrapgen::Tensor& t) {
  int32_t dtype = 0;
  wrapgen::check(aoti_torch_get_dtype(t.get(), &dtype), "aoti_torch_get_dtype");
  std::vector<int64_t> sizes, strides;
  int64_t n = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    sizes.push_back(t.size(d));
    strides.push_back(t.stride(d));
    n *= sizes.back();
  }
  std::printf("output %zu: %s %s\n", i, wrapgen::dtype_name(dtype).c_str(), wrapgen::format_tuple(sizes).c_str());
  const void* data = t.data_ptr();
  if (dtype == aoti_torch_dtype_float32()) return print_values<float>(data, n, sizes, strides);
  if (dtype == aoti_torch_dtype_float64()) return print_values<double>(data, n, sizes, strides);
  if (dtype == aoti_torch_dtype_int64()) return print_values<int64_t>(data, n, sizes, strides);
  if (dtype == aoti_torch_dtype_int32()) return print_values<int32_t>(data, n, sizes, strides);
  if (dtype == aoti_torch_dtype_bool() || dtype == aoti_torch_dtype_uint8()) return print_values<uint8_t>(data, n, sizes, strides);
  std::printf("(values of this dtype are not printed)\n");
}

// The outputs of `repeat` runs of the array-ref entry: allocated here from the library's output specs.
std::vector<wrapgen::Tensor> run_arrayref(wrapgen::ModelContainer& model, std::vector<wrapgen::NamedTensor>& inputs, int repeat) {
  const auto& library = model.library();
  if (library.arrayref_output == nullptr) throw wrapgen::Error(WG_RUNTIME_ERROR, "the package has no array-ref entry (aot_compile(..., arrayref=True))");
  std::vector<std::vector<int64_t>> in_sizes(inputs.size()), in_strides(inputs.size());
  std::vector<WgArray> in(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const wrapgen::Tensor& t = inputs[i].tensor;
    for (int64_t d = 0; d < t.dim(); ++d) {
      in_sizes[i].push_back(t.size(d));
      in_strides[i].push_back(t.stride(d));
    }
    wrapgen::check(aoti_torch_get_dtype(t.get(), &in[i].dtype), "aoti_torch_get_dtype");
    in[i] = WgArray{t.data_ptr(), in[i].dtype, static_cast<int32_t>(t.dim()), in_sizes[i].data(), in_strides[i].data()};
  }
  std::vector<wrapgen::Tensor> results;
  std::vector<WgArray> out(static_cast<size_t>(model.num_outputs()));
  for (int64_t i = 0; i < model.num_outputs(); ++i) {
    int32_t dtype = 0, rank = 0;
    const int64_t* sizes = nullptr;
    library.arrayref_output(i, &dtype, &rank, &sizes);
    std::vector<int64_t> strides(static_cast<size_t>(rank), 1);
    for (int32_t d = rank - 1; d > 0; --d) strides[d - 1] = strides[d] * std::max<int64_t>(sizes[d], 1);
    AtenTensorHandle h = nullptr;
    wrapgen::check(aoti_torch_empty_strided(rank, sizes, strides.data(), dtype, aoti_torch_device_type_cpu(), 0, &h), "aoti_torch_empty_strided");
    results.emplace_back(h);
    out[static_cast<size_t>(i)] = WgArray{results.back().data_ptr(), dtype, rank, sizes, nullptr};
  }
  for (int r = 0; r < repeat; ++r) {
    model.run_arrayref(in.data(), static_cast<int64_t>(in.size()), out.data(), static_cast<int64_t>(out.size()));
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  int repeat = 1;
  bool arrayref = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--arrayref") {
      arrayref = true;
      args.erase(args.begin() + static_cast<long>(i));
      break;
    }
  }
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--repeat") {
      repeat = std::atoi(args[i + 1].c_str());
      args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
      break;
    }
  }
  if (args.size() < 2 || repeat < 1) {
    std::fprintf(stderr, "usage: wrapgen_runner PACKAGE_DIR INPUTS.bin [OUTPUTS.bin] [--repeat N] [--arrayref]\n");
    return 2;
  }
  try {
    const std::string package = args[0];
    wrapgen::verify_package(package);  // before dlopen: a truncated model.so would die with SIGBUS
    wrapgen::ModelContainer model(package + "/model.so", wrapgen::read_tensor_file(package + "/weights.bin"));
    auto inputs = wrapgen::read_tensor_file(args[1]);
    if (static_cast<int64_t>(inputs.size()) != model.num_inputs()) {
      std::fprintf(stderr, "the model takes %lld inputs, %s holds %zu\n", static_cast<long long>(model.num_inputs()), args[1].c_str(), inputs.size());
      return 2;
    }
    if (arrayref) {
      std::vector<wrapgen::Tensor> results = run_arrayref(model, inputs, repeat);
      std::vector<std::pair<std::string, const wrapgen::Tensor*>> named;
      for (size_t i = 0; i < results.size(); ++i) {
        print_tensor(i, results[i]);
        named.emplace_back("output" + std::to_string(i), &results[i]);
      }
      if (args.size() >= 3) wrapgen::write_tensor_file(args[2], named);
      std::printf("runs: %d (array-ref entry), live handles in the model: %lld\n", repeat, static_cast<long long>(model.live_handles()));
      return model.live_handles() == 0 ? 0 : 3;
    }
    std::vector<wrapgen::Tensor> results;
    std::vector<WgValue> last;
    for (int r = 0; r < repeat; ++r) {
      std::vector<WgValue> values(inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        values[i].kind = WG_TENSOR;
        values[i].t = inputs[i].tensor.share().release();  // taken over by the model
      }
      results.clear();
      last = model.run(values);
      for (auto& v : last) results.emplace_back(v.kind == WG_TENSOR ? wrapgen::Tensor(v.t) : wrapgen::Tensor());
    }
    std::vector<std::pair<std::string, const wrapgen::Tensor*>> named;
    for (size_t i = 0; i < last.size(); ++i) {
      if (last[i].kind == WG_TENSOR) {
        print_tensor(i, results[i]);
        named.emplace_back("output" + std::to_string(i), &results[i]);
      } else if (last[i].kind == WG_FLOAT) {
        std::printf("output %zu: float %.17g\n", i, last[i].f);
      } else {
        std::printf("output %zu: int %lld\n", i, static_cast<long long>(last[i].i));
      }
    }
    if (args.size() >= 3) wrapgen::write_tensor_file(args[2], named);
    const int64_t live = model.live_handles();
    std::printf("runs: %d, live handles in the model: %lld\n", repeat, static_cast<long long>(live));
    return live == 0 ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wrapgen_runner: %s\n", e.what());
    return 1;
  }
}
