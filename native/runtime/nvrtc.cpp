// NVRTC function table and the compile call.
#include "nvrtc.hpp"

#include <memory>
#include <mutex>

#include "errors.hpp"
#include "shared_library.hpp"

namespace pygpukit {

namespace {

// The NVRTC C API as documented; nvrtcResult is an int-sized enum, nvrtcProgram an opaque pointer.
using nvrtcResult = int;
using nvrtcProgram = struct NvrtcProgramOpaque*;

struct NvrtcApi {
  nvrtcResult (*nvrtcVersion)(int*, int*) = nullptr;
  const char* (*nvrtcGetErrorString)(nvrtcResult) = nullptr;
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int*) = nullptr;
  nvrtcResult (*nvrtcGetSupportedArchs)(int*) = nullptr;
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                    const char* const*) = nullptr;
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*) = nullptr;
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, std::size_t*) = nullptr;
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, std::size_t*) = nullptr;
  nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, std::size_t*) = nullptr;
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*nvrtcAddNameExpression)(nvrtcProgram, const char*) = nullptr;
  nvrtcResult (*nvrtcGetLoweredName)(nvrtcProgram, const char*, const char**) = nullptr;
};

std::mutex g_nvrtc_mutex;
NvrtcApi g_api;
NvrtcStatus g_status;

template <typename Fn>
bool bind(void* handle, const char* name, Fn& slot) {
  slot = reinterpret_cast<Fn>(find_symbol(handle, name));
  return slot != nullptr;
}

std::string result_text(nvrtcResult code) {
  const char* text = g_api.nvrtcGetErrorString ? g_api.nvrtcGetErrorString(code) : nullptr;
  return text != nullptr ? text : "NVRTC error " + std::to_string(code);
}

const NvrtcApi& api() {
  std::lock_guard<std::mutex> lock(g_nvrtc_mutex);
  if (!g_status.loaded) throw RuntimeFailure("NVRTC has not been loaded");
  return g_api;
}

struct ProgramDeleter {
  void operator()(nvrtcProgram* program) const {
    if (program != nullptr && *program != nullptr) g_api.nvrtcDestroyProgram(program);
    delete program;
  }
};

}  // namespace

const NvrtcStatus& load_nvrtc(const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> lock(g_nvrtc_mutex);
  if (g_status.loaded) return g_status;
  LoadedLibrary lib = open_first("NVRTC", candidates);
  void* h = lib.handle;
  bool ok = bind(h, "nvrtcVersion", g_api.nvrtcVersion) &&
            bind(h, "nvrtcGetErrorString", g_api.nvrtcGetErrorString) &&
            bind(h, "nvrtcCreateProgram", g_api.nvrtcCreateProgram) &&
            bind(h, "nvrtcDestroyProgram", g_api.nvrtcDestroyProgram) &&
            bind(h, "nvrtcCompileProgram", g_api.nvrtcCompileProgram) &&
            bind(h, "nvrtcGetProgramLogSize", g_api.nvrtcGetProgramLogSize) &&
            bind(h, "nvrtcGetProgramLog", g_api.nvrtcGetProgramLog) &&
            bind(h, "nvrtcGetPTXSize", g_api.nvrtcGetPTXSize) && bind(h, "nvrtcGetPTX", g_api.nvrtcGetPTX) &&
            bind(h, "nvrtcGetCUBINSize", g_api.nvrtcGetCUBINSize) &&
            bind(h, "nvrtcGetCUBIN", g_api.nvrtcGetCUBIN) &&
            bind(h, "nvrtcAddNameExpression", g_api.nvrtcAddNameExpression) &&
            bind(h, "nvrtcGetLoweredName", g_api.nvrtcGetLoweredName);
  if (!ok) {
    g_api = NvrtcApi{};
    throw LibraryNotFound("NVRTC", {lib.path + ": missing NVRTC entry points (NVRTC 11.1 or newer needed)"});
  }
  bind(h, "nvrtcGetNumSupportedArchs", g_api.nvrtcGetNumSupportedArchs);
  bind(h, "nvrtcGetSupportedArchs", g_api.nvrtcGetSupportedArchs);
  g_api.nvrtcVersion(&g_status.major, &g_status.minor);
  int count = 0;
  if (g_api.nvrtcGetNumSupportedArchs && g_api.nvrtcGetSupportedArchs &&
      g_api.nvrtcGetNumSupportedArchs(&count) == 0 && count > 0) {
    g_status.supported_archs.resize(static_cast<std::size_t>(count));
    g_api.nvrtcGetSupportedArchs(g_status.supported_archs.data());
  }
  g_status.path = resolved_path(h, "nvrtcVersion", lib.path);
  g_status.loaded = true;
  return g_status;
}

CompileResult nvrtc_compile(const std::string& source, const std::string& name,
                            const std::vector<std::string>& options, CompileTarget target,
                            const std::vector<std::string>& name_expressions) {
  const NvrtcApi& nv = api();
  std::unique_ptr<nvrtcProgram, ProgramDeleter> program(new nvrtcProgram(nullptr));
  nvrtcResult rc = nv.nvrtcCreateProgram(program.get(), source.c_str(), name.c_str(), 0, nullptr, nullptr);
  if (rc != 0) throw NvrtcFailure(rc, "nvrtcCreateProgram failed: " + result_text(rc), "", options);
  for (const auto& expression : name_expressions) {
    rc = nv.nvrtcAddNameExpression(*program, expression.c_str());
    if (rc != 0) {
      throw NvrtcFailure(rc, "nvrtcAddNameExpression(" + expression + ") failed: " + result_text(rc), "",
                         options);
    }
  }
  std::vector<const char*> argv;
  argv.reserve(options.size());
  for (const auto& option : options) argv.push_back(option.c_str());
  nvrtcResult compiled = nv.nvrtcCompileProgram(*program, static_cast<int>(argv.size()), argv.data());

  CompileResult result;
  std::size_t log_size = 0;
  if (nv.nvrtcGetProgramLogSize(*program, &log_size) == 0 && log_size > 1) {
    result.log.resize(log_size);
    nv.nvrtcGetProgramLog(*program, result.log.data());
    result.log.resize(log_size - 1);  // drop the terminating NUL
  }
  if (compiled != 0) {
    throw NvrtcFailure(compiled, "compilation of " + name + " failed: " + result_text(compiled), result.log,
                       options);
  }

  std::size_t size = 0;
  if (target == CompileTarget::Cubin) {
    rc = nv.nvrtcGetCUBINSize(*program, &size);
    if (rc != 0 || size == 0) {
      throw NvrtcFailure(
          rc, "no CUBIN was produced for " + name + " (CUBIN needs an exact --gpu-architecture=sm_XY option)",
          result.log, options);
    }
    result.binary.resize(size);
    nv.nvrtcGetCUBIN(*program, result.binary.data());
  } else {
    rc = nv.nvrtcGetPTXSize(*program, &size);
    if (rc != 0 || size == 0) throw NvrtcFailure(rc, "no PTX was produced for " + name, result.log, options);
    result.binary.resize(size);
    nv.nvrtcGetPTX(*program, result.binary.data());
    if (!result.binary.empty() && result.binary.back() == '\0') result.binary.pop_back();
  }
  for (const auto& expression : name_expressions) {
    const char* lowered = nullptr;
    rc = nv.nvrtcGetLoweredName(*program, expression.c_str(), &lowered);
    if (rc != 0 || lowered == nullptr) {
      throw NvrtcFailure(rc, "nvrtcGetLoweredName(" + expression + ") failed: " + result_text(rc), result.log,
                         options);
    }
    result.lowered_names.emplace_back(expression, lowered);
  }
  return result;
}

}  // namespace pygpukit
