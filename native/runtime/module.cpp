// Module loading and kernel launch.
#include "module.hpp"

#include <cuda.h>

#include "context.hpp"
#include "driver.hpp"

namespace pygpukit {

std::uint64_t module_load(const std::string& image) {
  ensure_context();
  CUmodule module = nullptr;
  check(driver().cuModuleLoadData(&module, image.data()), "cuModuleLoadData");
  return reinterpret_cast<std::uint64_t>(module);
}

std::uint64_t module_function(std::uint64_t module, const std::string& name) {
  ensure_context();
  CUfunction function = nullptr;
  check(driver().cuModuleGetFunction(&function, reinterpret_cast<CUmodule>(module), name.c_str()),
        ("cuModuleGetFunction(" + name + ")").c_str());
  return reinterpret_cast<std::uint64_t>(function);
}

FunctionAttributes function_attributes(std::uint64_t function) {
  ensure_context();
  auto f = reinterpret_cast<CUfunction>(function);
  const DriverApi& api = driver();
  auto get = [&](CUfunction_attribute a) {
    int value = 0;
    check(api.cuFuncGetAttribute(&value, a, f), "cuFuncGetAttribute");
    return value;
  };
  FunctionAttributes out;
  out.max_threads_per_block = get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  out.shared_size_bytes = get(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  out.max_dynamic_shared_size_bytes = get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
  out.num_regs = get(CU_FUNC_ATTRIBUTE_NUM_REGS);
  out.local_size_bytes = get(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
  out.ptx_version = get(CU_FUNC_ATTRIBUTE_PTX_VERSION);
  out.binary_version = get(CU_FUNC_ATTRIBUTE_BINARY_VERSION);
  return out;
}

void function_set_max_dynamic_shared(std::uint64_t function, int bytes) {
  ensure_context();
  check(driver().cuFuncSetAttribute(reinterpret_cast<CUfunction>(function),
                                    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
        "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
}

void launch_raw(std::uint64_t function, const unsigned int grid[3], const unsigned int block[3],
                unsigned int shared, std::uint64_t stream, void** params) {
  ensure_context();
  check(driver().cuLaunchKernel(reinterpret_cast<CUfunction>(function), grid[0], grid[1], grid[2], block[0],
                                block[1], block[2], shared, reinterpret_cast<CUstream>(stream), params,
                                nullptr),
        "cuLaunchKernel");
}

}  // namespace pygpukit
