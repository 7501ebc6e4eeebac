"""Simulated agents: models with known, seeded behaviours.

They stand in for a model having a bad day, and for one having a good one.  Each reads only
the tool result *text*, exactly as a model would; none of them sees a ``ToolResult`` or any
other toolfault internal, so a baseline's message and toolfault's message are judged by the
same reader.

- ``stubborn``  sends the same call again after any error.
- ``cosmetic``  sends the same call reworded (case, whitespace, trailing slash).
- ``follower``  acts on what the text says: a ``Next action:`` line, a named parameter, a named
  alternative or check tool; stops on "stop and report".  With no instruction in the text it
  does what models do: it retries.
- ``confused``  a seeded mix: sometimes follows, sometimes repeats, rewords, changes a random
  argument or calls a random tool.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from toolfault_cli.bench._model import AgentModel, AgentTurn
from toolfault_cli.bench._tasks import PlannedCall, TaskBrief, ToolCall

_NEXT = re.compile(r"^Next action:\s*(.+)$", re.MULTILINE)
_MUST = re.compile(r"^You must now (?:either )?(.+)$", re.MULTILINE)
_APPLIED = re.compile(r"^Effect: applied\b", re.MULTILINE)
_CALL = re.compile(r"\bcall(?:ing)? ([A-Za-z_][\w.\-]*)(.*)")
_WITH = re.compile(r"\bwith (?:a |the |an )?(?:different |corrected |new )?([A-Za-z_]\w*)")
_CHECK = re.compile(r"check (?:whether it happened|the result) with ([A-Za-z_][\w.\-]*)")
_MOVES = re.compile(r",\s*(?:or\s+)?|\s+or\s+|;\s*")


def looks_successful(text: str) -> bool:
    """A tool result reads as success when it is a JSON object without an ``error`` key."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" not in value


def reword(value: str, kind: str, n: int, avoid: Sequence[str] = ()) -> str:
    """A cosmetic variant of ``value`` (the ``n``-th in a cycle), unequal to it and to ``avoid``."""
    if kind == "case":
        variants = [value.lower(), value.upper(), value.swapcase(), value.title()]
    elif kind == "slash":
        variants = [f"{value}/", f"{value}//", f"{value} ", f"{value}/ "]
    else:
        variants = [f"{value} ", f" {value}", f"{value}  ", f" {value} "]
    variants = list(dict.fromkeys(v for v in variants if v != value and v not in avoid))
    if not variants:
        return f" {value} " if f" {value} " not in avoid else f"{value}   "
    return variants[n % len(variants)]


class ScriptedAgent:
    """Walks the brief's plan; what it does after an error is the subclass's behaviour."""

    name = "scripted"

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.brief: TaskBrief | None = None
        self.plan: tuple[PlannedCall, ...] = ()
        self.tools: dict[str, set[str]] = {}
        self.rng = random.Random(0)
        self.step = 0
        self.current: tuple[str, dict[str, Any]] = ("", {})
        self.checking: tuple[str, dict[str, Any]] | None = None
        self.fixed: set[str] = set()
        self.count = 0
        self.rewordings = 0

    def reset(self, brief: TaskBrief, tools: Sequence[Mapping[str, Any]], seed: str) -> None:
        self._clear()
        self.brief = brief
        self.plan = brief.plan
        for tool in tools:
            function = tool.get("function", tool)
            props = (function.get("parameters") or {}).get("properties") or {}
            self.tools[str(function["name"])] = set(props)
        self.rng = random.Random(f"{self.name}:{seed}")

    def next_turn(self, messages: Sequence[Mapping[str, Any]]) -> AgentTurn:
        last = messages[-1] if messages else {}
        if last.get("role") != "tool":
            first = self.plan[0]
            return self.call(first.tool, dict(first.args))
        text = str(last.get("content") or "")
        if looks_successful(text):
            return self.on_success(text)
        return self.on_error(text)

    # -- moves ------------------------------------------------------------------------------
    @property
    def planned(self) -> PlannedCall:
        return self.plan[min(self.step, len(self.plan) - 1)]

    def call(self, tool: str, args: dict[str, Any]) -> AgentTurn:
        self.count += 1
        self.current = (tool, args)
        return AgentTurn((ToolCall(tool, json.dumps(args), f"call_{self.count}"),))

    def again(self) -> AgentTurn:
        return self.call(self.current[0], dict(self.current[1]))

    def advance(self) -> AgentTurn:
        self.step += 1
        self.fixed = set()
        self.checking = None
        if self.step >= len(self.plan):
            return AgentTurn(final="Done.")
        nxt = self.plan[self.step]
        return self.call(nxt.tool, dict(nxt.args))

    def stop(self, why: str) -> AgentTurn:
        return AgentTurn(final=f"I could not finish the task: {why}.")

    def fix(self, param: str) -> AgentTurn:
        self.fixed.add(param)
        return self.call(self.current[0], {**self.current[1], param: self.planned.fixes[param]})

    def alternative(self, tool: str) -> AgentTurn:
        return self.call(tool, dict(self.planned.alternatives[tool]))

    def check(self, tool: str) -> AgentTurn:
        self.checking = (self.current[0], dict(self.current[1]))
        return self.call(tool, dict(self.planned.checks[tool]))

    def reworded(self) -> AgentTurn:
        tool, args = self.current
        cosmetic = {k: v for k, v in self.planned.cosmetic.items()
                    if tool == self.planned.tool and isinstance(args.get(k), str)}
        if not cosmetic:
            return self.again()
        params = sorted(cosmetic)
        param = params[self.rewordings % len(params)]
        self.rewordings += 1
        base = str(self.planned.args.get(param, args[param]))
        value = reword(base, cosmetic[param], self.rewordings, avoid=(str(args[param]),))
        return self.call(tool, {**args, param: value})

    # -- reading results ----------------------------------------------------------------------
    def on_success(self, text: str) -> AgentTurn:
        if self.checking is not None:
            checked, self.checking = self.checking, None
            try:
                found = bool(json.loads(text).get("found"))
            except (ValueError, AttributeError):
                found = False
            return self.advance() if found else self.call(*checked)
        return self.advance()

    def on_error(self, text: str) -> AgentTurn:
        return self.again()

    def follow(self, text: str) -> AgentTurn | None:
        """Act on a ``Next action:`` line (or the terminal message's moves), if there is one."""
        if _APPLIED.search(text):
            return self.advance()  # "the action already happened … continue as if it succeeded"
        found = _NEXT.search(text) or _MUST.search(text)
        if found is None:
            return None
        tool, args = self.current
        planned = self.planned
        options: dict[str, Callable[[], AgentTurn]] = {}
        for move in _MOVES.split(found.group(1)):
            low = move.lower()
            if "stop and report" in low or low.startswith("stop "):
                options.setdefault("stop", lambda: self.stop("the tool told me to stop"))
            check = _CHECK.search(move)
            if check and check.group(1) in planned.checks:
                options.setdefault("check", partial(self.check, check.group(1)))
                continue
            called = _CALL.search(move)
            if called is None:
                continue
            name, rest = called.groups()
            if name == tool:
                param = _WITH.search(rest)
                key = param.group(1) if param else ""
                if key in planned.fixes and key in args and key not in self.fixed:
                    options.setdefault("fix", partial(self.fix, key))
                elif ("later" in rest or low.startswith("wait") or "again" in rest) and \
                        "with" not in rest:
                    options.setdefault("retry", self.again)
            elif name in planned.alternatives and name in self.tools:
                options.setdefault("alternative", partial(self.alternative, name))
            elif name in planned.checks:
                options.setdefault("check", partial(self.check, name))
        for kind in ("fix", "alternative", "check", "retry", "stop"):
            if kind in options:
                return options[kind]()
        return self.stop("no move the tool allowed applies")

    def scan(self, text: str) -> AgentTurn | None:
        """Unstructured text: fix a parameter it names, or call an alternative it names."""
        tool, args = self.current
        planned = self.planned
        for param in planned.fixes:
            if param in args and param not in self.fixed and re.search(
                rf"\b{re.escape(param)}\b", text
            ):
                return self.fix(param)
        for name in planned.alternatives:
            if name != tool and re.search(rf"\b{re.escape(name)}\b", text):
                return self.alternative(name)
        return None


class StubbornAgent(ScriptedAgent):
    """Sends the identical call again after any error, forever."""

    name = "stubborn"


class CosmeticAgent(ScriptedAgent):
    """Rewords the same call (case, whitespace, trailing slash) instead of changing it."""

    name = "cosmetic"

    def on_error(self, text: str) -> AgentTurn:
        return self.reworded()


class FollowerAgent(ScriptedAgent):
    """Does what the error text says; with no instruction in it, retries the call."""

    name = "follower"

    def on_error(self, text: str) -> AgentTurn:
        return self.follow(text) or self.scan(text) or self.again()


class ConfusedAgent(ScriptedAgent):
    """A seeded random mix of following, repeating, rewording and changing things at random."""

    name = "confused"

    def on_error(self, text: str) -> AgentTurn:
        roll = self.rng.random()
        if roll < 0.4:
            return self.follow(text) or self.scan(text) or self.again()
        if roll < 0.6:
            return self.again()
        if roll < 0.75:
            return self.reworded()
        if roll < 0.93:
            return self.mutate()
        return self.wander()

    def mutate(self) -> AgentTurn:
        tool, args = self.current
        if not args:
            return self.again()
        param = self.rng.choice(sorted(args))
        value = args[param]
        changed: Any
        if isinstance(value, bool):
            changed = not value
        elif isinstance(value, (int, float)):
            changed = self.rng.choice((-1, 0, self.rng.randint(1, 2000)))
        elif isinstance(value, str):
            changed = self.rng.choice((value[:-1], f"{value}x", value.upper(), ""))
        else:
            changed = None
        return self.call(tool, {**args, param: changed})

    def wander(self) -> AgentTurn:
        others = sorted(name for name in self.tools if name != self.current[0])
        if not others:
            return self.again()
        return self.call(self.rng.choice(others), dict(self.current[1]))


AGENTS: Mapping[str, Callable[[], AgentModel]] = {
    "stubborn": StubbornAgent,
    "cosmetic": CosmeticAgent,
    "follower": FollowerAgent,
    "confused": ConfusedAgent,
}
