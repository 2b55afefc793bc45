// Devices and their primary contexts. Every runtime call first makes the primary context of the
// calling thread's current device current (cheap when it already is), so Python threads need no
// setup and pygpukit shares contexts with other libraries that use primary contexts.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace pygpukit {

// The calling thread's current device ordinal (0 until set_device is called on this thread).
int current_device();
// Validates `ordinal` and makes it the calling thread's current device.
void set_device(int ordinal);
// Makes the current device's primary context current on this thread; returns the device ordinal.
int ensure_context();
CUcontext primary_context(int ordinal);

// What reset_device did, for the caller to report.
struct DeviceResetSummary {
  int device = 0;
  std::string sync_error;         // what synchronizing the old context reported ("": it succeeded)
  std::uint64_t pool_blocks = 0;  // pool blocks (in use and cached) forgotten
  std::uint64_t pool_bytes = 0;   // and their bytes
  std::size_t gemm_plans = 0;     // cuBLASLt plans dropped
  bool staging_buffers = false;   // whether the device had staging buffers (now dropped)
  std::uint64_t generation = 0;   // contexts reset in this process so far, this one included
};

// Recovers device `ordinal` after a sticky error (a kernel fault): synchronizes what it can, makes
// the pool, the staging buffers and the cuBLASLt state forget the device (their memory dies with the
// context, so nothing stale is ever freed into the new one), resets the primary context
// (cuDevicePrimaryCtxReset) and retains a fresh one, which every thread picks up on its next call.
// Streams, events, modules and graphs created in the old context are invalid afterwards: their owners
// (the Python objects) must drop them without destroying them. No other thread may use the device
// meanwhile. Works on a healthy context too (everything of the device is then discarded). Throws
// CudaFailure saying that the process must be restarted when the driver refuses the new context
// (NVIDIA documents memory faults as needing a restart; later calls on the device then say the same).
DeviceResetSummary reset_device(int ordinal);

}  // namespace pygpukit
