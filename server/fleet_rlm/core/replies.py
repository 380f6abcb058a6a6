"""Reading a model's reply in whatever unambiguous form it came, without asking the model again.

The chat adapter asks for field headers (``[[ ## code ## ]]``). Many models answer otherwise:
JSON with the fields (models tuned for JSON mode, often inside a ```json fence with a remark
after it), prose and one fenced code block (small local models), or XML-like tags. Each of those
says exactly what the fields are, so it is read as it is; only a reply that does not (two
different code blocks, no code at all) is refused, and the step loop answers it with format help.

The header form is tried first (``TranscriptAdapter.parse``), so the common path costs what it
always did; the other forms are tried only when it fails. Each parsed reply's form is noted for
whoever listens (``noting_reply_forms``): a run counts them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

import dspy
from dspy.adapters.utils import parse_value

# The forms, as counted per run (usage["reply_forms"]) and shown per step in the trace.
FIELDS: Final = "fields"  # the field headers and the closing marker, as asked
FIELDS_UNCLOSED: Final = "fields_unclosed"  # the headers without the closing marker
JSON: Final = "json"  # an object with the fields, bare or in a ```json fence, text after it ignored
XML: Final = "xml"  # <field>...</field> for each field
PROSE_CODE: Final = "prose_code"  # prose (the reasoning) and one Python code block (the code)
PLAIN_TEXT: Final = "plain_text"  # the whole reply as the one text field asked for (the extraction)
UNREADABLE: Final = "unreadable"  # none of these: the step loop sends format help

# A fenced block: its tag and its body (also what ``program.extract_code`` runs).
FENCE: Final = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
PYTHON_TAGS: Final = frozenset({"", "python", "py", "python3"})
_HEADER = re.compile(r"\[\[ ## \w+ ## \]\]")
_JSON_FENCE_OPENERS = ("```json", "```JSON", "```")
REASONING, CODE = "reasoning", "code"

_noted: ContextVar[list[str] | None] = ContextVar("fleet_reply_forms", default=None)


@contextmanager
def noting_reply_forms() -> Iterator[list[str]]:
    """Collect the form of every reply parsed in this context, the model calls' worker threads included."""
    forms: list[str] = []
    token = _noted.set(forms)
    try:
        yield forms
    finally:
        _noted.reset(token)


def note_form(form: str) -> None:
    forms = _noted.get()
    if forms is not None:
        forms.append(form)


def header_form(completion: str) -> str:
    return FIELDS if "[[ ## completed ## ]]" in completion else FIELDS_UNCLOSED


def read_other_forms(signature: type[dspy.Signature], completion: str) -> tuple[str, dict[str, Any]] | None:
    """The fields of a reply that has no usable headers, and its form; None when it is ambiguous."""
    outputs = signature.output_fields
    text = completion.strip()
    for form, read in ((JSON, _json_fields), (XML, _tagged_fields)):
        raw = read(list(outputs), text)
        if raw is not None:
            fields = _typed(signature, raw)
            return None if fields is None else (form, fields)
    if set(outputs) == {REASONING, CODE}:
        code = _single_python_block(text)
        if code is None:
            return None
        return PROSE_CODE, {REASONING: _without_headers(FENCE.sub("", text)), CODE: code}
    (name, field), *others = outputs.items()
    if not others and field.annotation is str and text:  # one text field asked for: the reply is it
        return PLAIN_TEXT, {name: _without_headers(text)}
    return None


def _json_fields(names: list[str], text: str) -> dict[str, Any] | None:
    """The object at the start of the reply or of a ```json fence (anything after it ignored), if
    it has every field."""
    start = text.find("{")
    if start < 0:
        return None
    before = text[:start].rstrip()
    if before and not before.endswith(_JSON_FENCE_OPENERS):
        return None  # prose first: that is a code block holding a dict, not a JSON reply
    try:
        found, _ = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None
    return found if isinstance(found, dict) and all(n in found for n in names) else None


def _tagged_fields(names: list[str], text: str) -> dict[str, Any] | None:
    fields = {}
    for name in names:
        opened, closing = text.find(f"<{name}>"), text.rfind(f"</{name}>")
        if opened < 0 or closing < opened:
            return None
        fields[name] = text[opened + len(name) + 2 : closing].strip()
    return fields


def _single_python_block(text: str) -> str | None:
    """The body of the reply's Python (or untagged) code block, when there is exactly one (repeats allowed)."""
    bodies = {body.strip("\n") for tag, body in FENCE.findall(text) if tag.lower() in PYTHON_TAGS}
    return bodies.pop() if len(bodies) == 1 else None


def _without_headers(text: str) -> str:
    return _HEADER.sub("", text).strip()


def _typed(signature: type[dspy.Signature], raw: dict[str, Any]) -> dict[str, Any] | None:
    """Each field's value as its annotation asks (a text field keeps a JSON value as JSON text)."""
    fields = {}
    for name, field in signature.output_fields.items():
        value = raw[name]
        if field.annotation is str and not isinstance(value, str):
            value = json.dumps(value, ensure_ascii=False)
        try:
            fields[name] = parse_value(value, field.annotation)
        except ValueError:
            return None
    return fields
