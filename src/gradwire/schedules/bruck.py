"""Bruck's allgather (Bruck, Ho, Kipnis, Upfal & Weathersby 1997): ⌈lg p⌉ steps at any p,
where recursive doubling (``butterfly.py``) folds the extra ranks in and out (⌊lg p⌋ + 2).

Rank r starts with block r of ``blocks(n, p)``. Before step s it holds the 2^s blocks
r, r+1, …, r+2^s−1 (mod p); at step s it sends the first min(2^s, p − 2^s) of them to rank
r − 2^s and receives as many from rank r + 2^s, so that what it holds doubles (the last step
fills up to p). Everyone ends with every block. Bruck's closing local rotation is not needed:
every block lands at its own place in the buffer.

Cost, n bytes gathered in all (divisible by p): ⌈lg p⌉ steps moving ((p−1)/p)nβ, as the
butterfly does at p a power of two. A run of blocks that wraps past the end of the buffer
goes as two messages (a transfer is one range), so a step that sends more than one block
costs 2α: at most (2⌈lg p⌉ − 1)α + ((p−1)/p)nβ. At p a power of two the butterfly's lg p·α
is cheaper; elsewhere this saves the butterfly's fold, which carries up to twice the data.
"""

from __future__ import annotations

from gradwire.schedules.ir import Algorithm, Schedule, Transfer, blocks, build


def allgather(p: int, count: int, **_: object) -> Schedule:
    """Bruck: ⌈lg p⌉ steps at any p, each doubling the blocks held; everyone ends with every
    block."""
    starts = [s for s, _ in blocks(count, p)] + [count]

    def run(src: int, dst: int, first: int, n: int) -> list[Transfer]:
        """Blocks first … first+n−1 (mod p), as one range or two when they wrap."""
        end = first + n
        if end <= p:
            return [Transfer(src, dst, starts[first], starts[end] - starts[first])]
        return [Transfer(src, dst, starts[first], count - starts[first]),
                Transfer(src, dst, 0, starts[end - p])]

    steps, d = [], 1
    while d < p:
        n = min(d, p - d)
        steps.append([t for r in range(p) for t in run(r, (r - d) % p, r, n)])
        d *= 2
    return build("bruck", "allgather", p, count, steps)


ALGORITHMS = (Algorithm("allgather", "bruck", allgather),)
