"""A minimal CUDA driver client for training workloads on machines without PyTorch-on-GPU.

It reaches the driver the way libcudart does -- dlopen("libcuda.so.1"), a few symbols via
dlsym, the rest via cuGetProcAddress_v2 -- so the fault shim sees the same hook paths as
in a real job, and it fails the way PyTorch does: a RuntimeError reading
"CUDA error: <cudaGetErrorString text>" with an `.error_code`.  It works against the
stub driver (chaos/shim/cuda_stub) and against a real one (it loads a tiny PTX kernel).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p

from chaos.shim.cuda_errors import CODES, error_message

CUDA_VERSION = 12000  # what a CUDA 12 libcudart asks cuGetProcAddress for

_PTX = b"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry chaos_step()
{
    ret;
}
"""

_PROTOTYPES = {  # entry point -> argument types, all resolved through cuGetProcAddress_v2
    "cuDeviceGet": (POINTER(c_int), c_int),
    "cuDevicePrimaryCtxRetain": (POINTER(c_void_p), c_int),
    "cuCtxSetCurrent": (c_void_p,),
    "cuModuleLoadData": (POINTER(c_void_p), c_char_p),
    "cuModuleGetFunction": (POINTER(c_void_p), c_void_p, c_char_p),
    "cuMemAlloc": (POINTER(c_ulonglong), c_size_t),
    "cuMemcpyHtoD": (c_ulonglong, c_void_p, c_size_t),
    "cuLaunchKernel": (c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p,
                       c_void_p, c_void_p),
}


class CudaDriverError(RuntimeError):
    """A failed driver call, worded like PyTorch's torch.AcceleratorError."""

    def __init__(self, code: int, symbol: str):
        super().__init__(error_message(code))
        self.error_code = code
        self.error_name = CODES.get(code, "CUDA_ERROR_UNRECOGNIZED")
        self.symbol = symbol

    def __reduce__(self):
        # Ray pickles a worker's exception to its caller; the default rebuilds it from
        # ``args`` (the message alone), which this __init__ cannot take.
        return type(self), (self.error_code, self.symbol)


class DriverClient:
    """One device, one buffer, one empty kernel: a training step's driver traffic in miniature."""

    def __init__(self, device: int = 0, nbytes: int = 4096, library: str = "libcuda.so.1"):
        self._lib = ctypes.CDLL(library)  # dlopen; attribute access below is dlsym
        self._gpa = self._lib.cuGetProcAddress_v2
        self._gpa.argtypes = (c_char_p, POINTER(c_void_p), c_int, c_uint64, POINTER(c_int))
        self._ctx_sync = self._lib.cuCtxSynchronize  # the direct dlsym path
        self._ctx_sync.argtypes = ()
        self._call(self._lib.cuInit, "cuInit", 0)
        self._fn = {name: self._resolve(name, args) for name, args in _PROTOTYPES.items()}

        dev, self._ctx, module, self._kernel = c_int(), c_void_p(), c_void_p(), c_void_p()
        self._drv("cuDeviceGet", byref(dev), device)
        self._drv("cuDevicePrimaryCtxRetain", byref(self._ctx), dev)
        self._drv("cuCtxSetCurrent", self._ctx)
        self._drv("cuModuleLoadData", byref(module), _PTX)
        self._drv("cuModuleGetFunction", byref(self._kernel), module, b"chaos_step")
        self._dptr = c_ulonglong()
        self._drv("cuMemAlloc", byref(self._dptr), nbytes)
        self._host = ctypes.create_string_buffer(nbytes)

    def _resolve(self, name: str, argtypes: tuple) -> ctypes._CFuncPtr:
        pfn, status = c_void_p(), c_int()
        self._call(self._gpa, "cuGetProcAddress_v2", name.encode(), byref(pfn), CUDA_VERSION, 0, byref(status))
        return ctypes.CFUNCTYPE(c_int, *argtypes)(pfn.value)

    @staticmethod
    def _call(fn, symbol: str, *args) -> None:
        code = fn(*args)
        if code != 0:
            raise CudaDriverError(code, symbol)

    def _drv(self, name: str, *args) -> None:
        self._call(self._fn[name], name, *args)

    def step(self) -> None:
        """Copy inputs to the device, launch the kernel, wait: what one training step does."""
        self._drv("cuMemcpyHtoD", self._dptr, self._host, len(self._host))
        self._drv("cuLaunchKernel", self._kernel, 1, 1, 1, 1, 1, 1, 0, None, None, None)
        self.synchronize()

    def synchronize(self) -> None:
        """Wait for the device; deferred faults surface here, as they do in PyTorch."""
        self._call(self._ctx_sync, "cuCtxSynchronize")
