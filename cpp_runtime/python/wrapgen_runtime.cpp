// pybind11 module `wrapgen_runtime`: load a packaged model (library + weights) into a
// ModelContainer and call it from Python. Tensors cross as integer AtenTensorHandles (the
// Python side makes and consumes them with torch's own helpers), so this module needs
// libtorch and pybind11 only, not torch's Python C++ API. The GIL is released while a model
// runs or its weights are updated, so Python threads run the model concurrently.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>

#include "wrapgen/model_container.h"

namespace py = pybind11;

namespace {

class PyModel {
 public:
  PyModel(const std::string& library, const std::string& weights)
      : container_(std::make_unique<wrapgen::ModelContainer>(library, wrapgen::read_tensor_file(weights))) {}

  // inputs: (kind, value) pairs, a tensor's value being an owning handle (taken over).
  // Returns (status, message, [(kind, value), ...]); status 0 is success.
  std::tuple<int, std::string, py::list> run(const std::vector<std::tuple<int, py::object>>& inputs) {
    std::vector<WgValue> values(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& [kind, value] = inputs[i];
      values[i].kind = kind;
      if (kind == WG_TENSOR) {
        values[i].t = reinterpret_cast<AtenTensorHandle>(value.cast<uintptr_t>());
      } else if (kind == WG_FLOAT) {
        values[i].f = value.cast<double>();
      } else {
        values[i].i = value.cast<int64_t>();
      }
    }
    std::vector<WgValue> outputs;
    int status = WG_OK;
    std::string message;
    {
      py::gil_scoped_release unlocked;
      try {
        outputs = container_->run(values);
      } catch (const wrapgen::Error& e) {
        status = e.kind();
        message = e.what();
      } catch (const std::exception& e) {
        status = WG_RUNTIME_ERROR;
        message = e.what();
      }
    }
    py::list result;
    for (const auto& out : outputs) {
      if (out.kind == WG_TENSOR) {
        result.append(py::make_tuple(out.kind, reinterpret_cast<uintptr_t>(out.t)));
      } else if (out.kind == WG_FLOAT) {
        result.append(py::make_tuple(out.kind, out.f));
      } else {
        result.append(py::make_tuple(out.kind, out.i));
      }
    }
    return {status, message, result};
  }

  // values: constant name -> borrowed handle (the caller keeps ownership).
  void update_constants(const std::map<std::string, uintptr_t>& values) {
    std::vector<wrapgen::Tensor> owned;
    std::map<std::string, const wrapgen::Tensor*> by_name;
    owned.reserve(values.size());
    for (const auto& [name, handle] : values) {
      owned.push_back(wrapgen::Tensor::borrow(reinterpret_cast<AtenTensorHandle>(handle)));
      by_name[name] = &owned.back();
    }
    py::gil_scoped_release unlocked;
    container_->update_constants(by_name);
  }

  int64_t live_handles() const { return container_->live_handles(); }
  int64_t swaps() const { return container_->swaps(); }
  std::string metadata() const { return container_->library().metadata(); }
  std::vector<std::string> constant_names() const { return container_->constant_names(); }

 private:
  std::unique_ptr<wrapgen::ModelContainer> container_;
};

}  // namespace

PYBIND11_MODULE(wrapgen_runtime, m) {
  m.doc() = "wrapgen's C++ model runtime: packaged models, thread-safe runs, double-buffered weight updates";
  m.attr("MODEL_ABI_VERSION") = WG_MODEL_ABI_VERSION;
  py::class_<PyModel>(m, "Model")
      .def(py::init<const std::string&, const std::string&>(), py::arg("library"), py::arg("weights"))
      .def("run", &PyModel::run)
      .def("update_constants", &PyModel::update_constants)
      .def("live_handles", &PyModel::live_handles)
      .def("swaps", &PyModel::swaps)
      .def("metadata", &PyModel::metadata)
      .def("constant_names", &PyModel::constant_names);
}
