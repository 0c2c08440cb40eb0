// The C ABI between a compiled wrapgen model (a shared library) and whatever loads it: the
// Python loader (ctypes), the pybind11 module and the standalone runner. Plain C types only,
// so a model built by one compiler loads into a host built by another.
#pragma once
#ifndef WRAPGEN_ABI_H_
#define WRAPGEN_ABI_H_

#include <stdint.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

// Bumped when the layout of WgValue or the signature of an exported function changes.
#define WG_MODEL_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

// Kinds of values crossing the boundary.
enum WgValueKind { WG_TENSOR = 0, WG_INT = 1, WG_FLOAT = 2, WG_BOOL = 3, WG_NONE = 4 };

// Error kinds wg_run returns (0: success); loaders map them to exception types.
// WG_INDEX_OUT_OF_RANGE: a generated kernel read an index from data outside its dimension
// (embedding, index_select, gather), which Python raises as IndexError as eager does.
enum WgErrorKind { WG_OK = 0, WG_INPUT_MISMATCH = 1, WG_NOT_FINITE = 2, WG_RUNTIME_ERROR = 3, WG_INDEX_OUT_OF_RANGE = 4 };

// One input or output: a tensor handle, an integer, a float or a bool (by `kind`).
typedef struct WgValue {
  int32_t kind;
  int32_t reserved;
  int64_t i;
  double f;
  AtenTensorHandle t;
} WgValue;

// Functions every model library exports.
typedef uint32_t (*WgAbiVersionFn)(void);
typedef const char* (*WgMetadataFn)(void);
// Runs the program. `constants` are borrowed; tensor handles in `inputs` are *taken* (the model
// deletes them, also on error); tensor handles written to `outputs` are new references the caller
// owns. On error nothing is written to `outputs`, `message` holds the reason and the return value
// is a WgErrorKind.
typedef int32_t (*WgRunFn)(
    const AtenTensorHandle* constants,
    int64_t num_constants,
    WgValue* inputs,
    int64_t num_inputs,
    WgValue* outputs,
    int64_t num_outputs,
    char* message,
    int64_t message_size);
// Counts, and the name of constant i (the order `constants` must follow).
typedef int64_t (*WgCountFn)(void);
typedef const char* (*WgConstantNameFn)(int64_t);
// The device constant i must live on (models built since CUDA support; optional for loaders).
typedef void (*WgConstantDeviceFn)(int64_t, int32_t* device_type, int32_t* device_index);
// Tensor handles the model's own code holds right now (0 between calls: the leak check).
typedef int64_t (*WgLiveHandlesFn)(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // WRAPGEN_ABI_H_
