"""Load a Hugging Face model directory: config.json, safetensors weights (one file or
sharded through model.safetensors.index.json), tokenizer files.

Tensors are memory-mapped, not read: a cached model opens in well under a second and only
the pages a backend touches are read from disk. numpy has no bfloat16, so bf16 tensors are
widened to fp32 (exact) as they are mapped.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from pathlib import Path

import numpy as np

from engine.config import ModelConfig
from engine.errors import KogError
from engine.model import LoadedModel
from engine.tokenizer import Tokenizer

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        return [directory / s for s in index_shards(index)]
    single = directory / "model.safetensors"
    if not single.exists():
        raise KogError(f"no weights in {directory} (expected model.safetensors or model.safetensors.index.json)")
    return [single]


def index_shards(index: Path) -> list[str]:
    """The weight files a model.safetensors.index.json names, each once."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
            raise ValueError("its weight_map is not an object of file names")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise KogError(f"corrupt weight index {index}: {e}") from None
    return sorted(set(weight_map.values()))


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Map every tensor of one .safetensors file; checks the file is whole before trusting it."""
    try:
        with open(path, "rb") as f:
            size = path.stat().st_size
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > size - 8:
                raise ValueError("header runs past the end of the file")
            header = json.loads(f.read(header_len))
            if not isinstance(header, dict):
                raise ValueError("its header is not a JSON object")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise KogError(f"missing weights file {path}") from None
    except (OSError, ValueError, struct.error) as e:
        raise KogError(f"corrupt weights file {path}: {e}") from None
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES.get(info.get("dtype"))
            if dtype is None:
                raise KogError(f"unsupported tensor dtype {info.get('dtype')} for {name} in {path}")
            start, end = info["data_offsets"]
            count = int(np.prod(info["shape"], dtype=np.int64))
            if not 0 <= start <= end or base + end > size or end - start != count * np.dtype(dtype).itemsize:
                raise ValueError
            array = np.frombuffer(buf, dtype=dtype, count=count, offset=base + start).reshape(info["shape"])
        except (AttributeError, KeyError, TypeError, ValueError):  # an entry without its fields, or lying about them
            raise KogError(f"truncated or corrupt weights file {path} (tensor {name})") from None
        if info["dtype"] == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = array
    return tensors


def load_dir(directory: Path, name: str | None = None) -> LoadedModel:
    config_file = directory / "config.json"
    if not config_file.exists():
        raise KogError(f"{directory} has no config.json; not a Hugging Face model directory")
    config = ModelConfig.from_file(config_file)
    config.eos_token_ids = list(dict.fromkeys(config.eos_token_ids + _generation_eos_ids(directory)))
    weights: dict[str, np.ndarray] = {}
    for f in weight_files(directory):
        weights.update(read_safetensors(f))
    if config.tie_embeddings:
        weights.pop("lm_head.weight", None)
    check_weights(config, weights, directory)
    tokenizer = Tokenizer.from_dir(directory)
    if tokenizer.vocab_size > config.vocab_size:  # ids past the embedding's rows: no model to run them through
        raise KogError(f"the tokenizer in {directory} has {tokenizer.vocab_size:,} tokens, "
                       f"more than the model's vocab_size {config.vocab_size:,}")
    return LoadedModel(
        name=name or directory.name,
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        source=str(directory),
    )


def _generation_eos_ids(directory: Path) -> list[int]:
    """The end ids generation_config.json adds (instruct models often list end-of-turn there only)."""
    try:
        eos = json.loads((directory / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):  # absent or unreadable: config.json's ids stand
        return []
    ids = eos if isinstance(eos, list) else [eos]
    return [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, i, v, d = config.hidden_size, config.intermediate_size, config.vocab_size, config.head_dim
    q, kv = config.num_heads * d, config.num_kv_heads * d
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
        if config.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,)}
        if config.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
    return shapes


# Tensors a model may carry that the forward pass has no use for: RoPE tables it recomputes.
UNREAD_TENSORS = re.compile(r".*\.rotary_emb\.inv_freq$")
# Read when present: a GGUF's Llama 3 RoPE scaling, as divisors of the head's frequencies.
OPTIONAL_TENSORS = {"rope_freqs.weight": lambda config: (config.head_dim // 2,)}


def check_weights(config: ModelConfig, weights: dict[str, np.ndarray], source) -> None:
    """Every tensor the forward pass reads is present with the shape the config implies, and
    no other: a tensor nothing reads (a bias, an extra norm) means a variant kog does not run."""
    expected = expected_shapes(config)
    expected |= {key: shape(config) for key, shape in OPTIONAL_TENSORS.items() if key in weights}
    for key, shape in expected.items():
        if key not in weights:
            raise KogError(f"weights in {source} lack {key}; incomplete or not a {config.arch} model")
        if tuple(weights[key].shape) != shape:
            raise KogError(f"{key} in {source} has shape {tuple(weights[key].shape)}, expected {shape}")
    unread = sorted(key for key in weights if key not in expected and not UNREAD_TENSORS.match(key))
    if unread:
        more = f" (and {len(unread) - 1} more)" if len(unread) > 1 else ""
        raise KogError(f"weights in {source} hold {unread[0]}{more}, which kog's {config.arch} does not run")
