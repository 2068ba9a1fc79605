"""numpy_kmeans: Lloyd's K-means written the way NumPy code is: whole-array expressions, the
distances through one matrix product per iteration, the new centers through another.

usage: python3 numpy_kmeans.py [points=1000000] [dims=16] [k=16] [iterations=8] [seed=1]
prints: result name=numpy_kmeans points=.. seconds=.. points_per_s=.. checksum=..

Points are float64 around k true centers; the first k points start as centers. Per iteration:
G = X @ C.T (n x k), labels = argmin(|c|^2 - 2 G), a one-hot n x k matrix M and the centers
M.T @ X / counts: three n x k temporaries beside X, so the footprint is about twice X.
points_per_s counts points x iterations. The checksum is CRC-32s of the labels and of the
centers' bytes: with one BLAS thread (the bench pins OPENBLAS_NUM_THREADS=1) every run computes
the same bits.
"""
import sys
import time
import zlib

import numpy as np


def main():
    arg = lambda i, d: int(sys.argv[i]) if len(sys.argv) > i else d
    n, d, k, iters, seed = arg(1, 1000000), arg(2, 16), arg(3, 16), arg(4, 8), arg(5, 1)
    rng = np.random.default_rng(seed)
    truth = rng.uniform(-10.0, 10.0, (k, d))
    x = truth[rng.integers(0, k, n)]
    x += rng.standard_normal((n, d))
    centers = x[:k].copy()
    rows = np.arange(n)
    t0 = time.perf_counter()
    for _ in range(iters):
        g = x @ centers.T
        g *= -2.0
        g += (centers * centers).sum(axis=1)
        labels = g.argmin(axis=1)
        del g
        onehot = np.zeros((n, k))
        onehot[rows, labels] = 1.0
        counts = onehot.sum(axis=0)
        sums = onehot.T @ x
        del onehot
        centers = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1.0)[:, None], centers)
    dt = time.perf_counter() - t0
    check = zlib.crc32(labels.astype(np.int32).tobytes())
    print(
        f"result name=numpy_kmeans points={n} seconds={dt:.4f} points_per_s={n * iters / dt:.1f} "
        f"checksum={check:08x}:{zlib.crc32(centers.tobytes()):08x}"
    )


main()
