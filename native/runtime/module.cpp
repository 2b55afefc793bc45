// Module loading and kernel launch.
#include "module.hpp"

#include <cuda.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

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

namespace {

using FunctionSet = std::unordered_set<std::uint64_t>;

// Copy on write: a launch reads the current set through one atomic load; a change builds a new set
// under the mutex and publishes it. Replaced sets stay alive (a launch may still be reading one);
// there is one per change, and changes happen once per kernel and device.
std::mutex g_programmatic_mutex;
std::vector<std::unique_ptr<const FunctionSet>> g_programmatic_sets;
std::atomic<const FunctionSet*> g_programmatic{nullptr};

bool is_programmatic(std::uint64_t function) {
  const FunctionSet* set = g_programmatic.load(std::memory_order_acquire);
  return set != nullptr && set->count(function) != 0;
}

}  // namespace

void function_set_programmatic(std::uint64_t function, bool on) {
  std::lock_guard<std::mutex> lock(g_programmatic_mutex);
  const FunctionSet* current = g_programmatic.load(std::memory_order_relaxed);
  if (current != nullptr && (current->count(function) != 0) == on) return;
  if (current == nullptr && !on) return;
  auto next = std::make_unique<FunctionSet>(current ? *current : FunctionSet{});
  if (on) {
    next->insert(function);
  } else {
    next->erase(function);
  }
  g_programmatic.store(next.get(), std::memory_order_release);
  g_programmatic_sets.push_back(std::move(next));
}

bool function_programmatic(std::uint64_t function) { return is_programmatic(function); }

void launch_raw(std::uint64_t function, const unsigned int grid[3], const unsigned int block[3],
                unsigned int shared, std::uint64_t stream, void** params) {
  ensure_context();
  const DriverApi& api = driver();
  if (api.cuLaunchKernelEx != nullptr && is_programmatic(function)) {
    CUlaunchAttribute attribute{};
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = grid[0];
    config.gridDimY = grid[1];
    config.gridDimZ = grid[2];
    config.blockDimX = block[0];
    config.blockDimY = block[1];
    config.blockDimZ = block[2];
    config.sharedMemBytes = shared;
    config.hStream = reinterpret_cast<CUstream>(stream);
    config.attrs = &attribute;
    config.numAttrs = 1;
    check(api.cuLaunchKernelEx(&config, reinterpret_cast<CUfunction>(function), params, nullptr),
          "cuLaunchKernelEx(programmatic stream serialization)");
    return;
  }
  check(api.cuLaunchKernel(reinterpret_cast<CUfunction>(function), grid[0], grid[1], grid[2], block[0],
                           block[1], block[2], shared, reinterpret_cast<CUstream>(stream), params, nullptr),
        "cuLaunchKernel");
}

}  // namespace pygpukit
