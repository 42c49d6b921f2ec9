"""`portachat docs add|list|search|remove`: the document collections the server searches, managed
from the shell (same store under PORTACHAT_HOME/docs; the embedding model loads in this process)."""

from __future__ import annotations

import argparse

from portachat.commands.common import EPILOG, flag, later, positive_int
from portachat.i18n import _


def register(sub) -> None:
    p = sub.add_parser("docs", help=_("document collections for grounded chat (add, list, search, remove)"),
                       epilog=EPILOG,
                       description=_("Manage the document collections `portachat serve` searches (/v1/vector_stores, "
                                   "chat requests with \"documents\"): txt, md, pdf, docx and html files, Chinese "
                                   "and English, kept under $PORTACHAT_HOME/docs."))
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    def common(q: argparse.ArgumentParser, model: bool) -> None:
        flag(q, "--store-dir", default=None, help=_("the document store (default: $PORTACHAT_HOME/docs)"))
        if model:
            flag(q, "--embedding-model", default=None, metavar="PATH",
                 help=_("embedding model directory (e.g. all-MiniLM-L6-v2); the collection's model"))
            flag(q, "--embedding-name", default=None,
                 help=_("the name the collection records for the model (default: the collection's, else the folder "
                      "name); the server checks it against its --embedding-model"))
            flag(q, "--device", default=None, help=_("cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)"))
            flag(q, "--dtype", default=None, help=_("bf16|fp16|fp32 (default: the device's best for inference)"))

    q = actions.add_parser("add", help=_("add files or folders to a collection (made if new)"))
    q.add_argument("paths", nargs="+", metavar="PATH")
    flag(q, "--collection", required=True, help=_("collection name or id"))
    common(q, model=True)
    q.set_defaults(func=later("docs", "cmd_add"))

    q = actions.add_parser("list", help=_("collections, or the files of one"))
    flag(q, "--collection", default=None, help=_("list this collection's files"))
    flag(q, "--json", action="store_true")
    common(q, model=False)
    q.set_defaults(func=later("docs", "cmd_list"))

    q = actions.add_parser("search", help=_("the passages nearest a query"))
    q.add_argument("query")
    flag(q, "--collection", required=True, help=_("collection name or id"))
    q.add_argument("--max-num-results", "--max_num_results", "-k", type=positive_int, default=5, help=_("passages to show (default 5)"))
    flag(q, "--json", action="store_true")
    common(q, model=True)
    q.set_defaults(func=later("docs", "cmd_search"))

    q = actions.add_parser("remove", help=_("remove files from a collection, or the whole collection"))
    q.add_argument("files", nargs="*", metavar="FILE", help=_("file names or ids (none: the whole collection)"))
    flag(q, "--collection", required=True, help=_("collection name or id"))
    common(q, model=False)
    q.set_defaults(func=later("docs", "cmd_remove"))
