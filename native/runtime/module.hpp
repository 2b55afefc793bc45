// Loading compiled code (CUBIN or PTX) into the current context and launching its kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pygpukit {

struct FunctionAttributes {
  int max_threads_per_block = 0;
  int shared_size_bytes = 0;  // static shared memory
  int max_dynamic_shared_size_bytes = 0;
  int num_regs = 0;
  int local_size_bytes = 0;
  int ptx_version = 0;
  int binary_version = 0;
};

// Loads a CUBIN or PTX image; throws CudaFailure (e.g. CUDA_ERROR_UNSUPPORTED_PTX_VERSION) on failure.
std::uint64_t module_load(const std::string& image);
// Throws CudaFailure (CUDA_ERROR_NOT_FOUND) when the module has no such function.
std::uint64_t module_function(std::uint64_t module, const std::string& name);
FunctionAttributes function_attributes(std::uint64_t function);
void function_set_max_dynamic_shared(std::uint64_t function, int bytes);

// Programmatic dependent launch (SM90 and newer): a function marked here is launched with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, so the driver may start it while the kernel
// before it in the stream is still running. Only kernels that execute `griddepcontrol.wait` before they
// touch memory the earlier kernel writes (native/kernels/common/overlap.cuh) may be marked. Thread-safe;
// launches read the set without a lock.
void function_set_programmatic(std::uint64_t function, bool on);
bool function_programmatic(std::uint64_t function);

// Launches `function` with `params[i]` pointing at the value of kernel parameter i (cuLaunchKernel's
// form; the Python binding and the C API both build that array).
void launch_raw(std::uint64_t function, const unsigned int grid[3], const unsigned int block[3],
                unsigned int shared, std::uint64_t stream, void** params);

}  // namespace pygpukit
