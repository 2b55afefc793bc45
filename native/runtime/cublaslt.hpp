// cuBLASLt, opened at run time like NVRTC. This layer only finds and identifies the library; the GEMM
// entry points are bound by the op library that uses them.
#pragma once

#include <string>
#include <vector>

namespace pygpukit {

struct CublasLtStatus {
  bool loaded = false;
  std::string path;
  std::size_t version = 0;         // cublasLtGetVersion, e.g. 130100 for 13.1.0
  std::size_t cudart_version = 0;  // cublasLtGetCudartVersion
  void* handle = nullptr;          // dlopen handle, for binding further entry points
};

const CublasLtStatus& load_cublaslt(const std::vector<std::string>& candidates);
const CublasLtStatus& cublaslt_status();

}  // namespace pygpukit
