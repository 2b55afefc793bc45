// The C API table exported through the native module's _C_API capsule (see c_api.h).
#pragma once

#include "c_api.h"

namespace pygpukit {

const PygpukitCApi* c_api_table();

}  // namespace pygpukit
