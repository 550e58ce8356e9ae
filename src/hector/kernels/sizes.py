"""Tile-size arithmetic shared by every kernel family (one definition, so that block sizes,
autotuning buckets and launch grids round the same way)."""


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (launch grids)."""
    return -(-int(a) // int(b))
