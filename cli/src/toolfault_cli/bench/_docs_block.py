"""``toolfault bench --update-docs docs/bench.md``: the page's figures, generated from a run.

docs/bench.md holds a block between ``<!-- bench:begin -->`` and ``<!-- bench:end -->`` that
this module writes from one run of the default suite and one run of the loop-precision suite,
with the settings below; ``--check-docs`` re-runs both and fails (exit 1, with a diff) when the
committed block differs, the way ``toolfault docs --check`` guards docs/errors.md.  Nothing in
the block is a timing, so the same code gives the same bytes on any machine with the exact
cl100k_base counter (the counter changes both the error-token figures and the guard's message
cuts, so the block is only generated or checked with it).
"""

from __future__ import annotations

import difflib
import io
import sys
from pathlib import Path

from toolfault_cli.bench._loops import LoopsResult, Stat, run_loops
from toolfault_cli.bench._metrics import Summary, metrics_from_trace
from toolfault_cli.bench._policies import policy_labels
from toolfault_cli.bench._runner import STEP_CAP, Suite, run_suite

#: The settings behind the block: the default suite, and a loop suite that runs in seconds.
SEED = 7
EPISODES = 10
LOOP_SEEDS = 50
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
COMMAND = "toolfault bench --update-docs"


def _suite() -> Suite:
    return Suite(seed=SEED, episodes=EPISODES)


def _tables(summary: Summary, suite: Suite) -> str:
    from rich.console import Console

    from toolfault_cli.bench._table import render

    buffer = io.StringIO()
    console = Console(file=buffer, width=110, color_system=None, emoji=False,
                      highlight=False, force_terminal=False)
    console.print(render(summary, title=f"seed {suite.seed} · {suite.size} episodes",
                         breakdowns=False))
    lines = [line.rstrip() for line in buffer.getvalue().splitlines()]
    return "\n".join(lines).strip("\n")


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def _headlines(summary: Summary) -> list[str]:
    """The figures the prose relies on, each computed here (toolfault against the rest)."""
    ours = summary.policies["toolfault"]
    labels = policy_labels(summary.policies)
    others = {p: m for p, m in summary.policies.items() if p != "toolfault"}
    keeps_calling = {p: m for p, m in others.items() if m.longest_identical_run >= STEP_CAP}
    loops = sorted({m.longest_identical_run for m in keeps_calling.values()})
    dups = sorted(m.duplicate_side_effects for m in keeps_calling.values())
    follower = {p: v["follower"].success_rate for p, v in summary.agents.items()
                if "follower" in v}
    best_other = max((v for p, v in follower.items() if p != "toolfault"), default=0.0)
    out = [
        f"longest identical loop that reached a tool: {ours.longest_identical_run} under "
        f"toolfault; {', '.join(map(str, loops)) or '–'} (the step cap) under the baselines "
        f"that let the model keep calling ({', '.join(labels[p] for p in keeps_calling)})",
        f"duplicate side effects: {ours.duplicate_side_effects} under toolfault; "
        f"{dups[0]}–{dups[-1]} under those baselines" if dups else
        f"duplicate side effects: {ours.duplicate_side_effects} under toolfault",
        f"instruction follower's success: {_pct(follower.get('toolfault', 0.0))} under "
        f"toolfault; {_pct(best_other)} at best elsewhere",
        f"how toolfault's {ours.tasks} episodes ended: {ours.successes} reached the goal, "
        f"{ours.gave_up} finished with the goal missed, {ours.halts} halted by the ladder, "
        f"{ours.budget_stops} stopped by the per-turn budget, {ours.step_cap_hits} at the "
        f"step cap, {ours.crashes} crashed",
        f"identical calls blocked before reaching a tool: {ours.blocked}; error tokens per "
        f"task: {ours.error_tokens_per_task:.0f} under toolfault, "
        f"{others['traceback'].error_tokens_per_task:.0f} with raw tracebacks",
        f"LangChain default: {others['langchain'].crashes} of {others['langchain'].tasks} "
        f"episodes crashed ({_pct(others['langchain'].crashes / others['langchain'].tasks)})",
    ]
    return [f"- {line}." for line in out]


def _stat(stat: Stat) -> str:
    if stat.max is None:
        return "never"
    text = f"{stat.median:g} / {stat.max}"
    return text + (f" (never in {stat.missing})" if stat.missing else "")


def _loops(result: LoopsResult) -> list[str]:
    out = [
        f"Loop precision (`toolfault bench --loops --episodes {result.seeds}`, seed "
        f"{result.seed}, default `Limits`): legitimate runs harmed: **{result.harmed} of "
        f"{result.legit_runs}**; targets {'all met' if result.ok else 'MISSED'}.",
        "",
        "| loop family | path | calls until blocked (median / max) | calls until halted "
        "(median / max) |",
        "|---|---|---|---|",
    ]
    out += [f"| {row.family} | {row.path} | {_stat(row.block)} | {_stat(row.halt)} |"
            for row in result.loops]
    return out


def render_block() -> str:
    """The generated block, markers included (deterministic for this code and counter)."""
    suite = _suite()
    summary = metrics_from_trace(run_suite(suite).records)
    loops = run_loops(seeds=LOOP_SEEDS, seed=SEED)
    lines = [
        BEGIN,
        f"<!-- Generated by `{COMMAND} docs/bench.md` (seed {SEED}, {EPISODES} episodes per "
        f"cell, {LOOP_SEEDS} loop seeds, cl100k_base token counts); CI re-runs it with "
        f"--check-docs. Do not edit by hand. -->",
        "",
        f"Default suite, seed {suite.seed}: {len(suite.scenarios)} scenarios × "
        f"{len(suite.agents)} agents × {len(suite.policies)} policies × {suite.episodes} "
        f"episodes = {suite.size} episodes; error tokens counted with cl100k_base.",
        "",
        "```text",
        _tables(summary, suite),
        "```",
        "",
        *_headlines(summary),
        "",
        *_loops(loops),
        END,
    ]
    return "\n".join(lines)


def _splice(text: str, block: str) -> str | None:
    """``text`` with its block replaced, or ``None`` when it has no (well-ordered) markers."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[:start] + block + text[end + len(END):]


def docs_block_command(path: str, *, check: bool) -> int:
    """Write (or with ``check`` compare) the block in ``path``; exit 1 on drift, 2 on bad input."""
    from toolfault._tokens import token_counter_name
    from toolfault._usage import error, input_problem

    verb_flag = "--check-docs" if check else "--update-docs"
    if problem := input_problem(path, "Markdown file"):
        error("bench", f"{verb_flag}: {problem}")
        return 2
    if token_counter_name() != "cl100k_base":
        error("bench", f"{verb_flag}: the figures are counted with cl100k_base, which is not "
                       f"installed here: pip install 'toolfault[tokens]'")
        return 2
    target = Path(path)
    try:
        current = target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        error("bench", f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}")
        return 2
    if _splice(current, "") is None:
        error("bench", f"{verb_flag}: {path} has no {BEGIN} … {END} block to fill")
        return 2
    block = render_block()
    text = _splice(current, block)
    assert text is not None
    if check:
        if text == current:
            print(f"{path}: the bench figures are up to date.")
            return 0
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(),
                                    f"{path} (committed)", f"{path} (from a run)",
                                    lineterm="", n=1)
        print("\n".join(list(diff)[:80]))
        print(f"\n{path}: the bench figures drifted from a run: run `{COMMAND} {path}`.",
              file=sys.stderr)
        return 1
    if text != current:
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            error("bench", f"cannot write {path}: {exc.strerror or exc}")
            return 2
    print(f"wrote the bench figures into {path}")
    return 0
