// The CUDA driver API, resolved at run time. libcuda.so.1 is opened by path (never linked), only
// cuGetProcAddress is taken with dlsym, and every other entry point is requested through it at the
// ABI baseline of the CUDA major this module was built for (12000 or 13000), so the function
// pointer types below (taken from the same headers) always match what the driver hands back.
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

namespace pygpukit {

// Entry points this module uses. Adding one here is all it takes to make it callable as
// driver().name(...); a missing entry point stays nullptr.
#define PYGPUKIT_DRIVER_FUNCTIONS(X)   \
  X(cuInit)                            \
  X(cuDriverGetVersion)                \
  X(cuGetErrorName)                    \
  X(cuGetErrorString)                  \
  X(cuDeviceGetCount)                  \
  X(cuDeviceGet)                       \
  X(cuDeviceGetName)                   \
  X(cuDeviceGetUuid)                   \
  X(cuDeviceTotalMem)                  \
  X(cuDeviceGetAttribute)              \
  X(cuDevicePrimaryCtxRetain)          \
  X(cuDevicePrimaryCtxRelease)         \
  X(cuDevicePrimaryCtxReset)           \
  X(cuCtxSetCurrent)                   \
  X(cuCtxGetCurrent)                   \
  X(cuCtxSynchronize)                  \
  X(cuCtxGetStreamPriorityRange)       \
  X(cuMemGetInfo)                      \
  X(cuMemAlloc)                        \
  X(cuMemFree)                         \
  X(cuMemHostAlloc)                    \
  X(cuMemFreeHost)                     \
  X(cuMemcpyHtoD)                      \
  X(cuMemcpyDtoH)                      \
  X(cuMemcpyDtoD)                      \
  X(cuMemcpyHtoDAsync)                 \
  X(cuMemcpyDtoHAsync)                 \
  X(cuMemcpyDtoDAsync)                 \
  X(cuMemsetD8Async)                   \
  X(cuPointerGetAttribute)             \
  X(cuStreamCreateWithPriority)        \
  X(cuStreamDestroy)                   \
  X(cuStreamSynchronize)               \
  X(cuStreamQuery)                     \
  X(cuStreamWaitEvent)                 \
  X(cuStreamGetPriority)               \
  X(cuEventCreate)                     \
  X(cuEventDestroy)                    \
  X(cuEventRecord)                     \
  X(cuEventSynchronize)                \
  X(cuEventQuery)                      \
  X(cuEventElapsedTime)                \
  X(cuModuleLoadData)                  \
  X(cuModuleGetFunction)               \
  X(cuFuncGetAttribute)                \
  X(cuFuncSetAttribute)                \
  X(cuLaunchKernel)                    \
  X(cuLaunchKernelEx)                  \
  X(cuStreamBeginCapture)              \
  X(cuStreamEndCapture)                \
  X(cuThreadExchangeStreamCaptureMode) \
  X(cuGraphInstantiateWithFlags)       \
  X(cuGraphLaunch)                     \
  X(cuGraphExecUpdate)                 \
  X(cuGraphExecDestroy)                \
  X(cuGraphDestroy)                    \
  X(cuGraphGetNodes)

struct DriverApi {
#define PYGPUKIT_DRIVER_FIELD(name) decltype(&::name) name = nullptr;
  PYGPUKIT_DRIVER_FUNCTIONS(PYGPUKIT_DRIVER_FIELD)
#undef PYGPUKIT_DRIVER_FIELD
};

struct DriverStatus {
  bool loaded = false;
  std::string path;
  int version = 0;         // cuDriverGetVersion, e.g. 13000
  int init_result = -1;    // cuInit's CUresult; 0 when a device is usable
  std::string init_error;  // name and text of init_result when it is not 0
};

// The CUDA major whose headers (and ABI baseline) this module was built with.
int built_cuda_major();
// CUDA_VERSION of the headers this module was built with, e.g. 13000 + 10 * minor.
int built_header_version();

// Opens libcuda from the candidates (first one that loads), resolves the table and calls cuInit(0).
// Idempotent: later calls return the status of the first successful load. Throws LibraryNotFound when
// no candidate loads or when the driver is older than this module's CUDA major (naming both versions).
// A failing cuInit is not thrown: it is recorded in the status (init_result, init_error).
const DriverStatus& load_driver(const std::vector<std::string>& candidates);

// The status so far (loaded == false before load_driver succeeded).
const DriverStatus& driver_status();

// The resolved table; throws RuntimeFailure if the driver was not loaded or cuInit failed.
const DriverApi& driver();

// Throws CudaFailure naming `call` unless result is CUDA_SUCCESS. For a sticky error (see below) the
// message adds that the device's context is lost and that pygpukit.reset_device() recovers it.
void check(CUresult result, const char* call);

// Whether `code` is one of the driver's sticky errors: a kernel fault (illegal or misaligned address,
// illegal instruction, device assert, ...) after which every call in the context fails with the
// same error until the context is reset.
bool is_sticky_error(int code);

struct DeviceProperties {
  int ordinal = 0;
  std::string name;
  std::string uuid;
  std::size_t total_memory = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int multiprocessor_count = 0;
  int max_threads_per_block = 0;
  int max_threads_per_multiprocessor = 0;
  int warp_size = 0;
  int l2_cache_bytes = 0;
  int max_shared_memory_per_block = 0;
  int max_shared_memory_per_block_optin = 0;
  int max_shared_memory_per_multiprocessor = 0;
  int max_registers_per_block = 0;
  int clock_rate_khz = 0;
  int memory_clock_rate_khz = 0;
  int memory_bus_width_bits = 0;
  int pci_bus_id = 0;
  int pci_device_id = 0;
  int pci_domain_id = 0;
  int async_engine_count = 0;
  bool unified_addressing = false;
  bool concurrent_managed_access = false;
};

int device_count();
DeviceProperties device_properties(int ordinal);

}  // namespace pygpukit
