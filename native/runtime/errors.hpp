// Typed C++ errors raised by the runtime layer. The bindings translate each one into the matching
// Python class of pygpukit.core.errors, so the hierarchy here mirrors the Python one.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pygpukit {

class RuntimeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A shared library (libcuda, NVRTC, cuBLASLt) could not be found or loaded. `attempts` lists every
// candidate tried with the reason it failed, so the message can explain the search.
class LibraryNotFound : public RuntimeFailure {
 public:
  LibraryNotFound(std::string library, std::vector<std::string> attempts);
  const std::string& library() const { return library_; }
  const std::vector<std::string>& attempts() const { return attempts_; }

 private:
  std::string library_;
  std::vector<std::string> attempts_;
};

// A CUDA driver call returned an error; carries the driver's name and description of the code.
class CudaFailure : public RuntimeFailure {
 public:
  CudaFailure(int code, std::string name, std::string call, std::string description);
  int code() const { return code_; }
  const std::string& name() const { return name_; }
  const std::string& call() const { return call_; }

 private:
  int code_;
  std::string name_;
  std::string call_;
};

// NVRTC failed to compile; carries the compiler log and the options used.
class NvrtcFailure : public RuntimeFailure {
 public:
  NvrtcFailure(int code, std::string message, std::string log, std::vector<std::string> options);
  int code() const { return code_; }
  const std::string& log() const { return log_; }
  const std::vector<std::string>& options() const { return options_; }

 private:
  int code_;
  std::string log_;
  std::vector<std::string> options_;
};

// A cuBLASLt call failed, or cuBLASLt has no algorithm for a matmul it was asked to run; carries the
// cublasStatus_t name (CUBLAS_STATUS_NOT_SUPPORTED, ...) and the operation that failed.
class CublasLtFailure : public RuntimeFailure {
 public:
  CublasLtFailure(std::string status, std::string operation, const std::string& detail);
  const std::string& status() const { return status_; }
  const std::string& operation() const { return operation_; }

 private:
  std::string status_;
  std::string operation_;
};

}  // namespace pygpukit
