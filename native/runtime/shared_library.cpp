// dlopen-based loading with an explanation of every candidate tried.
#include "shared_library.hpp"

#include <dlfcn.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "errors.hpp"

namespace pygpukit {

bool debug_flag_value(const char* value) {
  if (value == nullptr) return false;
  std::string text(value);
  const auto blank = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && blank(text.back())) text.pop_back();
  std::size_t start = 0;
  while (start < text.size() && blank(text[start])) ++start;
  text.erase(0, start);
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text == "1" || text == "true" || text == "yes" || text == "on";
}

bool library_debug_enabled() { return debug_flag_value(std::getenv("PYGPUKIT_DEBUG_LIBRARY_LOAD")); }

LoadedLibrary open_first(const std::string& library, const std::vector<std::string>& candidates) {
  LoadedLibrary result;
  const bool debug = library_debug_enabled();
  for (const auto& candidate : candidates) {
    dlerror();
    void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      if (debug) std::fprintf(stderr, "[pygpukit] %s: loaded %s\n", library.c_str(), candidate.c_str());
      result.handle = handle;
      result.path = candidate;
      return result;
    }
    const char* reason = dlerror();
    std::string attempt = candidate + ": " + (reason != nullptr ? reason : "unknown dlopen error");
    if (debug) std::fprintf(stderr, "[pygpukit] %s: %s\n", library.c_str(), attempt.c_str());
    result.attempts.push_back(std::move(attempt));
  }
  throw LibraryNotFound(library, result.attempts);
}

void* find_symbol(void* handle, const char* name) { return handle ? dlsym(handle, name) : nullptr; }

std::string resolved_path(void* handle, const char* any_symbol, const std::string& fallback) {
  void* symbol = find_symbol(handle, any_symbol);
  Dl_info info{};
  if (symbol != nullptr && dladdr(symbol, &info) != 0 && info.dli_fname != nullptr) {
    return info.dli_fname;
  }
  return fallback;
}

}  // namespace pygpukit
