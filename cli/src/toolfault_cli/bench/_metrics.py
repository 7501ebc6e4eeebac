"""Metrics computed from a trace, and only from a trace.

The input is a list of JSONL records: ``call`` records in the shape of ``CallEvent.to_dict()``
(what ``Guard(trace="run.jsonl")`` writes), ``incident`` records, and, in bench traces,
``episode`` records holding what the world measured.  Because nothing else is read,
``toolfault report run.jsonl`` on a user's own trace computes the same numbers the bench
prints.  Where a user's trace lacks episode records, success and duplicate side effects are
inferred from the calls and marked as such (``success_measured`` / ``duplicates_measured``).

Definitions (per task, i.e. per distinct ``task`` value; then summed or maxed per group):

- *calls*: model tool calls (records); *executions*: times a tool actually ran (``attempts``,
  which counts in-wrapper retries too).
- *identical-retry run*: consecutive dispatched calls with one fingerprint where every call
  but the last failed; the longest such run is the loop length.  Blocked calls never reached
  the tool, so they do not extend a run; they are counted as *blocked*.
- *retry*: a call with the same fingerprint as the previous call of the task, which failed.
- *recovery*: a run of failures in a task that a later successful call ends.
- *cap hits*: retry-cap terminal messages; *budget hits*: calls refused by a budget; both are
  incidents.  *Step-cap loops*: episodes the harness ended at its hard step cap; *halts*:
  episodes the guard's ladder ended (the turn halted after ignored blocks); *budget stops*:
  episodes the agent loop ended because the guard refused a call over budget; *crashes*:
  episodes the framework aborted with an exception; *model errors*: episodes the model
  endpoint ended by failing (not the tools' doing: counted apart, per endpoint).
- *gave up*: episodes the agent ended itself without reaching the goal (a reported failure).

A *call record* is a line with ``type`` ``call`` (or no ``type``), a string ``tool`` and an
``ok``: other lines are not calls, so a file without one is not a toolfault trace.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

Record = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Metrics:
    """The numbers for one group of tasks (a policy, or a policy and an agent, …)."""

    tasks: int = 0
    successes: int = 0
    success_rate: float = 0.0
    success_measured: bool = True
    calls: int = 0
    calls_per_task: float = 0.0
    executions: int = 0
    executions_per_task: float = 0.0
    duplicate_side_effects: int = 0
    duplicates_measured: bool = True
    longest_identical_run: int = 0
    error_tokens: int = 0
    error_tokens_per_task: float = 0.0
    retries: int = 0
    retry_rate: float = 0.0
    blocked: int = 0
    error_streaks: int = 0
    recoveries: int = 0
    cap_hits: int = 0
    budget_hits: int = 0
    step_cap_hits: int = 0
    halts: int = 0
    budget_stops: int = 0
    crashes: int = 0
    model_errors: int = 0
    gave_up: int = 0
    #: Staged rollout (observe/shape modes): what enforce mode would have done differently.
    would_shape: int = 0
    would_reject: int = 0
    would_block: int = 0
    would_cap: int = 0
    would_exceed_budget: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(slots=True)
class _Task:
    calls: list[Record]
    episode: Record | None
    policy: str
    agent: str
    scenario: str


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSONL trace; blank lines are skipped, a malformed line is a ``ValueError``."""
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from None
            if isinstance(value, dict):
                records.append(value)
    return records


def _policy_of(record: Record) -> str:
    if record.get("policy"):
        return str(record["policy"])
    mode = record.get("mode") or "enforce"
    return "toolfault" if mode == "enforce" else f"toolfault ({mode})"


def is_call_record(record: Record) -> bool:
    """A line a guard (or the bench) wrote for one tool call."""
    return record.get("type", "call") == "call" and isinstance(record.get("tool"), str) \
        and "ok" in record


def _tasks(records: Iterable[Record]) -> list[_Task]:
    tasks: dict[str, _Task] = {}
    for record in records:
        kind = record.get("type", "call")
        if kind == "call" and not is_call_record(record):
            continue
        if kind not in ("call", "episode"):
            continue
        key = str(record.get("task", "default"))
        if "policy" not in record:
            key = f"{_policy_of(record)}\x00{key}"
        task = tasks.get(key)
        if task is None:
            task = tasks[key] = _Task([], None, _policy_of(record),
                                      str(record.get("agent") or "(trace)"),
                                      str(record.get("scenario") or "(trace)"))
        if kind == "episode":
            task.episode = record
        else:
            task.calls.append(record)
    return list(tasks.values())


def longest_identical_run(calls: Sequence[Record]) -> int:
    """The longest run of dispatched identical calls in which all but the last failed."""
    longest = run = 0
    previous: Record | None = None
    for call in calls:
        if not call.get("dispatched", True):
            continue
        if previous is not None and call.get("fingerprint") == previous.get("fingerprint") \
                and not previous.get("ok"):
            run += 1
        else:
            run = 1
        longest = max(longest, run)
        previous = call
    return longest


def inferred_duplicates(calls: Sequence[Record]) -> int:
    """Side effects that landed more than once for one fingerprint, as far as the trace shows."""
    landed: Counter[str] = Counter()
    for call in calls:
        if call.get("side_effect") and call.get("dispatched", True) and (
            call.get("ok") or call.get("outcome") == "applied"
        ):
            landed[str(call.get("fingerprint"))] += 1
    return sum(n - 1 for n in landed.values() if n > 1)


def _summarise(tasks: Sequence[_Task]) -> Metrics:
    if not tasks:
        return Metrics()
    successes = duplicates = calls = executions = tokens = retries = blocked = 0
    streaks = recoveries = cap_hits = budget_hits = step_caps = crashes = gave_up = longest = 0
    budget_stops = halts = model_errors = 0
    shadow = {"would_say": 0, "would_reject": 0, "would_block": 0, "would_be_terminal": 0,
              "would_exceed_budget": 0}
    success_measured = duplicates_measured = True
    for task in tasks:
        for call in task.calls:
            marks = call.get("shadow") or {}
            for mark in shadow:
                shadow[mark] += bool(marks.get(mark)) if isinstance(marks, dict) else 0
        episode = task.episode
        calls += len(task.calls)
        executions += sum(int(c.get("attempts", 0) or 0) for c in task.calls)
        tokens += sum(int(c.get("error_tokens", 0) or 0) for c in task.calls)
        blocked += sum(1 for c in task.calls if c.get("blocked"))
        cap_hits += sum(1 for c in task.calls if c.get("terminal") and not c.get("blocked"))
        budget_hits += sum(1 for c in task.calls if c.get("code") == "budget_exceeded")
        longest = max(longest, longest_identical_run(task.calls))
        previous: Record | None = None
        in_streak = False
        for call in task.calls:
            if previous is not None and not previous.get("ok") and \
                    call.get("fingerprint") == previous.get("fingerprint"):
                retries += 1
            if call.get("ok"):
                if in_streak:
                    recoveries += 1
                in_streak = False
            elif not in_streak:
                streaks += 1
                in_streak = True
            previous = call
        if episode is not None:
            successes += bool(episode.get("success"))
            duplicates += int(episode.get("duplicate_side_effects", 0) or 0)
            stop = episode.get("stop")
            step_caps += stop == "step_cap"
            budget_stops += stop == "budget"
            halts += stop == "halted"
            crashes += stop == "crash"
            model_errors += stop == "model_error"
            gave_up += stop == "finished" and not episode.get("success")
        else:
            success_measured = duplicates_measured = False
            successes += bool(task.calls and task.calls[-1].get("ok"))
            duplicates += inferred_duplicates(task.calls)
    n = len(tasks)
    return Metrics(
        tasks=n, successes=successes, success_rate=successes / n,
        success_measured=success_measured, calls=calls, calls_per_task=calls / n,
        executions=executions, executions_per_task=executions / n,
        duplicate_side_effects=duplicates, duplicates_measured=duplicates_measured,
        longest_identical_run=longest, error_tokens=tokens, error_tokens_per_task=tokens / n,
        retries=retries, retry_rate=retries / calls if calls else 0.0, blocked=blocked,
        error_streaks=streaks, recoveries=recoveries, cap_hits=cap_hits,
        budget_hits=budget_hits, step_cap_hits=step_caps, halts=halts,
        budget_stops=budget_stops, crashes=crashes, model_errors=model_errors, gave_up=gave_up,
        would_shape=shadow["would_say"],
        would_reject=shadow["would_reject"], would_block=shadow["would_block"],
        would_cap=shadow["would_be_terminal"], would_exceed_budget=shadow["would_exceed_budget"],
    )


def _by(tasks: Sequence[_Task], attr: str) -> dict[str, dict[str, Metrics]]:
    grouped: dict[str, dict[str, list[_Task]]] = {}
    for task in tasks:
        grouped.setdefault(task.policy, {}).setdefault(getattr(task, attr), []).append(task)
    return {p: {k: _summarise(v) for k, v in inner.items()} for p, inner in grouped.items()}


def _by_tool(tasks: Sequence[_Task]) -> dict[str, dict[str, Metrics]]:
    grouped: dict[str, dict[str, list[_Task]]] = {}
    for task in tasks:
        per_tool: dict[str, list[Record]] = {}
        for call in task.calls:
            per_tool.setdefault(str(call.get("tool")), []).append(call)
        for tool, calls in per_tool.items():
            grouped.setdefault(task.policy, {}).setdefault(tool, []).append(
                _Task(calls, None, task.policy, task.agent, task.scenario))
    return {p: {k: _summarise(v) for k, v in sorted(inner.items())}
            for p, inner in grouped.items()}


@dataclass(frozen=True, slots=True)
class EndpointErrors:
    """A model endpoint that failed during a run: how many episodes it ended, and why."""

    endpoint: str
    episodes: int
    first_error: str

    def to_dict(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "episodes": self.episodes,
                "first_error": self.first_error}


@dataclass(frozen=True, slots=True)
class Summary:
    """Metrics per policy, and per policy broken down by agent, scenario and tool.

    ``model_errors``: the endpoints that ended episodes by failing (empty when none did).
    """

    policies: dict[str, Metrics]
    agents: dict[str, dict[str, Metrics]]
    scenarios: dict[str, dict[str, Metrics]]
    tools: dict[str, dict[str, Metrics]]
    incidents: dict[str, int]
    model_errors: tuple[EndpointErrors, ...] = ()

    @property
    def episodes(self) -> int:
        """Episodes with a record of how they ended (0 for a user's trace)."""
        return sum(m.tasks for m in self.policies.values() if m.success_measured)

    def to_dict(self) -> dict[str, Any]:
        def nested(value: dict[str, dict[str, Metrics]]) -> dict[str, Any]:
            return {p: {k: m.to_dict() for k, m in inner.items()} for p, inner in value.items()}

        return {
            "policies": {p: m.to_dict() for p, m in self.policies.items()},
            "agents": nested(self.agents),
            "scenarios": nested(self.scenarios),
            "tools": nested(self.tools),
            "incidents": dict(self.incidents),
            "model_errors": [e.to_dict() for e in self.model_errors],
        }


def metrics_from_trace(records: Iterable[Record]) -> Summary:
    """All metrics from trace records (a bench run's or a user's ``Guard(trace=...)`` file)."""
    records = list(records)
    tasks = _tasks(records)
    policies: dict[str, list[_Task]] = {}
    for task in tasks:
        policies.setdefault(task.policy, []).append(task)
    incidents: Counter[str] = Counter(
        str(r.get("kind")) for r in records if r.get("type") == "incident"
    )
    return Summary(
        policies={p: _summarise(ts) for p, ts in policies.items()},
        agents=_by(tasks, "agent"),
        scenarios=_by(tasks, "scenario"),
        tools=_by_tool(tasks),
        incidents=dict(sorted(incidents.items())),
        model_errors=_endpoint_errors(records),
    )


def _endpoint_errors(records: Sequence[Record]) -> tuple[EndpointErrors, ...]:
    """Episodes ended by a failing model endpoint, per endpoint, in order of appearance."""
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    for record in records:
        if record.get("type") == "episode" and record.get("stop") == "model_error":
            endpoint = str(record.get("endpoint") or record.get("agent") or "(model)")
            counts[endpoint] += 1
            first.setdefault(endpoint, str(record.get("model_error") or "(no message)"))
    return tuple(EndpointErrors(e, counts[e], first[e]) for e in first)
