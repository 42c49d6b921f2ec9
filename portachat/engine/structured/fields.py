"""Request fields that constrain the output, read into one StructuredSpec (or None):

- OpenAI's `response_format`: `{"type": "json_object"}` or `{"type": "json_schema", "json_schema":
  {"name", "schema", "strict"}}` (`text` = no constraint);
- vLLM's `structured_outputs`: `{"json" | "regex" | "choice" | "grammar" | "json_object": ...}`, with
  an optional `whitespace_pattern` for JSON;
- vLLM's older spellings `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` (+
  `guided_whitespace_pattern`).

At most one of them per request. A malformed field is a StructuredError naming it (the server
answers 400 with it as `param`; `portachat generate` names the input line); a well-formed constraint
the grammar library cannot compile fails when the engine admits the request, naming the part it
cannot handle. Fields are read from any object with these attributes (a request model) or a dict
(a batch row).
"""

from __future__ import annotations

import json
from typing import Any

from portachat.engine.structured.spec import StructuredError, StructuredSpec
from portachat.i18n import _

_KINDS = ("json", "regex", "choice", "grammar", "json_object")
FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
          "guided_whitespace_pattern")


def _spec(kind: str, value: Any, param: str, whitespace: Any = None) -> StructuredSpec:
    if kind == "json" and isinstance(value, str):  # vLLM takes the schema as JSON text too
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise StructuredError(_("{param} is not valid JSON ({error}).").format(param=param, error=exc), param) from None
    return StructuredSpec(kind, value, whitespace, param=param)  # type: ignore[arg-type]


def _response_format(fmt: Any) -> StructuredSpec | None:
    if not isinstance(fmt, dict):
        raise StructuredError(_('response_format must be an object such as {"type": "json_object"}.'),
                              "response_format")
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return _spec("json_object", None, "response_format")
    if kind == "json_schema":
        body = fmt.get("json_schema")
        if not isinstance(body, dict):
            raise StructuredError(_("response_format.json_schema must be an object with 'name' and 'schema'."),
                                  "response_format.json_schema")
        schema = body.get("schema", {})
        return _spec("json", schema if schema != {} else True, "response_format.json_schema.schema")
    raise StructuredError(_("response_format type {kind} is not supported (text, json_object, json_schema).").format(
        kind=repr(kind)), "response_format.type")


def _structured_outputs(fields: Any) -> StructuredSpec | None:
    if not isinstance(fields, dict):
        raise StructuredError(_('structured_outputs must be an object such as {"regex": "..."}.'),
                              "structured_outputs")
    given = [k for k in _KINDS if fields.get(k) not in (None, False)]
    if len(given) > 1:
        raise StructuredError(_("structured_outputs takes one constraint, got {kinds}.").format(kinds=", ".join(given)),
                              "structured_outputs")
    if not given:
        return None
    kind = given[0]
    value = None if kind == "json_object" else fields[kind]
    return _spec(kind, value, f"structured_outputs.{kind}", fields.get("whitespace_pattern"))


def structured_spec(req: Any) -> StructuredSpec | None:
    """The output constraint of a request (chat or completions model, or a dict), or None."""
    get = req.get if isinstance(req, dict) else lambda name: getattr(req, name, None)
    found: list[StructuredSpec] = []
    if get("response_format") is not None:
        spec = _response_format(get("response_format"))
        found += [spec] if spec else []
    if get("structured_outputs") is not None:
        spec = _structured_outputs(get("structured_outputs"))
        found += [spec] if spec else []
    for kind in ("json", "regex", "choice", "grammar"):
        value = get(f"guided_{kind}")
        if value is not None:
            found.append(_spec(kind, value, f"guided_{kind}", get("guided_whitespace_pattern")))
    if len(found) > 1:
        names = ", ".join(s.param.split(".")[0] for s in found)
        raise StructuredError(_("Only one output constraint per request (got {names}).").format(names=names),
                              found[1].param)
    return found[0] if found else None
