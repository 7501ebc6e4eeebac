"""The terminal view: one rich table per policy, one per agent, readable at a glance."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from toolfault_cli.bench._metrics import Metrics, Summary
from toolfault_cli.bench._policies import MODE_POLICIES, policy_labels

#: Outcome columns: (header, definition).
OUTCOME_COLUMNS: tuple[tuple[str, str], ...] = (
    ("success", "tasks whose goal was reached and the agent finished"),
    ("dup.\neffects", "side effects that landed more than once, counted by the tools"),
    ("longest\nloop", "longest run of identical failing calls that reached the tool"),
    ("goal\nmissed", "the agent finished without reaching the goal (it reported a failure, "
     "or the world ended up wrong, e.g. a duplicate charge)"),
    ("halted", "episodes the guard's ladder ended: the model kept calling after its calls "
     "were blocked, and the turn was halted (a reported incident)"),
    ("budget\nstop", "episodes the loop ended when the guard refused a call over the per-turn "
     "budget (a reported incident)"),
    ("step\ncap", "episodes that ran into the harness's hard step cap: a loop"),
    ("crash", "episodes the framework aborted with an exception"),
    ("model\nerror", "episodes the model endpoint ended by failing (an HTTP error, a timeout, "
     "an answer that is not a chat completion): not the tools' doing"),
)
#: The column only a run with model endpoint errors shows.
MODEL_ERROR_COLUMN = "model\nerror"
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


def model_errors_note(summary: Summary) -> str:
    """Which endpoints failed and how many episodes each ended (``""`` when none did)."""
    episodes = summary.episodes
    return "\n".join(
        f"model endpoint errors: {e.endpoint} failed in {e.episodes} of {episodes} episodes "
        f"(first: {e.first_error}); those episodes say nothing about the tools"
        for e in summary.model_errors)


#: What the ``*`` beside a figure means, in the terminal and on the page.
INFERRED_NOTE = ("* inferred from the calls (the trace has no episode records): a task counts "
                 "as a success when its last call succeeded, a duplicate when one side-effect "
                 "call landed twice")


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def has_model_errors(summary: Summary) -> bool:
    """Whether any episode ended in a model endpoint error (then its column is shown)."""
    return any(m.model_errors for m in summary.policies.values())


def outcome_columns(summary: Summary) -> tuple[tuple[str, str], ...]:
    """The outcome columns for ``summary``: "model error" only when there were any."""
    if has_model_errors(summary):
        return OUTCOME_COLUMNS
    return tuple(c for c in OUTCOME_COLUMNS if c[0] != MODEL_ERROR_COLUMN)


def outcome_cells(m: Metrics, *, model_errors: bool = False) -> list[str]:
    """Outcome figures; ``*`` marks an inferred one, ``–`` one only episode records hold."""
    success = _pct(m.success_rate) + ("" if m.success_measured else "*")
    dups = f"{m.duplicate_side_effects}" + ("" if m.duplicates_measured else "*")
    endings = [m.gave_up, m.halts, m.budget_stops, m.step_cap_hits, m.crashes] + \
        [m.model_errors] * model_errors
    if not m.success_measured:  # no episode records: how episodes ended is unknown, not 0
        return [success, dups, str(m.longest_identical_run)] + ["–"] * len(endings)
    return [success, dups, str(m.longest_identical_run), *map(str, endings)]


def cost_cells(m: Metrics) -> list[str]:
    return [f"{m.calls_per_task:.1f}", f"{m.executions_per_task:.1f}",
            f"{m.error_tokens_per_task:.0f}", _pct(m.retry_rate), str(m.blocked),
            f"{m.recoveries}/{m.error_streaks}", str(m.cap_hits + m.budget_hits)]


def cells(m: Metrics, *, model_errors: bool = False) -> list[str]:
    """One full row: outcome columns, then cost columns."""
    return outcome_cells(m, model_errors=model_errors) + cost_cells(m)


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


def stages(summary: Summary) -> dict[str, Metrics]:
    """The rollout stages a trace holds, in rollout order (observe, shape, enforce, others);
    empty unless it holds a mode other than enforce."""
    found = {name: m for name, m in summary.policies.items() if name.startswith("toolfault")}
    if not any(name in MODE_POLICIES and name != "toolfault" for name in found):
        return {}
    order = list(MODE_POLICIES)
    return dict(sorted(found.items(),
                       key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))


def stage_table(summary: Summary) -> Table | None:
    """Per rollout stage (observe / shape / enforce): what changed and what would have."""
    found = stages(summary)
    if not found:
        return None
    table = Table(title="rollout stages: what enforce would change", box=box.SIMPLE_HEAD,
                  title_justify="left", title_style="bold")
    table.add_column("stage")
    for header, _ in STAGE_COLUMNS:
        table.add_column(header, justify="right")
    labels = policy_labels(summary.policies)
    for name, m in found.items():
        table.add_row(Text(labels[name]), *stage_cells(m))
    return table


def render(summary: Summary, *, title: str = "toolfault bench", breakdowns: bool = True,
           note: str | None = None) -> Group:
    """Everything the terminal shows; ``note`` names the token counter behind the figures."""
    errors = has_model_errors(summary)
    parts: list[Table | Text] = [
        policy_table(summary, title=f"{title} — outcomes", columns=outcome_columns(summary),
                     row=lambda m: outcome_cells(m, model_errors=errors)),
        policy_table(summary, title="cost", columns=COST_COLUMNS, row=cost_cells),
    ]
    if errors:
        parts.append(Text(model_errors_note(summary), style="bold red"))
    stage = stage_table(summary)
    if stage is not None:
        parts.append(stage)
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
    "halted": "needs episode records; – when the trace has none",
    "budget stop": "needs episode records; – when the trace has none",
    "step cap": "needs episode records; – when the trace has none",
    "crash": "needs episode records; – when the trace has none",
    "model error": "needs episode records; – when the trace has none",
    "calls/task": "tool calls recorded per task",
}


def legend(*, trace: bool = False, model_errors: bool = False) -> list[tuple[str, str]]:
    """Column names and what they mean (the HTML page shows the same legend).

    ``trace=True``: the words for a user's trace without episode records;
    ``model_errors``: include the column only a run with model endpoint errors shows.
    """
    outcome = OUTCOME_COLUMNS if model_errors else tuple(
        c for c in OUTCOME_COLUMNS if c[0] != MODEL_ERROR_COLUMN)
    out = [(h.replace("-\n", "").replace("/\n", "/").replace("\n", " "), d)
           for h, d in outcome + COST_COLUMNS]
    return [(h, TRACE_DEFINITIONS.get(h, d)) for h, d in out] if trace else out
