"""The terminal view: one rich table per policy, one per agent, readable at a glance."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from toolfault.bench._metrics import Metrics, Summary
from toolfault.bench._policies import policy_labels

#: Outcome columns: (header, definition).
OUTCOME_COLUMNS: tuple[tuple[str, str], ...] = (
    ("success", "tasks whose goal was reached and the agent finished"),
    ("dup.\neffects", "side effects that landed more than once, counted by the tools"),
    ("longest\nloop", "longest run of identical failing calls that reached the tool"),
    ("goal\nmissed", "the agent finished without reaching the goal (it reported a failure, "
     "or the world ended up wrong, e.g. a duplicate charge)"),
    ("budget\nstop", "episodes the loop ended when the guard refused a call over the per-turn "
     "budget (a reported incident)"),
    ("step\ncap", "episodes that ran into the harness's hard step cap: a loop"),
    ("crash", "episodes the framework aborted with an exception"),
)
#: Cost columns: (header, definition).
COST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("calls/\ntask", "tool calls the model made per task"),
    ("runs/\ntask", "times a tool actually ran per task (in-wrapper retries included)"),
    ("err tok/\ntask", "tokens of error text added to the model's context per task"),
    ("retry\nrate", "share of calls that repeat the previous failed call"),
    ("blocked", "identical calls refused before reaching the tool"),
    ("recov-\nered", "error streaks a later successful call ended / all error streaks"),
    ("cap\nhits", "retry-cap and budget incidents"),
)


#: What the ``*`` beside a figure means, in the terminal and on the page.
INFERRED_NOTE = ("* inferred from the calls (the trace has no episode records): a task counts "
                 "as a success when its last call succeeded, a duplicate when one side-effect "
                 "call landed twice")


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def outcome_cells(m: Metrics) -> list[str]:
    """Outcome figures; ``*`` marks an inferred one, ``–`` one only episode records hold."""
    success = _pct(m.success_rate) + ("" if m.success_measured else "*")
    dups = f"{m.duplicate_side_effects}" + ("" if m.duplicates_measured else "*")
    if not m.success_measured:  # no episode records: how episodes ended is unknown, not 0
        return [success, dups, str(m.longest_identical_run), "–", "–", "–", "–"]
    return [success, dups, str(m.longest_identical_run), str(m.gave_up), str(m.budget_stops),
            str(m.step_cap_hits), str(m.crashes)]


def cost_cells(m: Metrics) -> list[str]:
    return [f"{m.calls_per_task:.1f}", f"{m.executions_per_task:.1f}",
            f"{m.error_tokens_per_task:.0f}", _pct(m.retry_rate), str(m.blocked),
            f"{m.recoveries}/{m.error_streaks}", str(m.cap_hits + m.budget_hits)]


def cells(m: Metrics) -> list[str]:
    """One full row: outcome columns, then cost columns."""
    return outcome_cells(m) + cost_cells(m)


def _style(name: str) -> str:
    return "bold green" if name.startswith("toolfault") else ""


def policy_table(summary: Summary, *, title: str, columns: tuple[tuple[str, str], ...],
                 row: Callable[[Metrics], list[str]], caption: str | None = None) -> Table:
    """Policies as rows, one set of metrics as columns."""
    table = Table(title=Text(title), box=box.SIMPLE_HEAVY, title_style="bold", header_style="bold",
                  caption=caption, caption_style="dim", pad_edge=False)
    table.add_column("policy", no_wrap=True)
    for header, _ in columns:
        table.add_column(header, justify="right")
    labels = policy_labels(summary.policies)
    for name, metrics in summary.policies.items():
        table.add_row(Text(labels[name]), *row(metrics), style=_style(name))
    return table


def breakdown_table(groups: Mapping[str, Mapping[str, Metrics]], *, title: str, what: str
                    ) -> Table:
    """Rows per agent (or scenario), a column per policy: success · longest loop · dups."""
    table = Table(title=title, box=box.SIMPLE_HEAVY, title_style="bold", header_style="bold",
                  caption="success%·longest loop·duplicate side effects",
                  caption_style="dim", pad_edge=False)
    table.add_column(what, no_wrap=True)
    labels = policy_labels(groups)
    for policy in groups:
        table.add_column(Text(labels[policy]), justify="right", style=_style(policy))
    keys: list[str] = []
    for inner in groups.values():
        keys.extend(k for k in inner if k not in keys)
    for key in keys:
        row = []
        for policy in groups:
            m = groups[policy].get(key)
            row.append("–" if m is None else
                       f"{_pct(m.success_rate)}·{m.longest_identical_run}·"
                       f"{m.duplicate_side_effects}")
        table.add_row(Text(key), *row)
    return table


#: Staged-rollout columns: what enforce mode would have changed, from the trace's shadow marks.
STAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("calls", "tool calls in this stage"),
    ("retry\nrate", "share of calls that repeat the previous failed call"),
    ("would\nshape", "raw errors the model saw that enforce/shape would have rewritten"),
    ("would\nreject", "calls with invalid arguments that reached the tool anyway"),
    ("would\nblock", "identical calls past the cap that reached the tool anyway"),
    ("would\ncap", "failures that would have returned the terminal message"),
    ("would\nexceed", "calls over a budget ceiling that were let through"),
    ("cap\nhits", "retry-cap and budget incidents actually enforced"),
)


def stage_cells(m: Metrics) -> list[str]:
    return [str(m.calls), _pct(m.retry_rate), str(m.would_shape), str(m.would_reject),
            str(m.would_block), str(m.would_cap), str(m.would_exceed_budget),
            str(m.cap_hits + m.budget_hits)]


def stage_table(summary: Summary) -> Table | None:
    """Per rollout stage (observe / shape / enforce): what changed and what would have."""
    stages = {name: m for name, m in summary.policies.items() if name.startswith("toolfault")}
    if len(stages) < 2 and not any("(" in name for name in stages):
        return None
    table = Table(title="rollout stages: what enforce would change", box=box.SIMPLE_HEAD,
                  title_justify="left", title_style="bold")
    table.add_column("stage")
    for header, _ in STAGE_COLUMNS:
        table.add_column(header, justify="right")
    for name, m in stages.items():
        table.add_row(Text(name), *stage_cells(m))
    return table


def render(summary: Summary, *, title: str = "toolfault bench", breakdowns: bool = True,
           note: str | None = None) -> Group:
    """Everything the terminal shows; ``note`` names the token counter behind the figures."""
    parts: list[Table | Text] = [
        policy_table(summary, title=f"{title} — outcomes", columns=OUTCOME_COLUMNS,
                     row=outcome_cells),
        policy_table(summary, title="cost", columns=COST_COLUMNS, row=cost_cells),
    ]
    stages = stage_table(summary)
    if stages is not None:
        parts.append(stages)
    inferred = any(not m.success_measured or not m.duplicates_measured
                   for m in summary.policies.values())
    if inferred:
        parts.append(Text(INFERRED_NOTE, style="dim"))
    if note:
        parts.append(Text(note, style="dim"))
    if breakdowns:
        agents = {p: v for p, v in summary.agents.items() if set(v) != {"(trace)"}}
        if agents:
            parts.append(breakdown_table(agents, title="by agent", what="agent"))
        scenarios = {p: v for p, v in summary.scenarios.items() if set(v) != {"(trace)"}}
        if scenarios:
            parts.append(breakdown_table(scenarios, title="by scenario", what="scenario"))
        elif summary.tools:
            parts.append(breakdown_table(summary.tools, title="by tool", what="tool"))
    return Group(*parts)


def print_summary(summary: Summary, console: Console | None = None, *,
                  title: str = "toolfault bench", breakdowns: bool = True,
                  note: str | None = None) -> None:
    """Print the tables; a non-terminal output gets 120 columns so files stay readable."""
    if console is None:
        console = Console(emoji=False)
        if not console.is_terminal:
            console = Console(width=120, emoji=False)
    console.print(render(summary, title=title, breakdowns=breakdowns, note=note))


#: Definitions that change when the figures come from a user's trace without episode records.
TRACE_DEFINITIONS: Mapping[str, str] = {
    "success": "tasks whose last call succeeded (* inferred: the trace does not say whether "
               "the task reached its goal)",
    "dup. effects": "calls to side-effect tools with the same arguments that landed more than "
                    "once, as the trace shows (* inferred: the tools did not count them)",
    "goal missed": "needs episode records (the bench writes them); – when the trace has none",
    "budget stop": "needs episode records; – when the trace has none",
    "step cap": "needs episode records; – when the trace has none",
    "crash": "needs episode records; – when the trace has none",
    "calls/task": "tool calls recorded per task",
}


def legend(*, trace: bool = False) -> list[tuple[str, str]]:
    """Column names and what they mean (the HTML page shows the same legend).

    ``trace=True``: the words for a user's trace without episode records.
    """
    out = [(h.replace("-\n", "").replace("/\n", "/").replace("\n", " "), d)
           for h, d in OUTCOME_COLUMNS + COST_COLUMNS]
    return [(h, TRACE_DEFINITIONS.get(h, d)) for h, d in out] if trace else out
