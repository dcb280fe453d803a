"""Loading models from files, and each way a model file can be bad."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from engine.config import ModelConfig  # noqa: E402
from engine.errors import KogError  # noqa: E402
from engine.loader import load_model  # noqa: E402
from engine.loaders.gguf_file import _unpermute  # noqa: E402
from tests.conftest import make_tiny_model  # noqa: E402


@pytest.fixture
def tiny_dir(tmp_path, seed):
    make_tiny_model(tmp_path / "m", "qwen2", seed)
    return tmp_path / "m"


def test_missing_path(tmp_path):
    with pytest.raises(KogError, match="no model at"):
        load_model(tmp_path / "nothing-here")


def test_directory_without_config(tmp_path):
    with pytest.raises(KogError, match="no config.json"):
        load_model(tmp_path)


def test_missing_weights(tiny_dir):
    (tiny_dir / "model.safetensors").unlink()
    with pytest.raises(KogError, match="no weights"):
        load_model(tiny_dir)


def test_truncated_weights(tiny_dir):
    path = tiny_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(KogError, match="truncated or corrupt"):
        load_model(tiny_dir)


@pytest.mark.parametrize("header", [None, b"[1, 2]", b'{"w": {"dtype": "F32", "shape": [2]}}', b'{"w": [1]}'])
def test_corrupt_weights_header(tiny_dir, header):
    path = tiny_dir / "model.safetensors"
    path.write_bytes(b"\xff" * 64 if header is None else len(header).to_bytes(8, "little") + header + bytes(8))
    with pytest.raises(KogError, match="corrupt weights file"):
        load_model(tiny_dir)


def test_weights_missing_a_tensor(tiny_dir):
    from safetensors.numpy import load_file, save_file

    path = tiny_dir / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path)
    with pytest.raises(KogError, match="lack model.layers.1.mlp.up_proj.weight"):
        load_model(tiny_dir)


def test_unknown_architecture(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    config["architectures"], config["model_type"] = ["MambaForCausalLM"], "mamba"
    (tiny_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(KogError, match="unsupported architecture 'MambaForCausalLM'"):
        load_model(tiny_dir)


@pytest.mark.parametrize("text", ["{ not json", "[1, 2]"])
def test_corrupt_config(tiny_dir, text):
    (tiny_dir / "config.json").write_text(text)
    with pytest.raises(KogError, match="corrupt model config"):
        load_model(tiny_dir)


@pytest.mark.parametrize("arch, overrides, message", [
    ("llama", {"attention_bias": True}, "attention biases are not supported for llama"),
    ("llama", {"mlp_bias": True}, "MLP biases are not supported"),
    ("qwen3", {"attention_bias": True}, "attention biases are not supported for qwen3"),
    ("llama", {"hidden_act": "gelu"}, "activation 'gelu' is not supported"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 16}, "qwen3 sliding-window attention is not supported"),
])
def test_a_variant_kog_does_not_run_is_refused(tmp_path, seed, arch, overrides, message):
    """transformers builds and saves these models; kog would read them and write wrong text."""
    make_tiny_model(tmp_path / "m", arch, seed, **overrides)
    with pytest.raises(KogError, match=message):
        load_model(tmp_path / "m")


def test_a_rope_frequency_table_of_the_wrong_size_is_refused(tiny_dir):
    from safetensors.numpy import load_file, save_file

    path = tiny_dir / "model.safetensors"
    tensors = load_file(path)
    tensors["rope_freqs.weight"] = np.ones(1, dtype=np.float32)
    save_file(tensors, path)
    with pytest.raises(KogError, match=r"rope_freqs.weight .* has shape \(1,\), expected"):
        load_model(tiny_dir)


def test_a_tensor_nothing_reads_is_refused(tiny_dir):
    """A variant the config does not name (here an O projection bias) shows in its weights."""
    from safetensors.numpy import load_file, save_file

    path = tiny_dir / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.0.self_attn.o_proj.bias"] = np.zeros(32, dtype=np.float32)
    save_file(tensors, path)
    with pytest.raises(KogError, match="hold model.layers.0.self_attn.o_proj.bias, which kog's qwen2 does not run"):
        load_model(tiny_dir)


@pytest.mark.parametrize("fields, message", [
    ({"rope_scaling": "linear"}, "rope_scaling must be an object"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope scaling 'llama3' needs the numbers low_freq_factor"),
    ({"rope_scaling": None, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "'linear' needs the numbers factor"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope scaling type 'yarn'"),
    ({"max_position_embeddings": 0}, "max_position_embeddings must be a positive integer, got 0"),
    ({"num_hidden_layers": "2"}, "num_hidden_layers must be a positive integer, got '2'"),
    ({"num_attention_heads": 4, "num_key_value_heads": 3}, "4 attention heads do not share 3 key/value heads evenly"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be a positive number"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_theta must be a positive number, got 0"),
])
def test_a_malformed_config_field_is_one_clear_error(tiny_dir, fields, message):
    config = json.loads((tiny_dir / "config.json").read_text()) | fields
    (tiny_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(KogError, match=message):
        load_model(tiny_dir)


def write_gguf(path, arch="llama", tensor_type=gguf.GGMLQuantizationType.F32, heads=True, strings=(), numbers=()):
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in dict(strings).items():
        writer.add_string(key, value)
    for key, value in ({f"{arch}.vocab_size": 16} | dict(numbers)).items():  # (token_embd's rows)
        (writer.add_uint32 if isinstance(value, int) else writer.add_float32)(key, value)
    writer.add_block_count(1)
    writer.add_embedding_length(32)
    if heads:
        writer.add_head_count(2)
    writer.add_context_length(64)
    writer.add_feed_forward_length(64)
    data = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    if tensor_type == gguf.GGMLQuantizationType.F32:
        writer.add_tensor("token_embd.weight", data)
    else:
        quantized = gguf.quants.quantize(data, tensor_type)
        writer.add_tensor("token_embd.weight", quantized, raw_shape=quantized.shape, raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_unknown_architecture(tmp_path):
    write_gguf(tmp_path / "m.gguf", arch="mamba")
    with pytest.raises(KogError, match="unsupported GGUF architecture 'mamba'"):
        load_model(tmp_path / "m.gguf")


def test_gguf_without_its_head_count(tmp_path, monkeypatch):
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    write_gguf(tmp_path / "m.gguf", heads=False)
    with pytest.raises(KogError, match="lacks a valid llama.attention.head_count"):
        load_model(tmp_path / "m.gguf")


def test_gguf_rope_scaling_and_end_of_turn_ids_are_read(tmp_path):
    from engine.loaders.gguf_file import open_reader, read_config

    write_gguf(tmp_path / "m.gguf", strings={"llama.rope.scaling.type": "linear"},
               numbers={"llama.rope.scaling.factor": 4.0, "llama.vocab_size": 16, "tokenizer.ggml.eos_token_id": 2,
                        "tokenizer.ggml.eot_token_id": 7, "tokenizer.ggml.eom_token_id": 2})
    config = read_config(open_reader(tmp_path / "m.gguf"), tmp_path / "m.gguf")
    assert config.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    assert config.eos_token_ids == [2, 7]  # kept through the converted copy's config.json
    assert ModelConfig.from_hf(config.to_hf()).eos_token_ids == [2, 7]
    write_gguf(tmp_path / "y.gguf", strings={"llama.rope.scaling.type": "yarn"}, numbers={"llama.rope.scaling.factor": 4.0})
    with pytest.raises(KogError, match="unsupported rope scaling type 'yarn'"):
        load_model(tmp_path / "y.gguf")


def test_a_conversion_by_an_older_kog_is_replaced(tmp_path, monkeypatch):
    import engine.loader
    from engine.loader import converted_dir

    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(engine.loader, "convert_gguf", lambda source, target: target.mkdir())  # the cache's bookkeeping only
    path = tmp_path / "M.GGUF"  # the suffix in any case
    write_gguf(path)
    stat = path.stat()
    converted = tmp_path / "home" / "cache" / "converted"
    older = converted / f"M-{stat.st_size}-{stat.st_mtime_ns}"  # the first converter named no version
    other_file = converted / f"M-{stat.st_size + 1}-{stat.st_mtime_ns}-v2"
    older.mkdir(parents=True)
    other_file.mkdir()
    target = converted_dir(path)
    assert target.exists() and target != older
    assert sorted(p.name for p in converted.iterdir()) == sorted([target.name, other_file.name])


def test_a_conversion_of_the_same_files_earlier_copy_is_replaced(tmp_path, monkeypatch):
    import engine.loader
    from engine.loader import SOURCE_NOTE, converted_dir

    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    def convert(source, target):  # the cache's bookkeeping only
        target.mkdir(parents=True)
        (target / SOURCE_NOTE).write_text(str(source.resolve()))
    monkeypatch.setattr(engine.loader, "convert_gguf", convert)
    path, namesake = tmp_path / "M.gguf", tmp_path / "elsewhere" / "M.gguf"
    namesake.parent.mkdir()
    write_gguf(path)
    write_gguf(namesake)
    first, kept = converted_dir(path), converted_dir(namesake)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # pulled again: a new mtime
    second = converted_dir(path)
    assert second != first and second.exists() and not first.exists()
    assert kept.exists()  # another file of the same name keeps its own conversion


def test_generation_config_end_ids_stop_generation_too(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    (tiny_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [config["eos_token_id"], 5, 6]}))
    assert {5, 6} <= load_model(tiny_dir).stop_ids
    (tiny_dir / "generation_config.json").write_text("[not json")  # unreadable: config.json's ids stand
    assert 5 not in load_model(tiny_dir).stop_ids


def test_gguf_unsupported_tensor_type(tmp_path, monkeypatch):
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    write_gguf(tmp_path / "m.gguf", tensor_type=gguf.GGMLQuantizationType.Q5_0)
    with pytest.raises(KogError, match="unsupported GGUF tensor type Q5_0"):
        load_model(tmp_path / "m.gguf")
    assert not any((tmp_path / "home").rglob("*.safetensors"))  # nothing half-converted left behind


def test_gguf_truncated(tmp_path, default_gguf, monkeypatch):
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    truncated = tmp_path / "cut.gguf"
    with open(default_gguf, "rb") as src:
        truncated.write_bytes(src.read(5_000_000))
    with pytest.raises(KogError, match="corrupt or truncated GGUF"):
        load_model(truncated)


def test_unpermute_inverts_the_gguf_converter_permutation():
    rng = np.random.default_rng(1)
    heads, head_dim, width = 3, 8, 5
    w = rng.standard_normal((heads * head_dim, width))
    # the converter's order: per head, the split halves interleaved pairwise
    permuted = w.reshape(heads, 2, head_dim // 2, width).swapaxes(1, 2).reshape(w.shape)
    assert np.array_equal(_unpermute(permuted, heads), w)


def test_config_round_trips_through_hf_format(tiny_dir):
    config = ModelConfig.from_file(tiny_dir / "config.json")
    assert ModelConfig.from_hf(config.to_hf()) == config


def test_a_mistral_window_caps_the_context(tmp_path, seed):
    make_tiny_model(tmp_path, "mistral", seed)
    assert load_model(tmp_path).config.max_context == 512


def write_model_gguf(path, numbers=()):
    """A whole one-layer llama GGUF: F32 tensors, a byte-level tokenizer; `numbers` override metadata (uint32)."""
    from tests.test_tokenizer import byte_spelling

    tokens = byte_spelling() + ["ĠĠ", "<|end|>"]
    hidden, inter, rng = 32, 64, np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    fields = {"llama.block_count": 1, "llama.embedding_length": hidden, "llama.attention.head_count": 2,
              "llama.attention.head_count_kv": 2, "llama.context_length": 64, "llama.feed_forward_length": inter}
    for key, value in (fields | dict(numbers)).items():
        writer.add_uint32(key, value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 1) + [gguf.TokenType.CONTROL])
    writer.add_token_merges(["Ġ Ġ"])
    writer.add_eos_token_id(len(tokens) - 1)
    shapes = {"token_embd.weight": (len(tokens), hidden), "output_norm.weight": (hidden,),
              "blk.0.attn_norm.weight": (hidden,), "blk.0.ffn_norm.weight": (hidden,),
              "blk.0.attn_q.weight": (hidden, hidden), "blk.0.attn_k.weight": (hidden, hidden),
              "blk.0.attn_v.weight": (hidden, hidden), "blk.0.attn_output.weight": (hidden, hidden),
              "blk.0.ffn_gate.weight": (inter, hidden), "blk.0.ffn_up.weight": (inter, hidden),
              "blk.0.ffn_down.weight": (hidden, inter)}
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("numbers, message", [
    ({"llama.attention.head_count_kv": 0}, "lacks a valid llama.attention.head_count_kv"),
    ({"llama.context_length": 0}, "lacks a valid llama.context_length"),
    ({"llama.attention.head_count": 4, "llama.attention.head_count_kv": 3}, "4 attention heads do not share 3"),
])
def test_gguf_metadata_is_refused_before_anything_is_converted(tmp_path, monkeypatch, numbers, message):
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    write_model_gguf(tmp_path / "m.gguf", numbers)
    with pytest.raises(KogError, match=message) as refused:
        load_model(tmp_path / "m.gguf")
    assert str(tmp_path / "m.gguf") in str(refused.value)
    assert not (tmp_path / "home" / "cache" / "converted").exists() or not any((tmp_path / "home" / "cache" / "converted").iterdir())


def test_a_gguf_conversion_cleans_up_after_a_killed_one_and_takes_any_file_name(tmp_path, monkeypatch):
    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    path = tmp_path / os.fsdecode(b"\xffodd name.gguf")  # not UTF-8: kept as surrogates
    write_model_gguf(path)
    converted = tmp_path / "home" / "cache" / "converted"
    converted.mkdir(parents=True)
    dead = converted / ".converting-999999999-abandoned"  # a process that no longer runs
    live = converted / f".converting-{os.getpid()}-running"  # one that does (here: this one)
    for staging in (dead, live):
        staging.mkdir()
        (staging / "model.safetensors").write_bytes(b"half")
    model = load_model(path)
    assert model.config.num_layers == 1 and model.source == str(path)
    assert not dead.exists() and live.exists()
    assert load_model(path).config == model.config  # from the cached copy


def test_a_full_disk_while_converting_is_one_error_and_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.numpy

    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    write_model_gguf(tmp_path / "m.gguf")

    def full_disk(*args, **kwargs):
        raise safetensors.SafetensorError("Error while serializing: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.numpy, "save_file", full_disk)
    with pytest.raises(KogError, match="cannot write the converted model .*No space left on device"):
        load_model(tmp_path / "m.gguf")
    assert list((tmp_path / "home" / "cache" / "converted").iterdir()) == []


def test_a_conversion_another_process_finished_first_is_kept(tmp_path, monkeypatch):
    from engine.loader import conversion_of, convert_gguf

    monkeypatch.setenv("KOG_HOME", str(tmp_path / "home"))
    write_model_gguf(tmp_path / "m.gguf")
    target = conversion_of(tmp_path / "m.gguf")
    convert_gguf(tmp_path / "m.gguf", target)  # the other process's copy
    (target / "marker").write_text("theirs")
    convert_gguf(tmp_path / "m.gguf", target)  # this one, finishing second
    assert (target / "marker").read_text() == "theirs"
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_a_corrupt_weight_index_or_tokenizer_config_is_one_error(tiny_dir):
    (tiny_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": 5}}))
    with pytest.raises(KogError, match="corrupt weight index"):
        load_model(tiny_dir)
    (tiny_dir / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(KogError, match="corrupt weight index"):
        load_model(tiny_dir)
    (tiny_dir / "model.safetensors.index.json").unlink()
    (tiny_dir / "tokenizer_config.json").write_text("[]")
    with pytest.raises(KogError, match="corrupt .*tokenizer_config.json: a JSON list, not an object"):
        load_model(tiny_dir)


def test_a_tokenizer_with_ids_past_the_vocabulary_is_refused(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    (tiny_dir / "config.json").write_text(json.dumps(config | {"vocab_size": 8}))
    shrunk = {k: v[:8] if k in ("model.embed_tokens.weight", "lm_head.weight") else v
              for k, v in load_safetensors_numpy(tiny_dir / "model.safetensors").items()}
    save_safetensors_numpy(shrunk, tiny_dir / "model.safetensors")
    with pytest.raises(KogError, match="more than the model's vocab_size 8"):
        load_model(tiny_dir)


def load_safetensors_numpy(path):
    from safetensors.numpy import load_file

    return load_file(path)


def save_safetensors_numpy(tensors, path):
    from safetensors.numpy import save_file

    save_file(tensors, path)
