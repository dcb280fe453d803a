"""Text <-> token ids for one model, on top of Hugging Face `tokenizers` (which does the BPE).

A tokenizer comes from a Hugging Face model directory or from a GGUF file's metadata. A GGUF
keeps the vocabulary, the merges and the special ids, but of the pre-tokenizer only llama.cpp's
name for it; `from_gguf` maps that name back to what the model's original tokenizer.json uses,
so ids match the ones the model was trained on. `save` writes the Hugging Face layout, so a
GGUF's tokenizer can be converted once and loaded later with `from_dir` (or by transformers).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from engine import chat_template
from engine.errors import KogError

# Tokens that end a turn (or a document) in the chat formats kog runs; any that a vocabulary
# marks special stop generation, besides its eos.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>", "<end_of_turn>")

# Split patterns from the original tokenizer.json of each family.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_bytes():
    return None, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False


def _smollm():
    # SmolLM2 was trained with every digit its own pre-token.
    digits = pre_tokenizers.Digits(individual_digits=True)
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return None, pre_tokenizers.Sequence([digits, gpt2]), False


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
    return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _llama3():
    # Llama 3's BPE takes a whole pre-token straight from the vocabulary before merging.
    return None, _split_then_bytes(_LLAMA3_SPLIT), True


def _qwen2():
    return normalizers.NFC(), _split_then_bytes(_QWEN2_SPLIT), False


# llama.cpp's `tokenizer.ggml.pre` name -> () -> (normalizer, pre-tokenizer, BPE ignore_merges).
# "default" is what llama.cpp writes when it knows nothing better; like transformers, read it as GPT-2.
PRE_TOKENIZERS = {
    "gpt2": _gpt2_bytes,
    "default": _gpt2_bytes,
    "smollm": _smollm,
    "llama-bpe": _llama3,
    "qwen2": _qwen2,
    "deepseek-r1-qwen": _qwen2,
}


def _byte_spelling() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the alphabet byte-level vocabularies are written in."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    spelling = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in spelling):
        spelling[b] = chr(256 + n)
    return spelling


_BYTE_SPELLING = _byte_spelling()
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a raw byte in SentencePiece byte-fallback vocabularies
_BYTE_ALPHABET = frozenset(_BYTE_SPELLING.values())


def _gguf_value(reader: gguf.GGUFReader, key: str, default=None):
    field = reader.fields.get(key)
    return field.contents() if field is not None else default


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def _template_processor(backend: Backend, bos: str | None, eos: str | None, add_bos: bool, add_eos: bool):
    """A post-processor that puts BOS before and/or EOS after the text (the flags transformers uses)."""
    bos_id = backend.token_to_id(bos) if bos else None
    eos_id = backend.token_to_id(eos) if eos else None
    add_bos, add_eos = add_bos and bos_id is not None, add_eos and eos_id is not None
    single = " ".join([bos] * add_bos + ["$A"] + [eos] * add_eos)
    specials = dict([(bos, bos_id)] * add_bos + [(eos, eos_id)] * add_eos)
    return processors.TemplateProcessing(single=single, special_tokens=list(specials.items()))


class Tokenizer:
    """A `tokenizers.Tokenizer` plus what a chat needs: special ids, stop ids, the chat template.

    `stop_ids` is eos plus every end-of-turn token (END_OF_TURN) the vocabulary marks special:
    instruct models end a turn with one and a document with another. (A GGUF's own end-of-turn
    ids travel in the model config's eos ids, which the converted copy keeps.)
    """

    def __init__(
        self,
        backend: Backend,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
    ):
        self._backend = backend
        self.bos_token, self.eos_token, self.pad_token = bos_token, eos_token, pad_token
        self.bos_id = backend.token_to_id(bos_token) if bos_token else None
        self.eos_id = backend.token_to_id(eos_token) if eos_token else None
        self.chat_template = chat_template
        # What encode(add_special_tokens=True) adds is the post-processor's business; read it back.
        probe = backend.encode("", add_special_tokens=True).ids
        self.add_bos_token = self.bos_id is not None and probe[:1] == [self.bos_id]
        self.add_eos_token = self.eos_id is not None and len(probe) > self.add_bos_token and probe[-1] == self.eos_id
        special = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        stops = {special[t] for t in END_OF_TURN if t in special}
        self.stop_ids: set[int] = stops | ({self.eos_id} if self.eos_id is not None else set())

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        path = Path(path)
        try:
            backend = Backend.from_file(str(path / "tokenizer.json"))
        except Exception as e:  # tokenizers raises a bare Exception for unreadable files
            raise KogError(f"cannot load {path / 'tokenizer.json'}: {' '.join(str(e).split())}") from None
        config_file = path / "tokenizer_config.json"
        try:
            config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.exists() else {}
            if not isinstance(config, dict):
                raise ValueError(f"a JSON {type(config).__name__}, not an object")
        except (OSError, ValueError) as e:
            raise KogError(f"corrupt {config_file}: {e}") from None
        bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        if "add_bos_token" in config or "add_eos_token" in config:
            # explicit flags win over tokenizer.json's post-processor, as in transformers
            add_bos, add_eos = bool(config.get("add_bos_token")), bool(config.get("add_eos_token"))
            backend.post_processor = _template_processor(backend, bos, eos, add_bos, add_eos)
        template = config.get("chat_template")
        if (path / "chat_template.jinja").exists():  # newer HF dirs keep it in its own file
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        elif isinstance(template, list):  # named templates; the one used for chat is "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(
            backend,
            bos_token=bos,
            eos_token=eos,
            pad_token=_token_text(config.get("pad_token")),
            chat_template=template,
        )

    @classmethod
    def from_gguf(cls, reader: gguf.GGUFReader) -> "Tokenizer":
        keys = gguf.Keys.Tokenizer
        model = _gguf_value(reader, keys.MODEL)
        if model != "gpt2":
            raise KogError(f"unsupported GGUF tokenizer {model!r}: kog reads byte-level BPE ('gpt2') vocabularies")
        pre = _gguf_value(reader, keys.PRE, "default")
        if pre not in PRE_TOKENIZERS:
            raise KogError(f"unsupported GGUF pre-tokenizer {pre!r} (kog knows: {', '.join(PRE_TOKENIZERS)})")
        tokens = _gguf_value(reader, keys.LIST)
        merges = _gguf_value(reader, keys.MERGES)
        if not tokens or not merges:
            raise KogError("GGUF file has no tokenizer vocabulary or merges")
        types = _gguf_value(reader, keys.TOKEN_TYPE) or [gguf.TokenType.NORMAL] * len(tokens)
        if len(types) != len(tokens):
            raise KogError(f"corrupt GGUF tokenizer: {len(types)} token types for {len(tokens)} tokens")

        vocab: dict[str, int] = {}
        added: list[AddedToken] = []
        for i, (token, kind) in enumerate(zip(tokens, types)):
            if kind in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED):
                # matched whole in the text before BPE runs, so they keep their own spelling
                added.append(AddedToken(token, special=kind == gguf.TokenType.CONTROL, normalized=False))
            elif not _BYTE_ALPHABET.issuperset(token):
                token = "".join(_BYTE_SPELLING[b] for b in token.encode("utf-8"))
            vocab.setdefault(token, i)

        normalizer, pre_tokenizer, ignore_merges = PRE_TOKENIZERS[pre]()
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        try:
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError("a merge is not two tokens")
            backend = Backend(models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges))
        except Exception as e:  # tokenizers raises a bare Exception for a merge of unknown tokens
            raise KogError(f"corrupt GGUF tokenizer: {' '.join(str(e).split())}") from None
        if normalizer is not None:
            backend.normalizer = normalizer
        backend.pre_tokenizer = pre_tokenizer
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([t for t in added if t.special])
        backend.add_tokens([t for t in added if not t.special])

        def token_of(key: str) -> str | None:
            index = _gguf_value(reader, key)
            return tokens[index] if index is not None and index < len(tokens) else None

        bos, eos = token_of(keys.BOS_ID), token_of(keys.EOS_ID)
        add_bos, add_eos = (bool(_gguf_value(reader, key, False)) for key in (keys.ADD_BOS, keys.ADD_EOS))
        if add_bos or add_eos:
            backend.post_processor = _template_processor(backend, bos, eos, add_bos, add_eos)
        return cls(
            backend,
            bos_token=bos,
            eos_token=eos,
            pad_token=token_of(keys.PAD_ID),
            chat_template=_gguf_value(reader, keys.CHAT_TEMPLATE),
        )

    def save(self, directory: str | Path) -> None:
        """Write tokenizer.json + tokenizer_config.json, readable by `from_dir` and by transformers."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._backend.save(str(directory / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "add_bos_token": self.add_bos_token,
            "add_eos_token": self.add_eos_token,
            "clean_up_tokenization_spaces": False,  # decode must give back exactly what was encoded
            "chat_template": self.chat_template,
        }
        config = {k: v for k, v in config.items() if v is not None}
        text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
        (directory / "tokenizer_config.json").write_text(text, encoding="utf-8")

    # --- text <-> ids -------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids for `text`; special tokens written in it become single ids. add_special_tokens adds
        BOS/EOS where the model asks for them (`add_bos_token`, `add_eos_token`)."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # --- chat ---------------------------------------------------------------------------------

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None, **variables
    ) -> str:
        if not self.chat_template:
            raise KogError("this model has no chat template")
        return chat_template.render(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            **variables,
        )

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None, **variables
    ) -> list[int]:
        # The template writes every special token itself (BOS included), so nothing is added.
        prompt = self.apply_chat_template(messages, add_generation_prompt, tools, **variables)
        return self.encode(prompt, add_special_tokens=False)


class IncrementalDecoder:
    """Turns a stream of token ids into text as it arrives.

    Only a short window of recent ids is decoded. Its first CONTEXT ids are already-emitted
    context, so decoders that treat the start of a text specially (Metaspace, Strip) see a middle,
    and only the text past them is new. A U+FFFD at the end of the text may be half of a character
    whose other bytes are still to come, so trailing U+FFFDs wait until a later id settles them,
    or until flush().

    The concatenated output equals `decode(all ids)` for byte-level BPE. For byte-fallback
    vocabularies (SentencePiece) it does as long as byte tokens form valid UTF-8: `tokenizers`
    turns a whole run of byte tokens into U+FFFDs when any byte in it is invalid, after the fact.
    """

    CONTEXT = 5

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._done = 0  # characters of decode(self._ids) already returned

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        text = self._decode(self._ids)
        end = len(text.rstrip("\ufffd"))
        shorter = self._shorten(text) if len(self._ids) >= 4 * self.CONTEXT else None
        if shorter is not None:
            start, dropped, kept = shorter
            end = max(end, dropped)  # the text before a clean cut is final, trailing U+FFFDs included
            new = text[self._done : end]
            self._ids = self._ids[start:]
            self._done = kept + max(end, self._done) - dropped
            return new
        new = text[self._done : end]
        self._done = max(self._done, end)
        return new

    def _shorten(self, text: str) -> tuple[int, int, int] | None:
        """Where the window can start anew without changing its text, if it can now.

        The cut, about CONTEXT ids from the end, must split no character still being decoded; the
        new start, about CONTEXT ids before the cut, must decode as it does in place (not from the
        middle of a character). Neither may fall inside a run of byte-fallback tokens. A character
        spans at most 4 ids, so one of 4 neighbouring places will do for each. Returns (new start,
        characters before the cut in `text`, the same in the new window), or None to retry on the
        next id.
        """
        last_cut = len(self._ids) - self.CONTEXT
        for cut in range(last_cut, last_cut - 4, -1):
            if self._inside_byte_run(cut):
                continue
            before = self._decode(self._ids[:cut])
            tail = text[len(before) :]
            # With no text after the cut, only a clean end of `before` shows nothing is pending there.
            if not (text.startswith(before) and (tail or not before.endswith("\ufffd"))):
                continue
            for start in range(cut - self.CONTEXT, cut - self.CONTEXT - 4, -1):
                if self._inside_byte_run(start):
                    continue
                context = self._decode(self._ids[start:cut])
                window = self._decode(self._ids[start:])
                if before.endswith(context) and window.startswith(context) and window[len(context) :] == tail:
                    return start, len(before), len(context)
        return None

    def _inside_byte_run(self, i: int) -> bool:
        """Whether ids i-1 and i are both byte-fallback tokens (`<0xE2>`), which decode as one run."""
        pair = self._ids[i - 1 : i + 1] if i > 0 else []
        return bool(pair) and all(_BYTE_TOKEN.fullmatch(self._tokenizer.id_to_token(t) or "") for t in pair)

    def flush(self) -> str:
        """Whatever is still held back; the decoder is then empty and ready for a new stream."""
        rest = self._decode(self._ids)[self._done :]
        self._ids, self._done = [], 0
        return rest
