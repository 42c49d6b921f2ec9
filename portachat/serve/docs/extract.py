"""Text out of a document's bytes: plain text and Markdown (UTF-8, else GB18030 as older Chinese files
are), PDF (pypdf), Word .docx (python-docx) and HTML (the stdlib parser, scripts and styles dropped).
The type comes from the file name, else from the first bytes."""

from __future__ import annotations

import io
from html.parser import HTMLParser
from pathlib import PurePath

from portachat.i18n import _

SUPPORTED_TYPES = ("txt", "md", "pdf", "docx", "html")
_SUFFIXES = {".txt": "txt", ".text": "txt", ".md": "md", ".markdown": "md", ".pdf": "pdf", ".docx": "docx",
             ".html": "html", ".htm": "html"}


class ExtractError(ValueError):
    """A file whose text cannot be read; `code` is OpenAI's last_error code (unsupported_file, invalid_file)."""

    def __init__(self, message: str, code: str = "invalid_file") -> None:
        super().__init__(message)
        self.code = code


def file_type(filename: str, data: bytes) -> str:
    kind = _SUFFIXES.get(PurePath(filename).suffix.lower())
    if kind is not None:
        return kind
    head = data[:512].lstrip()
    if head.startswith(b"%PDF"):
        return "pdf"
    if head[:200].lower().startswith((b"<!doctype html", b"<html")):
        return "html"
    if head.startswith(b"PK"):
        raise ExtractError(_("{file}: a zip archive with an unknown suffix; name Word files *.docx").format(
            file=filename),
                           code="unsupported_file")
    try:
        _decode(data, filename)
    except ExtractError:
        raise ExtractError(_("{file}: unsupported file type (supported: {types})").format(
            file=filename, types=", ".join(SUPPORTED_TYPES)),
                           code="unsupported_file") from None
    return "txt"


def _decode(data: bytes, filename: str) -> str:
    for encoding in ("utf-8-sig", "gb18030"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    raise ExtractError(_("{file}: not UTF-8 or GB18030 text").format(file=filename))


# pypdf and python-docx parse what a client uploaded: besides their own error types they raise
# whatever a malformed file provokes (lxml's XMLSyntaxError, pypdf's LimitReachedError for a stream
# past its decompression limit, AttributeError, RecursionError, ...). Any of them means "this file
# cannot be read": the file is marked failed with that reason, never a 500.
def _pdf(data: bytes, filename: str) -> str:
    from pypdf import PdfReader  # deferred: optional package (a PDF upload needs it)

    try:
        reader = PdfReader(io.BytesIO(data))
        return "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except Exception as exc:  # noqa: BLE001 - see above
        raise ExtractError(_("{file}: not a readable PDF ({error})").format(
            file=filename, error=f"{type(exc).__name__}: {str(exc)[:300]}")) from None


def _docx(data: bytes, filename: str) -> str:
    import docx  # deferred: optional package (a .docx upload needs it)

    try:
        document = docx.Document(io.BytesIO(data))
        lines = [p.text for p in document.paragraphs]
        for table in document.tables:
            lines += ["\t".join(cell.text for cell in row.cells) for row in table.rows]
    except Exception as exc:  # noqa: BLE001 - see above
        raise ExtractError(_("{file}: not a readable .docx file ({error})").format(
            file=filename, error=f"{type(exc).__name__}: {str(exc)[:300]}")) from None
    return "\n".join(lines)


class _HTMLText(HTMLParser):
    _SKIP = {"script", "style", "noscript", "template", "head"}
    _BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article",
               "blockquote", "pre", "table", "ul", "ol", "title"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in self._SKIP:
            self.skipping += 1
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self._BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def _html(data: bytes, filename: str) -> str:
    parser = _HTMLText()
    parser.feed(_decode(data, filename))
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


def extract_text(filename: str, data: bytes) -> str:
    """The document's text; ExtractError for an unsupported type, an unreadable file or no text at all."""
    kind = file_type(filename, data)
    if kind == "pdf":
        text = _pdf(data, filename)
    elif kind == "docx":
        text = _docx(data, filename)
    elif kind == "html":
        text = _html(data, filename)
    else:
        text = _decode(data, filename)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise ExtractError(_("{file}: no text found (a scanned PDF needs OCR first)").format(file=filename))
    return text
