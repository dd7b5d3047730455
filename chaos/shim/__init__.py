"""CUDA fault injection: an LD_PRELOAD shim (shim.c), its plan model, control file and builder.

See chaos/shim/README.md.  Import the submodules directly; this package imports nothing so
that shipping `chaos` into a Ray runtime_env stays cheap.
"""
