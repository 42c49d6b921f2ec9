"""`portachat docs add|list|search|remove`: the document collections the server searches, managed

What runs. The flags are in commands/docs.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from portachat.device import get_device
from portachat.engine.embeddings import load_embedding_model
from portachat.i18n import _
from portachat.model.source import display_name, resolve
from portachat.serve.docs import DocStore, StoreError
from portachat.serve.docs.ingest import EMBED_BATCH, attach_file, search, text_embedder

_SUFFIXES = {".txt", ".text", ".md", ".markdown", ".pdf", ".docx", ".html", ".htm"}


def _fail(message: object) -> NoReturn:
    """Stop with `portachat docs: error: MESSAGE` (exit status 1, as argparse's own errors read)."""
    raise SystemExit("portachat docs: " + _("error: {message}").format(message=message))


def _store(args: argparse.Namespace):
    return DocStore(args.store_dir) if args.store_dir else DocStore()


def _model(args: argparse.Namespace, recorded: str | None):
    """The embedding model, named as the collection records it (so the server and the CLI share collections)."""
    if not args.embedding_model:
        _fail(_("give --embedding-model PATH (an embedding model directory, e.g. all-MiniLM-L6-v2; the server's "
                "--model NAME=PATH for it names the same directory)"))
    path = resolve(args.embedding_model).path
    print("[portachat] " + _("loading {path} ...").format(path=path), file=sys.stderr, flush=True)
    embedder = load_embedding_model(path, get_device(kind=args.device), args.dtype)
    # A package's "model" folder says nothing: name it after the folder above.
    name = display_name(path.parent if path.name == "model" else path)
    return text_embedder(embedder, args.embedding_name or recorded or name)


def _collection(store, name: str, create: bool = False) -> dict:
    row = store.find_store(name)
    if row is None and create:
        row = store.create_store(name)
        print("[portachat] " + _("created collection {name} ({id})").format(name=name, id=row["id"]), file=sys.stderr)
    if row is None:
        names = ", ".join(r["name"] or r["id"] for r in store.stores()) or _("none yet")
        _fail(_("no collection '{name}' (collections: {names}); make one with "
                "`portachat docs add FILE --collection NAME`").format(name=name, names=names))
    return row


def _files(paths: list[str]) -> list[Path]:
    out = []
    for text in paths:
        p = Path(text).expanduser()
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in _SUFFIXES)
        elif p.is_file():
            out.append(p)
        else:
            _fail(_("{path}: no such file or directory").format(path=text))
    if not out:
        _fail(_("no documents ({suffixes}) under {paths}").format(suffixes=", ".join(sorted(_SUFFIXES)),
                                                                 paths=" ".join(paths)))
    return out


def cmd_add(args: argparse.Namespace) -> int:
    tty = sys.stderr.isatty()
    lead = "\r" if tty else ""  # a terminal's progress line is rewritten in place
    files = _files(args.paths)
    store = _store(args)
    row = _collection(store, args.collection, create=True)
    model = _model(args, row["embedding_model"])
    failed = 0
    for n, path in enumerate(files, 1):
        # Adding a file name the collection already has replaces it (after the new one is in).
        older = [f["file_id"] for f in store.store_files(row["id"]) if store.file(f["file_id"])["filename"] == path.name]
        meta = store.add_file(path.name, path.read_bytes())

        def progress(done: int, total: int, name: str = path.name, n: int = n) -> None:
            if tty or total > EMBED_BATCH:  # a long file shows progress even in a log
                print(lead + "[portachat] " + _("{n}/{files} {name}: {done}/{total} chunks embedded").format(
                    n=n, files=len(files), name=name, done=done, total=total),
                      end="" if tty else "\n", file=sys.stderr, flush=True)

        result = attach_file(store, row["id"], meta["id"], model, progress)
        if result["status"] != "completed":
            failed += 1
            store.delete_file(meta["id"])
            print("[portachat] " + _("skipped {path}: {error}").format(
                path=path, error=json.loads(result["last_error"])["message"]), file=sys.stderr)
        else:
            for file_id in older:
                _detach(store, row["id"], file_id)
            print(lead + "[portachat] " + _("{n}/{files} {name}: {chunks} chunks ({id})").format(
                n=n, files=len(files), name=path.name, chunks=result["chunks"], id=meta["id"]),
                  file=sys.stderr, flush=True)
    print(_("{added} added to '{collection}' ({id}), {failed} skipped").format(
        added=len(files) - failed, collection=args.collection, id=row["id"], failed=failed))
    return 1 if failed == len(files) else 0


def cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.collection:
        row = _collection(store, args.collection)
        files = [{**store.file(f["file_id"]), **f} for f in store.store_files(row["id"])]
        if args.json:
            print(json.dumps(files, ensure_ascii=False, indent=2))
        for f in [] if args.json else files:
            print(_("{id}  {status:9s}  {chunks:5d} chunks  {filename}").format(
                id=f["file_id"], status=f["status"], chunks=f["chunks"], filename=f["filename"]))
        return 0
    rows = [{**r, "file_counts": store.file_counts(r["id"])} for r in store.stores()]
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=2))
        return 0
    if not rows:
        print(_("no collections yet: `portachat docs add FILE --collection NAME --embedding-model PATH`"))
    for r in rows:
        print(_("{id}  {name:20s}  {files:4d} files  {model}").format(
            id=r["id"], name=r["name"] or "-", files=r["file_counts"]["completed"], model=r["embedding_model"] or "-"))
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    store = _store(args)
    row = _collection(store, args.collection)
    model = _model(args, row["embedding_model"])
    try:
        hits = search(store, row["id"], args.query, model, args.max_num_results)
    except StoreError as exc:
        _fail(exc)
    if args.json:
        print(json.dumps([h.__dict__ for h in hits], ensure_ascii=False, indent=2))
        return 0
    for i, h in enumerate(hits, 1):
        text = " ".join(h.text.split())
        print(_("[{i}] {score:.3f}  {filename} (part {part}, chars {start}-{end})").format(
            i=i, score=h.score, filename=h.filename, part=h.chunk_index + 1, start=h.start, end=h.end)
              + f"\n    {text[:300]}{'...' if len(text) > 300 else ''}")
    if not hits:
        print(_("no passages (is the collection empty?)"))
    return 0


def _detach(store, store_id: str, file_id: str) -> None:
    store.remove_file(store_id, file_id)
    if not any(r["file_id"] == file_id for s in store.stores() for r in store.store_files(s["id"])):
        store.delete_file(file_id)  # in no collection any more


def cmd_remove(args: argparse.Namespace) -> int:
    store = _store(args)
    row = _collection(store, args.collection)
    if not args.files:
        store.delete_store(row["id"])
        print(_("removed collection '{collection}' ({id})").format(collection=args.collection, id=row["id"]))
        return 0
    attached = {f["file_id"]: store.file(f["file_id"]) for f in store.store_files(row["id"])}
    for name in args.files:
        ids = [i for i, f in attached.items() if name in (i, f["filename"])]
        if not ids:
            _fail(_("'{name}' is not in '{collection}' (see `portachat docs list --collection {collection}`)").format(
                name=name, collection=args.collection))
        for file_id in ids:
            _detach(store, row["id"], file_id)
            print(_("removed {filename} ({id}) from '{collection}'").format(
                filename=attached[file_id]["filename"], id=file_id, collection=args.collection))
    return 0
