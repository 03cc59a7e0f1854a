#ifndef PYTHON_BINDINGS_TTile_OPS
#define PYTHON_BINDINGS_TTile_OPS
include "tessera/TTile/TTile.td"
#endif
