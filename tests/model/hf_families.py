"""Tiny Hugging Face model directories of the Llama, Qwen2 and Qwen3 families, built locally with
`transformers` (config -> random model -> save_pretrained) plus a small byte-level BPE tokenizer
trained here and a ChatML chat template, as real checkpoints of these families ship them."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 320
WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly gnomes at dawn; "
    "numbers like 12, 345 and 6789 appear too. Hello, how are you today? I am fine, thank you!"
)


def train_bpe() -> Tokenizer:
    """A byte-level BPE (GPT-2 alphabet, as SmolLM2's and Qwen's) with ChatML control tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    texts = [" ".join(WORDS.split()[i:] + WORDS.split()[:i]) for i in range(40)]
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, directory: Path, chat_template: str | None = CHATML) -> None:
    import transformers

    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(str(directory))


def hf_config(family: str, **overrides):
    import transformers

    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    common.update(overrides)
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}
    return cls[family](**common)


def randomize_(model: torch.nn.Module, seed: int = 0, std: float = 0.3) -> None:
    """Every weight random (norms around 1), so parity exercises all of them, biases included."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(torch.randn(p.shape, generator=generator) * std + base)


def make_hf_dir(directory: Path, family: str, seed: int = 0, tokenizer: Tokenizer | None = None, **overrides):
    """Save a tiny random `family` model with tokenizer into `directory`; returns the HF model (fp32, eval)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(family, **overrides), dtype=torch.float32)
    randomize_(model, seed)
    model.eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    save_tokenizer(tokenizer or train_bpe(), directory)
    return model
