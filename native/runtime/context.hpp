// Devices and their primary contexts. Every runtime call first makes the primary context of the
// calling thread's current device current (cheap when it already is), so Python threads need no
// setup and pygpukit shares contexts with other libraries that use primary contexts.
#pragma once

#include <cuda.h>

namespace pygpukit {

// The calling thread's current device ordinal (0 until set_device is called on this thread).
int current_device();
// Validates `ordinal` and makes it the calling thread's current device.
void set_device(int ordinal);
// Makes the current device's primary context current on this thread; returns the device ordinal.
int ensure_context();
CUcontext primary_context(int ordinal);

}  // namespace pygpukit
