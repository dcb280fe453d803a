"""Every kernel source compiles for sm_90 with nvcc (CI, no GPU needed); registers and spills are printed.

The decode kernel compiles with its default shape (Llama-3.2-1B on 132 multiprocessors) and
with the other target shapes, as the runtime NVRTC build would, and as the traced build of
bench/decode_breakdown.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
NVCC = shutil.which("nvcc")

SHAPES = {  # -D macros as engine/backends/cuda.py would pass them
    "smollm2-135m": dict(KOG_H=576, KOG_NH=9, KOG_NKV=3, KOG_D=64, KOG_INTER=1536, KOG_VOCAB=49152, KOG_NL=30,
                         KOG_QKV_BIAS=0, KOG_QK_NORM=0, KOG_EPS="9.999999747378752e-06f", KOG_SCALE="0.125f",
                         KOG_NBLK=132, KOG_TIED=1),
    "qwen2.5-1.5b": dict(KOG_H=1536, KOG_NH=12, KOG_NKV=2, KOG_D=128, KOG_INTER=8960, KOG_VOCAB=151936, KOG_NL=28,
                         KOG_QKV_BIAS=1, KOG_QK_NORM=0, KOG_EPS="9.999999974752427e-07f",
                         KOG_SCALE="0.08838834613561630f", KOG_NBLK=132, KOG_TIED=1),
    "qwen3-1.7b": dict(KOG_H=2048, KOG_NH=16, KOG_NKV=8, KOG_D=128, KOG_INTER=6144, KOG_VOCAB=151936, KOG_NL=28,
                       KOG_QKV_BIAS=0, KOG_QK_NORM=1, KOG_EPS="9.999999974752427e-07f",
                       KOG_SCALE="0.08838834613561630f", KOG_NBLK=132, KOG_TIED=1),
}
# A GPU of fewer multiprocessors (a 32-SM slice): larger shares per block, so the shared-memory plan
# must shrink what is optional (the stash) instead of failing to build.
LLAMA_32 = dict(KOG_H=2048, KOG_NH=32, KOG_NKV=8, KOG_D=64, KOG_INTER=8192, KOG_VOCAB=128256, KOG_NL=16, KOG_QKV_BIAS=0,
                KOG_QK_NORM=0, KOG_EPS="9.999999747378752e-06f", KOG_SCALE="0.125f", KOG_NBLK=32, KOG_TIED=1)

# The traced build bench/decode_breakdown.py makes (its stamps are compiled out of every other build).
TRACED = dict(KOG_TRACE=64, KOG_TRACE_LAYER=8)

CASES = ([(p.name, {}) for p in sorted(KERNELS.glob("*.cu"))] + [("decode.cu", d) for d in SHAPES.values()]
         + [("decode.cu", LLAMA_32), ("decode.cu", TRACED)])
IDS = ([p.name for p in sorted(KERNELS.glob("*.cu"))] + [f"decode.cu[{n}]" for n in SHAPES]
       + ["decode.cu[llama-3.2-1b-32-blocks]", "decode.cu[traced]"])


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("source,defines", CASES, ids=IDS)
def test_kernel_compiles(source, defines, tmp_path):
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-c", "-Xptxas", "-v", str(KERNELS / source), "-o", str(tmp_path / "k.o")]
    cmd += [f"-D{k}={v}" for k, v in defines.items()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{source} failed to compile:\n{out[-4000:]}"
    for fn, regs in re.findall(r"Function properties for (\w+).*?Used (\d+) registers", out, re.S):
        print(f"{source}: {fn}: {regs} registers")
    for line in out.splitlines():
        if "spill" in line or "Used" in line:
            print(line.strip())
