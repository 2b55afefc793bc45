// Matrix multiplication through cuBLASLt (loaded at run time, see cublaslt.hpp), with plans cached by
// shapes, types, layouts and alignment, and a per-stream workspace taken from the memory pool.
// Everything is in cuBLASLt's column-major terms; the Python side (pygpukit/ops/gemm/cublaslt.py)
// maps row-major arrays onto it.
//
// The caller speaks pygpukit's codes, never cuBLASLt's: element types are pygpukit::codes::DType
// values and the epilogue a pygpukit::codes::Activation plus a bias flag (native/kernels/common/
// codes.cuh, the one definition the kernels and pygpukit.core.codes read too). gemm.cpp alone maps
// them to cudaDataType_t, cublasComputeType_t and cublasLtEpilogue_t.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace pygpukit {

struct GemmPlan;  // cuBLASLt descriptors, the chosen algorithm and its workspace size (gemm.cpp)

// One GEMM call shape: D (m x n) = alpha * op(A) op(B) + beta * D (+ epilogue), per batch entry.
// Filled once per call shape; gemm_prepare chooses the algorithm and keeps it here, so a repeated
// call (gemm) only passes the pointers and the stream.
struct GemmArgs {
  int a_dtype = 1, b_dtype = 1, d_dtype = 1;  // codes::DType; C shares D's type
  int bias_dtype = -1;                        // codes::DType of the bias vector, when `bias`
  bool tf32 = false;                          // float32: allow TF32 tensor cores
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;
  int activation = 0;   // codes::Activation: kActNone, kActRelu or kActGeluTanh (cuBLASLt's GELU)
  bool bias = false;    // add a device vector of m elements (D's rows in column-major terms)
  bool scales = false;  // fp8: float scales of A and B, device pointers given per call
  // How A's and B's scales are read (cublasLtMatmulMatrixScale_t): 0 one scalar, 3 a vector along the
  // non-contracted dimension (OUTER_VEC_32F), 4 one per 128 elements along K (VEC128_32F), 5 one per
  // 128x128 block (BLK128x128_32F). Meaningful only with `scales`.
  int scale_mode_a = 0, scale_mode_b = 0;
  bool d_scale = false;            // fp8 output: D = scale_d * result, a device float32 scalar given per call
  double alpha = 1.0, beta = 0.0;  // beta != 0 reads D as C

  // The plan gemm_prepare chose, for the device and pointer alignments it saw (not a user field).
  std::shared_ptr<GemmPlan> plan;
  int plan_device = -1;
  int plan_align_a = 0, plan_align_b = 0, plan_align_d = 0;
};

// Checks the fields and runs cuBLASLt's heuristic for these args with the alignment of these
// pointers, without launching anything; keeps the plan in args and returns true. Returns false when
// cuBLASLt has no algorithm for the problem (int8 with sizes or layouts it does not take, say).
// With `scales` the heuristic sees A's and B's scale pointers set, as a launch sets them and as torch's
// scaled matmul asks (whether cuBLASLt needs them for vector or block scale modes is not yet known):
// a_scale / b_scale when given, else a and b as stand-ins (never read by the heuristic). Other failures throw
// CublasLtFailure (cuBLASLt) or RuntimeFailure (invalid fields).
bool gemm_prepare(GemmArgs& args, std::uint64_t a, std::uint64_t b, std::uint64_t d,
                  std::uint64_t a_scale = 0, std::uint64_t b_scale = 0);

// Launches the prepared matmul on `stream`. A pointer less aligned than the plan assumed gets the
// plan of its alignment (cached); CublasLtFailure when cuBLASLt refuses.
void gemm(const GemmArgs& args, std::uint64_t a, std::uint64_t b, std::uint64_t d, std::uint64_t bias,
          std::uint64_t a_scale, std::uint64_t b_scale, std::uint64_t stream, std::uint64_t d_scale = 0);

// Plans in the cache, for statistics and tests.
std::size_t gemm_plan_count();
// Drops the workspace of a stream (before the stream is destroyed).
void gemm_release_stream(std::uint64_t stream);
// Device reset (context.cpp reset_device, before the context is reset): forgets the device's
// cuBLASLt handle, plans and workspaces without touching the device (its memory dies with the
// context; the pool forgets the workspace blocks). Returns the number of plans dropped.
std::size_t gemm_forget_device(int device);

}  // namespace pygpukit
