// The array-ref entry of a wrapgen CPU package (wrapgen.aot_compile(..., arrayref=True)): inputs
// and outputs cross as plain descriptors instead of tensor handles, so a call costs little more
// than the program's arithmetic. Plain C, no torch header: a caller needs only this file and
// dlopen. Constants are the same AtenTensorHandles wg_run takes (void* here).
#pragma once
#ifndef WRAPGEN_ARRAYREF_H_
#define WRAPGEN_ARRAYREF_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Element types: torch's ScalarType numbers (what aoti_torch_dtype_*() return).
enum WgDtype {
  WG_DTYPE_UINT8 = 0, WG_DTYPE_INT8 = 1, WG_DTYPE_INT16 = 2, WG_DTYPE_INT32 = 3, WG_DTYPE_INT64 = 4,
  WG_DTYPE_FLOAT16 = 5, WG_DTYPE_FLOAT32 = 6, WG_DTYPE_FLOAT64 = 7, WG_DTYPE_BOOL = 11, WG_DTYPE_BFLOAT16 = 15
};

// One input or output: `data` points at the first element; `strides` may be NULL (contiguous).
// The entry accepts only the dtype, rank and sizes the program was compiled for, contiguous.
typedef struct WgArray {
  void* data;
  int32_t dtype;
  int32_t rank;
  const int64_t* sizes;
  const int64_t* strides;
} WgArray;

// Runs the program: reads `inputs`, writes every output into the caller's memory at
// `outputs[i].data` (nothing else is written outside the model's own memory). Returns 0, or a
// WgErrorKind (1: a descriptor does not match; `message` names the argument) and writes no output.
// Output memory must not overlap an input's: an output may be written before the last read of
// an input. Safe to call from many threads at once with the same constants.
typedef int32_t (*WgRunArrayRefFn)(
    void* const* constants,
    int64_t num_constants,
    const WgArray* inputs,
    int64_t num_inputs,
    const WgArray* outputs,
    int64_t num_outputs,
    char* message,
    int64_t message_size);

// The same call with the constants bound once (wg_arrayref_bind): a run reads their data
// pointers from the context instead of asking each handle on every call. `context` must come
// from wg_arrayref_bind of this library; the rest is as for WgRunArrayRefFn.
typedef int32_t (*WgRunArrayRefBoundFn)(
    const void* context,
    const WgArray* inputs,
    int64_t num_inputs,
    const WgArray* outputs,
    int64_t num_outputs,
    char* message,
    int64_t message_size);

// Binds a set of constants (the handles WgRunArrayRefFn takes): checks each one's dtype, sizes,
// strides and device against the program and records its data pointer. The handles, and the
// memory they point at, must outlive the context; writing new values into that memory (a weight
// update in place) needs no new binding, new tensors do. Returns 0 and sets `*context`, or a
// WgErrorKind (1: a constant does not match; `message` names it). Free with WgArrayRefUnbindFn.
typedef int32_t (*WgArrayRefBindFn)(
    void* const* constants,
    int64_t num_constants,
    void** context,
    char* message,
    int64_t message_size);
typedef void (*WgArrayRefUnbindFn)(void* context);

// What output i must be (a package's outputs have fixed shapes): the caller allocates that much.
// Returns 0, or 1 when i is out of range. `*sizes` points at `*rank` values owned by the library.
typedef int32_t (*WgArrayRefOutputFn)(int64_t i, int32_t* dtype, int32_t* rank, const int64_t** sizes);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // WRAPGEN_ARRAYREF_H_
