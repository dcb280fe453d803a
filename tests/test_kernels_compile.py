"""Every kernel source compiles for sm_90 with nvcc (CI, no GPU needed); registers and spills are printed.

The decode kernel compiles with its default shape (Llama-3.2-1B on 132 multiprocessors), with the
shape of every model in models.toml, as the runtime NVRTC build would, on a 32-block grid, as the
traced build of bench/decode_breakdown.py, and as the drafts' build (five positions a pass) of the
shapes the GPU tests check and of Qwen3-8B (its LM head's sums in chunks). Every registry shape's drafts'
build fits a block's shared memory at `kog agent fix`'s default positions a pass, or more.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
NVCC = shutil.which("nvcc")

GRID = 132  # H200's (and H100 SXM's) multiprocessors: one block each


def registry_shapes() -> dict[str, dict[str, str]]:
    """-D macros for every model in models.toml, as engine/backends/cuda.py passes them: a registry model
    whose shape does not build would only fail on a user's GPU."""
    from engine.backends.cuda import shape_defines
    from engine.registry import Registry

    shapes = {}
    for spec in Registry().all():
        c = spec.model_config()
        shapes[spec.name] = shape_defines(c, GRID, c.tie_embeddings)
    return shapes


SHAPES = registry_shapes()
# A GPU of fewer multiprocessors (a 32-SM slice): larger shares per block, so the shared-memory plan
# must shrink what is optional (the stash) instead of failing to build.
LLAMA_32 = SHAPES["llama-3.2-1b-instruct"] | {"KOG_NBLK": "32"}

# The traced build bench/decode_breakdown.py makes (its stamps are compiled out of every other build).
TRACED = dict(KOG_TRACE=64, KOG_TRACE_LAYER=8)

# The drafts' build (engine/backends/cuda.py draft_positions): five positions a pass (Qwen3-8B: the LM head's sums
# in chunks, kernels' LM_CHUNK; Qwen2.5-Coder-7B: down's tiles in strips of uneven lengths, kernels' mma_strips).
DRAFTS = {n: SHAPES[n] | {"KOG_NPOS": "5"} for n in ("smollm2-135m-instruct", "llama-3.2-1b-instruct",
                                                      "qwen2.5-coder-1.5b-instruct", "qwen3-1.7b", "qwen3-8b",
                                                      "qwen2.5-coder-7b-instruct")}
# ... and SmolLM2's with down in two slices of the plain build's whole rows (the host passes that layout).
DRAFTS_DN_HALVES = DRAFTS["smollm2-135m-instruct"] | {"KOG_DRAFTS_DN_HALVES": "1", "KOG_DN_LAYOUT": "1"}

# ... with its knobs' other paths (kernels/decode_common.cuh): every product in FMAs where the shape's default takes
# the tensor cores, the long gathers' pairs held in registers.
DRAFTS_KNOBS = DRAFTS["llama-3.2-1b-instruct"] | {"KOG_MMA": "0", "KOG_GATHER_TO_XS": "0"}
# ... and a pass without a draft on the tensor cores too (by default it multiplies their granules in FMAs).
DRAFTS_ONE_MMA = DRAFTS["qwen2.5-coder-1.5b-instruct"] | {"KOG_MMA_ONE_FMA": "0"}

CASES = ([(p.name, {}) for p in sorted(KERNELS.glob("*.cu"))] + [("decode.cu", d) for d in SHAPES.values()]
         + [("decode.cu", LLAMA_32), ("decode.cu", TRACED)] + [("decode.cu", d) for d in DRAFTS.values()]
         + [("decode.cu", DRAFTS_KNOBS), ("decode.cu", DRAFTS_ONE_MMA), ("decode.cu", DRAFTS_DN_HALVES)])
IDS = ([p.name for p in sorted(KERNELS.glob("*.cu"))] + [f"decode.cu[{n}]" for n in SHAPES]
       + ["decode.cu[llama-3.2-1b-32-blocks]", "decode.cu[traced]"] + [f"decode.cu[{n}-drafts]" for n in DRAFTS]
       + ["decode.cu[llama-3.2-1b-drafts-knobs]", "decode.cu[qwen2.5-1.5b-drafts-one-mma]", "decode.cu[smollm2-135m-drafts-dn-halves]"])


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


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", list(SHAPES))
def test_drafts_build_fits(name, tmp_path):
    """engine/backends/cuda.py fit_positions on nvcc's front end, as the backend runs it on NVRTC's: from
    the most positions `--drafts` takes down, a build is refused only by the shared-memory assertion, and
    the front ends' default fits every registry model on a 132-block grid."""
    from engine.backends import DEFAULT_DRAFTS, DRAFT_POSITIONS_MAX
    from engine.backends.cuda import compile_error, first_error, fit_positions

    def front_end(positions: int) -> int:
        cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-c", "-fdevice-syntax-only", str(KERNELS / "decode.cu"), "-o", str(tmp_path / "k.o")]
        cmd += [f"-D{k}={v}" for k, v in (SHAPES[name] | {"KOG_NPOS": str(positions)}).items()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode:  # (any error but the shared-memory refusal ends fit_positions, and the test)
            first = first_error(proc.stdout + proc.stderr)
            raise compile_error(first, f"{positions} positions: {first}")
        return positions

    positions, _ = fit_positions(DRAFT_POSITIONS_MAX, front_end)
    print(f"{name}: {positions} positions a pass fit")
    assert positions >= DEFAULT_DRAFTS
