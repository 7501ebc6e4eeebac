"""``toolfault bench --loops``: the ladder's precision, measured.

Loop protection is judged by two numbers at once (docs/DESIGN: "stop loops, never good
work"): legitimate runs harmed, which must be zero, and how fast loops are stopped.  Every
family (:mod:`~toolfault_cli.bench._loop_families`) runs over many seeds against a real
:class:`~toolfault.Guard`; a legitimate script also runs on the bare functions, and its run is
*harmed* when any call was refused (blocked, halted, ``no_progress``, ``tool_blocked``), any
call failed that succeeded bare, the model's calls diverged, or the world ended in another
state.  A loop is measured in its own calls: when it was first stopped (the terminal message,
a refusal, ``tool_blocked`` or ``no_progress``), when the turn halted, and how many tool
bodies ran.  Paths: one call at a time (``guard.call``), parallel batches (``await
guard.arun_tool_calls``) and several conversations at once (``guard.scoped``, interleaved).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolfault._errors import FailureClass
from toolfault._guard import Guard
from toolfault._limits import Limits
from toolfault._result import ToolResult
from toolfault._returned import default_error_result
from toolfault_cli.bench._loop_families import FAMILIES, Call, Family, Plan, Script, Seen
from toolfault_cli.bench._loop_world import WorldRef, office_tools, tool_functions

#: Seeds per family and path in the default run.
DEFAULT_SEEDS = 200
#: Conversations served at once by one guard in the ``conversations`` path.
CONVERSATIONS = 4
_REFUSED = frozenset({"no_progress", "tool_blocked"})


# -- one run -----------------------------------------------------------------------------------
def _static(calls: list[Call], rng: random.Random | None) -> Script:
    """A fixed list of calls as a script: one at a time, or (``rng``) in parallel batches
    of 1 to 4 that never hold two calls about one item."""
    i = 0
    while i < len(calls):
        batch = [calls[i]]
        i += 1
        size = rng.randint(1, 4) if rng is not None else 1
        while i < len(calls) and len(batch) < size and \
                all(c.item != calls[i].item for c in batch):
            batch.append(calls[i])
            i += 1
        yield batch


def _script(plan: Plan, rng: random.Random | None) -> Script:
    return _static(plan, rng) if isinstance(plan, list) else plan


def _bare_send(functions: dict[str, Callable[..., Any]]) -> Callable[[list[Call]], list[Seen]]:
    def send(batch: list[Call]) -> list[Seen]:
        out = []
        for call in batch:
            args = json.loads(call.args) if isinstance(call.args, str) else call.args
            try:
                value = functions[call.tool](**args)
            except Exception:  # noqa: BLE001 - the bare run: a failure is a failure
                out.append(Seen(ok=False))
                continue
            out.append(Seen(ok=default_error_result(value) is None, value=value))
        return out
    return send


def seen(result: ToolResult) -> Seen:
    """A guarded result as the suite judges it."""
    code = result.code
    return Seen(ok=result.ok, value=result.data if result.ok else None,
                refused=result.blocked or result.halt or code in _REFUSED,
                halt=result.halt, terminal=result.terminal, code=code)


def _drive(script: Script, send: Callable[[list[Call]], list[Seen]]
           ) -> list[tuple[Call, Seen]]:
    log: list[tuple[Call, Seen]] = []
    try:
        batch = next(script)
        while True:
            answers = send(batch)
            log.extend(zip(batch, answers, strict=True))
            batch = script.send(answers)
    except StopIteration:
        return log


async def _adrive(script: Script, send: Callable[[list[Call]], Awaitable[list[Seen]]]
                  ) -> list[tuple[Call, Seen]]:
    log: list[tuple[Call, Seen]] = []
    try:
        batch = next(script)
        while True:
            answers = await send(batch)
            log.extend(zip(batch, answers, strict=True))
            batch = script.send(answers)
    except StopIteration:
        return log


def new_guard(ref: WorldRef, limits: Limits | None) -> Guard:
    """A guard over the office's tools, as a team would wrap them (no waits between
    in-wrapper retries: the suite counts calls, not seconds)."""
    guard = Guard(limits=limits, sleep=lambda _: None, scan_env_secrets=False)
    for tool in office_tools(ref):
        guard.tool(name=tool.name, side_effect=tool.side_effect)(tool.fn)
    return guard


@dataclass(slots=True)
class Run:
    """One seed of one family on one path."""

    family: Family
    path: str
    seed: int
    guarded: list[tuple[Call, Seen]]
    bodies: int = 0
    harm: str | None = None


def _judge(run: Run, bare: list[tuple[Call, Seen]], bare_state: Any, state: Any) -> None:
    """Set ``run.harm`` to the first way the guarded run differs from the bare one."""
    for i, ((call, got), (bare_call, want)) in enumerate(zip(run.guarded, bare, strict=False)):
        if call != bare_call:
            run.harm = f"call {i + 1}: the model's calls diverged ({call.tool} vs " \
                       f"{bare_call.tool})"
            return
        if got.refused or (want.ok and not got.ok):
            how = "halted" if got.halt else "blocked, not run" if got.refused else "failed"
            run.harm = f"call {i + 1}: {call.tool}({_shown(call.args)}) answered " \
                       f"{got.code} ({how}) where the bare call " + \
                       ("succeeded" if want.ok else "ran")
            return
    if len(run.guarded) != len(bare):
        run.harm = f"{len(run.guarded)} calls where the bare run made {len(bare)}"
    elif state != bare_state:
        run.harm = "the world ended in another state than the bare run left it"


def _shown(args: Any) -> str:
    text = args if isinstance(args, str) else json.dumps(args)
    return text if len(text) <= 80 else text[:77] + "..."


def run_one(family: Family, seed: int, limits: Limits | None, *, batch: bool = False
            ) -> Run:
    """One seed, one call at a time (``batch``: in parallel batches, through
    ``arun_tool_calls``)."""
    return asyncio.run(_run_batch(family, seed, limits)) if batch else \
        _run_sync(family, seed, limits)


def _bare(family: Family, seed: int, batch: bool) -> tuple[list[tuple[Call, Seen]], Any]:
    rng = random.Random(seed)
    ref = WorldRef(family.world(rng))
    plan = family.plan(rng, ref.world)
    log = _drive(_script(plan, random.Random(seed) if batch else None),
                 _bare_send(tool_functions(ref)))
    return log, ref.world.state()


def _run_sync(family: Family, seed: int, limits: Limits | None) -> Run:
    rng = random.Random(seed)
    ref = WorldRef(family.world(rng))
    plan = family.plan(rng, ref.world)
    guard = new_guard(ref, limits)
    log = _drive(_script(plan, None),
                 lambda batch: [seen(guard.call(c.tool, c.args)) for c in batch])
    guard.close()
    return _finish(Run(family, "sync", seed, log, ref.world.executions), family, seed,
                   ref, batch=False)


async def _run_batch(family: Family, seed: int, limits: Limits | None) -> Run:
    rng = random.Random(seed)
    ref = WorldRef(family.world(rng))
    plan = family.plan(rng, ref.world)
    guard = new_guard(ref, limits)

    async def send(batch: list[Call]) -> list[Seen]:
        results = await guard.arun_tool_calls([(c.tool, c.args) for c in batch])
        return [seen(r) for r in results]

    log = await _adrive(_script(plan, random.Random(seed)), send)
    guard.close()
    return _finish(Run(family, "batch", seed, log, ref.world.executions), family, seed,
                   ref, batch=True)


def _finish(run: Run, family: Family, seed: int, ref: WorldRef, *, batch: bool) -> Run:
    if family.kind == "legit":
        bare, bare_state = _bare(family, seed, batch)
        _judge(run, bare, bare_state, ref.world.state())
    return run


def run_conversations(families: Sequence[Family], seed: int, limits: Limits | None
                      ) -> list[Run]:
    """``CONVERSATIONS`` conversations on one guard, each through its own ``scoped`` guard,
    their calls interleaved at random: three legitimate ones and one loop."""
    rng = random.Random(seed)
    legit = [f for f in families if f.kind == "legit"]
    loops = [f for f in families if f.kind == "loop"]
    chosen = rng.sample(legit, min(CONVERSATIONS - 1, len(legit))) + \
        ([rng.choice(loops)] if loops else [])
    ref = WorldRef()
    guard = new_guard(ref, limits)
    live: list[tuple[Family, int, WorldRef, Guard, Script, list[tuple[Call, Seen]]]] = []
    for k, family in enumerate(chosen):
        conv_seed = seed * 1_000 + k
        crng = random.Random(conv_seed)
        own = WorldRef(family.world(crng))
        plan = family.plan(crng, own.world)
        live.append((family, conv_seed, own, guard.scoped(f"conversation-{seed}-{k}"),
                     _script(plan, None), []))
    before: dict[int, int] = {}  # bodies run before a loop's first loop call
    pending: dict[int, list[Call] | None] = {}
    for i, (_, _, _, _, script, _) in enumerate(live):
        pending[i] = next(script, None)
    while any(batch is not None for batch in pending.values()):
        i = rng.choice([k for k, batch in pending.items() if batch is not None])
        family, _, own, scope, script, log = live[i]
        batch = pending[i]
        assert batch is not None
        ref.world = own.world
        if i not in before and batch[0].loop:
            before[i] = own.world.executions
        answers = [seen(scope.call(c.tool, c.args)) for c in batch]
        log.extend(zip(batch, answers, strict=True))
        try:
            pending[i] = script.send(answers)
        except StopIteration:
            pending[i] = None
    guard.close()
    return [_finish(Run(family, "conversations", conv_seed, log,
                        own.world.executions - before.get(i, 0)),
                    family, conv_seed, own, batch=False)
            for i, (family, conv_seed, own, _, _, log) in enumerate(live)]


# -- the suite -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Stat:
    """Median and maximum over seeds (``None``: never happened in some seed)."""

    median: float | None
    max: int | None
    missing: int = 0

    @classmethod
    def of(cls, values: Iterable[int | None]) -> Stat:
        seen_ = list(values)
        have = [v for v in seen_ if v is not None]
        missing = len(seen_) - len(have)
        if not have:
            return cls(None, None, missing)
        return cls(statistics.median(have), max(have), missing)

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "max": self.max, "never": self.missing}


@dataclass(frozen=True, slots=True)
class LegitRow:
    family: str
    path: str
    runs: int
    harmed: int
    calls: int
    examples: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LoopRow:
    family: str
    path: str
    runs: int
    block: Stat
    halt: Stat
    after_block: Stat
    bodies: Stat
    calls: Stat


@dataclass(frozen=True, slots=True)
class Target:
    """One target: what is promised, what was measured, whether it held."""

    name: str
    promised: str
    measured: str
    met: bool


@dataclass(slots=True)
class LoopsResult:
    seeds: int
    seed: int
    limits: Limits
    legit: list[LegitRow] = field(default_factory=list)
    loops: list[LoopRow] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(t.met for t in self.targets)

    @property
    def harmed(self) -> int:
        return sum(r.harmed for r in self.legit)

    @property
    def legit_runs(self) -> int:
        return sum(r.runs for r in self.legit)

    def to_dict(self) -> dict[str, Any]:
        limits = self.limits
        return {
            "seeds": self.seeds, "seed": self.seed, "ok": self.ok,
            "limits": {
                "retry_limits": {k.value: limits.limit_for(k) for k in FailureClass},
                "halt_after_refusals": limits.halt_after_refusals,
                "max_tool_failures_per_turn": limits.max_tool_failures_per_turn,
                "no_progress_repeats": limits.no_progress_repeats,
            },
            "legitimate": {"runs": self.legit_runs, "harmed": self.harmed,
                           "families": [{"family": r.family, "path": r.path, "runs": r.runs,
                                         "harmed": r.harmed, "calls": r.calls,
                                         "examples": list(r.examples)} for r in self.legit]},
            "loops": [{"family": r.family, "path": r.path, "runs": r.runs,
                       "calls_until_blocked": r.block.to_dict(),
                       "calls_until_halted": r.halt.to_dict(),
                       "halted_after_block": r.after_block.to_dict(),
                       "bodies_run": r.bodies.to_dict(), "calls": r.calls.to_dict()}
                      for r in self.loops],
            "targets": [{"target": t.name, "promised": t.promised, "measured": t.measured,
                         "met": t.met} for t in self.targets],
        }


def _loop_numbers(run: Run) -> tuple[int | None, int | None, int, int]:
    """Calls until first stopped, until halted (1-based, loop calls only), bodies, calls."""
    block = halt = None
    n = 0
    for call, got in run.guarded:
        if not call.loop:
            continue
        n += 1
        if block is None and (got.refused or got.terminal):
            block = n
        if halt is None and got.halt:
            halt = n
    return block, halt, run.bodies, n


def _legit_row(name: str, path: str, runs: Sequence[Run]) -> LegitRow:
    harmed = [r for r in runs if r.harm is not None]
    examples = tuple(f"seed {r.seed}: {r.harm}" for r in harmed[:3])
    return LegitRow(name, path, len(runs), len(harmed),
                    sum(len(r.guarded) for r in runs), examples)


def _loop_row(name: str, path: str, runs: Sequence[Run]) -> LoopRow:
    numbers = [_loop_numbers(r) for r in runs]
    after = [h - b if h is not None and b is not None else None for b, h, _, _ in numbers]
    return LoopRow(name, path, len(runs), Stat.of(b for b, _, _, _ in numbers),
                   Stat.of(h for _, h, _, _ in numbers), Stat.of(after),
                   Stat.of(x for _, _, x, _ in numbers), Stat.of(c for _, _, _, c in numbers))


def _loop_run(family: Family, seed: int, limits: Limits | None) -> Run:
    """A loop, one call at a time; bodies counted from its first loop call."""
    rng = random.Random(seed)
    ref = WorldRef(family.world(rng))
    plan = family.plan(rng, ref.world)
    guard = new_guard(ref, limits)
    before: list[int] = []  # bodies run by the warm-up, before the first loop call

    def send(batch: list[Call]) -> list[Seen]:
        if not before and batch[0].loop:
            before.append(ref.world.executions)
        return [seen(guard.call(c.tool, c.args)) for c in batch]

    log = _drive(_script(plan, None), send)
    guard.close()
    return Run(family, "sync", seed, log, ref.world.executions - sum(before))


def run_loops(*, seeds: int = DEFAULT_SEEDS, seed: int = 7, limits: Limits | None = None,
              families: Sequence[Family] = FAMILIES,
              progress: Callable[[str], None] | None = None) -> LoopsResult:
    """Every family over ``seeds`` seeds on every path, and the targets checked."""
    result = LoopsResult(seeds, seed, limits or Limits())
    base = seed * 100_003
    for family in families:
        if progress is not None:
            progress(family.name)
        if family.kind == "legit":
            runs = [_run_sync(family, base + s, limits) for s in range(seeds)]
            result.legit.append(_legit_row(family.name, "sync", runs))
            if family.batch:
                runs = [run_one(family, base + s, limits, batch=True) for s in range(seeds)]
                result.legit.append(_legit_row(family.name, "batch", runs))
        else:
            runs = [_loop_run(family, base + s, limits) for s in range(seeds)]
            result.loops.append(_loop_row(family.name, "sync", runs))
    if progress is not None:
        progress("conversations")
    conv: list[Run] = []
    for s in range(max(1, seeds // 2)):
        conv += run_conversations(families, base + s, limits)
    legit_conv = [r for r in conv if r.family.kind == "legit"]
    if legit_conv:
        result.legit.append(_legit_row(f"{CONVERSATIONS} conversations at once",
                                       "conversations", legit_conv))
    loop_conv = [r for r in conv if r.family.kind == "loop"]
    if loop_conv:
        result.loops.append(_loop_row("loops among conversations", "conversations",
                                      loop_conv))
    result.targets = targets(result)
    return result


# -- targets -------------------------------------------------------------------------------------
def _row(result: LoopsResult, family: str) -> LoopRow | None:
    return next((r for r in result.loops if r.family == family and r.path == "sync"), None)


def _fmt(stat: Stat) -> str:
    if stat.max is None:
        return "never"
    text = f"median {stat.median:g}, max {stat.max}"
    return text + (f", never in {stat.missing} runs" if stat.missing else "")


def _within(stat: Stat, limit: int) -> bool:
    return stat.max is not None and stat.missing == 0 and stat.max <= limit


def targets(result: LoopsResult) -> list[Target]:
    """The promises at these limits (at the defaults: 0 harmed; an identical failing call
    blocked at its cap and halted within cap + 2; varying bad arguments blocked within 6;
    an identical read within 6; every loop halted within 3 calls after its block)."""
    limits = result.limits
    refusals = limits.halt_after_refusals
    out = [Target("legitimate runs harmed", "0", f"{result.harmed} of {result.legit_runs}",
                  result.harmed == 0)]
    for family, cls in (("identical failing call", FailureClass.BAD_INPUT),
                        ("identical call, outage", FailureClass.TRANSIENT)):
        row = _row(result, family)
        if row is None:
            continue
        cap = limits.limit_for(cls)
        exact = row.block.missing == 0 and row.block.max == cap and row.block.median == cap
        out.append(Target(f"{family}: blocked at the cap", f"at call {cap}",
                          _fmt(row.block), exact))
        if refusals is not None:
            out.append(Target(f"{family}: halted", f"within {cap + refusals} calls",
                              _fmt(row.halt), _within(row.halt, cap + refusals)))
    for family, ceiling in (("varying bad arguments", limits.max_tool_failures_per_turn),
                            ("identical read", limits.no_progress_repeats)):
        row = _row(result, family)
        if row is None or ceiling is None:
            continue
        out.append(Target(f"{family}: blocked", f"within {ceiling + 1} calls",
                          _fmt(row.block), _within(row.block, ceiling + 1)))
    if refusals is not None:
        for row in result.loops:
            out.append(Target(f"{row.family}: halted after its block",
                              f"within {refusals + 1} calls", _fmt(row.after_block),
                              _within(row.after_block, refusals + 1)))
    return out



# -- the command ---------------------------------------------------------------------------------
#: Seeds per family and path with ``--quick``.
QUICK_SEEDS = 20
