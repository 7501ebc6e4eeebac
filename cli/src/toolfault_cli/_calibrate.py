"""``toolfault calibrate TRACE``: the ladder's thresholds, tried on your own traffic.

A JSONL trace (``Guard(trace=...)``) is replayed call by call, per conversation (task) and
turn, through a real :class:`~toolfault.Guard` for the current and a candidate
:class:`~toolfault.Limits`: the decisions are the guard's own, not a model of them.  Each
call is stood in for by a tool that answers what the trace recorded: the same failure code,
or a result that is the same as, or changed from, the identical call's last one (the trace's
``shadow.result``).  A call the traced guard refused was never run; it answers what the
identical call last did.

Each call either limits would refuse is flagged by what it looks like: a *poll* (the
identical call's result changed), a *re-read* (a success asked again), a *recovered mistake*
(a failure of a tool that later succeeded in the turn), or a *loop*.  The suggestion is the
least strict setting that refuses none of the first three, never looser than the defaults
need.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolfault._catalog import Catalog
from toolfault._errors import ConfigurationError, ToolError
from toolfault._limits import Backoff, Limits

#: The decisions a replay reports, from the strongest.
DECISIONS = ("halted", "tool_blocked", "blocked", "no_progress")
#: The ladder's settings calibrate can suggest.
TUNED = ("no_progress_repeats", "max_tool_failures_per_turn", "halt_after_refusals")


@dataclass(frozen=True, slots=True)
class TracedCall:
    """One call line of a trace, as much as a replay needs."""

    index: int
    task: str
    turn: int
    tool: str
    fingerprint: str
    ok: bool
    code: str | None
    dispatched: bool
    side_effect: bool
    #: ``"same"`` or ``"changed"``: the result against the identical call's last one.
    result: str | None

    @classmethod
    def from_record(cls, index: int, record: Mapping[str, Any]) -> TracedCall:
        shadow = record.get("shadow") or {}
        return cls(index=index, task=str(record.get("task") or "default"),
                   turn=int(record.get("turn") or 0), tool=str(record["tool"]),
                   fingerprint=str(record.get("fingerprint") or ""),
                   ok=bool(record.get("ok")), code=record.get("code"),
                   dispatched=bool(record.get("dispatched", True)),
                   side_effect=bool(record.get("side_effect")),
                   result=shadow.get("result") if isinstance(shadow, dict) else None)


@dataclass(slots=True)
class Replay:
    """What one :class:`Limits` decided for each call (``None``: answered)."""

    limits: Limits
    decisions: list[str | None] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        found = Counter(d for d in self.decisions if d is not None)
        return {name: found.get(name, 0) for name in DECISIONS}


def calls_of(records: Iterable[Mapping[str, Any]]) -> list[TracedCall]:
    """The call lines of a trace, in the order they were written."""
    calls: list[TracedCall] = []
    for record in records:
        if record.get("type") == "call" and isinstance(record.get("tool"), str):
            calls.append(TracedCall.from_record(len(calls), record))
    return calls


def replay(calls: Sequence[TracedCall], limits: Limits) -> Replay:
    """Run the traced calls through a guard with ``limits``; what it decided for each."""
    from toolfault._guard import Guard

    limits = dataclasses.replace(limits, backoff=Backoff(attempts=1), max_calls_per_turn=None,
                                 max_spend_per_task=None)
    guard = Guard(limits=limits, scan_env_secrets=False, error_result=None)
    catalog = Catalog.default()
    current: dict[str, TracedCall] = {}
    answers = _Answers(catalog)

    def stand_in(call: str) -> str:
        traced = current["call"]
        outcome = answers.outcome(traced)
        if outcome is None:
            return answers.result(traced)
        entry = catalog.get(outcome)
        raise ToolError(outcome, f"{traced.tool} failed as traced ({outcome})",
                        failure_class=entry.failure_class, retryable=False)

    for name in sorted({c.tool for c in calls}):
        side_effect = any(c.side_effect for c in calls if c.tool == name)
        guard.tool(name=name, side_effect=side_effect, description=f"replays {name}")(stand_in)
    scopes: dict[str, Guard] = {}
    turns: dict[str, int] = {}
    out = Replay(limits)
    for traced in calls:
        scope = scopes.get(traced.task)
        if scope is None:
            scope = scopes[traced.task] = guard.scoped(traced.task)
            turns[traced.task] = traced.turn
        while turns[traced.task] < traced.turn:
            scope.new_turn()
            turns[traced.task] += 1
        current["call"] = traced
        result = scope.call(traced.tool, {"call": traced.fingerprint or str(traced.index)})
        out.decisions.append(_decision(result))
    guard.close()
    return out


class _Answers:
    """What each traced call answers in a replay: its failure code or its result."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._last: dict[tuple[str, str], TracedCall] = {}
        self._results: dict[tuple[str, str], int] = defaultdict(int)

    def outcome(self, traced: TracedCall) -> str | None:
        """The failure code to raise, or ``None`` for a result."""
        key = (traced.task, traced.fingerprint)
        source: TracedCall | None = traced
        if traced.dispatched:
            self._last[key] = traced
        else:  # refused in the trace: what the identical call last did (a result if never)
            source = self._last.get(key)
        if source is None or source.ok or source.code == "no_progress":
            return None
        code = source.code or "tool_error"
        try:
            self._catalog.get(code)
        except Exception:  # noqa: BLE001 - a code of the user's own catalog, or tool_blocked
            return "tool_error"
        return "tool_error" if code == "tool_blocked" else code

    def result(self, traced: TracedCall) -> str:
        key = (traced.task, traced.fingerprint)
        if traced.result == "changed":
            self._results[key] += 1
        return f"result {self._results[key]} of {traced.fingerprint[:12]}"


def _decision(result: Any) -> str | None:
    if result.halt:
        return "halted"
    if result.code == "tool_blocked":
        return "tool_blocked"
    if result.code == "no_progress" and not result.blocked:
        return "no_progress"
    if result.blocked:
        return "blocked"
    return None


def looks_like(calls: Sequence[TracedCall]) -> list[str]:
    """Per call: ``poll``, ``re-read``, ``recovered`` or ``loop`` (what a refusal would hit).

    Judged from the calls, not from what the traced guard answered: a *poll*'s identical call
    returned something else at some point; a *re-read* is the first repeat of a success; a
    *recovered* call is a failure its tool later got past, or the success that got past it;
    the rest is a *loop*.  A call the traced guard refused shows no outcome, so a trace
    recorded with ``mode="observe"`` (every call runs) tells the most.
    """
    changed = {(c.task, c.fingerprint) for c in calls if c.result == "changed"}
    by_turn: dict[tuple[str, int], list[TracedCall]] = defaultdict(list)
    for c in calls:
        by_turn[(c.task, c.turn)].append(c)
    kinds: dict[int, str] = {}
    for turn_calls in by_turn.values():
        seen: Counter[str] = Counter()
        last_ok: dict[str, bool] = {}
        failed_tools: set[str] = set()
        for i, c in enumerate(turn_calls):
            seen[c.fingerprint] += 1
            later_ok = any(n.ok and n.tool == c.tool for n in turn_calls[i + 1:])
            if (c.task, c.fingerprint) in changed:
                kinds[c.index] = "poll"
            elif seen[c.fingerprint] == 1 and c.dispatched and (
                    (c.ok and c.tool in failed_tools) or (not c.ok and later_ok)):
                kinds[c.index] = "recovered"
            elif seen[c.fingerprint] == 2 and last_ok.get(c.fingerprint):
                kinds[c.index] = "re-read"
            else:
                kinds[c.index] = "loop"
            if c.dispatched:
                last_ok[c.fingerprint] = c.ok
                if not c.ok:
                    failed_tools.add(c.tool)
    return [kinds[c.index] for c in calls]


def suggest(calls: Sequence[TracedCall], limits: Limits) -> dict[str, int | None]:
    """The least strict rungs under which no poll, re-read or recovered mistake of this
    traffic is refused, never looser than ``limits`` (each raised one step at a time)."""
    kinds = looks_like(calls)
    suggested: dict[str, int | None] = {name: getattr(limits, name) for name in TUNED}
    for _ in range(60):
        decisions = replay(calls, _with(limits, suggested)).decisions
        rungs = [_rung_for(calls[i], d) for i, d in enumerate(decisions)
                 if d is not None and kinds[i] != "loop"]
        rung = next((r for r in rungs if r is not None and suggested[r] is not None), None)
        if rung is None:
            break
        value = suggested[rung]
        assert value is not None
        suggested[rung] = None if value >= 50 else value + 1
    return suggested


def _with(limits: Limits, values: Mapping[str, int | None]) -> Limits:
    return dataclasses.replace(limits, **values)  # type: ignore[arg-type]


def _rung_for(call: TracedCall, decision: str) -> str | None:
    """The setting that made a call refused (``None``: a cap, which calibrate leaves)."""
    if decision == "no_progress" or (decision == "blocked" and call.ok):
        return "no_progress_repeats"
    if decision == "tool_blocked":
        return "max_tool_failures_per_turn"
    if decision == "halted":
        return "halt_after_refusals"
    return None


def parse_settings(pairs: Sequence[str], base: Limits | None = None) -> Limits:
    """``name=value`` pairs (``none`` for ``None``) applied to ``base`` (default Limits)."""
    values: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(Limits)}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or name not in names:
            raise ConfigurationError(f"expected NAME=VALUE with a Limits field name, got {pair!r}")
        text = raw.strip()
        if text.lower() == "none":
            values[name] = None
        elif name in ("progress_exempt", "volatile_fields"):
            values[name] = frozenset(v.strip() for v in text.split(",") if v.strip())
        else:
            try:
                values[name] = int(text)
            except ValueError:
                try:
                    values[name] = float(text)
                except ValueError:
                    raise ConfigurationError(f"{name}: expected a number or none, "
                                             f"got {text!r}") from None
    try:
        return dataclasses.replace(base or Limits(), **values)
    except TypeError as exc:
        raise ConfigurationError(str(exc)) from None


def calibrate(records: Iterable[Mapping[str, Any]], current: Limits, candidate: Limits
              ) -> dict[str, Any]:
    """The whole report as data (what ``--json`` prints)."""
    calls = calls_of(records)
    kinds = looks_like(calls)
    now, then = replay(calls, current), replay(calls, candidate)
    changes = []
    for c, before, after, kind in zip(calls, now.decisions, then.decisions, kinds, strict=True):
        if before or after:
            changes.append({"index": c.index, "task": c.task, "turn": c.turn, "tool": c.tool,
                            "current": before, "candidate": after, "looks_like": kind})
    harmed = {name: sum(1 for ch in changes if ch[name] and ch["looks_like"] != "loop")
              for name in ("current", "candidate")}
    return {
        "calls": len(calls),
        "conversations": len({c.task for c in calls}),
        "current": {"limits": _shown(current), **now.counts(),
                    "legitimate_refused": harmed["current"]},
        "candidate": {"limits": _shown(candidate), **then.counts(),
                      "legitimate_refused": harmed["candidate"]},
        "looks_like": dict(Counter(kinds)),
        "changes": changes,
        "suggested": suggest(calls, current) if calls else {},
    }


def _shown(limits: Limits) -> dict[str, Any]:
    return {name: getattr(limits, name) for name in TUNED}


def calibrate_command(trace: str, current: Sequence[str], candidate: Sequence[str], *,
                      as_json: bool = False, plain: bool = False) -> int:
    """Print what each Limits would refuse in ``trace`` and the suggested rungs."""
    from toolfault_cli.bench._metrics import read_trace

    try:
        records = read_trace(trace)
        base = parse_settings(current)
        other = parse_settings(candidate, base)
    except (ValueError, ConfigurationError) as exc:
        from toolfault._usage import error

        error("calibrate", str(exc))
        return 2
    if not any(r.get("type") == "call" for r in records):
        from toolfault._usage import error

        error("calibrate", f"{trace} has no toolfault call record (is it a Guard(trace=...) "
                           "file?)")
        return 2
    report = calibrate(records, base, other)
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    _print(report, plain=plain)
    return 0


def _print(report: dict[str, Any], *, plain: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(no_color=plain, highlight=False, emoji=False)
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(report["looks_like"].items()))
    console.print(f"[bold]toolfault calibrate[/]: {report['calls']} calls in "
                  f"{report['conversations']} conversations ({kinds})")
    table = Table(title="what each Limits would refuse", title_justify="left")
    for column in ("", "current", "candidate"):
        table.add_column(column, justify="left" if not column else "right")
    current, candidate = report["current"], report["candidate"]
    for name in TUNED:
        table.add_row(name, str(current["limits"][name]), str(candidate["limits"][name]))
    table.add_section()
    for name in DECISIONS:
        table.add_row(name, str(current[name]), str(candidate[name]))
    table.add_section()
    table.add_row("[bold]legitimate calls refused[/]",
                  *(f"[red]{n}[/]" if n else "[green]0[/]" for n in
                    (current["legitimate_refused"], candidate["legitimate_refused"])))
    console.print(table)
    if report["changes"]:
        calls = Table(title="calls either would refuse (first 30)", title_justify="left")
        for column in ("#", "task", "turn", "tool", "current", "candidate", "looks like"):
            calls.add_column(column)
        for ch in report["changes"][:30]:
            kind = ch["looks_like"]
            calls.add_row(str(ch["index"]), ch["task"], str(ch["turn"]), ch["tool"],
                          ch["current"] or "-", ch["candidate"] or "-",
                          kind if kind == "loop" else f"[yellow]{kind}[/]")
        console.print(calls)
    suggested = ", ".join(f"{k}={v}" for k, v in report["suggested"].items())
    console.print(f"suggested (the least strict rungs that refuse no poll, re-read or "
                  f"recovered mistake here): [bold]Limits({suggested})[/]")
