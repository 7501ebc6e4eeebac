"""The evidence: does toolfault make retries fall and duplicates vanish?  Measure it.

``toolfault bench`` runs simulated agents (and optionally a real model) on tasks with injected
faults, toolfault against the baselines teams ship, on the same seeds; ``toolfault report``
computes the same metrics from any JSONL trace, including your own ``Guard(trace=...)`` file.

Modules: ``_tasks`` (worlds, tools, faults), ``_agents`` (simulated models), ``_model`` (the
``AgentModel`` protocol and an OpenAI-compatible client), ``_policies`` (toolfault and the
baselines), ``_runner`` (episodes and the trace), ``_metrics`` (numbers from a trace),
``_table`` / ``_html`` (the views), ``_overhead`` (per-call micro-benchmarks).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from toolfault.bench._agents import AGENTS
from toolfault.bench._metrics import Metrics, Summary, metrics_from_trace, read_trace
from toolfault.bench._model import AgentModel, AgentTurn, OpenAICompatibleModel
from toolfault.bench._policies import BENCH_LIMITS, POLICIES, POLICY_NAMES
from toolfault.bench._runner import STEP_CAP, RunResult, Suite, quick_suite, run_suite
from toolfault.bench._tasks import SCENARIO_NAMES, SCENARIOS, TaskBrief, ToolCall

if TYPE_CHECKING:
    from rich.console import Console

#: Episodes per (scenario, agent, policy) cell in the default suite.
DEFAULT_EPISODES = 10

__all__ = [
    "AGENTS",
    "DEFAULT_EPISODES",
    "POLICIES",
    "POLICY_NAMES",
    "SCENARIOS",
    "SCENARIO_NAMES",
    "STEP_CAP",
    "AgentModel",
    "AgentTurn",
    "Metrics",
    "OpenAICompatibleModel",
    "RunResult",
    "Suite",
    "Summary",
    "TaskBrief",
    "ToolCall",
    "bench_command",
    "bench_json",
    "metrics_from_trace",
    "quick_suite",
    "read_trace",
    "report_command",
    "run_suite",
]


def bench_json(result: RunResult, summary: Summary) -> dict[str, Any]:
    """The machine-readable result: deterministic for a seed (no timings, no paths)."""
    from toolfault import __version__
    from toolfault._tokens import token_counter_name

    return {
        "toolfault": __version__,
        "suite": result.suite.to_dict(),
        "token_counter": token_counter_name(),
        "limits": {
            "retry_limits": {k.value: v for k, v in BENCH_LIMITS.retry_limits.items()},
            "max_calls_per_turn": BENCH_LIMITS.max_calls_per_turn,
            "backoff_attempts": BENCH_LIMITS.backoff.attempts,
        },
        **summary.to_dict(),
    }


def _suite_from(args: argparse.Namespace) -> Suite:
    seed = int(getattr(args, "seed", 7) or 0)
    episodes = getattr(args, "episodes", None)
    suite = quick_suite(seed) if getattr(args, "quick", False) else Suite(
        seed=seed, episodes=DEFAULT_EPISODES)
    if episodes:
        suite = replace(suite, episodes=int(episodes))
    return suite


def _model_factory(args: argparse.Namespace) -> dict[str, Any] | None:
    url = getattr(args, "model_url", None)
    if not url:
        return None
    model = getattr(args, "model", None) or "default"
    key = os.environ.get(getattr(args, "api_key_env", None) or "OPENAI_API_KEY")

    def factory() -> AgentModel:
        return OpenAICompatibleModel(url, model, api_key=key)

    return {f"model:{model}": factory}


class _TraceWriter:
    """Writes the run's records as JSONL (a fresh file, same encoding as ``JsonlSink``)."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115

    def __call__(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")

    def close(self) -> None:
        self._file.close()


def _stores_command(redis_url: str | None, *, as_json: bool) -> int:
    """``toolfault bench --stores``: guarded calls/s per store vs a bare call, one run."""
    from rich.console import Console
    from rich.table import Table

    from toolfault.stores._throughput import store_throughput

    rows = store_throughput(1.0, redis_url=redis_url)
    if as_json:
        sys.stdout.write(json.dumps({"stores": rows}, indent=2) + "\n")
        return 0
    table = Table(title="guarded successful calls per store (same run, same function)")
    for header in ("store", "calls/s", "µs/call", "× bare rate", "added µs/call"):
        table.add_column(header, justify="left" if header == "store" else "right")
    for row in rows:
        table.add_row(row["store"], f"{row['calls_per_second']:,.0f}",
                      f"{row['us_per_call']:.2f}", f"{row['ratio_vs_bare']:.4f}",
                      f"{row['overhead_us']:.2f}")
    Console().print(table)
    return 0


def bench_command(args: argparse.Namespace) -> int:
    """``toolfault bench``: run the suite, print the table (or JSON), write trace and page."""
    from rich.console import Console

    if getattr(args, "overhead", False):
        from toolfault.bench._overhead import overhead_command

        return overhead_command(as_json=bool(getattr(args, "json", False)))
    if getattr(args, "stores", False):
        return _stores_command(getattr(args, "redis_url", None),
                               as_json=bool(getattr(args, "json", False)))
    suite = _suite_from(args)
    models = _model_factory(args)
    if models is not None:
        suite = replace(suite, agents=tuple(models), episodes=getattr(args, "episodes", None) or 1)
    err = Console(stderr=True)
    writer = _TraceWriter(args.trace) if getattr(args, "trace", None) else None
    try:
        result = _run_with_progress(suite, models, writer, err)
    finally:
        if writer is not None:
            writer.close()
    summary = metrics_from_trace(result.records)
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(bench_json(result, summary), indent=2) + "\n")
    else:
        from toolfault.bench._table import print_summary

        out = Console() if sys.stdout.isatty() else Console(width=120)
        print_summary(summary, out, title=f"toolfault bench · seed {suite.seed} · "
                      f"{suite.size} episodes · step cap {suite.step_cap}")
        out.print(f"[dim]ran {suite.size} episodes in {result.seconds:.1f}s[/dim]")
    if getattr(args, "report", None):
        from toolfault.bench._html import write_html

        path = write_html(
            args.report, summary, title="toolfault bench",
            subtitle=f"seed {suite.seed} · {len(suite.scenarios)} scenarios × "
                     f"{len(suite.agents)} agents × {len(suite.policies)} policies × "
                     f"{suite.episodes} episodes = {suite.size} episodes · step cap "
                     f"{suite.step_cap} · ran in {result.seconds:.1f}s",
            examples=result.examples)
        err.print(f"wrote {path}")
    if getattr(args, "trace", None):
        err.print(f"wrote {args.trace}")
    return 0


def _run_with_progress(suite: Suite, models: dict[str, Any] | None, writer: _TraceWriter | None,
                       err: Console) -> RunResult:
    """Run the suite behind a progress bar on stderr (stdout stays clean for --json)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                  transient=True) as progress:
        task = progress.add_task("episodes", total=suite.size)

        def advance(meta: Mapping[str, Any]) -> None:
            progress.update(task, advance=1,
                            description=f"{meta['scenario']} · {meta['policy']}".ljust(40))

        return run_suite(suite, models=models, on_episode=advance, on_record=writer)


def report_command(args: argparse.Namespace) -> int:
    """``toolfault report run.jsonl``: the bench's table and page, from any trace."""
    from rich.console import Console

    err = Console(stderr=True)
    path = Path(args.trace)
    try:
        records = read_trace(path)
    except FileNotFoundError:
        err.print(f"toolfault report: no such file: {path}")
        return 2
    except (OSError, ValueError) as exc:
        err.print(f"toolfault report: {exc}")
        return 2
    summary = metrics_from_trace(records)
    if not summary.policies:
        err.print(f"toolfault report: {path} holds no call records")
        return 1
    if getattr(args, "json", False):
        from toolfault._tokens import token_counter_name

        payload = {"trace": str(path), "records": len(records),
                   "token_counter": token_counter_name(), **summary.to_dict()}
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        from toolfault.bench._table import print_summary

        print_summary(summary, None, title=f"toolfault report · {path.name} · "
                      f"{sum(m.tasks for m in summary.policies.values())} tasks")
    if getattr(args, "report", None):
        from toolfault.bench._html import write_html

        calls = sum(m.calls for m in summary.policies.values())
        out = write_html(args.report, summary, title="toolfault report",
                         subtitle=f"{path.name} · {calls} calls · "
                                  f"{sum(m.tasks for m in summary.policies.values())} tasks")
        err.print(f"wrote {out}")
    return 0
