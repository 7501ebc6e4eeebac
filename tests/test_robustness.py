"""No input makes Guard.call raise, and every failure keeps the four-part shape."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfault import Backoff, Guard, Limits, ToolError

FOUR_PART = re.compile(
    r"^\S+ failed \(code: [a-z_]+\)\.\nReason: .+\.\nRejected arguments: .+\.\n"
    r"Effect: (none|unknown|applied)\. .+\nNext action: .+\.$", re.S)
TERMINAL = re.compile(r"^\S+ failed \d+ times with identical arguments \(code: [a-z_]+\)\.\n"
                      r"Retrying the same call is not allowed\.\nYou must now .+\.$", re.S)

guard = Guard(limits=Limits(retry_limit=2, max_calls_per_turn=10_000,
                            backoff=Backoff(attempts=2, initial=0, jitter=0, maximum=0)),
              scan_env_secrets=False)


@guard.tool
def typed(count: int, name: str, ratio: float = 1.0, tags: list[str] | None = None) -> str:
    """A typed tool. Use it for robustness checks."""
    return f"{count}-{name}"


@guard.tool
def anything(payload: Any = None) -> Any:
    """Echo anything back. Use it for robustness checks."""
    if isinstance(payload, str) and payload.startswith("boom"):
        raise RuntimeError(payload)
    if isinstance(payload, str) and payload.startswith("tool"):
        raise ToolError("conflict", payload)
    return payload


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
    | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.one_of(st.text(max_size=6), st.integers()), inner, max_size=4) | st.tuples(inner),
    max_leaves=15,
)
arguments = st.one_of(
    junk,
    st.dictionaries(st.sampled_from(["count", "name", "ratio", "tags", "payload", "x"]), junk,
                    max_size=5),
    st.text(max_size=60),
    st.builds(lambda d: __import__("json").dumps(d), st.dictionaries(st.text(max_size=5),
                                                                      st.integers())),
    st.just(object()),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["typed", "anything", "typo", "", "x" * 300]), args=arguments)
def test_guard_call_never_raises(name: str, args: Any) -> None:
    """Any tool name and any argument value gives a ToolResult with a well-formed text."""
    result = guard.call(name, args)
    assert isinstance(result.text, str)
    if not result.ok:
        assert FOUR_PART.match(result.text) or TERMINAL.match(result.text), result.text
        assert "Traceback" not in result.text
        assert isinstance(result.data, dict)
