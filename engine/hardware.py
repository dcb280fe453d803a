"""What the machine is and what its memory delivers: the ceiling MBU is measured against.

The read bandwidth is measured, not taken from a datasheet: a large buffer (far beyond the
caches) is read once per repetition and the best repetition counts, on the GPU by a
grid-stride kernel of 16-byte streaming loads, on the CPU by a BLAS matrix-vector product (as
the CPU backend reads its weights).
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np

_GPU_READ_KERNEL = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ data, long long n, unsigned* sink) {
    unsigned folded = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(data + i);
        folded ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (folded == 0x9e3779b9u) *sink = folded;  // keeps the loads alive; practically never true
}
"""


def read_bandwidth_gb_s(device: str, size_bytes: int | None = None, repetitions: int = 10) -> float:
    """Best-of-`repetitions` read rate of one large buffer on `device` ("cpu" or "cuda"), GB/s."""
    if device == "cuda":
        return _gpu_read(size_bytes or 2 << 30, repetitions)
    return _cpu_read(size_bytes or 1 << 30, repetitions)


def _cpu_read(size_bytes: int, repetitions: int) -> float:
    # The CPU backend streams its weights through BLAS matrix-vector products (on all cores): the ceiling is the
    # same product over one large matrix. Its values differ page by page: identical pages (all ones) may be merged
    # by the host and read faster than memory, and a plain sum is bound by its adds, not by memory.
    cols = 4096
    matrix = np.arange(size_bytes // 4 // cols * cols, dtype=np.float32).reshape(-1, cols)
    vector = np.ones(cols, dtype=np.float32)
    best = float("inf")
    for _ in range(repetitions):
        start = time.perf_counter()
        matrix @ vector
        best = min(best, time.perf_counter() - start)
    return matrix.nbytes / best / 1e9


def _gpu_read(size_bytes: int, repetitions: int) -> float:
    import cupy as cp

    n = size_bytes // 16
    data = cp.random.randint(0, 1 << 30, size=n * 4, dtype=cp.int32)
    sink = cp.zeros(1, dtype=cp.uint32)
    kernel = cp.RawKernel(_GPU_READ_KERNEL, "read_all")
    blocks = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"] * 8
    best = float("inf")
    for i in range(repetitions + 2):  # two warm-ups
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        kernel((blocks,), (512,), (data, np.int64(n), sink))
        stop.record()
        stop.synchronize()
        if i >= 2:
            best = min(best, cp.cuda.get_elapsed_time(start, stop) * 1e-3)
    return n * 16 / best / 1e9


def describe(device: str) -> dict:
    """Name, driver and clocks of `device`, for benchmark reports."""
    info = {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "cpu_cores": os.cpu_count()}
    if device != "cuda":
        return info | {"device": f"CPU ({os.cpu_count()} cores)", "driver": f"numpy {np.__version__}"}
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    driver = cp.cuda.runtime.driverGetVersion()
    return info | {
        "device": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "driver": f"CUDA driver {driver // 1000}.{driver % 1000 // 10}",
        "sm_count": props["multiProcessorCount"],
        "sm_clock_mhz": props["clockRate"] / 1000,
        "memory_clock_mhz": props["memoryClockRate"] / 1000,
        "memory_gb": props["totalGlobalMem"] / 1e9,
        "cupy": cp.__version__,
    }
