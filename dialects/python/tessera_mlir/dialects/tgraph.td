#ifndef PYTHON_BINDINGS_TGraph_OPS
#define PYTHON_BINDINGS_TGraph_OPS
include "tessera/TGraph/TGraph.td"
#endif
