"""What the emitter hands its channels: one redaction of the caller's and the model's text,
shared by the observers, the JSONL trace and the span."""

from __future__ import annotations

import base64
import io
import json
import time
import urllib.parse
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfault import Guard
from toolfault._call import _Call, _new_call_id, own_call_id
from toolfault._errors import Outcome
from toolfault._result import FailureInfo, new_result
from toolfault._trace import CallEvent, _dumps

#: Registered secrets (the guard is given them) and credential shapes nobody registered
#: (each with the part of it that is secret).
_REGISTERED = ("Tr0ub4dor&3-horse", "tok_live_9f8e7d6c5b4a3210", 'pa"ss\\wörd {x} 9!')
_SHAPES = {"sk-proj-Qw3rTy8uIoPaSdFgHjKl0987": "sk-proj-Qw3rTy8uIoPaSdFgHjKl0987",
           "AKIAZ7Q4LMNB2XCV8RT6": "AKIAZ7Q4LMNB2XCV8RT6",
           "ghp_Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7c": "ghp_Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7c",
           "Bearer 9fQ2-zX81ab.Qr7Tt": "9fQ2-zX81ab.Qr7Tt",
           "postgres://app:Zq7Pw-url-4411@db.internal/app": "Zq7Pw-url-4411",
           "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzaGFwZSJ9.c2hhcGUtc2lnbmF0dXJl":
               "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzaGFwZSJ9.c2hhcGUtc2lnbmF0dXJl"}


def _split(value: str) -> str:
    third = max(1, len(value) // 3)
    return f"{value[:third]}\n{value[third:2 * third]}\r\n  {value[2 * third:]}"


_FORMS = {
    "plain": lambda v: v,
    "base64": lambda v: base64.b64encode(f"user:{v}".encode()).decode(),
    "base64url": lambda v: base64.urlsafe_b64encode(v.encode()).decode().rstrip("="),
    "url_encoded": lambda v: urllib.parse.quote(v, safe=""),
    "json_escaped": lambda v: json.dumps(v)[1:-1],
    "hex": lambda v: v.encode().hex(),
    "split_lines": _split,
    "upper": str.upper,
}
#: What may not appear in a line: each secret, and each form of it as placed (a shape's
#: letters changed by case are no longer the shape, as in the canary matrix).
_NEEDLES = sorted({n for value, part in [*((r, r) for r in _REGISTERED), *_SHAPES.items()]
                   for name, form in _FORMS.items()
                   if value in _REGISTERED or name != "upper"
                   for n in (part, form(value), json.dumps(form(value))[1:-1])})
_secret = st.sampled_from(_REGISTERED + tuple(_SHAPES))
_form = st.sampled_from(sorted(_FORMS))
#: Ordinary text a secret sits in, and values that only look odd (quotes, escapes, markers).
_around = st.sampled_from(["", "id ", "note: ", "x-", "call_", "toolu_", " end", "caf\u00e9 ",
                           '"', "\\", "\n", "%", "token", "=", "SFO"])


@st.composite
def _hiding(draw: st.DrawFn) -> str:
    """Text holding a secret, in one of its travelling forms, or none."""
    if draw(st.booleans()):
        return draw(_around) + draw(_around)
    secret, form = draw(_secret), draw(_form)
    if form == "upper" and secret in _SHAPES:
        form = "plain"
    return draw(_around) + _FORMS[form](secret) + draw(_around)


_values = st.recursive(_hiding() | st.integers() | st.booleans() | st.none(),
                       lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(_hiding(), inner, max_size=3), max_leaves=6)


def _line_as_before(guard: Guard, event: CallEvent, raw: dict[str, Any]) -> str:
    """The line the sink wrote before it trusted the event: the caller's and the model's
    text fields redacted one by one (``raw``), then the whole line redacted again."""
    secrets = guard.redactor.secrets
    record = event.to_dict()
    for key in ("tool", "call_id", "task", "code", "mode"):
        value = raw.get(key, record[key])
        record[key] = secrets(value) if isinstance(value, str) else value
    return secrets(_dumps(record))


@settings(max_examples=300, deadline=None)
@given(tool=_hiding(), call_id=st.none() | _hiding(), task=_hiding(), code=_hiding(),
       ok=st.booleans(), args=st.dictionaries(_hiding(), _values, max_size=4),
       shadow=st.dictionaries(st.sampled_from(["would_reject", "json_reason", "result"]),
                              _hiding(), max_size=2),
       mode=st.sampled_from(["enforce", "shape", "observe"]))
def test_a_second_pass_over_the_whole_line_finds_no_secret(
        tool: str, call_id: str | None, task: str, code: str, ok: bool,
        args: dict[str, Any], shadow: dict[str, Any], mode: str) -> None:
    """With every field of the caller's or the model's text redacted before JSON encoding
    (secrets in every field, in plain, base64, URL-encoded, escaped, hex, split and upper
    forms), redacting the whole line once more, as the sink did, finds nothing: the lines
    are the same bytes, or the second pass only ate a field's closing quote (``token="``
    read as ``token=`` and a value) and broke the line, and the line holds no secret the
    line redacted twice did not."""
    out, seen = io.StringIO(), []
    guard = Guard(trace=out, observers=[seen.append], secrets=list(_REGISTERED),
                  scan_env_secrets=False, mode=mode)  # type: ignore[arg-type]
    guard.new_task(task)
    cid = call_id or _new_call_id()
    call = _Call(None, tool, args, cid, time.monotonic())
    call.shadow.update(shadow)
    call.dispatched = True
    failure = None if ok else FailureInfo(code=code, outcome=Outcome.NO_EFFECT)
    result = new_result(tool, ok, "done", None, 1, cid, failure, "ab" * 32)
    guard._emitter.emit(call, result)
    guard.close()
    (line,) = out.getvalue().splitlines()
    (event,) = seen
    assert line == event.to_jsonl()
    sealed_tool = result.tool if ok else guard._shaper.seal(result).tool
    raw = {"tool": sealed_tool, "call_id": cid, "task": task, "code": None if ok else code}
    before = _line_as_before(guard, event, raw)
    if before != line:
        with pytest.raises(json.JSONDecodeError):
            json.loads(before)
    assert _needles(line) <= _needles(before)  # (a form glued to a word may pass both)
    for text in _strings(json.loads(line)):  # each field as redacted is redacted already
        assert guard.redactor.secrets(text) == text


def _needles(line: str) -> set[str]:
    lowered = line.lower()
    return {n for n in _NEEDLES if n in line or n.lower() in lowered}


def _strings(value: Any) -> list[str]:
    """Every string of a parsed line: keys and values, nested ones too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_observers_the_trace_and_the_span_get_one_redaction_of_the_id_and_name() -> None:
    """A caller's call id and the task are redacted for observers as for the trace (an
    observer no longer sees the raw id); an id the guard made is written as it is."""
    out, seen = io.StringIO(), []
    guard = Guard(trace=out, observers=[seen.append], secrets=["model-9f8e7d6c"],
                  scan_env_secrets=False)
    guard.new_task("task-model-9f8e7d6c")

    @guard.tool
    def ping(n: int) -> int:
        return n

    given = guard.call("ping", {"n": 1}, call_id="toolu_model-9f8e7d6c")
    made = guard.call("ping", {"n": 2})
    guard.close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert given.call_id == "toolu_model-9f8e7d6c"  # the caller gets their own id back
    assert [e.call_id for e in seen] == [line["call_id"] for line in lines] == \
        ["toolu_[REDACTED]", made.call_id]
    assert [e.task for e in seen] == [line["task"] for line in lines] == ["task-[REDACTED]"] * 2


def test_only_an_id_this_process_made_is_its_own() -> None:
    """The guard's own ids hold its random head and a counter; a framework's or provider's
    id, one that merely starts like the guard's, or a look-alike with other digits is the
    caller's text."""
    made = _new_call_id()
    head = made.rstrip("0123456789")
    assert own_call_id(made) and own_call_id(head + "12")
    for other in ("call_abc123", "toolu_01ABC", head, head + "12x", head + "1\u0662",
                  head + "-1", "call_" + made, made + " "):
        assert not own_call_id(other), other


def test_a_task_id_or_call_id_that_is_no_string_is_still_traced() -> None:
    """Redacted as any value is (a number stays a number), so the call still reaches the
    trace and the observers."""
    out, seen = io.StringIO(), []
    guard = Guard(task_id=5, trace=out, observers=[seen.append],  # type: ignore[arg-type]
                  scan_env_secrets=False)

    @guard.tool
    def ping(n: int) -> int:
        return n

    guard.call("ping", {"n": 1})
    guard.shape("ping", {"n": 2}, ValueError("bad"), call_id=7)  # type: ignore[arg-type]
    guard.close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["task"] for line in lines] == [e.task for e in seen] == [5, 5]
    assert lines[1]["call_id"] == seen[1].call_id == 7
