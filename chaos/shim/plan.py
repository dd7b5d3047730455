"""What the CUDA shim should inject: a validated plan and its rendering for the C side.

The C parser is deliberately tiny (`key=value` per line), so every check that can give a
helpful message happens here; the rendered text is always something the shim accepts.
"""

from __future__ import annotations

import fnmatch
import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from chaos.errors import ProfileError
from chaos.shim.cuda_errors import CODES, ERRORS

# The entry points shim.c wraps, concrete name -> the name cuGetProcAddress is asked for.
# A symbols glob matches either; tests keep this in step with shim.c's WRAPPED table.
WRAPPED: dict[str, str] = {
    **{n: "cuLaunchKernel" for n in ("cuLaunchKernel", "cuLaunchKernel_ptsz")},
    **{n: "cuLaunchKernelEx" for n in ("cuLaunchKernelEx", "cuLaunchKernelEx_ptsz")},
    **{n: "cuLaunchCooperativeKernel" for n in ("cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz")},
    "cuMemAlloc_v2": "cuMemAlloc",
    **{n: "cuMemAllocAsync" for n in ("cuMemAllocAsync", "cuMemAllocAsync_ptsz")},
    **{n: "cuMemcpyHtoD" for n in ("cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds")},
    **{n: "cuMemcpyDtoH" for n in ("cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds")},
    **{n: "cuMemcpyAsync" for n in ("cuMemcpyAsync", "cuMemcpyAsync_ptsz")},
    **{n: "cuMemcpyHtoDAsync" for n in ("cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz")},
    **{n: "cuMemcpyDtoHAsync" for n in ("cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz")},
    **{n: "cuCtxSynchronize" for n in ("cuCtxSynchronize", "cuCtxSynchronize_v2")},
    **{n: "cuStreamSynchronize" for n in ("cuStreamSynchronize", "cuStreamSynchronize_ptsz")},
    **{n: "cuStreamQuery" for n in ("cuStreamQuery", "cuStreamQuery_ptsz")},
    "cuEventQuery": "cuEventQuery",
    "cuEventSynchronize": "cuEventSynchronize",
    **{n: "cuGraphLaunch" for n in ("cuGraphLaunch", "cuGraphLaunch_ptsz")},
}

Mode = Literal["error", "deferred", "sticky", "hang", "delay"]

PRESETS: dict[str, dict[str, Any]] = {
    # Xid 48: the kernel runs, the next sync reports it, and the context is dead.
    "ecc": {"symbols": ("cuLaunchKernel*",), "mode": "deferred", "sticky": True,
            "error": "CUDA_ERROR_ECC_UNCORRECTABLE"},
    # Xid 31: a bad pointer poisons the context; every later call fails.
    "illegal-address": {"symbols": ("cuLaunchKernel*",), "mode": "sticky",
                        "error": "CUDA_ERROR_ILLEGAL_ADDRESS"},
    # Xid 13: the launch itself fails.
    "launch-failed": {"symbols": ("cuLaunchKernel*",), "mode": "error",
                      "error": "CUDA_ERROR_LAUNCH_FAILED"},
    # Xid 79, "GPU has fallen off the bus": every call from now on fails.
    "gpu-lost": {"symbols": ("*",), "mode": "sticky", "error": "CUDA_ERROR_UNKNOWN"},
}

_GLOB = re.compile(r"^[A-Za-z0-9_*?\[\]]+$")
_KERNEL_GLOB = re.compile(r"^[^\s;=]+$")
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Plan(BaseModel):
    """One fault: where (symbols, selectors), when (trigger) and what (mode, error)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plan_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12], pattern=r"^[A-Za-z0-9_.:-]{1,63}$")
    symbols: tuple[str, ...] = Field(("cuLaunchKernel*",), min_length=1)
    mode: Mode = "error"
    sticky: bool = False
    error: int = 719
    after: NonNegativeInt = 0
    every: PositiveInt = 1
    probability: float = Field(1.0, gt=0.0, le=1.0)
    seed: NonNegativeInt = 0
    times: PositiveInt | None = 1  # None = unlimited
    rank: NonNegativeInt | None = None
    local_rank: NonNegativeInt | None = None
    device: NonNegativeInt | None = None
    boot_id: str | None = None  # fire only on the host whose current boot is this one
    kernel: str | None = None
    delay_us: NonNegativeInt = 0

    @field_validator("symbols", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return tuple(s.strip() for s in v.split(",")) if isinstance(v, str) else v

    @field_validator("symbols")
    @classmethod
    def _known_symbols(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for glob in v:
            if not _GLOB.match(glob):
                raise ValueError(f"symbol glob {glob!r} may only hold letters, digits, _ * ? [ ]")
            if not any(fnmatch.fnmatchcase(n, glob) or fnmatch.fnmatchcase(b, glob) for n, b in WRAPPED.items()):
                raise ValueError(f"symbol glob {glob!r} matches no wrapped entry point "
                                 f"(wrapped: {', '.join(sorted(set(WRAPPED.values())))})")
        return v

    @field_validator("error", mode="before")
    @classmethod
    def _error_code(cls, v: Any) -> Any:
        if isinstance(v, str) and not v.strip().isdigit():
            name = v.strip().upper()
            if name not in ERRORS:
                raise ValueError(f"unknown CUDA error name {v!r} (known: {', '.join(ERRORS)})")
            return ERRORS[name][0]
        return v

    @field_validator("error")
    @classmethod
    def _error_range(cls, v: int) -> int:
        if not 0 < v < 100000:
            raise ValueError(f"error code {v} is not a CUDA error (must be 1..99999; 0 is success)")
        return v

    @field_validator("kernel")
    @classmethod
    def _kernel_glob(cls, v: str | None) -> str | None:
        if v is not None and not (_KERNEL_GLOB.match(v) and len(v) < 128):
            raise ValueError(f"kernel glob {v!r} must be 1-127 characters without spaces, ';' or '='")
        return v

    @field_validator("boot_id")
    @classmethod
    def _boot_id_form(cls, v: str | None) -> str | None:
        if v is not None and not _BOOT_ID.fullmatch(v):
            raise ValueError(f"boot id {v!r} is not a Linux boot id: a lowercase UUID such as "
                             "1b4e28ba-2fa1-11d2-883f-0016d3cca427, as /proc/sys/kernel/random/boot_id "
                             "holds it (without the newline)")
        return v

    @model_validator(mode="after")
    def _mode_needs(self) -> Plan:
        if self.mode == "delay" and self.delay_us == 0:
            raise ValueError("mode 'delay' needs delay_us > 0")
        if self.delay_us and self.mode != "delay":
            raise ValueError(f"delay_us={self.delay_us} only applies to mode 'delay', not {self.mode!r}")
        return self

    @property
    def error_name(self) -> str:
        return CODES.get(self.error, "CUDA_ERROR_UNRECOGNIZED")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Plan:
        """A named fault (ecc, illegal-address, launch-failed, gpu-lost), fields overridable."""
        if name not in PRESETS:
            raise ProfileError(f"unknown CUDA fault preset {name!r} (known: {', '.join(PRESETS)})")
        return cls(**{**PRESETS[name], **overrides})

    def render(self) -> str:
        """The `key=value` text shim.c parses (see chaos/shim/README.md)."""
        fields = {
            "plan_id": self.plan_id, "symbols": ",".join(self.symbols), "mode": self.mode,
            "sticky": int(self.sticky), "error": self.error, "after": self.after, "every": self.every,
            "probability": repr(self.probability), "seed": self.seed, "times": self.times or 0,
            "rank": self.rank, "local_rank": self.local_rank, "device": self.device,
            "boot_id": self.boot_id, "kernel": self.kernel, "delay_us": self.delay_us,
        }
        return "".join(f"{k}={v}\n" for k, v in fields.items() if v is not None)
