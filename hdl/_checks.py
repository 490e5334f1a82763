"""Constructor-parameter checks shared by the blocks: one-line TypeError/ValueError naming the value.

A component whose constructor rejects its parameters is never elaborated, so Amaranth warns at exit that
it was "created but never used"; a test that builds rejected components silences that with the file
switch ``# amaranth: UnusedElaboratable=no`` (as Amaranth's own tests do), the checks do not touch
Amaranth's private attributes.
"""

__all__ = ["check_int", "check_pow2"]


def check_int(owner, name, value, minimum):
    """Return `value` if it is an int (not a bool) of at least `minimum`; raise otherwise.

    `owner` is the object being built (None for none). It is not used any more (the checks used to mark
    a rejected component as used, through an Amaranth private attribute); the call sites keep passing it.
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {value}")
    return value


def check_pow2(owner, name, value):
    """Return log2(value) for an integer power of two of at least 2; raise otherwise."""
    check_int(owner, name, value, 2)
    if value & (value - 1):
        raise ValueError(f"{name} must be a power of two, not {value}")
    return value.bit_length() - 1
