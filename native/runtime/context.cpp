// Primary contexts, retained once per device and held for the life of the process; reset_device
// resets one and retains it again.
#include "context.hpp"

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "driver.hpp"
#include "errors.hpp"
#include "gemm.hpp"
#include "memory.hpp"
#include "staging.hpp"

namespace pygpukit {

namespace {

std::mutex g_context_mutex;
std::vector<CUcontext> g_primary;  // index: ordinal; nullptr until retained
// Bumped by every reset_device: a thread whose cached context is of an older generation looks its
// context up again, so no thread keeps making a reset context current.
std::atomic<std::uint64_t> g_generation{0};
thread_local int t_device = 0;
thread_local CUcontext t_device_context = nullptr;  // primary context of t_device, once looked up
thread_local std::uint64_t t_generation = 0;        // g_generation when t_device_context was looked up

void require_ordinal(int ordinal) {
  if (g_primary.empty()) g_primary.resize(static_cast<std::size_t>(device_count()), nullptr);
  if (ordinal < 0 || ordinal >= static_cast<int>(g_primary.size())) {
    throw RuntimeFailure("device " + std::to_string(ordinal) + " does not exist (" +
                         std::to_string(g_primary.size()) + " CUDA device(s) available)");
  }
}

std::string error_name(CUresult rc) {
  const char* name = nullptr;
  if (driver().cuGetErrorName != nullptr) driver().cuGetErrorName(rc, &name);
  return name != nullptr ? name : "CUDA error " + std::to_string(static_cast<int>(rc));
}

// Retains the primary context of `device`. The driver answers a sticky error here when the device
// cannot get a new context in this process (after a memory fault, even once the faulted context was
// reset): say that plainly instead of suggesting another reset.
CUcontext retain(int ordinal, CUdevice device) {
  CUcontext ctx = nullptr;
  const CUresult rc = driver().cuDevicePrimaryCtxRetain(&ctx, device);
  if (rc == CUDA_SUCCESS) return ctx;
  if (!is_sticky_error(static_cast<int>(rc))) check(rc, "cuDevicePrimaryCtxRetain");
  const char* text = nullptr;
  if (driver().cuGetErrorString != nullptr) driver().cuGetErrorString(rc, &text);
  throw CudaFailure(static_cast<int>(rc), error_name(rc), "cuDevicePrimaryCtxRetain",
                    std::string(text != nullptr ? text : "no description") +
                        ". The driver refuses a new CUDA context on device " + std::to_string(ordinal) +
                        " after this fault, so CUDA cannot use that device again in this process (NVIDIA "
                        "documents this error as needing a process restart): restart the process");
}

}  // namespace

int current_device() { return t_device; }

CUcontext primary_context(int ordinal) {
  std::lock_guard<std::mutex> lock(g_context_mutex);
  const DriverApi& api = driver();
  require_ordinal(ordinal);
  CUcontext& ctx = g_primary[static_cast<std::size_t>(ordinal)];
  if (ctx == nullptr) {
    CUdevice device = 0;
    check(api.cuDeviceGet(&device, ordinal), "cuDeviceGet");
    ctx = retain(ordinal, device);
  }
  return ctx;
}

void set_device(int ordinal) {
  const std::uint64_t generation = g_generation.load(std::memory_order_acquire);
  t_device_context = primary_context(ordinal);  // validates
  t_generation = generation;
  t_device = ordinal;
  ensure_context();
}

int ensure_context() {
  const std::uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (t_device_context == nullptr || t_generation != generation) {
    t_device_context = primary_context(t_device);
    t_generation = generation;
  }
  // Ask the driver rather than remembering: another library may have switched contexts on this thread.
  const DriverApi& api = driver();
  CUcontext current = nullptr;
  check(api.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != t_device_context) check(api.cuCtxSetCurrent(t_device_context), "cuCtxSetCurrent");
  return t_device;
}

DeviceResetSummary reset_device(int ordinal) {
  const DriverApi& api = driver();
  DeviceResetSummary summary;
  summary.device = ordinal;
  CUcontext old = primary_context(ordinal);  // validates (and retains a never-used device's context)
  CUdevice device = 0;
  check(api.cuDeviceGet(&device, ordinal), "cuDeviceGet");

  // (a) Let whatever still runs finish; in a faulted context this reports the sticky error at once.
  CUresult rc = api.cuCtxSetCurrent(old);
  if (rc == CUDA_SUCCESS) rc = api.cuCtxSynchronize();
  if (rc != CUDA_SUCCESS) summary.sync_error = error_name(rc);

  // (b) Forget what lives in the context, before it goes: nothing here touches the driver.
  summary.gemm_plans = gemm_forget_device(ordinal);  // its workspaces are pool blocks, forgotten next
  summary.staging_buffers = staging_forget_device(ordinal);
  const auto [blocks, bytes] = forget_device_memory(ordinal);
  summary.pool_blocks = blocks;
  summary.pool_bytes = bytes;

  // (c) Reset the primary context, then release the retain it kept and retain a fresh one. The old
  // handle is dropped and the generation bumped first, so that no thread uses it again even when the
  // driver refuses the new context (retain() then throws, and every later call says so too).
  {
    std::lock_guard<std::mutex> lock(g_context_mutex);
    check(api.cuDevicePrimaryCtxReset(device), "cuDevicePrimaryCtxReset");
    CUcontext& ctx = g_primary[static_cast<std::size_t>(ordinal)];
    ctx = nullptr;
    summary.generation = g_generation.fetch_add(1, std::memory_order_acq_rel) + 1;
    check(api.cuDevicePrimaryCtxRelease(device), "cuDevicePrimaryCtxRelease");
    ctx = retain(ordinal, device);
  }
  // (d) Back to this thread's own device, in its new context when that is the one reset.
  ensure_context();
  return summary;
}

}  // namespace pygpukit
