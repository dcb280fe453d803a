"""Backend selection: `auto` takes the GPU when CuPy and a CUDA device are present."""

from __future__ import annotations

from engine.backends.base import Backend
from engine.errors import KogError
from engine.model import LoadedModel

DEVICES = ("auto", "cpu", "cuda")


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


def create_backend(model: LoadedModel, device: str = "auto", max_context: int | None = None) -> Backend:
    context = min(max_context or model.config.max_context, model.config.max_context)
    device = resolve_device(device)
    if device == "cuda":
        from engine.backends.cuda import CudaBackend

        return CudaBackend(model, context)
    from engine.backends.cpu import CpuBackend

    return CpuBackend(model, context)
