// Primary contexts, retained once per device and never released (they live as long as the process).
#include "context.hpp"

#include <mutex>
#include <string>
#include <vector>

#include "driver.hpp"
#include "errors.hpp"

namespace pygpukit {

namespace {

std::mutex g_context_mutex;
std::vector<CUcontext> g_primary;  // index: ordinal; nullptr until retained
thread_local int t_device = 0;
thread_local CUcontext t_device_context = nullptr;  // primary context of t_device, once looked up

}  // namespace

int current_device() { return t_device; }

CUcontext primary_context(int ordinal) {
  std::lock_guard<std::mutex> lock(g_context_mutex);
  const DriverApi& api = driver();
  if (g_primary.empty()) g_primary.resize(static_cast<std::size_t>(device_count()), nullptr);
  if (ordinal < 0 || ordinal >= static_cast<int>(g_primary.size())) {
    throw RuntimeFailure("device " + std::to_string(ordinal) + " does not exist (" +
                         std::to_string(g_primary.size()) + " CUDA device(s) available)");
  }
  CUcontext& ctx = g_primary[static_cast<std::size_t>(ordinal)];
  if (ctx == nullptr) {
    CUdevice device = 0;
    check(api.cuDeviceGet(&device, ordinal), "cuDeviceGet");
    check(api.cuDevicePrimaryCtxRetain(&ctx, device), "cuDevicePrimaryCtxRetain");
  }
  return ctx;
}

void set_device(int ordinal) {
  t_device_context = primary_context(ordinal);  // validates
  t_device = ordinal;
  ensure_context();
}

int ensure_context() {
  if (t_device_context == nullptr) t_device_context = primary_context(t_device);
  // Ask the driver rather than remembering: another library may have switched contexts on this thread.
  const DriverApi& api = driver();
  CUcontext current = nullptr;
  check(api.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != t_device_context) check(api.cuCtxSetCurrent(t_device_context), "cuCtxSetCurrent");
  return t_device;
}

}  // namespace pygpukit
