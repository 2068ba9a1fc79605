"""pydict: a Python program built on one large dict of small objects: build it, then probe it
at random (half the probes hit, and a hit updates the object it finds).

usage: python3 pydict.py [entries=3000000] [probes=3000000] [seed=1]
prints: result name=pydict entries=.. probes=.. seconds=.. ops_per_s=.. hits=.. checksum=..

Entry i's key is a 48-bit scramble of i and its value a small object with slots (its own number,
a tag and a hit count): the objects are laid out in the order built, and a probe lands on a random
one, so the probes touch the dict's table and the objects at random. ops_per_s counts entries
inserted plus probes made, over both phases. Integers only: every run computes the same checksum.
"""
import sys
import time

MASK = (1 << 64) - 1


class Rec:
    __slots__ = ("n", "tag", "hits")

    def __init__(self, n, tag):
        self.n = n
        self.tag = tag
        self.hits = 0


def key(i, seed):
    return (((i + seed) * 0x9E3779B97F4A7C15) & MASK) >> 16


def main():
    entries = int(sys.argv[1]) if len(sys.argv) > 1 else 3000000
    probes = int(sys.argv[2]) if len(sys.argv) > 2 else 3000000
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    t0 = time.perf_counter()
    d = {}
    for i in range(entries):
        k = key(i, seed)
        d[k] = Rec(i, k & 0xFFFF)
    built = time.perf_counter()
    hits = 0
    check = 0
    s = seed
    span = 2 * entries
    for _ in range(probes):
        s = (s * 6364136223846793005 + 1442695040888963407) & MASK
        r = d.get(key((s >> 20) % span, seed))
        if r is not None:
            r.hits += 1
            hits += 1
            check = (check * 31 + r.n * 65537 + r.tag + r.hits) & MASK
    dt = time.perf_counter() - t0
    print(
        f"result name=pydict entries={entries} probes={probes} seconds={dt:.4f} "
        f"ops_per_s={(entries + probes) / dt:.1f} build_s={built - t0:.4f} hits={hits} "
        f"size={len(d)} checksum={check:016x}"
    )


main()
