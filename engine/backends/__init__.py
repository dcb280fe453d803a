"""Backend selection: `auto` takes the GPU when CuPy and a CUDA device are present."""

from __future__ import annotations

from engine.backends.base import Backend
from engine.errors import KogError
from engine.model import LoadedModel
from engine.sampling import SamplingParams

DEVICES = ("auto", "cpu", "cuda")
DRAFT_POSITIONS_MAX = 8  # positions a drafted decode pass feeds at most (cuda: kernels' NPOS)
# The front ends' --drafts where none is given and the decode can use drafts (CUDA, greedy, no repetition penalty).
# The tokens do not change; on the default model's real replies five positions a pass decode free prose 1.1x and
# text that copies its context (edits, tests, an agent's fix) 1.3-1.7x faster, the stretches that copy nothing
# running the plain build (PERF.md session 74). Where five do not fit the GPU's shared memory (every registry model
# fits them on an H100 or H200) the engine takes the most that do.
DEFAULT_DRAFTS = 5


def cuda_available() -> bool:
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


def resolve_device(device: str) -> str:
    if device not in DEVICES:
        raise KogError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise KogError("--device cuda needs an NVIDIA GPU and CuPy (pip install 'kog[cuda]'); none found")
    return device


def resolve_drafts(asked: int | None, device: str, params: SamplingParams) -> int:
    """--drafts on a resolved `device`: `asked`, or where none is given DEFAULT_DRAFTS where a decode with `params`
    checks drafts, else 1 (no drafts' build compiled at load for nothing)."""
    if asked is not None:
        return asked
    checks_drafts = device == "cuda" and params.greedy and params.repetition_penalty == 1.0
    return DEFAULT_DRAFTS if checks_drafts else 1


def check_drafts(draft_positions: int, device: str = "cuda") -> None:
    """Drafted passes (`draft_positions` > 1) on a resolved `device`: in range, and on the CUDA backend."""
    if not 1 <= draft_positions <= DRAFT_POSITIONS_MAX:
        raise KogError(f"--drafts must be 1 (off) to {DRAFT_POSITIONS_MAX}, got {draft_positions}")
    if draft_positions > 1 and device != "cuda":
        raise KogError("--drafts needs the CUDA backend: the CPU backend decodes one position a pass")


def create_backend(model: LoadedModel, device: str = "auto", max_context: int | None = None,
                   draft_positions: int = 1) -> Backend:
    """`draft_positions` > 1: greedy decoding checks up to draft_positions - 1 draft tokens copied from the
    context in each pass through the model (CUDA only; the tokens are the same)."""
    device = resolve_device(device)
    check_drafts(draft_positions, device)
    context = min(max_context or model.config.max_context, model.config.max_context)
    if device == "cuda":
        from engine.backends.cuda import CudaBackend

        return CudaBackend(model, context, draft_positions=draft_positions)
    from engine.backends.cpu import CpuBackend

    return CpuBackend(model, context)
