// Finding cuBLASLt and reading its version.
#include "cublaslt.hpp"

#include <mutex>

#include "errors.hpp"
#include "shared_library.hpp"

namespace pygpukit {

namespace {
std::mutex g_cublaslt_mutex;
CublasLtStatus g_status;
}  // namespace

const CublasLtStatus& load_cublaslt(const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> lock(g_cublaslt_mutex);
  if (g_status.loaded) return g_status;
  LoadedLibrary lib = open_first("cuBLASLt", candidates);
  auto get_version = reinterpret_cast<std::size_t (*)()>(find_symbol(lib.handle, "cublasLtGetVersion"));
  auto get_cudart = reinterpret_cast<std::size_t (*)()>(find_symbol(lib.handle, "cublasLtGetCudartVersion"));
  if (get_version == nullptr) {
    throw LibraryNotFound("cuBLASLt", {lib.path + ": has no cublasLtGetVersion"});
  }
  g_status.version = get_version();
  g_status.cudart_version = get_cudart != nullptr ? get_cudart() : 0;
  g_status.path = resolved_path(lib.handle, "cublasLtGetVersion", lib.path);
  g_status.handle = lib.handle;
  g_status.loaded = true;
  return g_status;
}

const CublasLtStatus& cublaslt_status() {
  std::lock_guard<std::mutex> lock(g_cublaslt_mutex);
  return g_status;
}

}  // namespace pygpukit
