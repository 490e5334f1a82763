"""Constructor-parameter checks shared by the blocks: one-line TypeError/ValueError naming the value.

A component whose constructor rejects its parameters is never elaborated; the checks mark it as used so
that Amaranth does not add an "created but never used" warning to the real error.
"""

__all__ = ["check_int", "check_pow2"]


def _reject(owner, exc):
    if owner is not None:
        setattr(owner, "_MustUse__used", True)
    raise exc


def check_int(owner, name, value, minimum):
    """Return `value` if it is an int (not a bool) of at least `minimum`; raise otherwise."""
    if not isinstance(value, int) or isinstance(value, bool):
        _reject(owner, TypeError(f"{name} must be an integer, not {value!r}"))
    if value < minimum:
        _reject(owner, ValueError(f"{name} must be at least {minimum}, not {value}"))
    return value


def check_pow2(owner, name, value):
    """Return log2(value) for an integer power of two of at least 2; raise otherwise."""
    check_int(owner, name, value, 2)
    if value & (value - 1):
        _reject(owner, ValueError(f"{name} must be a power of two, not {value}"))
    return value.bit_length() - 1
