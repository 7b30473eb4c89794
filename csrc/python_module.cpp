// The Python extension module. It only has to exist: loading it runs the
// static registrations of the ops. Written against the limited C API (no
// pybind11), so one binary serves every Python the wheel is tagged for.
#include <Python.h>

extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr,
  };
  return PyModule_Create(&module_def);
}
}
