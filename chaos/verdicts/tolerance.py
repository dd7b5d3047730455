"""The one tolerance every step and state comparison goes through (``math.isclose``).

Steps compare within ``STEP_RTOL`` (float steps — epoch fractions — that arithmetic leaves a
hair apart, 1.1 against 1.0999999999999999, are one step); state values within the suite's
``rtol`` (``--chaos-state-rtol``, ``Expect.state_rtol``) plus ``STATE_ATOL``; digests and
other non-numbers exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

STEP_RTOL = 1e-9
STATE_RTOL = 1e-4
STATE_ATOL = 1e-6


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def close(a: Any, b: Any, rtol: float, atol: float = 0.0) -> bool:
    """Numbers within ``rtol``/``atol`` of each other (NaN is close to nothing); anything
    else only when equal; None never."""
    if a is None or b is None:
        return False
    if _number(a) and _number(b):
        return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
    return bool(a == b)


def same_step(a: Any, b: Any) -> bool:
    return close(a, b, STEP_RTOL)


def same_state(a: Any, b: Any, rtol: float = STATE_RTOL) -> bool:
    return close(a, b, rtol, STATE_ATOL)


def step_in(step: Any, steps: Iterable[Any]) -> bool:
    return any(same_step(step, s) for s in steps)


def step_key(step: Any) -> Any:
    """A step as a dict key that steps ``same_step`` calls equal share: a whole float is its
    int, any other float its value to 9 significant digits (the step tolerance)."""
    if isinstance(step, float) and math.isfinite(step):
        return int(step) if step.is_integer() else float(f"{step:.9g}")
    return step


def finite(value: Any) -> bool:
    """A number that can be compared (not NaN or infinite)."""
    return _number(value) and math.isfinite(value)


def valid_rtol(rtol: Any) -> bool:
    """A state tolerance that can fail something: a finite number >= 0 (an infinite one passes
    every comparison; NaN and negative ones are no tolerance)."""
    return finite(rtol) and rtol >= 0
