"""The evidence: does toolfault make retries fall and duplicates vanish?  Measure it.

``toolfault bench`` runs simulated agents (and optionally a real model) on tasks with injected
faults, toolfault against the baselines teams ship, on the same seeds; ``toolfault report``
computes the same metrics from any JSONL trace, including your own ``Guard(trace=...)`` file.

Modules: ``_tasks`` (worlds, tools, faults), ``_agents`` (simulated models), ``_model`` (the
``AgentModel`` protocol and an OpenAI-compatible client), ``_policies`` (toolfault and the
baselines), ``_runner`` (episodes and the trace), ``_metrics`` (numbers from a trace),
``_table`` / ``_html`` (the views), ``_overhead`` (per-call micro-benchmarks),
``_loops`` (the ladder's precision suite: ``_loop_world``, ``_loop_families``, ``_loops_view``).
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
from urllib.parse import urlsplit

from toolfault_cli.bench._agents import AGENTS
from toolfault_cli.bench._metrics import (
    Metrics,
    Summary,
    is_call_record,
    metrics_from_trace,
    read_trace,
)
from toolfault_cli.bench._model import AgentModel, AgentTurn, OpenAICompatibleModel
from toolfault_cli.bench._policies import BENCH_LIMITS, POLICIES, POLICY_NAMES
from toolfault_cli.bench._runner import STEP_CAP, RunResult, Suite, quick_suite, run_suite
from toolfault_cli.bench._tasks import SCENARIO_NAMES, SCENARIOS, TaskBrief, ToolCall

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


def token_counter_note(*, from_trace: bool = False) -> str:
    """One line naming the token counter behind every error-token figure shown."""
    from toolfault._tokens import token_counter_name

    here = ("exact cl100k_base counts" if token_counter_name() == "cl100k_base" else
            "estimated counts (install toolfault[tokens] for exact cl100k_base counts)")
    if from_trace:
        return ("error tokens: as recorded in the trace by the guard that wrote it (its "
                "tokenizer: exact cl100k_base where toolfault[tokens] was installed, else the "
                "estimate)")
    return f"error tokens: {here}"


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

    from toolfault._usage import error
    from toolfault.stores._throughput import store_throughput

    if redis_url is not None and (problem := _redis_problem(redis_url)):
        error("bench", problem)
        return 1
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


def _redis_problem(url: str) -> str | None:
    """Why ``url`` is not a reachable Redis (a PING), or ``None``; numbers need a real server."""
    try:
        import redis
    except ImportError:
        return "--redis-url needs the redis package: pip install 'toolfault[redis]'"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
        client.close()
    except (redis.RedisError, ValueError, OSError) as exc:
        from toolfault._usage import shown_url

        detail = " ".join(str(exc).split())
        parts = urlsplit(url)
        if parts.password:
            detail = detail.replace(parts.password, "***")
        return f"cannot reach Redis at {shown_url(url)}: {detail}"
    return None


def bench_command(args: argparse.Namespace) -> int:
    """``toolfault bench``: run the suite, print the table (or JSON), write trace and page."""
    from rich.console import Console

    if getattr(args, "overhead", False):
        from toolfault_cli.bench._overhead import overhead_command

        return overhead_command(as_json=bool(getattr(args, "json", False)))
    if getattr(args, "loops", False):
        from toolfault_cli.bench._loops_view import loops_command

        return loops_command(args)
    if getattr(args, "stores", False):
        return _stores_command(getattr(args, "redis_url", None),
                               as_json=bool(getattr(args, "json", False)))
    from toolfault._usage import error

    suite = _suite_from(args)
    models = _model_factory(args)
    if models is not None:
        suite = replace(suite, agents=tuple(models), episodes=getattr(args, "episodes", None) or 1)
        problem = _endpoint_problem(args)
        if problem:
            error("bench", problem)
            return 1
    err = Console(stderr=True, highlight=False, emoji=False)
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
        from toolfault_cli.bench._table import print_summary

        out = Console(emoji=False) if sys.stdout.isatty() else Console(width=120, emoji=False)
        print_summary(summary, out, title=f"toolfault bench · seed {suite.seed} · "
                      f"{suite.size} episodes · step cap {suite.step_cap}",
                      note=token_counter_note())
        out.print(f"[dim]ran {suite.size} episodes in {result.seconds:.1f}s[/dim]")
    if getattr(args, "report", None):
        path = _write_page(
            args.report, summary, title="toolfault bench",
            subtitle=f"seed {suite.seed} · {len(suite.scenarios)} scenarios × "
                     f"{len(suite.agents)} agents × {len(suite.policies)} policies × "
                     f"{suite.episodes} episodes = {suite.size} episodes · step cap "
                     f"{suite.step_cap} · ran in {result.seconds:.1f}s",
            examples=result.examples, source="bench", tokens_note=token_counter_note())
        if path is None:
            return 2
        err.print(f"wrote {path}", markup=False)
    if getattr(args, "trace", None):
        err.print(f"wrote {args.trace}", markup=False)
    if models is not None and summary.model_errors:
        from toolfault._usage import shown_url

        failed = sum(e.episodes for e in summary.model_errors)
        if failed == summary.episodes:
            error("bench", f"every episode ended in a model error: the endpoint at "
                           f"{shown_url(args.model_url)} stopped answering chat completions")
        else:
            error("bench", f"{failed} of {summary.episodes} episodes ended in a model error: "
                           f"the endpoint at {shown_url(args.model_url)} failed during the "
                           f"run, so those episodes measure nothing (see the page or the "
                           f"trace for each error)")
        return 1
    return 0


def _write_page(path: str, summary: Summary, **kw: Any) -> Path | None:
    """The HTML page, or one error line if the file cannot be written after all."""
    from toolfault._usage import error
    from toolfault_cli.bench._html import write_html

    try:
        return write_html(path, summary, **kw)
    except OSError as exc:
        error("bench" if kw.get("source") == "bench" else "report",
              f"cannot write {path}: {exc.strerror or exc}")
        return None


def _endpoint_problem(args: argparse.Namespace) -> str | None:
    """One chat completion before the run: why the endpoint cannot drive the bench, or None."""
    from toolfault_cli.bench._model import ModelError

    env = getattr(args, "api_key_env", None) or "OPENAI_API_KEY"
    model = OpenAICompatibleModel(args.model_url, getattr(args, "model", None) or "default",
                                  api_key=os.environ.get(env), timeout=30.0)
    try:
        model.check()
    except ModelError as exc:
        hint = ""
        if exc.status in (401, 403):
            hint = (f" (set ${env}, or name another variable with --api-key-env)"
                    if not os.environ.get(env) else f" (the key comes from ${env})")
        return f"model endpoint check failed: {exc}{hint}; no episodes were run"
    return None


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

    from toolfault._usage import error

    err = Console(stderr=True, highlight=False, emoji=False)
    path = Path(args.trace)
    try:
        records = read_trace(path)
    except FileNotFoundError:
        error("report", f"no such file: {path}")
        return 2
    except IsADirectoryError:
        error("report", f"{path} is a directory, not a JSONL trace")
        return 2
    except PermissionError:
        error("report", f"cannot read {path}: permission denied")
        return 2
    except UnicodeDecodeError:
        error("report", f"{path} is not a text file (expected a JSONL trace)")
        return 2
    except OSError as exc:
        error("report", f"cannot read {path}: {exc.strerror or exc}")
        return 2
    except ValueError as exc:
        error("report", str(exc))
        return 2
    if not any(is_call_record(r) for r in records):
        error("report", f"{path} has no toolfault call record (a line with \"type\": \"call\", "
                        f"a \"tool\" and \"ok\", as Guard(trace=...) writes)")
        return 2
    try:
        summary = metrics_from_trace(records)
    except (ValueError, TypeError, AttributeError) as exc:
        error("report", f"{path} is not a toolfault trace: a record has an unexpected value "
                        f"({type(exc).__name__}: {exc})")
        return 2
    if getattr(args, "json", False):
        from toolfault._tokens import token_counter_name

        payload = {"trace": str(path), "records": len(records),
                   "token_counter": token_counter_name(), **summary.to_dict()}
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    else:
        from toolfault_cli.bench._table import print_summary

        print_summary(summary, None, title=f"toolfault report · {path.name} · "
                      f"{sum(m.tasks for m in summary.policies.values())} tasks",
                      note=token_counter_note(from_trace=True))
    if getattr(args, "report", None):
        calls = sum(m.calls for m in summary.policies.values())
        out = _write_page(args.report, summary, title="toolfault report",
                         subtitle=f"{path.name} · {calls} calls · "
                                  f"{sum(m.tasks for m in summary.policies.values())} tasks",
                         source="trace", tokens_note=token_counter_note(from_trace=True))
        if out is None:
            return 2
        err.print(f"wrote {out}", markup=False)
    return 0
