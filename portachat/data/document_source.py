"""What every pretraining source is: a fixed list of units of documents, read by index, with the one
rule that splits units into train and val (the parquet/text/jsonl sources and the synthetic
curriculum all use it)."""

from __future__ import annotations

from collections.abc import Iterator

from portachat.i18n import _


class DataError(ValueError):
    """Bad or missing data. The message says which file, what is wrong and what to do."""


class DocumentSource:
    """A fixed, ordered list of units; `read_unit(u)` returns the documents of unit `u`."""

    name: str = "source"
    num_units: int = 0

    def read_unit(self, u: int) -> list[str]:
        raise NotImplementedError

    def iter_documents(self, limit_chars: int | None = None) -> Iterator[str]:
        """All documents in order; with `limit_chars`, stop after that many characters (the last is cut)."""
        remaining = limit_chars
        for u in range(self.num_units):
            for doc in self.read_unit(u):
                if remaining is not None:
                    if remaining <= 0:
                        return
                    doc = doc[:remaining]
                    remaining -= len(doc)
                yield doc

    def _check_unit(self, u: int) -> None:
        if not 0 <= u < self.num_units:
            raise IndexError(f"unit {u} out of range for {self.name} ({self.num_units} units)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, num_units={self.num_units})"


def split_range(n: int, split: str, val_fraction: float, what: str) -> range:
    """The last `val_fraction` of n units (at least 1) are val, the rest train."""
    if n < 2:
        raise DataError(
            _("{what} has only {n} unit(s) of data, too little to split into train and val; "
              "give at least 2 documents (better: thousands)").format(what=what, n=n)
        )
    num_val = min(n - 1, max(1, round(n * val_fraction)))
    return range(n - num_val, n) if split == "val" else range(0, n - num_val)


def check_split_args(split: str, val_fraction: float) -> None:
    if split not in ("train", "val"):
        raise DataError(_("split must be 'train' or 'val', got {split}").format(split=repr(split)))
    if not 0.0 < val_fraction < 1.0:
        raise DataError(_("val_fraction must be between 0 and 1 (exclusive), got {val_fraction}").format(
            val_fraction=val_fraction))
