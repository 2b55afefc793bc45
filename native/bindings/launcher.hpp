// The per-kernel launch object behind JITKernel.__call__ (see launcher.cpp).
#pragma once

#include <Python.h>

namespace pygpukit {

// Adds the `Launcher` type to `module`; returns 0 on success, -1 with a Python error set.
int add_launcher_type(PyObject* module);

// Sets the Python error for the C++ exception being handled (defined in module.cpp).
void set_python_error_from_exception();

}  // namespace pygpukit
