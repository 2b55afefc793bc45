// Opening shared libraries from an ordered list of candidates. Handles are never closed: the CUDA
// libraries keep process-wide state and unloading them while kernels or handles live is undefined.
#pragma once

#include <string>
#include <vector>

namespace pygpukit {

struct LoadedLibrary {
  void* handle = nullptr;
  std::string path;                   // the candidate that loaded
  std::vector<std::string> attempts;  // "candidate: reason" for each candidate that did not
};

// Tries each candidate in order with dlopen(RTLD_NOW | RTLD_LOCAL). Throws LibraryNotFound naming
// every attempt when none loads. With PYGPUKIT_DEBUG_LIBRARY_LOAD on each attempt is printed to stderr.
LoadedLibrary open_first(const std::string& library, const std::vector<std::string>& candidates);

// dlsym that returns nullptr for a missing symbol.
void* find_symbol(void* handle, const char* name);

// The absolute path of the file a loaded handle came from (resolves bare sonames).
std::string resolved_path(void* handle, const char* any_symbol, const std::string& fallback);

// Whether PYGPUKIT_DEBUG_LIBRARY_LOAD is on: 1, true, yes or on in any case, blanks ignored (the rule
// of Python's pygpukit.core._env.env_flag). Every other value, 0/false/no/off included, is off.
bool library_debug_enabled();
bool debug_flag_value(const char* value);

}  // namespace pygpukit
