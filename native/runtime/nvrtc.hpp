// NVRTC, opened at run time from a candidate list (PYGPUKIT_NVRTC_PATH alone when set, else the pip
// wheels, then the system; the list is built in pygpukit/core/_libraries.py). Only the
// C API's stable entry points are declared here, so no NVRTC header or library is needed to build.
// Compilation needs no GPU: that is what lets CI compile every built-in kernel for every arch.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace pygpukit {

struct NvrtcStatus {
  bool loaded = false;
  std::string path;
  int major = 0;
  int minor = 0;
  std::vector<int> supported_archs;  // e.g. {75, 80, 86, ...}; empty if NVRTC cannot list them
};

enum class CompileTarget { Cubin, Ptx };

struct CompileResult {
  std::string binary;  // CUBIN bytes or PTX text
  std::string log;     // compiler log, possibly with warnings even on success
  std::vector<std::pair<std::string, std::string>> lowered_names;  // name expression -> mangled name
};

// Idempotent: the first candidate that loads and exposes the entry points wins for the process.
const NvrtcStatus& load_nvrtc(const std::vector<std::string>& candidates);

// Compiles `source` with `options` (for example "--gpu-architecture=sm_90"). CUBIN needs an exact
// sm_XY architecture option; PTX works with compute_XY. Throws NvrtcFailure with the log on error.
CompileResult nvrtc_compile(const std::string& source, const std::string& name,
                            const std::vector<std::string>& options, CompileTarget target,
                            const std::vector<std::string>& name_expressions);

}  // namespace pygpukit
