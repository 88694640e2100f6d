"""numpy's f32 matmul rate, measured as `rumus bench --cpu-matmul` measures the CPU backend's.

    python3 scripts/bench/numpy_matmul.py [N]      # prints {"numpy_matmul_n": N, "gflops": ...}

An N x N x N f32 product `a @ b` (N = 512 by default), one warm-up, then repeated for at least
five products and half a second, but no more once 10 s have passed with one product timed; the
median product's rate in GFLOP/s (2 N^3 flops). Run it in
the same shell session as `rumus bench --cpu-matmul` to compare the two on one machine load.
"""
import json
import sys
import time

import numpy as np

n = int(sys.argv[1]) if len(sys.argv) > 1 else 512
a = (np.arange(n * n) * 7 % 13 - 6.0).astype(np.float32).reshape(n, n) / 8
b = (np.arange(n * n) * 5 % 11 - 5.0).astype(np.float32).reshape(n, n) / 8
a @ b
times, start = [], time.perf_counter()
while True:
    elapsed = time.perf_counter() - start
    enough = len(times) >= 5 or (len(times) >= 1 and elapsed >= 10.0)
    if enough and elapsed >= 0.5:
        break
    t = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"numpy_matmul_n": n, "gflops": 2 * n**3 / times[len(times) // 2] / 1e9}))
