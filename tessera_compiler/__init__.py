"""Tessera's compiler: tracing frontend support, pass driver, code generation and
bundle writer. The user-facing API is the ``tessera`` package; the runtime
(``tessera_runtime``) never imports this package."""
