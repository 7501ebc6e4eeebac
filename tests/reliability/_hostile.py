"""Generated hostile calls: any name, any arguments, tools that misbehave in every way.

Each generated call is checked for what the contract promises: it returns (never raises),
within the deadline, a well-formed message within twice the token budget, with no canary
secret.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfault import Backoff, Guard, Limits, ToolError, ToolResult, count_tokens

#: A short deadline, so tools that hang are abandoned quickly (the default is 120 s).
DEADLINE = 0.3
#: A call counts as a hang when it returns later than this (the deadline plus slack for a
#: machine shared with other work).
HANG_AFTER = DEADLINE + 2.0
CANARY = "cAnAry-7Q2x-Z9kL-44fe"
FOUR_PART = re.compile(
    r"^\S+ failed \(code: [a-z_]+\)\.\nReason: .+\.\nRejected arguments: .+\.\n"
    r"Effect: (none|unknown|applied)\. .+\nNext action: .+\.$", re.S)
TERMINAL = re.compile(r"^\S+ failed \d+ times with identical arguments \(code: [a-z_]+\)\.\n"
                      r"Retrying the same call is not allowed\.\nYou must now .+\.$", re.S)


class _Hostile(TimeoutError):
    """A TimeoutError whose text, args and repr all raise."""

    def __str__(self) -> str:
        raise TimeoutError("from __str__")

    def __repr__(self) -> str:
        raise TimeoutError("from __repr__")


class _NoInit(TimeoutError):
    def __init__(self, *args: Any) -> None:  # never calls super().__init__
        pass


class _BadResponse(TimeoutError):
    @property
    def response(self) -> Any:
        raise TimeoutError("from response")


class _NotStr(Exception):
    def __str__(self) -> Any:
        return 42


def _raisers() -> list[Callable[[str], BaseException]]:
    return [
        lambda p: TimeoutError(p),
        lambda p: _Hostile(p),
        lambda p: _NoInit(p),
        lambda p: _BadResponse(p),
        lambda p: TimeoutError(*([p] * 50)),
        lambda p: ValueError(p),
        lambda p: RuntimeError(p),
        lambda p: _NotStr(p),
        lambda p: ToolError("invalid_argument", p, next_action=p),
        lambda p: ToolError("conflict", p * 20),
        lambda p: KeyError(p),
        lambda p: ConnectionError(f"could not reach {p} at db1.internal:5432"),
        lambda p: ValueError(f"failed running SELECT * FROM users WHERE name = '{p}'"),
        lambda p: OSError(2, "No such file", f"/srv/app/{p}.db"),
        lambda p: TimeoutError(p, p),
        lambda p: RecursionError(p),
        lambda p: StopIteration(p),
        lambda p: GeneratorExit(p),
    ]


RAISERS = _raisers()
payloads = st.one_of(
    st.text(max_size=40),
    st.just(CANARY),
    st.builds(lambda a, b: f"{a}{CANARY}{b}", st.text(max_size=10), st.text(max_size=10)),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "字", "🙂", "-", "/", " "]),
              st.integers(0, 3_000)),
    st.sampled_from(["SELECT * FROM users", "/etc/passwd", "10.0.0.1:5432", "sk-" + "a" * 30]),
)
junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | payloads | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.one_of(st.text(max_size=6), payloads), inner, max_size=4),
    max_leaves=10,
)
arguments = st.one_of(
    st.dictionaries(st.sampled_from(["x", "mode", "payload", "password", "n"]), junk,
                    max_size=4),
    st.builds(lambda m, p: {"mode": m, "payload": p}, st.integers(0, 40), payloads),
    junk,
    st.text(max_size=60),
    st.builds(json.dumps, st.dictionaries(st.text(max_size=5), st.integers(), max_size=3)),
    st.builds(lambda p: p.encode("utf-8", "surrogatepass"), payloads),
)
names = st.one_of(
    st.sampled_from(["mode_tool", "amode_tool", "effect_tool", "typed"]),
    st.sampled_from(["typo", "", "x" * 300, f"get_{CANARY}", "../../etc/passwd"]),
    st.text(max_size=20),
)


def hostile_guard(*, deadline: float = DEADLINE) -> Guard:
    """A guard whose tools misbehave according to a ``mode`` argument."""
    guard = Guard(
        secrets=[CANARY], scan_env_secrets=False, deadline=deadline, isolate_sync_tools=True,
        limits=Limits(retry_limit=2, backoff=Backoff(attempts=2, initial=0.01, jitter=0,
                                                     maximum=0.05, max_seconds=0.2)),
    )
    release = threading.Event()  # never set: hanging tools wait until abandoned

    def act(mode: int, payload: Any) -> Any:
        text = payload if isinstance(payload, str) else str(payload)
        if mode < len(RAISERS):
            raise RAISERS[mode](text)
        if mode == 30:
            release.wait(DEADLINE * 4)  # past the deadline: abandoned in its thread
            return "late"
        if mode == 31:
            return {"echo": payload, "key": CANARY}
        if mode == 32:
            return {"error": f"backend said {text}"}
        if mode == 33:
            return text * 50
        if mode == 34:
            raise TimeoutError(text) from ValueError(CANARY)
        return payload

    @guard.tool
    def mode_tool(mode: int = 0, payload: Any = None) -> Any:
        return act(mode, payload)

    @guard.tool
    async def amode_tool(mode: int = 0, payload: Any = None) -> Any:
        if mode == 30:
            await asyncio.sleep(DEADLINE * 4)
            return "late"
        return act(mode, payload)

    def landed(args: dict[str, Any]) -> bool:
        if args.get("mode") == 1:
            raise _Hostile("check")
        if args.get("mode") == 30:
            release.wait(DEADLINE * 4)
        return bool(args.get("mode", 0) % 2)

    @guard.tool(side_effect=True, postcondition=landed, idempotency_key=["payload"])
    def effect_tool(mode: int = 0, payload: Any = None) -> Any:
        return act(mode, payload)

    @guard.tool
    def typed(count: int, name: str, ratio: float = 1.0) -> str:
        return f"{count}-{name}"

    return guard


@dataclass
class Tally:
    """What the generated calls did, counted rather than asserted, for the figures."""

    calls: int = 0
    raises: int = 0
    hangs: int = 0
    over_budget: int = 0
    malformed: int = 0
    leaks: int = 0
    slowest: float = 0.0
    examples: list[str] = field(default_factory=list)

    def note(self, problem: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(problem[:300])


def check(guard: Guard, result: Any, elapsed: float, tally: Tally) -> None:
    """Count what the contract forbids in one result."""
    tally.calls += 1
    tally.slowest = max(tally.slowest, elapsed)
    if elapsed > HANG_AFTER:
        tally.hangs += 1
        tally.note(f"hang {elapsed:.1f}s")
    if not isinstance(result, ToolResult):
        tally.malformed += 1
        return
    data = json.dumps(result.data, default=str)
    if CANARY.lower() in (result.text + result.tool).lower() or CANARY in data:
        tally.leaks += 1
        tally.note(f"leak: {result.text}")
    if not result.ok:
        # no_progress carries the result the model asked for after the four parts
        message = result.text.partition("\nResult (unchanged): ")[0]
        if not (FOUR_PART.match(message) or TERMINAL.match(message)):
            tally.malformed += 1
            tally.note(f"malformed: {result.text}")
        # The code and the next action are never cut: a message may pass its budget, never
        # twice over (then every line is cut).
        if count_tokens(result.text) > 2 * guard.catalog.token_budget:
            tally.over_budget += 1
            tally.note(f"over budget: {result.text}")


def run_one(guard: Guard, name: Any, args: Any, tally: Tally, *, use_async: bool) -> None:
    started = time.monotonic()
    try:
        if use_async:
            result = asyncio.run(guard.acall(name, args))
        else:
            result = guard.call(name, args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # counted: the contract says this never happens
        tally.raises += 1
        tally.note(f"raised {type(exc).__name__}")
        return
    check(guard, result, time.monotonic() - started, tally)
    if tally.calls % 40 == 0:
        guard.new_turn()


def generated_calls(examples: int, per_example: int, tally: Tally) -> None:
    """Run ``examples`` hypothesis examples of ``per_example`` calls each."""
    guard = hostile_guard()
    count_tokens("load the vocabulary before the clock starts")

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(batch=st.lists(st.tuples(names, arguments, st.integers(0, 9)),
                          min_size=per_example, max_size=per_example))
    def body(batch: list[tuple[Any, Any, int]]) -> None:
        for name, args, coin in batch:
            run_one(guard, name, args, tally, use_async=coin == 0)

    body()
    guard.close()
