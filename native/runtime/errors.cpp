// Message formatting for the typed runtime errors.
#include "errors.hpp"

#include <sstream>

namespace pygpukit {

namespace {

std::string describe_search(const std::string& library, const std::vector<std::string>& attempts) {
  std::ostringstream out;
  out << library << " could not be loaded";
  if (attempts.empty()) {
    out << ": no candidate locations were given";
  } else {
    out << "; tried:";
    for (const auto& attempt : attempts) out << "\n  " << attempt;
  }
  return out.str();
}

}  // namespace

LibraryNotFound::LibraryNotFound(std::string library, std::vector<std::string> attempts)
    : RuntimeFailure(describe_search(library, attempts)),
      library_(std::move(library)),
      attempts_(std::move(attempts)) {}

CudaFailure::CudaFailure(int code, std::string name, std::string call, std::string description)
    : RuntimeFailure(call + " failed with " + name + " (" + std::to_string(code) + "): " + description),
      code_(code),
      name_(std::move(name)),
      call_(std::move(call)) {}

NvrtcFailure::NvrtcFailure(int code, std::string message, std::string log, std::vector<std::string> options)
    : RuntimeFailure(std::move(message)), code_(code), log_(std::move(log)), options_(std::move(options)) {}

CublasLtFailure::CublasLtFailure(std::string status, std::string operation, const std::string& detail)
    : RuntimeFailure("cuBLASLt " + operation + " failed with " + status +
                     (detail.empty() ? "" : ": " + detail)),
      status_(std::move(status)),
      operation_(std::move(operation)) {}

}  // namespace pygpukit
