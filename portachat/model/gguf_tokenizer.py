"""The tokenizer a GGUF file describes, rebuilt with the `tokenizers` library alone.

A GGUF has no `tokenizer.json`: llama.cpp stores the vocabulary, the merges, each token's type and
the name of the pre-tokenizer (`tokenizer.ggml.pre`) as metadata. The split rules behind each
pre-tokenizer name live in llama.cpp's code (llama-vocab.cpp), not in the file, so they are copied
here. Where transformers' GGUF loader and llama.cpp disagree (SmolLM2's "smollm" splits digits one
by one, Llama 3's "llama-bpe" ignores merges for whole words), we follow llama.cpp, which matches
the models' original `tokenizer.json`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

from portachat.i18n import _


class GGUFTokenizerError(ValueError):
    """A GGUF whose tokenizer metadata we cannot rebuild (not byte-level BPE, unknown pre-tokenizer)."""


# llama.cpp's token types (llama_token_type): which ids are control tokens and which are added words.
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _regex_split(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _starcoder() -> pre_tokenizers.PreTokenizer:
    # llama.cpp: "\p{N}" first, then GPT-2's regex -- the StarCoder/SmolLM tokenizer.json's Digits + ByteLevel.
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


@dataclass(frozen=True)
class PreTokenizerRule:
    """What llama.cpp does for one `tokenizer.ggml.pre` name (llama-vocab.cpp)."""

    make: Callable[[], pre_tokenizers.PreTokenizer]
    ignore_merges: bool = False  # a word already in the vocabulary is one token, whatever the merges say
    add_bos: bool = False  # BOS is prepended when the file has no tokenizer.ggml.add_bos_token


_GPT2 = PreTokenizerRule(_gpt2)
_STARCODER = PreTokenizerRule(_starcoder)
_LLAMA3 = PreTokenizerRule(lambda: _regex_split(_LLAMA3_SPLIT), ignore_merges=True, add_bos=True)
_TEKKEN = PreTokenizerRule(lambda: _regex_split(_TEKKEN_SPLIT), ignore_merges=True, add_bos=True)
_QWEN2 = PreTokenizerRule(lambda: _regex_split(_QWEN2_SPLIT))

# tokenizer.ggml.pre -> rule, grouped as llama.cpp groups them.
_PRE_TOKENIZERS: dict[str, PreTokenizerRule] = {
    **dict.fromkeys(("default", "gpt-2", "mpt", "olmo", "jais", "trillion"), _GPT2),
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"), _STARCODER
    ),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"), _LLAMA3
    ),
    "tekken": _TEKKEN,  # Mistral Nemo (a "llama" GGUF)
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "kormo", "f2llmv2"), _QWEN2),
}

SUPPORTED_PRE_TOKENIZERS = tuple(sorted(_PRE_TOKENIZERS))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: each byte as a printable character (the spelling byte-level BPE vocabularies use)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


_BYTE_SPELLING = _bytes_to_unicode()
_BYTE_ALPHABET = frozenset(_BYTE_SPELLING.values())


def _in_byte_alphabet(token: str) -> bool:
    return set(token) <= _BYTE_ALPHABET


def _respelled(token: str) -> str:
    """A token some converters wrote as raw text ("é", "  ") in the byte alphabet the merges use."""
    if _in_byte_alphabet(token):
        return token
    return "".join(_BYTE_SPELLING[b] for b in token.encode("utf-8"))


def build_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """The byte-level BPE tokenizer described by a GGUF's `tokenizer.ggml.*` metadata."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFTokenizerError(
            _("this GGUF's tokenizer is {model}; only byte-level BPE ('gpt2': Llama 3, SmolLM2, Qwen2, Qwen3) "
              "is supported. Use the model's Hugging Face directory (with tokenizer.json) instead.").format(
                model=repr(model))
        )
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFTokenizerError(
            _("unknown pre-tokenizer tokenizer.ggml.pre={pre}; supported: {supported}").format(
                pre=repr(pre), supported=", ".join(SUPPORTED_PRE_TOKENIZERS))
        )
    rule = _PRE_TOKENIZERS[pre]

    tokens = [_respelled(t) for t in metadata["tokenizer.ggml.tokens"]]
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    tokenizer = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            ignore_merges=rule.ignore_merges,
        )
    )
    tokenizer.pre_tokenizer = rule.make()
    tokenizer.decoder = decoders.ByteLevel()

    # Control tokens (<|im_start|>, <|endoftext|>) and added words (<think>) must match whole, not be
    # cut into byte pieces. A "control" token outside the byte alphabet is a llama.cpp mislabel; adding
    # it would grow the vocabulary past the embedding size, so it is left out (as transformers does).
    raw_tokens = metadata["tokenizer.ggml.tokens"]
    types = metadata.get("tokenizer.ggml.token_type") or []
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(raw_tokens, types, strict=False)
        if kind == TOKEN_TYPE_CONTROL and _in_byte_alphabet(t)
    ]
    words = [
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(raw_tokens, types, strict=False)
        if kind == TOKEN_TYPE_USER_DEFINED and t in vocab
    ]
    if special:
        tokenizer.add_special_tokens(special)
    if words:
        tokenizer.add_tokens(words)

    post = _post_processor(metadata, raw_tokens)
    if post is not None:
        tokenizer.post_processor = post
    return tokenizer


def adds_bos(metadata: dict[str, Any]) -> bool:
    """Whether encoding prepends BOS: the file's flag, else llama.cpp's default for its pre-tokenizer
    (on for the Llama 3 group; Llama 3.x files often carry no flag)."""
    flag = metadata.get("tokenizer.ggml.add_bos_token")
    if flag is not None:
        return bool(flag)
    rule = _PRE_TOKENIZERS.get(metadata.get("tokenizer.ggml.pre", "default"))
    return bool(rule and rule.add_bos)


def adds_eos(metadata: dict[str, Any]) -> bool:
    return bool(metadata.get("tokenizer.ggml.add_eos_token", False))


def _post_processor(metadata: dict[str, Any], tokens: list[str]) -> processors.PostProcessor | None:
    """BOS/EOS added around encoded text when the file asks for it (Llama 3 adds <|begin_of_text|>)."""

    def added(wanted: bool, id_key: str) -> list[tuple[str, int]]:
        token_id = metadata.get(f"tokenizer.ggml.{id_key}")
        if not wanted or token_id is None:
            return []
        return [(tokens[int(token_id)], int(token_id))]

    bos, eos = added(adds_bos(metadata), "bos_token_id"), added(adds_eos(metadata), "eos_token_id")
    if not bos and not eos:
        return None
    bos_tokens, eos_tokens = [t for t, _ in bos], [t for t, _ in eos]
    single = [*bos_tokens, "$A", *eos_tokens]
    pair = [
        *bos_tokens,
        "$A:0",
        *eos_tokens,
        *(f"{t}:1" for t in bos_tokens),
        "$B:1",
        *(f"{t}:1" for t in eos_tokens),
    ]
    return processors.TemplateProcessing(
        single=" ".join(single),
        pair=" ".join(pair),
        special_tokens=list(dict(bos + eos).items()),
    )


def tokenizer_config(metadata: dict[str, Any], tokenizer: Tokenizer) -> dict[str, Any]:
    """The `tokenizer_config.json` dict: chat template, named special tokens, added tokens."""
    tokens = metadata["tokenizer.ggml.tokens"]

    def named(key: str) -> str | None:
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[int(token_id)] if token_id is not None and 0 <= int(token_id) < len(tokens) else None

    added = {
        str(index): {
            "content": token.content,
            "special": token.special,
            "normalized": token.normalized,
            "lstrip": token.lstrip,
            "rstrip": token.rstrip,
            "single_word": token.single_word,
        }
        for index, token in sorted(tokenizer.get_added_tokens_decoder().items())
    }
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": named("bos_token_id"),
        "eos_token": named("eos_token_id"),
        "pad_token": named("padding_token_id"),
        "unk_token": named("unknown_token_id"),
        "add_bos_token": adds_bos(metadata),
        "add_eos_token": adds_eos(metadata),
        "added_tokens_decoder": added,
        "clean_up_tokenization_spaces": False,
    }
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return config
