"""NumPy on arrays of a few hundred MiB: deterministic arithmetic, a sort and a matrix product;
prints a SHA-256 of every result so that runs can be compared byte for byte.
Usage: python3 numpy_hash.py MIB   (MIB: size of each of the two large arrays)"""
import hashlib
import sys

import numpy as np

mib = int(sys.argv[1])
n = mib * 1024 * 1024 // 8
a = np.arange(n, dtype=np.float64) * 1e-3
b = np.sin(a)
np.multiply(a, b, out=a)
a += np.float64(7.0)
print("product", hashlib.sha256(a.tobytes()).hexdigest())
b.sort()
print("sorted", hashlib.sha256(b.tobytes()).hexdigest())
m = (np.arange(512 * 512, dtype=np.float64) % 97).reshape(512, 512)
print("matmul", hashlib.sha256((m @ m).tobytes()).hexdigest())
print("sum", repr(float(a.sum())))
