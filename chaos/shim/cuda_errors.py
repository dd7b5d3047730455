"""CUDA driver error codes the shim can inject, with the text applications print for them.

Values are cuda.h's (runtime and driver agree on these); messages are cudaGetErrorString's,
which is what PyTorch puts after "CUDA error: ".
"""

from __future__ import annotations

# name -> (code, cudaGetErrorString text)
ERRORS: dict[str, tuple[int, str]] = {
    "CUDA_ERROR_INVALID_VALUE": (1, "invalid argument"),
    "CUDA_ERROR_OUT_OF_MEMORY": (2, "out of memory"),
    "CUDA_ERROR_NOT_INITIALIZED": (3, "initialization error"),
    "CUDA_ERROR_DEINITIALIZED": (4, "driver shutting down"),
    "CUDA_ERROR_NO_DEVICE": (100, "no CUDA-capable device is detected"),
    "CUDA_ERROR_INVALID_DEVICE": (101, "invalid device ordinal"),
    "CUDA_ERROR_INVALID_CONTEXT": (201, "invalid device context"),
    "CUDA_ERROR_ECC_UNCORRECTABLE": (214, "uncorrectable ECC error encountered"),
    "CUDA_ERROR_NVLINK_UNCORRECTABLE": (220, "uncorrectable NVLink error detected during the execution"),
    "CUDA_ERROR_CONTAINED": (226, "device-side error contained"),
    "CUDA_ERROR_NOT_READY": (600, "device not ready"),
    "CUDA_ERROR_ILLEGAL_ADDRESS": (700, "an illegal memory access was encountered"),
    "CUDA_ERROR_HARDWARE_STACK_ERROR": (714, "hardware stack error"),
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": (715, "an illegal instruction was encountered"),
    "CUDA_ERROR_MISALIGNED_ADDRESS": (716, "misaligned address"),
    "CUDA_ERROR_LAUNCH_FAILED": (719, "unspecified launch failure"),
    "CUDA_ERROR_UNKNOWN": (999, "unknown error"),
}

CODES: dict[int, str] = {code: name for name, (code, _) in ERRORS.items()}


def error_message(code: int) -> str:
    """PyTorch's wording for a failed CUDA call, e.g. 'CUDA error: unspecified launch failure'."""
    name = CODES.get(code)
    return f"CUDA error: {ERRORS[name][1] if name else f'unrecognized error code {code}'}"
