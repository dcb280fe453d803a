"""Random-init models at the real shapes of the models kog targets, built with transformers
(no download), weights rounded to bf16 so every backend and reference sees the same numbers.

Random init at transformers' default std (0.02) gives nearly flat logits, where any rounding
difference flips the argmax and greedy decoding degenerates into repeating one token. The
init here is scaled so that every layer moves the residual stream and the logits have real
margins: linear weights ~ N(0, (gain / sqrt(fan_in))^2), embeddings N(0, 0.05^2) (larger
makes the tied LM head favour the current token and greedy repeats it), norm weights
1 + N(0, 0.1^2).
"""

from __future__ import annotations

import math

import numpy as np

# the shapes kog's GPU targets are measured at, by their registry entries (models.toml `shape`); any other
# registry name builds that model's shape (the GPU tests: KOG_TEST_MODELS=qwen3-0.6b,...)
REGISTRY_NAMES = {
    "smollm2-135m": "smollm2-135m-instruct",
    "llama-3.2-1b": "llama-3.2-1b-instruct",
    "qwen2.5-1.5b": "qwen2.5-coder-1.5b-instruct",
    "qwen3-1.7b": "qwen3-1.7b",
}
SHAPES = tuple(REGISTRY_NAMES)


def round_to_bf16(w: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 -> fp32, round to nearest even: the numbers the CUDA backend holds of a matrix."""
    bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def as_the_gpu_holds(model):
    """`model` (a LoadedModel) with its matrices rounded to bf16 as the CUDA backend holds them (its norms and biases
    stay fp32): the CPU reference's greedy replies are then the GPU's. From a GGUF's dequantized fp32 values, free
    prose parts from the GPU's text within tens of tokens (PERF.md session 80)."""
    from dataclasses import replace

    return replace(model, weights={k: round_to_bf16(v) if v.ndim == 2 else v for k, v in model.weights.items()})


def hf_config(name: str):
    import transformers

    from engine.registry import Registry

    fields = Registry().get(REGISTRY_NAMES.get(name, name)).model_config().to_hf()
    return transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)


def build_hf(name: str, seed: int, device: str = "cpu", gain: float = 1.0, embed_std: float = 0.05, attn: str = "eager",
             untied: bool = False):
    """A transformers model of shape `name`, fp32, with scaled random weights rounded to bf16; `untied`: with an
    LM head of its own, whatever the shape's registry entry says."""
    import torch
    import transformers

    cfg = hf_config(name)
    cfg._attn_implementation = attn
    if untied:
        cfg.tie_word_embeddings = False
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    model = model.float().eval()
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1 and "norm" in pname:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, device=device))
            elif p.dim() == 1:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g, device=device))
            elif "embed" in pname or "lm_head" in pname:
                p.copy_(embed_std * torch.randn(p.shape, generator=g, device=device))
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=device) * (gain / math.sqrt(p.shape[1])))
            p.copy_(p.to(torch.bfloat16).float())
    return model


def loaded_model(hf_model, name: str):
    """The engine's LoadedModel for a transformers model (fp32 numpy weights, HF names)."""
    from engine.config import ModelConfig
    from engine.model import LoadedModel

    weights = {k: v.detach().float().cpu().numpy() for k, v in hf_model.state_dict().items()}
    config = ModelConfig.from_hf(hf_model.config.to_dict())
    if config.tie_embeddings:
        weights.pop("lm_head.weight", None)
    return LoadedModel(name=name, config=config, weights=weights, tokenizer=None, source=f"random:{name}")


def gpu_timing_model(name: str, seed: int = 7):
    """The engine's LoadedModel of shape `name` built on the GPU for timing runs, with the
    transformers copy freed again (bench/decode_breakdown.py, bench/ncu_source.py)."""
    import torch

    hf = build_hf(name, seed, device="cuda")
    lm = loaded_model(hf, name)
    del hf
    torch.cuda.empty_cache()
    return lm


def random_prompt(vocab: int, n: int, rng: np.random.Generator) -> list[int]:
    return [int(t) for t in rng.integers(0, vocab, size=n)]
