// The pybind11 module over native/runtime. It is built once per CUDA major, as
// pygpukit.core._native_cu12 and pygpukit.core._native_cu13; pygpukit.core._variant picks one.
// Errors are raised as the classes of pygpukit.core.errors, never as bare RuntimeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../runtime/cublaslt.hpp"
#include "../runtime/driver.hpp"
#include "../runtime/errors.hpp"
#include "../runtime/nvrtc.hpp"

namespace py = pybind11;
using namespace pygpukit;

#ifndef PYGPUKIT_NATIVE_MODULE
#error "PYGPUKIT_NATIVE_MODULE must name the module (set by native/CMakeLists.txt)"
#endif
#ifndef PYGPUKIT_VERSION
#error "PYGPUKIT_VERSION must be set by native/CMakeLists.txt"
#endif

namespace {

py::object error_class(const char* name) { return py::module_::import("pygpukit.core.errors").attr(name); }

void raise(const py::object& cls, const py::object& instance) { PyErr_SetObject(cls.ptr(), instance.ptr()); }

void translate(std::exception_ptr pending) {
  try {
    if (pending) std::rethrow_exception(pending);
  } catch (const LibraryNotFound& e) {
    const bool driver = e.library() == "libcuda";
    py::object cls = error_class(driver ? "DriverNotFoundError" : "LibraryNotFoundError");
    raise(cls, cls(e.what(), py::arg("library") = e.library(), py::arg("attempts") = e.attempts()));
  } catch (const CudaFailure& e) {
    py::object cls = error_class("CudaError");
    raise(cls,
          cls(e.what(), py::arg("code") = e.code(), py::arg("name") = e.name(), py::arg("call") = e.call()));
  } catch (const NvrtcFailure& e) {
    py::object cls = error_class("NvrtcError");
    raise(cls, cls(e.what(), py::arg("code") = e.code(), py::arg("log") = e.log(),
                   py::arg("options") = e.options()));
  } catch (const RuntimeFailure& e) {
    py::object cls = error_class("PyGPUkitError");
    raise(cls, cls(e.what()));
  }
}

py::dict driver_status_dict(const DriverStatus& s) {
  py::dict d;
  d["loaded"] = s.loaded;
  d["path"] = s.path;
  d["version"] = s.version;
  d["init_result"] = s.init_result;
  d["init_error"] = s.init_error;
  return d;
}

py::dict nvrtc_status_dict(const NvrtcStatus& s) {
  py::dict d;
  d["loaded"] = s.loaded;
  d["path"] = s.path;
  d["version"] = py::make_tuple(s.major, s.minor);
  d["supported_archs"] = s.supported_archs;
  return d;
}

py::dict cublaslt_status_dict(const CublasLtStatus& s) {
  py::dict d;
  d["loaded"] = s.loaded;
  d["path"] = s.path;
  d["version"] = s.version;
  d["cudart_version"] = s.cudart_version;
  return d;
}

py::dict properties_dict(const DeviceProperties& p) {
  py::dict d;
  d["ordinal"] = p.ordinal;
  d["name"] = p.name;
  d["uuid"] = p.uuid;
  d["total_memory"] = p.total_memory;
  d["compute_capability"] = py::make_tuple(p.compute_capability_major, p.compute_capability_minor);
  d["multiprocessor_count"] = p.multiprocessor_count;
  d["max_threads_per_block"] = p.max_threads_per_block;
  d["max_threads_per_multiprocessor"] = p.max_threads_per_multiprocessor;
  d["warp_size"] = p.warp_size;
  d["l2_cache_bytes"] = p.l2_cache_bytes;
  d["max_shared_memory_per_block"] = p.max_shared_memory_per_block;
  d["max_shared_memory_per_block_optin"] = p.max_shared_memory_per_block_optin;
  d["max_shared_memory_per_multiprocessor"] = p.max_shared_memory_per_multiprocessor;
  d["max_registers_per_block"] = p.max_registers_per_block;
  d["clock_rate_khz"] = p.clock_rate_khz;
  d["memory_clock_rate_khz"] = p.memory_clock_rate_khz;
  d["memory_bus_width_bits"] = p.memory_bus_width_bits;
  d["pci_bus_id"] = p.pci_bus_id;
  d["pci_device_id"] = p.pci_device_id;
  d["pci_domain_id"] = p.pci_domain_id;
  d["async_engine_count"] = p.async_engine_count;
  d["unified_addressing"] = p.unified_addressing;
  d["concurrent_managed_access"] = p.concurrent_managed_access;
  return d;
}

}  // namespace

PYBIND11_MODULE(PYGPUKIT_NATIVE_MODULE, m) {
  m.doc() = "pygpukit native runtime (driver API, NVRTC, cuBLASLt), loaded without linking CUDA";
  py::register_exception_translator(&translate);

  m.attr("__version__") = PYGPUKIT_VERSION;
  m.attr("CUDA_MAJOR") = built_cuda_major();
  m.attr("CUDA_HEADER_VERSION") = built_header_version();

  m.def(
      "load_driver",
      [](const std::vector<std::string>& candidates) {
        py::gil_scoped_release release;
        const DriverStatus& s = load_driver(candidates);
        py::gil_scoped_acquire acquire;
        return driver_status_dict(s);
      },
      py::arg("candidates"), "Open libcuda from the first loadable candidate and call cuInit(0).");
  m.def("driver_status", [] { return driver_status_dict(driver_status()); });
  m.def("device_count", &device_count, "Number of CUDA devices the driver reports.");
  m.def(
      "device_properties", [](int ordinal) { return properties_dict(device_properties(ordinal)); },
      py::arg("ordinal"));

  m.def(
      "load_nvrtc",
      [](const std::vector<std::string>& candidates) { return nvrtc_status_dict(load_nvrtc(candidates)); },
      py::arg("candidates"));
  m.def("nvrtc_status", [] { return nvrtc_status_dict(nvrtc_status()); });
  m.def(
      "nvrtc_compile",
      [](const std::string& source, const std::string& name, const std::vector<std::string>& options,
         const std::string& target, const std::vector<std::string>& name_expressions) {
        CompileTarget t;
        if (target == "cubin") {
          t = CompileTarget::Cubin;
        } else if (target == "ptx") {
          t = CompileTarget::Ptx;
        } else {
          throw py::value_error("target must be 'cubin' or 'ptx', got '" + target + "'");
        }
        CompileResult r;
        {
          py::gil_scoped_release release;
          r = nvrtc_compile(source, name, options, t, name_expressions);
        }
        py::dict lowered;
        for (const auto& [expression, mangled] : r.lowered_names) lowered[py::str(expression)] = mangled;
        return py::make_tuple(py::bytes(r.binary), r.log, lowered);
      },
      py::arg("source"), py::arg("name"), py::arg("options"), py::arg("target"),
      py::arg("name_expressions") = std::vector<std::string>{},
      "Compile CUDA C++ with NVRTC; returns (binary, log, lowered_names). Needs no GPU.");

  m.def(
      "load_cublaslt",
      [](const std::vector<std::string>& candidates) {
        return cublaslt_status_dict(load_cublaslt(candidates));
      },
      py::arg("candidates"));
  m.def("cublaslt_status", [] { return cublaslt_status_dict(cublaslt_status()); });
}
