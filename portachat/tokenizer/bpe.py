"""Byte-level BPE tokenizer: training, encoding, saving as a Hugging Face tokenizer directory.

The heavy lifting is HF `tokenizers` (Rust). This wrapper pins down portachat's choices:
Qwen2's split pattern (one that llama.cpp knows by name, so GGUF exports tokenize the same
there; it splits numbers into single digits), the chat special tokens, and a saved form that
`transformers.AutoTokenizer.from_pretrained(dir)` loads with no remote code.

BOS: our models are trained on documents that start with <|bos|>, so the saved tokenizer adds it
itself (a TemplateProcessing post-processor plus `add_bos_token: true`): transformers, vLLM and
llama.cpp's converter then feed the model what it was trained on. portachat's own `encode` never
adds it (callers say when they want it, `prepend_bos`), so loading a checkpoint saved before this
rule, or after it, gives the same ids; the chat template writes bos_token once, and runtimes encode
its output without adding another (transformers' apply_chat_template, vLLM's chat, llama.cpp's
server strips a leading bos_token when its vocabulary adds one).

Special tokens in ordinary text: `encode` treats its input as plain text, so a literal
"<|bos|>" typed by a user becomes several ordinary tokens, never the control token (the same
rule as tiktoken's encode_ordinary, which nanochat uses). Control tokens enter a sequence only
through `bos_id`/`special_ids`, i.e. through `chat.render_conversation`. The saved tokenizer.json
keeps HF's default (specials are parsed from text), because HF's chat template relies on it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer

from portachat.i18n import _
from portachat.storage.atomic import write_text_atomic
from portachat.tokenizer.errors import TokenizerConfigError, TokenizerFormatError, TokenizerNotFoundError
from portachat.tokenizer.template import CHAT_TEMPLATE

# Qwen2's pattern, character for character: llama.cpp and transformers' GGUF loader know it as the
# pre-tokenizer "qwen2", so an exported GGUF splits text exactly as we do. Numbers split into single
# digits (nanochat found that longer digit groups waste vocabulary at small sizes).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_NAME = "qwen2"
# Split patterns llama.cpp knows -> its pre-tokenizer name (tokenizer.ggml.pre).
KNOWN_PRE_TOKENIZERS = {
    SPLIT_PATTERN: PRE_TOKENIZER_NAME,
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ): "llama-bpe",
}

BOS = "<|bos|>"
USER_START, USER_END = "<|user_start|>", "<|user_end|>"
ASSISTANT_START, ASSISTANT_END = "<|assistant_start|>", "<|assistant_end|>"
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
OUTPUT_START, OUTPUT_END = "<|output_start|>", "<|output_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (
    BOS,
    USER_START,
    USER_END,
    ASSISTANT_START,
    ASSISTANT_END,
    PYTHON_START,
    PYTHON_END,
    OUTPUT_START,
    OUTPUT_END,
)
EOS = ASSISTANT_END  # generation stops at the end of the assistant's turn
PAD = BOS  # never a training target inside chat data, so masking pads never masks eos
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS) + 1  # all bytes, all specials, at least one merge

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
DEFAULT_MODEL_MAX_LENGTH = 2048


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable char ByteLevel uses for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shift)
            shift += 1
    return {c: b for b, c in chars.items()}


class Tokenizer:
    """portachat's tokenizer: a byte-level BPE with the chat special tokens."""

    def __init__(self, hf_tokenizer: HFTokenizer) -> None:
        # Private copy: the encode-specials-as-text switch below must not leak to the caller's object.
        self._hf = HFTokenizer.from_str(hf_tokenizer.to_str())
        self._hf.encode_special_tokens = True
        added = {tok.content: tok for tok in self._hf.get_added_tokens_decoder().values()}
        missing = [t for t in SPECIAL_TOKENS if t not in added or not added[t].special]
        if missing:
            raise TokenizerFormatError(
                _("tokenizer lacks portachat's special tokens {missing}; "
                  "train one with `portachat tokenizer train` instead of reusing a foreign tokenizer.json").format(
                    missing=missing)
            )
        self.special_ids: dict[str, int] = {t: self._hf.token_to_id(t) for t in SPECIAL_TOKENS}
        self.bos_id: int = self.special_ids[BOS]
        self.eos_id: int = self.special_ids[EOS]
        # Set on every load, so re-saving (or exporting) a checkpoint from before this rule fixes its files.
        self._hf.post_processor = bos_post_processor(self.bos_id)
        self._token_bytes: torch.Tensor | None = None
        self._fingerprint: str | None = None

    # ---- loading and saving -------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load from a directory holding tokenizer.json (or from the tokenizer.json file itself)."""
        path = Path(path)
        file = path if path.is_file() else path / TOKENIZER_FILE
        if not file.is_file():
            raise TokenizerNotFoundError(
                _("no tokenizer at {path}: expected a directory containing {file} "
                  "(create one with `portachat tokenizer train`)").format(path=path, file=TOKENIZER_FILE)
            )
        try:
            hf = HFTokenizer.from_file(str(file))
        except Exception as exc:  # the Rust side raises a bare Exception on bad JSON
            raise TokenizerFormatError(_("{path} is not a valid tokenizers JSON file: {error}").format(
                path=file, error=exc)) from exc
        return cls(hf)

    def save(self, directory: str | Path, model_max_length: int = DEFAULT_MODEL_MAX_LENGTH) -> None:
        """Write tokenizer.json and tokenizer_config.json (with the chat template) into `directory`.

        `model_max_length` should be the model's sequence length when saving next to a checkpoint.
        Each file is written to a temp file and renamed, so a crash never leaves a half-written one.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(directory / TOKENIZER_FILE, self._hf.to_str(pretty=True))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in (BOS, EOS)],
            "add_bos_token": True,  # as the post-processor in tokenizer.json does (see the module doc)
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": int(model_max_length),
            "chat_template": CHAT_TEMPLATE,
            "portachat_fingerprint": self.fingerprint(),
            "portachat_pre_tokenizer": self.pre_tokenizer_name(),  # llama.cpp's name, None if it has none
        }
        write_text_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2, ensure_ascii=False) + "\n")

    # ---- vocabulary ----------------------------------------------------------------------

    @property
    def end_ids(self) -> list[int]:
        """Every token that ends a generation: <|assistant_end|> (the end of a reply; eos, first) and
        <|bos|> (a model that writes it has ended its document and started another)."""
        return [self.eos_id, self.bos_id]

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, token_id: int) -> str:
        token = self._hf.id_to_token(token_id)
        if token is None:
            raise IndexError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")
        return token

    def token_to_id(self, token: str) -> int:
        token_id = self._hf.token_to_id(token)
        if token_id is None:
            raise KeyError(f"{token!r} is not a token of this vocabulary")
        return token_id

    def token_bytes(self) -> torch.Tensor:
        """int64 [vocab_size]: UTF-8 bytes each token stands for, 0 for special tokens (for bits-per-byte)."""
        if self._token_bytes is None:
            byte_of = _byte_decoder()
            specials = set(self.special_ids.values())
            counts = []
            for i in range(self.vocab_size):
                token = self._hf.id_to_token(i)
                if i in specials or token is None:
                    counts.append(0)
                else:  # each ByteLevel char is exactly one raw byte
                    counts.append(sum(1 if c in byte_of else len(c.encode("utf-8")) for c in token))
            self._token_bytes = torch.tensor(counts, dtype=torch.int64)
        return self._token_bytes.clone()

    def split_pattern(self) -> str | None:
        """The regex of the Split pre-tokenizer (None when the tokenizer has no such step)."""
        pre = json.loads(self._hf.to_str()).get("pre_tokenizer") or {}
        steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
        for step in steps:
            if step.get("type") == "Split":
                return (step.get("pattern") or {}).get("Regex")
        return None

    def pre_tokenizer_name(self) -> str | None:
        """llama.cpp's name for this tokenizer's split rule (e.g. "qwen2"), None if llama.cpp has none."""
        return KNOWN_PRE_TOKENIZERS.get(self.split_pattern() or "")

    def fingerprint(self) -> str:
        """Short hash of what decides the ids (vocab, merges, specials, split), to catch mismatches."""
        if self._fingerprint is None:
            state = json.loads(self._hf.to_str())
            model = state["model"]
            merges = [m.split(" ") if isinstance(m, str) else list(m) for m in model["merges"]]
            identity = {
                "vocab": model["vocab"],
                "merges": merges,
                "added": sorted((t["id"], t["content"]) for t in state["added_tokens"]),
                "pre_tokenizer": state["pre_tokenizer"],
            }
            blob = json.dumps(identity, sort_keys=True, ensure_ascii=False).encode("utf-8")
            self._fingerprint = hashlib.sha256(blob).hexdigest()[:16]
        return self._fingerprint

    # ---- encoding ------------------------------------------------------------------------

    def encode(self, text: str, prepend_bos: bool = False) -> list[int]:
        ids = self._hf.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if prepend_bos else ids

    def encode_batch(self, texts: list[str], prepend_bos: bool = False) -> list[list[int]]:
        """Encode many texts in parallel in Rust (skipping offsets when this tokenizers version can)."""
        batch = getattr(self._hf, "encode_batch_fast", self._hf.encode_batch)
        encodings = batch(list(texts), add_special_tokens=False)
        if prepend_bos:
            return [[self.bos_id, *e.ids] for e in encodings]
        return [e.ids for e in encodings]

    def decode(self, ids: list[int]) -> str:
        """Text for `ids`; special tokens appear as their literal strings."""
        return self._hf.decode(list(ids), skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, fingerprint={self.fingerprint()})"


def bos_post_processor(bos_id: int) -> processors.TemplateProcessing:
    """What `tokenizer(text)` adds around encoded text in other runtimes: one <|bos|> before each
    sequence (a pair is two documents, each led by its own bos, as in pretraining)."""
    return processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos_id)]
    )


def _new_bpe() -> HFTokenizer:
    tok = HFTokenizer(models.BPE(byte_fallback=False, unk_token=None, fuse_unk=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = None
    return tok


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 32768,
    max_chars: int = 2_000_000_000,
    doc_cap: int = 10_000,
    verbose: bool = True,
) -> Tokenizer:
    """Train a byte-level BPE on `texts`, reading at most `max_chars` characters in all and
    cropping each document to its first `doc_cap` characters (long documents would otherwise
    dominate the pair counts)."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise TokenizerConfigError(
            _("vocab_size={n} is too small: it must exceed 256 bytes + {special} special tokens; "
              "use at least {least} (32768 is the usual choice)").format(
                n=vocab_size, special=len(SPECIAL_TOKENS), least=MIN_VOCAB_SIZE)
        )
    if max_chars <= 0 or doc_cap <= 0:
        raise TokenizerConfigError(_("max_chars ({max_chars}) and doc_cap ({doc_cap}) must be positive").format(
            max_chars=max_chars, doc_cap=doc_cap))

    seen = {"docs": 0, "chars": 0}

    def capped() -> Iterator[str]:
        for text in texts:
            if not isinstance(text, str):
                raise TokenizerConfigError(_("training texts must be str, got {type}").format(type=type(text).__name__))
            doc = text[: min(doc_cap, max_chars - seen["chars"])]
            if not doc:
                continue
            seen["docs"] += 1
            seen["chars"] += len(doc)
            yield doc
            if seen["chars"] >= max_chars:
                return

    if verbose:
        print(
            _("tokenizer: training BPE, vocab_size={vocab_size} max_chars={max_chars} doc_cap={doc_cap}").format(
                vocab_size=f"{vocab_size:,}", max_chars=f"{max_chars:,}", doc_cap=f"{doc_cap:,}"),
            flush=True,
        )
    start = time.perf_counter()
    hf = _new_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(SPECIAL_TOKENS),
    )
    hf.train_from_iterator(capped(), trainer=trainer)
    if seen["chars"] == 0:
        raise TokenizerConfigError(_("no training text: the iterable gave no non-empty documents"))
    tokenizer = Tokenizer(hf)
    if verbose:
        elapsed = time.perf_counter() - start
        note = "" if tokenizer.vocab_size == vocab_size else _(" (too little text to learn more merges)")
        print(
            _("tokenizer: trained on {docs} documents, {chars} chars in {seconds}s, vocab {vocab}{note}").format(
                docs=f"{seen['docs']:,}", chars=f"{seen['chars']:,}", seconds=f"{elapsed:.1f}",
                vocab=f"{tokenizer.vocab_size:,}", note=note),
            flush=True,
        )
    return tokenizer
