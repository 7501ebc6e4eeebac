"""Running the suite: every (scenario, agent, policy) cell on the same seeded episodes.

The runner owns the agent loop (the conversation, the hard step cap) and writes the trace:
one record per model call (``CallEvent.to_dict()`` shape plus the bench's ``policy``,
``agent``, ``scenario``, ``episode`` and ``seed``), the guard's incidents, and one ``episode``
record with what the world measured (success, side effects, duplicates).  Metrics are then
computed from that trace only, so a user's own trace gives the same numbers.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from toolfault._guard import Guard
from toolfault_cli.bench._agents import AGENTS, looks_successful
from toolfault_cli.bench._model import SYSTEM_PROMPT, AgentModel, ModelError, assistant_message
from toolfault_cli.bench._policies import POLICIES, POLICY_NAMES, PolicyRun
from toolfault_cli.bench._tasks import SCENARIO_NAMES, Scenario, ToolDef, WorldRef, scenario

#: Every episode ends after this many tool calls, so a baseline that loops still ends.
STEP_CAP = 30
#: How an example reads when the framework crashed instead of showing the model anything.
CRASH_PREFIX = "(nothing: the framework re-raised "
#: How an example reads when no error was shown but the world shows the damage.
SILENT_PREFIX = "(no error shown: "


@dataclass(frozen=True, slots=True)
class Suite:
    """What to run.  The same seed gives the same worlds, agent choices and numbers."""

    seed: int = 7
    episodes: int = 5
    scenarios: tuple[str, ...] = SCENARIO_NAMES
    agents: tuple[str, ...] = tuple(AGENTS)
    policies: tuple[str, ...] = POLICY_NAMES
    step_cap: int = STEP_CAP

    @property
    def size(self) -> int:
        return len(self.scenarios) * len(self.agents) * len(self.policies) * self.episodes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "size": self.size}


def quick_suite(seed: int = 7) -> Suite:
    """The tiny suite: one episode per cell (smoke tests, CI)."""
    return Suite(seed=seed, episodes=1)


@dataclass(slots=True)
class RunResult:
    """The trace of a run, plus the first error text each policy showed (for the report)."""

    suite: Suite
    records: list[dict[str, Any]] = field(default_factory=list)
    examples: dict[str, dict[str, str]] = field(default_factory=dict)
    seconds: float = 0.0


_SCHEMAS: dict[str, list[dict[str, Any]]] = {}


def tool_schemas(item: Scenario) -> list[dict[str, Any]]:
    """The scenario's tools in OpenAI ``tools`` format, as the guard derives them."""
    if item.name not in _SCHEMAS:
        guard = Guard(scan_env_secrets=False)
        for tool in item.make_tools(WorldRef()):
            guard.tool(name=tool.name)(tool.fn)
        _SCHEMAS[item.name] = [
            {"type": "function", "function": {"name": spec.name,
                                              "description": spec.description,
                                              "parameters": spec.schema}}
            for spec in guard.tools.values()
        ]
    return _SCHEMAS[item.name]


def run_suite(
    suite: Suite,
    *,
    models: Mapping[str, Callable[[], AgentModel]] | None = None,
    on_episode: Callable[[Mapping[str, Any]], None] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> RunResult:
    """Run every cell of ``suite``; ``models`` replaces the simulated agents when given."""
    started = time.perf_counter()
    agents = dict(models) if models is not None else {name: AGENTS[name] for name in suite.agents}
    result = RunResult(suite)
    shown_by = "follower" if "follower" in agents else next(iter(agents), "")

    def emit(record: dict[str, Any]) -> None:
        result.records.append(record)
        if on_record is not None:
            on_record(record)

    for scenario_name in suite.scenarios:
        item = scenario(scenario_name)
        schemas = tool_schemas(item)
        for policy_name in suite.policies:
            ref = WorldRef()
            tools: Sequence[ToolDef] = item.make_tools(ref)
            run = POLICIES[policy_name].bind(tools)
            for agent_name, factory in agents.items():
                agent = factory()
                for episode in range(suite.episodes):
                    meta = {"policy": policy_name, "agent": agent_name,
                            "scenario": item.name, "episode": episode, "seed": suite.seed}
                    first_error = run_episode(item, run, ref, agent, schemas, suite, meta, emit)
                    if first_error is not None and episode == 0 and agent_name == shown_by:
                        result.examples.setdefault(item.name, {})[policy_name] = first_error
                    if on_episode is not None:
                        on_episode(meta)
    result.seconds = time.perf_counter() - started
    return result


def run_episode(item: Scenario, run: PolicyRun, ref: WorldRef, agent: AgentModel,
                schemas: Sequence[Mapping[str, Any]], suite: Suite, meta: Mapping[str, Any],
                emit: Callable[[dict[str, Any]], None]) -> str | None:
    """One conversation until the agent answers, the step cap, a halt, a crash or a model error.

    How it ended is the episode record's ``stop``: ``finished``, ``step_cap``, ``halted`` (the
    guard's ladder ended the turn), ``budget`` (a call over the per-turn budget was refused),
    ``crash`` (the framework re-raised) or ``model_error`` (the model endpoint failed; the
    record then names the ``endpoint`` and the ``model_error``).

    Returns the first error text the model was shown (``None`` if there was none).
    """
    seed = f"{suite.seed}:{item.name}:{meta['episode']}"
    world = item.make_world(random.Random(seed))
    ref.world = world
    task = f"{item.name}/{meta['agent']}/{meta['policy']}/{meta['episode']}"
    run.start(task)
    agent.reset(item.brief, schemas, seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": item.brief.goal},
    ]
    calls = 0
    stop = "finished"
    first_error: str | None = None
    model_error: dict[str, str] = {}
    while stop == "finished":
        try:
            turn = agent.next_turn(messages)
        except ModelError as exc:
            stop = "model_error"
            model_error = {"endpoint": str(getattr(agent, "endpoint", "") or agent.name),
                           "model_error": str(exc)}
            break
        if not turn.calls:
            break
        if calls >= suite.step_cap:
            stop = "step_cap"
            break
        messages.append(assistant_message(turn))
        if len(turn.calls) > suite.step_cap - calls:
            stop = "step_cap"
        for tool_call in turn.calls[: suite.step_cap - calls]:
            outcome = run.call(tool_call)
            calls += 1
            emit({**outcome.record, **meta})
            if outcome.crashed:
                stop = "crash"
                if first_error is None:
                    first_error = (f"{CRASH_PREFIX}{outcome.record.get('code')}: "
                                   f"{outcome.text} and the agent run ended)")
                break
            if outcome.halt:
                stop = "budget" if outcome.budget else "halted"
                break
            if first_error is None and not looks_successful(outcome.text):
                first_error = outcome.text
            messages.append({"role": "tool", "tool_call_id": tool_call.id,
                             "content": outcome.text})
    if first_error is None and world.duplicates:
        first_error = (f"{SILENT_PREFIX}an automatic retry succeeded, and the side effect "
                       f"landed {world.duplicates + 1} times)")
    for record in run.finish():
        emit({**record, **meta})
    emit({
        "type": "episode", "task": task, **meta, "stop": stop,
        "success": stop == "finished" and world.goal_met(), "calls": calls,
        "executions": world.executions, "side_effects": world.side_effects,
        "duplicate_side_effects": world.duplicates, "stray_side_effects": world.stray,
        "waited_s": round(run.waited, 3), **model_error,
    })
    return first_error
