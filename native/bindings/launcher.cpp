// Launcher: the hot path of JITKernel.__call__, written against the CPython API so a launch from
// Python costs one call into C. It packs the arguments from the kernel's declared parameter kinds,
// reads GPUArray attributes directly, resolves the current stream and launches.
//
//   launcher = Launcher(function, device, max_threads, max_shared, kinds, elements, array_type, thread_state,
//                       streams_var)
//   launcher.launch(args, grid, block, shared_mem, stream) -> None (launched) or NotImplemented
//
// NotImplemented means "some argument is not the common case": the Python side then takes its general
// path, which validates everything and raises the typed error. So this file never has to explain a bad
// argument; it only has to never accept what the general path would reject.
//
// kinds holds one code per parameter: 'p' pointer; b B h H i I q Q f d ? e (struct formats) for scalars;
// 'o' a struct passed by value as bytes; 'x' anything else (always the general path).
#include "launcher.hpp"

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "../runtime/module.hpp"

namespace pygpukit {

namespace {

struct Strings {
  PyObject* buffer;
  PyObject* live;
  PyObject* device;
  PyObject* ptr;
  PyObject* contiguous;
  PyObject* dtype;
  PyObject* offset;
  PyObject* itemsize;
  PyObject* ctype;
  PyObject* handle;
};
Strings g_str{};

struct Impl {
  std::uint64_t function = 0;
  long device = 0;
  long max_threads = 0;
  long max_shared = 0;
  std::string kinds;
  std::vector<PyObject*> elements;   // per parameter: the pointee's C type (str) or nullptr; owned
  std::vector<PyObject*> accepted;   // per parameter: a dtype object already checked against it; owned
  PyObject* array_type = nullptr;    // owned
  PyObject* thread_state = nullptr;  // owned
  PyObject* streams_var = nullptr;   // owned: the ContextVar holding the current-stream stack
};

struct LauncherObject {
  PyObject_HEAD Impl* impl;
};

// Reads an attribute; nullptr (error cleared) when missing.
PyObject* attr(PyObject* o, PyObject* name) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (v == nullptr) PyErr_Clear();
  return v;
}

bool as_long(PyObject* o, long long* out) {
  if (o == nullptr || !PyLong_CheckExact(o)) return false;
  int overflow = 0;
  *out = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0 || (*out == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  return true;
}

bool dims(PyObject* o, unsigned out[3]) {
  out[0] = out[1] = out[2] = 1;
  long long v = 0;
  if (PyLong_CheckExact(o)) {
    if (!as_long(o, &v) || v < 1 || v > UINT_MAX) return false;
    out[0] = static_cast<unsigned>(v);
    return true;
  }
  if (!PyTuple_CheckExact(o)) return false;
  const Py_ssize_t n = PyTuple_GET_SIZE(o);
  if (n < 1 || n > 3) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!as_long(PyTuple_GET_ITEM(o, i), &v) || v < 1 || v > UINT_MAX) return false;
    out[i] = static_cast<unsigned>(v);
  }
  return true;
}

// The address for a pointer parameter, or false for the general path.
bool pointer_value(Impl& k, std::size_t index, PyObject* arg, std::uint64_t* out) {
  if (arg == Py_None) {
    *out = 0;
    return true;
  }
  if (PyLong_CheckExact(arg)) {
    *out = PyLong_AsUnsignedLongLong(arg);
    if (*out == static_cast<std::uint64_t>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    return true;
  }
  if (reinterpret_cast<PyObject*>(Py_TYPE(arg)) != k.array_type) return false;
  bool ok = false;
  PyObject* buffer = attr(arg, g_str.buffer);
  PyObject* live = buffer ? attr(buffer, g_str.live) : nullptr;
  PyObject* device = buffer ? attr(buffer, g_str.device) : nullptr;
  PyObject* ptr = buffer ? attr(buffer, g_str.ptr) : nullptr;
  PyObject* contiguous = attr(arg, g_str.contiguous);
  PyObject* dtype = attr(arg, g_str.dtype);
  PyObject* offset = attr(arg, g_str.offset);
  PyObject* itemsize = dtype ? attr(dtype, g_str.itemsize) : nullptr;
  long long device_v = 0, offset_v = 0, itemsize_v = 0;
  if (live == Py_True && contiguous == Py_True && as_long(device, &device_v) && device_v == k.device &&
      ptr != nullptr && PyLong_CheckExact(ptr) && as_long(offset, &offset_v) &&
      as_long(itemsize, &itemsize_v)) {
    PyObject* element = k.elements[index];
    ok = element == nullptr || dtype == k.accepted[index];
    if (!ok) {
      PyObject* ctype = attr(dtype, g_str.ctype);
      ok = ctype != nullptr && PyUnicode_Check(ctype) && PyUnicode_Compare(ctype, element) == 0;
      if (ok) {
        Py_XSETREF(k.accepted[index], Py_NewRef(dtype));
      }
      PyErr_Clear();
      Py_XDECREF(ctype);
    }
    if (ok) {
      const std::uint64_t base = PyLong_AsUnsignedLongLong(ptr);
      ok = !(base == static_cast<std::uint64_t>(-1) && PyErr_Occurred());
      PyErr_Clear();
      *out = base + static_cast<std::uint64_t>(offset_v * itemsize_v);
    }
  }
  Py_XDECREF(buffer);
  Py_XDECREF(live);
  Py_XDECREF(device);
  Py_XDECREF(ptr);
  Py_XDECREF(contiguous);
  Py_XDECREF(dtype);
  Py_XDECREF(offset);
  Py_XDECREF(itemsize);
  return ok;
}

template <typename T>
bool integer_value(PyObject* arg, T* out) {
  long long v = 0;
  unsigned long long u = 0;
  PyObject* index = nullptr;
  if (PyLong_Check(arg)) {
    index = Py_NewRef(arg);
  } else if (!PyFloat_Check(arg) && PyIndex_Check(arg)) {
    index = PyNumber_Index(arg);
    if (index == nullptr) {
      PyErr_Clear();
      return false;
    }
  } else {
    return false;
  }
  bool ok;
  if constexpr (std::is_signed_v<T>) {
    int overflow = 0;
    v = PyLong_AsLongLongAndOverflow(index, &overflow);
    ok = overflow == 0 && !(v == -1 && PyErr_Occurred()) && v >= std::numeric_limits<T>::min() &&
         v <= std::numeric_limits<T>::max();
    if (ok) *out = static_cast<T>(v);
  } else {
    u = PyLong_AsUnsignedLongLong(index);
    ok =
        !(u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) && u <= std::numeric_limits<T>::max();
    if (ok) *out = static_cast<T>(u);
  }
  PyErr_Clear();
  Py_DECREF(index);
  return ok;
}

// Python ints (not bool), floats and NumPy numbers; the general path accepts exactly these for float
// parameters (it rejects bool and strings).
bool float_value(PyObject* arg, double* out) {
  if (PyBool_Check(arg)) return false;
  const bool numpy_number = std::strncmp(Py_TYPE(arg)->tp_name, "numpy.", 6) == 0 &&
                            Py_TYPE(arg)->tp_as_number != nullptr &&
                            Py_TYPE(arg)->tp_as_number->nb_float != nullptr &&
                            std::strstr(Py_TYPE(arg)->tp_name, "bool") == nullptr;
  if (!PyFloat_Check(arg) && !PyLong_Check(arg) && !numpy_number) return false;
  *out = PyFloat_AsDouble(arg);
  if (*out == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

// Places `value` at the next offset aligned to its size; records that offset in *at.
// IEEE half from a double, rounded to nearest even like NumPy's conversion (little-endian bytes).
int pack_half(double value, unsigned char out[2]) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFloat_Pack2(value, reinterpret_cast<char*>(out), 1);
#else
  return _PyFloat_Pack2(value, out, 1);
#endif
}

template <typename T>
bool put(char* buffer, std::size_t* size, std::size_t* at, const T& value) {
  *size = (*size + sizeof(T) - 1) / sizeof(T) * sizeof(T);
  *at = *size;
  std::memcpy(buffer + *size, &value, sizeof(T));
  *size += sizeof(T);
  return true;
}

constexpr std::size_t kMaxParams = 64;
constexpr std::size_t kMaxBytes = 4096;

// Packs one argument at the next aligned offset; false sends the launch to the general path.
bool pack_one(Impl& k, std::size_t i, PyObject* arg, char* data, std::size_t* size, std::size_t* at) {
  if (*size + 16 > kMaxBytes) return false;
  switch (k.kinds[i]) {
    case 'p': {
      std::uint64_t p = 0;
      return pointer_value(k, i, arg, &p) && put(data, size, at, p);
    }
    case 'b': {
      std::int8_t v;
      return integer_value(arg, &v) && put(data, size, at, v);
    }
    case 'B': {
      std::uint8_t v;
      return integer_value(arg, &v) && put(data, size, at, v);
    }
    case 'h': {
      std::int16_t v;
      return integer_value(arg, &v) && put(data, size, at, v);
    }
    case 'H': {
      std::uint16_t v;
      return integer_value(arg, &v) && put(data, size, at, v);
    }
    case 'i': {
      std::int32_t v;
      return integer_value(arg, &v) && put(data, size, at, v);
    }
    case 'I': {
      std::uint32_t v;
      return integer_value(arg, &v) && put(data, size, at, v);
    }
    case 'q': {
      std::int64_t v;
      return integer_value(arg, &v) && put(data, size, at, v);
    }
    case 'Q': {
      std::uint64_t v;
      return integer_value(arg, &v) && put(data, size, at, v);
    }
    case 'f': {
      double d;
      if (!float_value(arg, &d)) return false;
      if (std::isfinite(d) && std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max())) {
        return false;  // the general path reports it as out of range
      }
      return put(data, size, at, static_cast<float>(d));
    }
    case 'd': {
      double d;
      return float_value(arg, &d) && put(data, size, at, d);
    }
    case '?': {
      const int truth = PyObject_IsTrue(arg);
      if (truth < 0) {
        PyErr_Clear();
        return false;
      }
      return put(data, size, at, static_cast<std::uint8_t>(truth));
    }
    case 'e': {
      double d;
      unsigned char half[2];
      if (!float_value(arg, &d) || pack_half(d, half) != 0) {
        PyErr_Clear();
        return false;
      }
      std::uint16_t bits = static_cast<std::uint16_t>(half[0] | (half[1] << 8));
      return put(data, size, at, bits);
    }
    case 'o': {
      if (!PyBytes_CheckExact(arg)) return false;
      const std::size_t n = static_cast<std::size_t>(PyBytes_GET_SIZE(arg));
      *size = (*size + 7) / 8 * 8;
      *at = *size;
      if (*size + n > kMaxBytes) return false;
      std::memcpy(data + *size, PyBytes_AS_STRING(arg), n);
      *size += n;
      return true;
    }
    default:
      return false;
  }
}

bool stream_handle(Impl& k, PyObject* stream, std::uint64_t* out) {
  PyObject* owner = nullptr;
  if (stream == Py_None) {
    PyObject* streams = nullptr;  // the current-stream stack: a tuple, innermost last
    if (PyContextVar_Get(k.streams_var, nullptr, &streams) != 0 || streams == nullptr ||
        !PyTuple_CheckExact(streams)) {
      PyErr_Clear();
      Py_XDECREF(streams);
      return false;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(streams);
    if (n == 0) {
      Py_DECREF(streams);
      *out = 0;
      return true;
    }
    owner = Py_NewRef(PyTuple_GET_ITEM(streams, n - 1));
    Py_DECREF(streams);
  } else {
    owner = Py_NewRef(stream);
  }
  PyObject* handle = attr(owner, g_str.handle);
  Py_DECREF(owner);
  bool ok = handle != nullptr && PyLong_CheckExact(handle);
  if (ok) {
    *out = PyLong_AsUnsignedLongLong(handle);
    ok = !(*out == static_cast<std::uint64_t>(-1) && PyErr_Occurred());
    PyErr_Clear();
  }
  Py_XDECREF(handle);
  return ok;
}

PyObject* launcher_launch(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 5) {
    PyErr_SetString(PyExc_TypeError, "Launcher.launch(args, grid, block, shared_mem, stream)");
    return nullptr;
  }
  Impl& k = *reinterpret_cast<LauncherObject*>(self)->impl;
  PyObject* args = argv[0];
  if (!PyTuple_CheckExact(args) || static_cast<std::size_t>(PyTuple_GET_SIZE(args)) != k.kinds.size()) {
    Py_RETURN_NOTIMPLEMENTED;
  }
  unsigned grid[3], block[3];
  long long shared = 0, device = 0;
  if (!dims(argv[1], grid) || !dims(argv[2], block) || !as_long(argv[3], &shared) || shared < 0 ||
      shared > k.max_shared) {
    Py_RETURN_NOTIMPLEMENTED;
  }
  if (static_cast<long long>(block[0]) * block[1] * block[2] > k.max_threads) Py_RETURN_NOTIMPLEMENTED;
  PyObject* device_obj = attr(k.thread_state, g_str.device);
  const bool same_device = as_long(device_obj, &device) && device == k.device;
  Py_XDECREF(device_obj);
  if (!same_device) Py_RETURN_NOTIMPLEMENTED;
  alignas(16) char data[kMaxBytes];
  std::size_t offsets[kMaxParams];
  void* params[kMaxParams];
  std::size_t size = 0;
  const std::size_t count = k.kinds.size();
  if (count > kMaxParams) Py_RETURN_NOTIMPLEMENTED;
  for (std::size_t i = 0; i < count; ++i) {
    if (!pack_one(k, i, PyTuple_GET_ITEM(args, i), data, &size, &offsets[i])) Py_RETURN_NOTIMPLEMENTED;
  }
  // The stream last: reading a paced stream's handle takes a token (pygpukit.scheduler), which a launch
  // sent to the general path after it would take a second time.
  std::uint64_t stream = 0;
  if (!stream_handle(k, argv[4], &stream)) Py_RETURN_NOTIMPLEMENTED;
  for (std::size_t i = 0; i < count; ++i) params[i] = data + offsets[i];
  try {
    launch_raw(k.function, grid, block, static_cast<unsigned>(shared), stream, count ? params : nullptr);
  } catch (...) {
    set_python_error_from_exception();
    return nullptr;
  }
  Py_RETURN_NONE;
}

// Drops what an Impl holds (its references) and the Impl.
void release(Impl* impl) {
  if (impl == nullptr) return;
  for (PyObject* o : impl->elements) Py_XDECREF(o);
  for (PyObject* o : impl->accepted) Py_XDECREF(o);
  Py_XDECREF(impl->array_type);
  Py_XDECREF(impl->thread_state);
  Py_XDECREF(impl->streams_var);
  delete impl;
}

int launcher_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"function", "device",     "max_threads",  "max_shared",  "kinds",
                                "elements", "array_type", "thread_state", "streams_var", nullptr};
  unsigned long long function = 0;
  long device = 0, max_threads = 0, max_shared = 0;
  const char* kinds = nullptr;
  PyObject* elements = nullptr;
  PyObject* array_type = nullptr;
  PyObject* thread_state = nullptr;
  PyObject* streams_var = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KlllsO!OOO!", const_cast<char**>(names), &function, &device,
                                   &max_threads, &max_shared, &kinds, &PyTuple_Type, &elements, &array_type,
                                   &thread_state, &PyContextVar_Type, &streams_var)) {
    return -1;
  }
  const std::size_t n = std::strlen(kinds);
  if (static_cast<std::size_t>(PyTuple_GET_SIZE(elements)) != n) {
    PyErr_SetString(PyExc_ValueError, "Launcher: elements must have one entry per parameter");
    return -1;
  }
  auto* impl = new Impl();
  impl->function = function;
  impl->device = device;
  impl->max_threads = max_threads;
  impl->max_shared = max_shared;
  impl->kinds = kinds;
  for (std::size_t i = 0; i < n; ++i) {
    PyObject* e = PyTuple_GET_ITEM(elements, static_cast<Py_ssize_t>(i));
    impl->elements.push_back(e == Py_None ? nullptr : Py_NewRef(e));
    impl->accepted.push_back(nullptr);
  }
  impl->array_type = Py_NewRef(array_type);
  impl->thread_state = Py_NewRef(thread_state);
  impl->streams_var = Py_NewRef(streams_var);
  auto* obj = reinterpret_cast<LauncherObject*>(self);
  release(obj->impl);  // __init__ called again: the previous settings' references go too
  obj->impl = impl;
  return 0;
}

PyObject* launcher_new(PyTypeObject* type, PyObject* /*args*/, PyObject* /*kwargs*/) {
  PyObject* self = type->tp_alloc(type, 0);
  if (self != nullptr) reinterpret_cast<LauncherObject*>(self)->impl = nullptr;
  return self;
}

void launcher_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  release(reinterpret_cast<LauncherObject*>(self)->impl);
  type->tp_free(self);
  Py_DECREF(type);  // heap types are referenced by their instances
}

PyObject* launcher_kinds(PyObject* self, void* /*closure*/) {
  Impl* impl = reinterpret_cast<LauncherObject*>(self)->impl;
  return PyUnicode_FromString(impl ? impl->kinds.c_str() : "");
}

PyMethodDef g_methods[] = {
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&launcher_launch)),
     METH_FASTCALL,
     "launch(args, grid, block, shared_mem, stream): None after a launch, NotImplemented for the general "
     "path"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef g_getset[] = {{"kinds", &launcher_kinds, nullptr, "one code per kernel parameter", nullptr},
                          {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot g_slots[] = {
    {Py_tp_doc,
     const_cast<char*>("Packs a kernel's arguments and launches it (the fast path of JITKernel.__call__).")},
    {Py_tp_new, reinterpret_cast<void*>(&launcher_new)},
    {Py_tp_init, reinterpret_cast<void*>(&launcher_init)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&launcher_dealloc)},
    {Py_tp_methods, g_methods},
    {Py_tp_getset, g_getset},
    {0, nullptr}};

PyType_Spec g_spec = {"pygpukit.core.Launcher", static_cast<int>(sizeof(LauncherObject)), 0,
                      Py_TPFLAGS_DEFAULT, g_slots};

}  // namespace

int add_launcher_type(PyObject* module) {
  struct Name {
    PyObject** slot;
    const char* text;
  };
  const Name names[] = {{&g_str.buffer, "_buffer"},
                        {&g_str.live, "_live"},
                        {&g_str.device, "device"},
                        {&g_str.ptr, "ptr"},
                        {&g_str.contiguous, "_contiguous"},
                        {&g_str.dtype, "_dtype"},
                        {&g_str.offset, "_offset"},
                        {&g_str.itemsize, "itemsize"},
                        {&g_str.ctype, "ctype"},
                        {&g_str.handle, "_handle"}};
  for (const Name& n : names) {
    if (*n.slot == nullptr) *n.slot = PyUnicode_InternFromString(n.text);
    if (*n.slot == nullptr) return -1;
  }
  PyObject* type = PyType_FromSpec(&g_spec);
  if (type == nullptr) return -1;
  if (PyModule_AddObject(module, "Launcher", type) != 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}

}  // namespace pygpukit
