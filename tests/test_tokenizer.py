"""The tokenizer against transformers, on the real default model and on synthetic GGUF vocabularies."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

from tokenizers import Regex, pre_tokenizers  # noqa: E402
from tokenizers import Tokenizer as Backend  # noqa: E402

from engine.errors import KogError  # noqa: E402
from engine.tokenizer import IncrementalDecoder, Tokenizer  # noqa: E402

@pytest.fixture(scope="module")
def smollm_gguf(default_gguf) -> Path:
    return default_gguf


@pytest.fixture(scope="module")
def tok(smollm_gguf) -> Tokenizer:
    return Tokenizer.from_gguf(gguf.GGUFReader(smollm_gguf))


@pytest.fixture(scope="module")
def hf(smollm_gguf):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(smollm_gguf.parent, gguf_file=smollm_gguf.name)


TEXTS = [
    "Hello, world!",
    "日本語のテキストと中文字符，还有한국어.",
    "Café naïve façade — Ærøskøbing, Ελληνικά, Русский текст.",
    "שלום עולם، مرحبا بالعالم",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 heart ❤️ rainbow 🏳️‍🌈",
    "def f(x):\n\tif x:\n\t\treturn {'a': [1, 2]}\n    return None\n",
    '{"name": "kog", "tokens": [1, 22, 333], "nested": {"ok": true, "pi": 3.14159}}',
    "  leading spaces",
    "trailing spaces   ",
    "multiple\n\n\nnewlines\n",
    "windows\r\nline\r\nendings\r\n",
    " ",
    "   ",
    "\t",
    "\n",
    "",
    "0123456789 3.14159 1,000,000 2024-11-30 x=12345678901234567890",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text <|im_end|>",
    "a <|im_start|>b<|im_end|>c<file_sep>",
    "not special: <|im_star|> < |im_end| >",
    "it's, don't, we'll, I'M, you'RE",
    "\u00a0non-breaking\u2003em-space\u200bzero-width",
    "e\u0301 vs \u00e9",
    "\ufffd replacement char",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(tok, hf, text):
    ids = tok.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert tok.encode(text, add_special_tokens=True) == hf(text)["input_ids"]
    assert tok.decode(ids) == hf.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


def test_special_tokens_are_single_ids(tok):
    assert tok.encode("<|im_start|>user<|im_end|>") == [1, *tok.encode("user"), 2]
    assert tok.token_to_id("<|im_end|>") == 2 and tok.id_to_token(2) == "<|im_end|>"


def test_smollm2_metadata(tok, hf):
    assert tok.vocab_size == len(hf) == 49152
    assert (tok.bos_id, tok.eos_id) == (hf.bos_token_id, hf.eos_token_id)
    assert tok.stop_ids == {hf.eos_token_id, tok.token_to_id("<|endoftext|>")}
    assert not tok.add_bos_token
    assert tok.chat_template == hf.chat_template


def test_decode_random_ids_matches_transformers(tok, hf, seed):
    rng = random.Random(seed)
    for _ in range(20):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 40))]
        assert tok.decode(ids) == hf.decode(ids), ids
        assert tok.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True), ids


CHATS = {
    "no_system": [{"role": "user", "content": "What is 2+2?"}],
    "system": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi!"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the GPU cross the bus? To get to the other die."},
        {"role": "user", "content": "Another one, with code:\n```py\nprint('hi')\n```"},
    ],
    "unicode": [
        {"role": "user", "content": "Traduis « bonjour » en 日本語 😀 and שלום"},
        {"role": "assistant", "content": "こんにちは 👋🏽"},
        {"role": "user", "content": "  spaces  \r\n"},
    ],
}


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("chat", CHATS)
def test_chat_template_matches_transformers(tok, hf, chat, add_generation_prompt):
    messages = CHATS[chat]
    text = hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    ids = hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, return_dict=False)
    assert tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == text
    assert tok.encode_chat(messages, add_generation_prompt=add_generation_prompt) == list(ids)


def test_save_round_trip_and_transformers_load(tok, tmp_path):
    transformers = pytest.importorskip("transformers")
    tok.save(tmp_path)
    again = Tokenizer.from_dir(tmp_path)
    reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        ids = tok.encode(text)
        assert again.encode(text) == ids == reloaded.encode(text, add_special_tokens=False)
        assert again.encode(text, add_special_tokens=True) == reloaded(text)["input_ids"]
        assert again.decode(ids) == reloaded.decode(ids) == tok.decode(ids)
    for name in ("bos_id", "eos_id", "stop_ids", "vocab_size", "chat_template", "add_bos_token", "pad_token"):
        assert getattr(again, name) == getattr(tok, name), name
    assert (reloaded.bos_token, reloaded.eos_token) == (tok.bos_token, tok.eos_token)
    messages = CHATS["multi_turn"]
    expected = reloaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tok.apply_chat_template(messages) == expected


# --- synthetic GGUF vocabularies --------------------------------------------------------------

def byte_spelling() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes, in byte order (what byte-level vocabularies use)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


# The Split patterns of the families' original tokenizer.json files.
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPLIT_TEXTS = TEXTS + [
    "Numbers 1 12 123 1234 12345 and a1b22c333",
    "x  =   y\n\n\n  z\t\t w \r\n\r\n end   ",
    "HELLO'S world'LL they've  'd ?!... --> <= >>>",
]


def write_vocab_gguf(path: Path, pre: str, model: str = "gpt2", add_bos: bool = True) -> None:
    """A byte-level vocabulary (256 bytes, a few merges, a few control tokens) and nothing else."""
    spelled = byte_spelling()
    merges = ["1 2", "12 3", "Ġ Ġ", "ĠĠ Ġ", "h e", "he l", "hel l", "hell o", "Ċ Ċ"]
    tokens = spelled + [m.replace(" ", "") for m in merges] + ["xyz", "<|begin_of_text|>", "<|eot_id|>", "<tool>"]
    types = [gguf.TokenType.NORMAL] * (len(tokens) - 3) + [gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.USER_DEFINED]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|begin_of_text|>"))
    writer.add_eos_token_id(tokens.index("<|eot_id|>"))
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def from_vocab_gguf(tmp_path: Path, pre: str, **kw) -> Tokenizer:
    path = tmp_path / f"{pre}.gguf"
    write_vocab_gguf(path, pre, **kw)
    return Tokenizer.from_gguf(gguf.GGUFReader(path))


def saved_backend(tokenizer: Tokenizer, directory: Path) -> Backend:
    tokenizer.save(directory)
    return Backend.from_file(str(directory / "tokenizer.json"))


def split_then_bytes(regex: str) -> pre_tokenizers.PreTokenizer:
    split = pre_tokenizers.Split(Regex(regex), behavior="isolated")
    return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


REFERENCE_PRE_TOKENIZERS = {
    "llama-bpe": lambda: split_then_bytes(LLAMA3_REGEX),
    "qwen2": lambda: split_then_bytes(QWEN2_REGEX),
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    ),
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
}


def test_qwen2_regex_is_transformers():
    qwen2 = pytest.importorskip("transformers.models.qwen2.tokenization_qwen2")
    assert QWEN2_REGEX == qwen2.PRETOKENIZE_REGEX


@pytest.mark.parametrize("pre", REFERENCE_PRE_TOKENIZERS)
def test_gguf_pre_tokenizer_splits(tmp_path, pre):
    backend = saved_backend(from_vocab_gguf(tmp_path, pre), tmp_path / "hf")
    reference = REFERENCE_PRE_TOKENIZERS[pre]()
    for text in SPLIT_TEXTS:
        assert backend.pre_tokenizer.pre_tokenize_str(text) == reference.pre_tokenize_str(text), text


def test_gguf_family_details(tmp_path):
    llama, qwen, smol = (from_vocab_gguf(tmp_path, pre) for pre in ("llama-bpe", "qwen2", "smollm"))
    # Llama 3 takes a pre-token found whole in the vocabulary without merging; the others merge.
    assert len(llama.encode("xyz")) == 1 and len(qwen.encode("xyz")) == 3
    # digits: groups of up to three for Llama 3, one at a time for Qwen2 and SmolLM2
    assert [llama.decode([i]) for i in llama.encode("1234")] == ["123", "4"]
    assert [qwen.decode([i]) for i in qwen.encode("1234")] == ["1", "2", "3", "4"]
    assert [smol.decode([i]) for i in smol.encode("1234")] == ["1", "2", "3", "4"]
    # Qwen2 normalizes to NFC first
    assert qwen.encode("e\u0301") == qwen.encode("\u00e9") != llama.encode("e\u0301")


def test_gguf_special_tokens_bos_and_template(tmp_path):
    tok = from_vocab_gguf(tmp_path, "llama-bpe")
    bos, eot, tool = (tok.token_to_id(t) for t in ("<|begin_of_text|>", "<|eot_id|>", "<tool>"))
    assert (tok.bos_id, tok.eos_id, tok.stop_ids) == (bos, eot, {eot})
    assert tok.encode("hello", add_special_tokens=True) == [bos, tok.token_to_id("hello")]
    assert tok.encode("a<tool>b<|eot_id|>") == [tok.token_to_id("a"), tool, tok.token_to_id("b"), eot]
    assert tok.decode([bos, tool, eot], skip_special_tokens=True) == "<tool>"
    assert tok.encode_chat([{"role": "user", "content": "hello"}]) == [bos, tok.token_to_id("hello"), eot]
    plain = from_vocab_gguf(tmp_path, "qwen2", add_bos=False)
    assert plain.encode("hello", add_special_tokens=True) == [plain.token_to_id("hello")]


def test_gguf_bos_survives_save_for_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = from_vocab_gguf(tmp_path, "llama-bpe")
    tok.save(tmp_path / "hf")
    reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in SPLIT_TEXTS:
        assert reloaded(text)["input_ids"] == tok.encode(text, add_special_tokens=True), text


@pytest.mark.parametrize("pre", ["bogus", "deepseek-llm"])
def test_gguf_unknown_pre_tokenizer(tmp_path, pre):
    with pytest.raises(KogError, match=f"unsupported GGUF pre-tokenizer '{pre}'"):
        from_vocab_gguf(tmp_path, pre)


def test_gguf_unsupported_tokenizer_model(tmp_path):
    with pytest.raises(KogError, match="unsupported GGUF tokenizer 'llama'"):
        from_vocab_gguf(tmp_path, "default", model="llama")


# --- HF directories ---------------------------------------------------------------------------

def test_from_dir_named_templates_and_flags(tmp_path):
    tok = from_vocab_gguf(tmp_path, "llama-bpe")
    tok.save(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "chat"}]
    config["add_bos_token"] = False
    config["bos_token"] = {"content": "<|begin_of_text|>", "special": True, "__type": "AddedToken"}
    config_file.write_text(json.dumps(config))
    loaded = Tokenizer.from_dir(tmp_path)
    assert loaded.chat_template == "chat"
    assert loaded.bos_id == tok.bos_id and not loaded.add_bos_token
    assert loaded.encode("hello", add_special_tokens=True) == [tok.token_to_id("hello")]
    (tmp_path / "chat_template.jinja").write_text("from file")
    assert Tokenizer.from_dir(tmp_path).chat_template == "from file"


def test_from_dir_missing(tmp_path):
    with pytest.raises(KogError, match="cannot load"):
        Tokenizer.from_dir(tmp_path)


def test_no_chat_template(tmp_path):
    tok = from_vocab_gguf(tmp_path, "gpt2")
    tok.chat_template = None
    with pytest.raises(KogError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


# --- streaming --------------------------------------------------------------------------------

class DecodeSpy:
    """Passes decode through and records the longest id list decoded, to bound the per-token cost."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer, self.longest = tokenizer, 0

    def decode(self, ids, skip_special_tokens=False):
        self.longest = max(self.longest, len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def stream(tokenizer, ids, skip_special_tokens=False) -> tuple[list[str], int]:
    spy = DecodeSpy(tokenizer)
    decoder = IncrementalDecoder(spy, skip_special_tokens=skip_special_tokens)
    chunks = [decoder.push(i) for i in ids]
    chunks.append(decoder.flush())
    return chunks, spy.longest


STREAM_CHARS = "aé中😀👍🏽👨‍👩‍👧 \n\t{}0ש€\u0301\ufffd"


def random_streams(tok: Tokenizer, rng: random.Random):
    byte_ids = [i for i in map(tok.token_to_id, byte_spelling()) if i is not None]  # SmolLM2 lacks a few bytes
    for _ in range(60):
        yield [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 80))]  # anything at all
        text = "".join(rng.choice(STREAM_CHARS) for _ in range(rng.randrange(1, 60)))
        yield tok.encode(text)  # real text, with characters split over byte tokens
        yield [rng.choice(byte_ids) for _ in range(rng.randrange(1, 80))]  # raw bytes, mostly invalid UTF-8
        yield tok.encode(text.replace("中", "<|im_end|>"))


def test_incremental_decoder_random_streams(tok, seed):
    rng = random.Random(seed)
    for ids in random_streams(tok, rng):
        for skip in (False, True):
            full = tok.decode(ids, skip_special_tokens=skip)
            chunks, longest = stream(tok, ids, skip)
            assert "".join(chunks) == full, (seed, ids, skip)
            assert "\ufffd" in full or not any("\ufffd" in c for c in chunks), (seed, ids, skip)
            assert longest <= 4 * IncrementalDecoder.CONTEXT, (seed, ids, skip)


def test_incremental_decoder_holds_split_characters(tok):
    ids = tok.encode("a😀b")
    assert len(ids) > 3  # the emoji is spread over several byte tokens
    chunks, _ = stream(tok, ids)
    assert "😀" in chunks and "".join(chunks) == "a😀b"


def test_incremental_decoder_bounded_on_endless_replacement_chars(tok):
    ids = tok.encode("\ufffd" * 300)
    chunks, longest = stream(tok, ids)
    assert "".join(chunks) == tok.decode(ids) == "\ufffd" * 300
    assert longest <= 4 * IncrementalDecoder.CONTEXT
    assert sum(map(len, chunks[:-1])) >= 290  # emitted along the way, not saved up for flush


def test_incremental_decoder_flush_resets(tok):
    decoder = IncrementalDecoder(tok)
    ids = tok.encode("😀")
    assert "".join(decoder.push(i) for i in ids[:-1]) == ""
    assert decoder.flush() == tok.decode(ids[:-1])
    assert "".join(decoder.push(i) for i in tok.encode("ok")) + decoder.flush() == "ok"


@pytest.mark.parametrize("merges, types_cut, message", [
    (["1 2", "x y"], 0, "out of vocabulary"),  # a merge of tokens the vocabulary lacks
    (["12"], 0, "a merge is not two tokens"),
    (["1 2"], 1, "token types for"),
])
def test_a_corrupt_gguf_vocabulary_is_one_error(tmp_path, merges, types_cut, message):
    spelled = byte_spelling()
    tokens = spelled + ["12", "<|eot_id|>"]
    writer = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 1 - types_cut) + [gguf.TokenType.CONTROL])
    writer.add_token_merges(merges)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(KogError, match=message):
        Tokenizer.from_gguf(gguf.GGUFReader(tmp_path / "v.gguf"))
