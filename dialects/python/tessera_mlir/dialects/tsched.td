#ifndef PYTHON_BINDINGS_TSched_OPS
#define PYTHON_BINDINGS_TSched_OPS
include "tessera/TSched/TSched.td"
#endif
