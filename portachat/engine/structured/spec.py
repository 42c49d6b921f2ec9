"""What a request constrains its output to: a JSON schema, any JSON object, a regex, one of some
strings, or a grammar (Lark, or llama.cpp's GBNF). Plain data, no grammar library: the server and
`types.py` build these cheaply; `compile.py` turns one into the library's grammar."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from portachat.engine.errors import EngineError
from portachat.i18n import _

Kind = Literal["json", "json_object", "regex", "choice", "grammar"]
KINDS: tuple[str, ...] = ("json", "json_object", "regex", "choice", "grammar")


class StructuredError(EngineError):
    """A constraint the grammar library cannot compile; `param` names the request field it came from."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, kind="invalid")
        self.param = param


@dataclass(frozen=True)
class StructuredSpec:
    kind: Kind
    value: Any = None  # json: the schema (dict or True); regex/grammar: the text; choice: list[str]
    whitespace_pattern: str | None = None  # json: the whitespace allowed between tokens (default: one space)
    param: str = "structured_outputs"  # the request field it came from, named in errors

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise StructuredError(_("{param}: {problem}").format(param=self.param, problem=problem), self.param)


def _problem(spec: StructuredSpec) -> str | None:
    if spec.kind not in KINDS:
        return _("unknown constraint kind {kind} (one of {kinds})").format(kind=repr(spec.kind), kinds=", ".join(KINDS))
    v = spec.value
    if spec.kind == "json" and not (isinstance(v, dict) or v is True):
        return _("a JSON schema must be an object, got {type}").format(type=type(v).__name__)
    if spec.kind in ("regex", "grammar") and (not isinstance(v, str) or not v.strip()):
        return _("the {kind} must be a non-empty string").format(kind=spec.kind)
    if spec.kind == "choice" and (
        not isinstance(v, list | tuple) or not v or not all(isinstance(c, str) and c for c in v)
    ):
        return _("choice must be a non-empty list of non-empty strings")
    if spec.whitespace_pattern is not None and not isinstance(spec.whitespace_pattern, str):
        return _("whitespace_pattern must be a string")
    return None
