// The pybind11 module over native/runtime. It is built once per CUDA major, as
// pygpukit.core._native_cu12 and pygpukit.core._native_cu13; pygpukit.core._variant picks one.
// Errors are raised as the classes of pygpukit.core.errors, never as bare RuntimeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../runtime/c_api.hpp"
#include "../runtime/context.hpp"
#include "../runtime/cublaslt.hpp"
#include "../runtime/driver.hpp"
#include "../runtime/errors.hpp"
#include "../runtime/gemm.hpp"
#include "../runtime/graph.hpp"
#include "../runtime/memory.hpp"
#include "../runtime/module.hpp"
#include "../runtime/nvrtc.hpp"
#include "../runtime/staging.hpp"
#include "../runtime/streams.hpp"
#include "launcher.hpp"

#include <cstring>

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
    raise(cls, cls(e.what(), py::arg("code") = e.code(), py::arg("name") = e.name(),
                   py::arg("call") = e.call(), py::arg("context_lost") = is_sticky_error(e.code())));
  } catch (const NvrtcFailure& e) {
    py::object cls = error_class("NvrtcError");
    raise(cls, cls(e.what(), py::arg("code") = e.code(), py::arg("log") = e.log(),
                   py::arg("options") = e.options()));
  } catch (const OutOfMemory& e) {
    py::object cls = error_class("OutOfMemoryError");
    raise(cls, cls(e.what(), py::arg("requested") = e.requested, py::arg("in_use") = e.in_use,
                   py::arg("cached") = e.cached, py::arg("limit") = e.limit));
  } catch (const InvalidFree& e) {
    py::object cls = error_class("InvalidPointerError");
    raise(cls, cls(e.what()));
  } catch (const CublasLtFailure& e) {
    py::object cls = error_class("CublasLtError");
    raise(cls, cls(e.what(), py::arg("status") = e.status(), py::arg("operation") = e.operation()));
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

py::dict stats_dict(const PgkStats& s) {
  py::dict d;
  d["in_use_bytes"] = s.in_use_bytes;
  d["cached_bytes"] = s.cached_bytes;
  d["pending_bytes"] = s.pending_bytes;
  d["peak_in_use_bytes"] = s.peak_in_use_bytes;
  d["in_use_blocks"] = s.in_use_blocks;
  d["cached_blocks"] = s.cached_blocks;
  d["requests"] = s.requests;
  d["reuse_hits"] = s.reuse_hits;
  d["device_allocations"] = s.device_allocations;
  d["frees"] = s.frees;
  d["releases"] = s.releases;
  d["released_bytes"] = s.released_bytes;
  d["limit"] = s.limit == UINT64_MAX ? py::object(py::none()) : py::object(py::int_(s.limit));
  return d;
}

void bind_runtime(py::module_& m) {
  using u64 = std::uint64_t;
  m.def("set_device", &set_device, py::arg("ordinal"));
  m.def("get_device", &current_device);
  m.def("device_synchronize", &device_synchronize, py::call_guard<py::gil_scoped_release>());
  m.def(
      "reset_device",
      [](int ordinal) {
        DeviceResetSummary s;
        {
          py::gil_scoped_release release;
          s = reset_device(ordinal);
        }
        py::dict d;
        d["device"] = s.device;
        d["sync_error"] = s.sync_error;
        d["pool_blocks"] = s.pool_blocks;
        d["pool_bytes"] = s.pool_bytes;
        d["gemm_plans"] = s.gemm_plans;
        d["staging_buffers"] = s.staging_buffers;
        d["generation"] = s.generation;
        return d;
      },
      py::arg("ordinal"),
      "Reset the primary context of a device after a kernel fault (native/runtime/context.hpp); the "
      "Python objects of the device must be invalidated first (pygpukit.reset_device does both).");

  m.def("mem_empty_cache", &empty_cache, py::arg("all_devices") = false);
  m.def("mem_set_limit", &set_memory_limit, py::arg("bytes"));
  m.def("mem_stats", [] {
    py::dict d = stats_dict(memory_stats());
    std::uint64_t limit = 0, reserved = 0;
    global_memory_usage(&limit, &reserved);
    d["all_devices_limit"] = limit == UINT64_MAX ? py::object(py::none()) : py::object(py::int_(limit));
    d["all_devices_reserved_bytes"] = reserved;
    return d;
  });
  m.def("mem_set_global_limit", &set_global_memory_limit, py::arg("bytes"));
  m.def("mem_get_info", [] {
    std::size_t free_bytes = 0, total_bytes = 0;
    device_memory_info(&free_bytes, &total_bytes);
    return py::make_tuple(free_bytes, total_bytes);
  });
  m.def("pinned_alloc", &pinned_allocate, py::arg("nbytes"));
  m.def("pinned_free", &pinned_free, py::arg("ptr"));
  auto copy_fn = [](CopyKind kind) {
    return [kind](u64 dst, u64 src, u64 nbytes, u64 stream, bool async) {
      copy(kind, dst, src, nbytes, stream, async);
    };
  };
  m.def("memcpy_htod", copy_fn(CopyKind::HostToDevice), py::arg("dst"), py::arg("src"), py::arg("nbytes"),
        py::arg("stream") = 0, py::arg("async_") = false, py::call_guard<py::gil_scoped_release>());
  m.def("memcpy_dtoh", copy_fn(CopyKind::DeviceToHost), py::arg("dst"), py::arg("src"), py::arg("nbytes"),
        py::arg("stream") = 0, py::arg("async_") = false, py::call_guard<py::gil_scoped_release>());
  m.def("memcpy_dtod", copy_fn(CopyKind::DeviceToDevice), py::arg("dst"), py::arg("src"), py::arg("nbytes"),
        py::arg("stream") = 0, py::arg("async_") = false, py::call_guard<py::gil_scoped_release>());
  m.def(
      "memcpy_pageable_htod",
      [](u64 dst, u64 src, u64 nbytes, u64 stream) {
        copy_host_to_device(dst, reinterpret_cast<const void*>(src), nbytes, stream);
      },
      py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "Synchronous copy from pageable host memory, staged through pinned buffers when large.");
  m.def(
      "memcpy_pageable_dtoh",
      [](u64 dst, u64 src, u64 nbytes, u64 stream) {
        copy_device_to_host(reinterpret_cast<void*>(dst), src, nbytes, stream);
      },
      py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::arg("stream") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "Synchronous copy to pageable host memory, staged through pinned buffers when large.");
  m.def("staging_config", [] {
    const StagingConfig& c = staging_config();
    py::dict d;
    d["min_bytes"] = c.min_bytes;
    d["chunk_bytes"] = c.chunk_bytes;
    d["buffers"] = c.buffers;
    d["threads"] = c.threads;
    return d;
  });
  m.def("memset_d8", &memset_bytes, py::arg("dst"), py::arg("value"), py::arg("nbytes"),
        py::arg("stream") = 0);

  m.def("stream_create", &stream_create, py::arg("priority") = 0, py::arg("non_blocking") = true);
  m.def("stream_destroy", &stream_destroy, py::arg("stream"), py::call_guard<py::gil_scoped_release>());
  m.def("stream_synchronize", &stream_synchronize, py::arg("stream"),
        py::call_guard<py::gil_scoped_release>());
  m.def("stream_query", &stream_query, py::arg("stream"));
  m.def("stream_priority", &stream_priority, py::arg("stream"));
  m.def("stream_priority_range", &stream_priority_range);
  m.def("stream_wait_event", &stream_wait_event, py::arg("stream"), py::arg("event"));
  m.def("event_create", &event_create, py::arg("timing") = true, py::arg("blocking_sync") = false);
  m.def("event_destroy", &event_destroy, py::arg("event"));
  m.def("event_record", &event_record, py::arg("event"), py::arg("stream") = 0);
  m.def("event_synchronize", &event_synchronize, py::arg("event"), py::call_guard<py::gil_scoped_release>());
  m.def("event_query", &event_query, py::arg("event"));
  m.def("event_elapsed_ms", &event_elapsed_ms, py::arg("start"), py::arg("end"));

  m.def(
      "module_load", [](const py::bytes& image) { return module_load(std::string(image)); },
      py::arg("image"));
  m.def("module_function", &module_function, py::arg("module"), py::arg("name"));
  m.def("function_attributes", [](u64 f) {
    FunctionAttributes a = function_attributes(f);
    py::dict d;
    d["max_threads_per_block"] = a.max_threads_per_block;
    d["shared_size_bytes"] = a.shared_size_bytes;
    d["max_dynamic_shared_size_bytes"] = a.max_dynamic_shared_size_bytes;
    d["num_regs"] = a.num_regs;
    d["local_size_bytes"] = a.local_size_bytes;
    d["ptx_version"] = a.ptx_version;
    d["binary_version"] = a.binary_version;
    return d;
  });
  m.def("function_set_max_dynamic_shared", &function_set_max_dynamic_shared, py::arg("function"),
        py::arg("bytes"));
  m.def("function_set_programmatic", &function_set_programmatic, py::arg("function"), py::arg("on"),
        "Launch the function with programmatic stream serialization (it waits with griddepcontrol.wait)");
  m.def("function_programmatic", &function_programmatic, py::arg("function"));
  m.def("programmatic_launch_available", [] { return driver().cuLaunchKernelEx != nullptr; });
  m.def("capture_begin", &capture_begin, py::arg("stream"), py::arg("mode") = 0);
  m.def("release_hold", &release_hold, py::arg("hold"), py::arg("device") = -1);
  m.def("capture_end", &capture_end, py::arg("stream"));
  m.def("graph_instantiate", &graph_instantiate, py::arg("graph"));
  m.def("graph_launch", &graph_launch, py::arg("exec"), py::arg("stream") = 0);
  m.def("graph_exec_update", &graph_exec_update, py::arg("exec"), py::arg("graph"));
  m.def("graph_node_count", &graph_node_count, py::arg("graph"));
  m.def("graph_destroy", &graph_destroy, py::arg("graph"));
  m.def("graph_exec_destroy", &graph_exec_destroy, py::arg("exec"));
}

// The hot path of every kernel launch from Python, as a METH_FASTCALL function (no pybind11
// dispatcher): launch(function, gx, gy, gz, bx, by, bz, shared, stream, args: bytes, offsets: bytes).
// `args` holds every parameter's bytes; `offsets` the packed uint32 offset of each parameter in it.
PyObject* launch_fast(PyObject* /*self*/, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 11) {
    PyErr_SetString(PyExc_TypeError, "launch() takes 11 positional arguments");
    return nullptr;
  }
  std::uint64_t ints[9];
  for (int i = 0; i < 9; ++i) {
    ints[i] = PyLong_AsUnsignedLongLong(argv[i]);
    if (ints[i] == static_cast<std::uint64_t>(-1) && PyErr_Occurred()) return nullptr;
  }
  if (!PyBytes_Check(argv[9]) || !PyBytes_Check(argv[10])) {
    PyErr_SetString(PyExc_TypeError, "launch(): args and offsets must be bytes");
    return nullptr;
  }
  char* data = PyBytes_AS_STRING(argv[9]);
  const std::size_t size = static_cast<std::size_t>(PyBytes_GET_SIZE(argv[9]));
  const char* offset_data = PyBytes_AS_STRING(argv[10]);
  const std::size_t count = static_cast<std::size_t>(PyBytes_GET_SIZE(argv[10])) / sizeof(std::uint32_t);
  constexpr std::size_t kInline = 64;
  void* inline_params[kInline];
  std::vector<void*> heap_params;
  void** params = inline_params;
  if (count > kInline) {
    heap_params.resize(count);
    params = heap_params.data();
  }
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t offset;
    std::memcpy(&offset, offset_data + i * sizeof(offset), sizeof(offset));
    if (offset >= size) {
      PyErr_SetString(PyExc_ValueError, "launch(): argument offset out of range");
      return nullptr;
    }
    params[i] = data + offset;
  }
  const unsigned grid[3] = {static_cast<unsigned>(ints[1]), static_cast<unsigned>(ints[2]),
                            static_cast<unsigned>(ints[3])};
  const unsigned block[3] = {static_cast<unsigned>(ints[4]), static_cast<unsigned>(ints[5]),
                             static_cast<unsigned>(ints[6])};
  try {
    launch_raw(ints[0], grid, block, static_cast<unsigned>(ints[7]), ints[8], count ? params : nullptr);
  } catch (...) {
    set_python_error_from_exception();
    return nullptr;
  }
  Py_RETURN_NONE;
}

}  // namespace

void pygpukit::set_python_error_from_exception() {
  try {
    translate(std::current_exception());
  } catch (const std::exception& e) {  // not one of ours: report it plainly
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "launch failed");
}

namespace {

// mem_alloc(nbytes, stream) -> pointer and mem_free(ptr, device=-1): the allocation hot path, without
// the pybind11 dispatcher.
PyObject* mem_alloc_fast(PyObject* /*self*/, PyObject* const* argv, Py_ssize_t argc) {
  if (argc < 1 || argc > 2) {
    PyErr_SetString(PyExc_TypeError, "mem_alloc(nbytes, stream=0)");
    return nullptr;
  }
  const unsigned long long nbytes = PyLong_AsUnsignedLongLong(argv[0]);
  if (nbytes == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  unsigned long long stream = 0;
  if (argc == 2) {
    stream = PyLong_AsUnsignedLongLong(argv[1]);
    if (stream == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  }
  try {
    return PyLong_FromUnsignedLongLong(device_allocate(nbytes, stream));
  } catch (...) {
    set_python_error_from_exception();
    return nullptr;
  }
}

PyObject* mem_free_fast(PyObject* /*self*/, PyObject* const* argv, Py_ssize_t argc) {
  if (argc < 1 || argc > 2) {
    PyErr_SetString(PyExc_TypeError, "mem_free(ptr, device=-1)");
    return nullptr;
  }
  const unsigned long long ptr = PyLong_AsUnsignedLongLong(argv[0]);
  if (ptr == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  long device = -1;
  if (argc == 2) {
    device = PyLong_AsLong(argv[1]);
    if (device == -1 && PyErr_Occurred()) return nullptr;
  }
  try {
    device_free(ptr, static_cast<int>(device));
  } catch (...) {
    set_python_error_from_exception();
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef g_fast_methods[] = {
    {"mem_alloc", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&mem_alloc_fast)),
     METH_FASTCALL,
     "mem_alloc(nbytes, stream=0): allocate device memory through the pool; returns the pointer"},
    {"mem_free", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&mem_free_fast)),
     METH_FASTCALL, "mem_free(ptr, device=-1): return a block to the pool"},
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&launch_fast)), METH_FASTCALL,
     "launch(function, gx, gy, gz, bx, by, bz, shared, stream, args, offsets): launch a loaded kernel"},
    {nullptr, nullptr, 0, nullptr}};

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
  // module_local: _native_cu12 and _native_cu13 may both be imported into one process (tests do),
  // and each registers its own GemmArgs type.
  py::class_<GemmArgs>(m, "GemmArgs", py::module_local(),
                       "One cuBLASLt GEMM call shape in column-major terms (native/runtime/gemm.hpp): dtypes "
                       "as pygpukit dtype codes, the epilogue as an activation code and a bias flag.")
      .def(py::init<>())
      .def_readwrite("a_dtype", &GemmArgs::a_dtype)
      .def_readwrite("b_dtype", &GemmArgs::b_dtype)
      .def_readwrite("d_dtype", &GemmArgs::d_dtype)
      .def_readwrite("bias_dtype", &GemmArgs::bias_dtype)
      .def_readwrite("tf32", &GemmArgs::tf32)
      .def_readwrite("trans_a", &GemmArgs::trans_a)
      .def_readwrite("trans_b", &GemmArgs::trans_b)
      .def_readwrite("m", &GemmArgs::m)
      .def_readwrite("n", &GemmArgs::n)
      .def_readwrite("k", &GemmArgs::k)
      .def_readwrite("lda", &GemmArgs::lda)
      .def_readwrite("ldb", &GemmArgs::ldb)
      .def_readwrite("ldd", &GemmArgs::ldd)
      .def_readwrite("batch", &GemmArgs::batch)
      .def_readwrite("stride_a", &GemmArgs::stride_a)
      .def_readwrite("stride_b", &GemmArgs::stride_b)
      .def_readwrite("stride_d", &GemmArgs::stride_d)
      .def_readwrite("activation", &GemmArgs::activation)
      .def_readwrite("bias", &GemmArgs::bias)
      .def_readwrite("scales", &GemmArgs::scales)
      .def_readwrite("scale_mode_a", &GemmArgs::scale_mode_a)
      .def_readwrite("scale_mode_b", &GemmArgs::scale_mode_b)
      .def_readwrite("d_scale", &GemmArgs::d_scale)
      .def_readwrite("alpha", &GemmArgs::alpha)
      .def_readwrite("beta", &GemmArgs::beta)
      .def_property_readonly("prepared", [](const GemmArgs& g) { return static_cast<bool>(g.plan); });
  m.def("gemm_prepare", &gemm_prepare, py::arg("args"), py::arg("a"), py::arg("b"), py::arg("d"),
        py::arg("a_scale") = 0, py::arg("b_scale") = 0,
        "Choose the cuBLASLt algorithm for args with the alignment of these pointers, without launching; "
        "False when cuBLASLt has none.");
  m.def("gemm", &gemm, py::arg("args"), py::arg("a"), py::arg("b"), py::arg("d"), py::arg("bias"),
        py::arg("a_scale"), py::arg("b_scale"), py::arg("stream"), py::arg("d_scale") = 0,
        "cuBLASLt D = alpha * op(A) op(B) + beta * D (+ epilogue) for prepared args (see gemm.hpp).");
  m.def("gemm_plan_count", &gemm_plan_count);

  bind_runtime(m);
  if (PyModule_AddFunctions(m.ptr(), g_fast_methods) != 0) throw py::error_already_set();
  if (add_launcher_type(m.ptr()) != 0) throw py::error_already_set();

  // The C API for other extensions; the capsule name is the attribute's full dotted name.
  static const std::string capsule_name = std::string("pygpukit.core.") +
                                          PYBIND11_TOSTRING(PYGPUKIT_NATIVE_MODULE) + "." +
                                          PYGPUKIT_C_API_CAPSULE_ATTR;
  m.attr(PYGPUKIT_C_API_CAPSULE_ATTR) =
      py::capsule(static_cast<const void*>(c_api_table()), capsule_name.c_str());
  m.attr("C_API_VERSION") = PYGPUKIT_C_API_VERSION;
}
