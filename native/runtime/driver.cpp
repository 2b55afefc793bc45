// Loading libcuda and resolving the driver table through cuGetProcAddress.
#include "driver.hpp"

#include <cstdio>
#include <mutex>

#include "context.hpp"
#include "errors.hpp"
#include "shared_library.hpp"

namespace pygpukit {

namespace {

constexpr int kAbiBaseline = (CUDA_VERSION / 1000) * 1000;

std::mutex g_driver_mutex;
DriverApi g_api;
DriverStatus g_status;

std::string error_text(CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (g_api.cuGetErrorName != nullptr) g_api.cuGetErrorName(result, &name);
  if (g_api.cuGetErrorString != nullptr) g_api.cuGetErrorString(result, &text);
  std::string out = name != nullptr ? name : "CUDA_ERROR_" + std::to_string(static_cast<int>(result));
  if (text != nullptr) out += std::string(": ") + text;
  return out;
}

void resolve_table(void* handle, const std::string& path) {
  auto get_proc =
      reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(find_symbol(handle, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    throw LibraryNotFound("libcuda", {path + ": has no cuGetProcAddress_v2 (driver older than CUDA 12.0)"});
  }
  // cuDriverGetVersion exists in every driver; take it first so an old driver gets a clear message
  // instead of a failed lookup.
  void* pfn = nullptr;
  CUdriverProcAddressQueryResult status{};
  get_proc("cuDriverGetVersion", &pfn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (pfn == nullptr) throw LibraryNotFound("libcuda", {path + ": cuDriverGetVersion not found"});
  int version = 0;
  reinterpret_cast<decltype(&::cuDriverGetVersion)>(pfn)(&version);
  if (version < kAbiBaseline) {
    throw LibraryNotFound("libcuda", {path + ": the driver supports CUDA " + std::to_string(version / 1000) +
                                      "." + std::to_string((version % 1000) / 10) +
                                      " but this native module (cu" + std::to_string(kAbiBaseline / 1000) +
                                      ") needs CUDA " + std::to_string(kAbiBaseline / 1000) + ".0 or newer"});
  }
  g_status.version = version;
#define PYGPUKIT_RESOLVE(name)                                                                  \
  pfn = nullptr;                                                                                \
  get_proc(#name, &pfn, kAbiBaseline, CU_GET_PROC_ADDRESS_DEFAULT, &status);                    \
  g_api.name = reinterpret_cast<decltype(g_api.name)>(pfn);                                     \
  if (library_debug_enabled() && pfn == nullptr) {                                              \
    std::fprintf(stderr, "[pygpukit] libcuda: entry point %s unavailable (status %d)\n", #name, \
                 static_cast<int>(status));                                                     \
  }
  PYGPUKIT_DRIVER_FUNCTIONS(PYGPUKIT_RESOLVE)
#undef PYGPUKIT_RESOLVE
  // CUDA 13.0 gave cuCtxSynchronize a context argument (PFN_cuCtxSynchronize_v13000). The table keeps
  // the original no-argument entry point, so ask for the version that CUDA 12 defined.
  pfn = nullptr;
  get_proc("cuCtxSynchronize", &pfn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  g_api.cuCtxSynchronize = reinterpret_cast<decltype(g_api.cuCtxSynchronize)>(pfn);
}

}  // namespace

int built_cuda_major() { return CUDA_VERSION / 1000; }
int built_header_version() { return CUDA_VERSION; }

const DriverStatus& load_driver(const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> lock(g_driver_mutex);
  if (g_status.loaded) return g_status;
  LoadedLibrary lib = open_first("libcuda", candidates);
  resolve_table(lib.handle, lib.path);
  g_status.path = resolved_path(lib.handle, "cuGetProcAddress_v2", lib.path);
  if (g_api.cuInit == nullptr) throw LibraryNotFound("libcuda", {g_status.path + ": cuInit not found"});
  CUresult init = g_api.cuInit(0);
  g_status.init_result = static_cast<int>(init);
  if (init != CUDA_SUCCESS) g_status.init_error = error_text(init);
  g_status.loaded = true;
  return g_status;
}

const DriverStatus& driver_status() {
  std::lock_guard<std::mutex> lock(g_driver_mutex);
  return g_status;
}

const DriverApi& driver() {
  std::lock_guard<std::mutex> lock(g_driver_mutex);
  if (!g_status.loaded) throw RuntimeFailure("the CUDA driver has not been loaded");
  if (g_status.init_result != CUDA_SUCCESS) {
    throw CudaFailure(g_status.init_result, g_status.init_error, "cuInit", "the driver did not initialise");
  }
  return g_api;
}

bool is_sticky_error(int code) {
  switch (code) {
    case 700:  // CUDA_ERROR_ILLEGAL_ADDRESS
    case 702:  // CUDA_ERROR_LAUNCH_TIMEOUT
    case 710:  // CUDA_ERROR_ASSERT
    case 714:  // CUDA_ERROR_HARDWARE_STACK_ERROR
    case 715:  // CUDA_ERROR_ILLEGAL_INSTRUCTION
    case 716:  // CUDA_ERROR_MISALIGNED_ADDRESS
    case 717:  // CUDA_ERROR_INVALID_ADDRESS_SPACE
    case 718:  // CUDA_ERROR_INVALID_PC
    case 719:  // CUDA_ERROR_LAUNCH_FAILED
    case 721:  // CUDA_ERROR_TENSOR_MEMORY_LEAK (CUDA 13 headers)
      return true;
    default:
      return false;
  }
}

void check(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  if (g_api.cuGetErrorName != nullptr) g_api.cuGetErrorName(result, &name);
  if (g_api.cuGetErrorString != nullptr) g_api.cuGetErrorString(result, &text);
  std::string description = text != nullptr ? text : "no description";
  if (is_sticky_error(static_cast<int>(result))) {
    const std::string device = std::to_string(current_device());
    description += ". The CUDA context of device " + device +
                   " is lost: later calls on it fail with this error. pygpukit.reset_device(" + device +
                   ") discards the context with its arrays, streams, events, graphs and kernels and asks "
                   "the driver for a new one";
    if (result != CUDA_ERROR_ASSERT) {
      description +=
          ", which the driver may refuse after this kind of fault (NVIDIA documents it as needing a "
          "process restart; reset_device then says so)";
    }
  }
  throw CudaFailure(static_cast<int>(result), name != nullptr ? name : "CUDA_ERROR_UNKNOWN", call,
                    description);
}

int device_count() {
  const DriverApi& api = driver();
  int count = 0;
  check(api.cuDeviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

DeviceProperties device_properties(int ordinal) {
  const DriverApi& api = driver();
  CUdevice device = 0;
  check(api.cuDeviceGet(&device, ordinal), "cuDeviceGet");
  DeviceProperties p;
  p.ordinal = ordinal;
  char name[256] = {};
  check(api.cuDeviceGetName(name, sizeof(name) - 1, device), "cuDeviceGetName");
  p.name = name;
  CUuuid uuid{};
  if (api.cuDeviceGetUuid != nullptr && api.cuDeviceGetUuid(&uuid, device) == CUDA_SUCCESS) {
    static const char* hex = "0123456789abcdef";
    std::string text = "GPU-";
    for (int i = 0; i < 16; ++i) {
      auto byte = static_cast<unsigned char>(uuid.bytes[i]);
      text += hex[byte >> 4];
      text += hex[byte & 15];
      if (i == 3 || i == 5 || i == 7 || i == 9) text += '-';
    }
    p.uuid = text;
  }
  check(api.cuDeviceTotalMem(&p.total_memory, device), "cuDeviceTotalMem");
  auto attr = [&](CUdevice_attribute a) {
    int value = 0;
    check(api.cuDeviceGetAttribute(&value, a, device), "cuDeviceGetAttribute");
    return value;
  };
  p.compute_capability_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  p.compute_capability_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  p.multiprocessor_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  p.max_threads_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  p.max_threads_per_multiprocessor = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  p.warp_size = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  p.l2_cache_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  p.max_shared_memory_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
  p.max_shared_memory_per_block_optin = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  p.max_shared_memory_per_multiprocessor = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  p.max_registers_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  p.clock_rate_khz = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
  p.memory_clock_rate_khz = attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
  p.memory_bus_width_bits = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  p.pci_bus_id = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  p.pci_device_id = attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
  p.pci_domain_id = attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
  p.async_engine_count = attr(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
  p.unified_addressing = attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) != 0;
  p.concurrent_managed_access = attr(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS) != 0;
  return p;
}

}  // namespace pygpukit
