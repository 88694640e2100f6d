"""numpy's f32 matmul rate, measured as `rumus bench --cpu-matmul` measures the CPU backend's.

    python3 scripts/bench/numpy_matmul.py [N]      # prints {"numpy_matmul_n": N, "gflops": ...}

An N x N x N f32 product `a @ b` (N = 512 by default), one warm-up, then repeated for at least
five products and half a second; the median product's rate in GFLOP/s (2 N^3 flops). Run it in
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
while len(times) < 5 or time.perf_counter() - start < 0.5:
    t = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"numpy_matmul_n": n, "gflops": 2 * n**3 / times[len(times) // 2] / 1e9}))
