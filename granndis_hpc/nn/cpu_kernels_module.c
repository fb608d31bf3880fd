/* What makes the C kernels (cpu_kernels.c) an extension module of the package, granndis_hpc.nn._cpu_kernels:
 * importing it finds the library inside the installed package (never elsewhere on disk), and
 * nn/cpu_kernels.py then calls its functions through ctypes on the same loaded file.  `dispatch` names
 * the instruction set the loader chose for this CPU. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

const char *cpu_kernels_dispatch(void);

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cpu_kernels",
                                    "The C kernels of the CPU path (called through ctypes by cpu_kernels.py).",
                                    -1, NULL};

PyMODINIT_FUNC PyInit__cpu_kernels(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "dispatch", cpu_kernels_dispatch()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
