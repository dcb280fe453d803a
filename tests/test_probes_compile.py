"""The bench probes' CUDA sources compile for sm_90 (CI, no GPU needed): a probe that no longer
builds would only be found on the device, at the price of a device call."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
NVCC = shutil.which("nvcc")
PROBES = ["cluster_probe", "coded_probe", "mma_probe", "fetch_probe", "l2_side_probe", "store_probe", "stream_probe",
          "sync_probe", "tlb_probe"]


def probe_source(name: str) -> str:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SOURCE


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", PROBES)
def test_probe_compiles(name, tmp_path):
    src = tmp_path / f"{name}.cu"
    src.write_text(probe_source(name))
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-cubin", str(src), "-o", str(tmp_path / f"{name}.cubin")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"bench/{name}.py's kernels failed to compile:\n{(proc.stdout + proc.stderr)[-4000:]}"
