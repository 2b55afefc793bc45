// Matrix multiplication through cuBLASLt (loaded at run time, see cublaslt.hpp), with plans cached by
// shapes, types, layouts and alignment, and a per-stream workspace taken from the memory pool.
// Everything is in cuBLASLt's column-major terms; the Python side maps row-major arrays onto it.
#pragma once

#include <cstdint>
#include <string>

namespace pygpukit {

// Values are cuBLASLt's (cudaDataType_t, cublasComputeType_t, cublasLtEpilogue_t).
enum GemmType : int {
  kR32F = 0,
  kR64F = 1,
  kR16F = 2,
  kR8I = 3,
  kR32I = 10,
  kR16BF = 14,
  kR8F_E4M3 = 28,
  kR8F_E5M2 = 29
};
enum GemmCompute : int { kCompute32F = 68, kCompute32FFastTF32 = 77, kCompute64F = 70, kCompute32I = 72 };
enum GemmEpilogue : int {
  kEpilogueDefault = 1,
  kEpilogueRelu = 2,
  kEpilogueBias = 4,
  kEpilogueReluBias = 6,
  kEpilogueGelu = 32,
  kEpilogueGeluBias = 36
};

struct GemmArgs {
  int a_type = kR32F, b_type = kR32F, d_type = kR32F;  // C shares D's type
  int compute = kCompute32F;
  int scale_type = kR32F;  // alpha/beta type
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;  // D is m x n
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;
  std::uint64_t a = 0, b = 0, d = 0;
  std::uint64_t bias = 0;  // device vector of m elements (D's rows in column-major terms)
  int bias_type = -1;
  int epilogue = kEpilogueDefault;
  std::uint64_t a_scale = 0, b_scale = 0;  // fp8: device float scalars
  double alpha = 1.0, beta = 0.0;          // beta != 0 reads D as C
  std::uint64_t stream = 0;
};

// Runs D = alpha * op(A) op(B) + beta * D (+ epilogue). Throws RuntimeFailure naming the cuBLASLt status
// when cuBLASLt refuses (e.g. an unsupported combination on this device).
void gemm(const GemmArgs& args);

// Plans in the cache and workspaces held, for statistics and tests.
std::size_t gemm_plan_count();
// Drops the workspace of a stream (before the stream is destroyed).
void gemm_release_stream(std::uint64_t stream);

}  // namespace pygpukit
