"""The CPU backend against Hugging Face transformers (torch, fp32) as the independent reference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from engine.backends.cpu import CpuBackend, silu  # noqa: E402
from engine.benchmark import cache_argument  # noqa: E402
from engine.loader import load_model  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from tests.conftest import TIE, TINY_ARCHS, TINY_VOCAB, make_tiny_model  # noqa: E402

GREEDY_TOKENS = 64


def relative_error(ours: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(ours - reference).max() / np.abs(reference).max())


def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding through transformers' own KV cache, never stopping early."""
    ids, out = torch.tensor([prompt]), []
    cache = cache_argument(model, transformers.DynamicCache())
    with torch.no_grad():
        for _ in range(n):
            result = model(ids, use_cache=True, **cache)
            out.append(int(result.logits[0, -1].argmax()))
            ids = torch.tensor([[out[-1]]])
    return out


def assert_greedy_agrees(model, prompt: list[int], tokens: list[int]) -> None:
    """Our greedy tokens are transformers', or leave them only at a near-tie of its logits (up to there the
    two ran the same tokens, so the same state)."""
    expected = reference_greedy(model, prompt, len(tokens))
    same = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), len(tokens))
    if same < len(tokens):
        with torch.no_grad():
            row = model(torch.tensor([prompt + tokens[:same]])).logits[0, -1].numpy()
        margin = float(row[expected[same]] - row[tokens[same]])
        assert margin <= TIE * float(row.std()), f"left transformers' greedy tokens at step {same} (margin {margin:.3g})"


def ours_greedy(backend: CpuBackend, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    logits = backend.prefill(prompt).copy()
    return logits, list(backend.decode(SamplingParams(), prompt, n, stop_ids=set()))


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
@pytest.mark.parametrize("dtype,shard", [("float32", None), ("bfloat16", None), ("float16", "40KB")])
def test_tiny_models_match_transformers(tmp_path, arch, dtype, shard, seed):
    reference = make_tiny_model(tmp_path, arch, seed, dtype=dtype, shard=shard)
    if shard:
        assert (tmp_path / "model.safetensors.index.json").exists()
    model = load_model(tmp_path)
    prompt = np.random.default_rng(seed).integers(0, TINY_VOCAB, 24).tolist()
    logits, tokens = ours_greedy(CpuBackend(model, 512), prompt, GREEDY_TOKENS)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1].numpy()
    assert relative_error(logits, expected) < 1e-3
    assert_greedy_agrees(reference, prompt, tokens)


@pytest.mark.slow
def test_default_gguf_matches_transformers(default_gguf):
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        default_gguf.parent, gguf_file=default_gguf.name, torch_dtype=torch.float32
    ).eval()
    model = load_model(default_gguf)
    prompt = model.tokenizer.encode_chat([{"role": "user", "content": "Write a Python function that reverses a list."}])
    logits, tokens = ours_greedy(CpuBackend(model, 1024), prompt, GREEDY_TOKENS)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1].numpy()
    assert relative_error(logits, expected) < 1e-3
    assert_greedy_agrees(reference, prompt, tokens)


def test_silu_of_very_negative_gates_is_minus_zero_without_a_warning():
    gates = -np.random.default_rng().uniform(89, 1e4, 16).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would print on the user's terminal, inside the reply
        out = silu(gates)
    assert np.all(out == 0) and out.dtype == np.float32
