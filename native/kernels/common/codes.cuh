// Codes shared by the Python launchers and the kernels: each enum here is the single definition.
// pygpukit/core/codes.py parses this file (plain "enum Name : int { kValue = N, ... };" lines, one
// enum per line group), so the Python side never copies a number. Keep that form: no expressions,
// no macros inside the braces.
#pragma once

namespace pygpukit {
namespace codes {

// Fused epilogue / elementwise activations. "gelu" is the exact erf form everywhere; "gelu_tanh"
// the tanh approximation (what cuBLASLt's GELU epilogue computes).
enum Activation : int { kActNone = 0, kActRelu = 1, kActGeluTanh = 2, kActSilu = 3, kActGelu = 4 };

// Element types in the order of PYGPUKIT_FOR_EACH_ELEMENT_TYPE (common/element_types.cuh), which is
// the order of pygpukit.core.dtypes.all_dtypes(); a test checks all three agree.
enum DType : int {
  kF64 = 0,
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kF8E4M3 = 4,
  kF8E5M2 = 5,
  kI8 = 6,
  kI16 = 7,
  kI32 = 8,
  kI64 = 9,
  kU8 = 10,
  kU16 = 11,
  kU32 = 12,
  kU64 = 13,
  kB8 = 14
};

}  // namespace codes
}  // namespace pygpukit
