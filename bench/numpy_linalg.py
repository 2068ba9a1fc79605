"""numpy_linalg: NumPy dense linear algebra, seed 002's DGEMM kind of work: C = A @ B, then
X = solve(A, C) (LU with partial pivoting, n right-hand sides), on n x n doubles.

usage: python3 numpy_linalg.py [n=4000] [seed=1]
prints: result name=numpy_linalg n=.. seconds=.. gflop_per_s=.. max_err=.. checksum=..

A is random plus n on its diagonal (well conditioned), so X equals B to ~1e-12; the run fails
if it does not. BLAS threads are whatever OPENBLAS_NUM_THREADS says (the bench pins it, the same
for every setup). The checksum is the sums of C and X to 9 significant digits: a sum's last bits
move with the BLAS's blocking, its ninth digit does not.
"""
import sys
import time

import numpy as np


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    rng = np.random.default_rng(seed)
    a = rng.random((n, n))
    a[np.diag_indices(n)] += n
    b = rng.random((n, n))
    t0 = time.perf_counter()
    c = a @ b
    x = np.linalg.solve(a, c)
    dt = time.perf_counter() - t0
    err = float(np.abs(x - b).max())
    if not err < 1e-8:
        print(f"numpy_linalg: solve(A, A @ B) is {err} away from B", file=sys.stderr)
        sys.exit(1)
    # 2n^3 for the product; 2/3 n^3 for the LU and 2n^3 for the n triangular solve pairs.
    flop = 2 * n**3 + (2 / 3) * n**3 + 2 * n**3
    print(
        f"result name=numpy_linalg n={n} seconds={dt:.4f} gflop_per_s={flop / dt / 1e9:.3f} "
        f"max_err={err:.1e} checksum={c.sum():.8e}:{x.sum():.8e}"
    )


main()
