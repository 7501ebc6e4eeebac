"""The precision suite's views: rich tables for the terminal, one card for the page."""

from __future__ import annotations

import json
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from toolfault_cli.bench._html import _CSS, _GRID, _INK, _MUTED, _e, _nice_max, _tick, _ticks
from toolfault_cli.bench._loop_families import LOOP_CAP
from toolfault_cli.bench._loops import DEFAULT_SEEDS, QUICK_SEEDS, LoopsResult, Stat, run_loops

_OK = "#0f9d8a"
_BAD = "#e0594b"
_HALT = "#5b7fa6"


def _stat(stat: Stat) -> str:
    if stat.max is None:
        return "never"
    median = f"{stat.median:g}" if stat.median is not None else "–"
    return f"{median} / {stat.max}" + (f" ({stat.missing} never)" if stat.missing else "")


def _short(stat: Stat) -> str:
    """The median, and the maximum when it differs (``≤``)."""
    if stat.median is None or stat.max is None:
        return "never"
    return f"{stat.median:g}" + ("" if stat.max == stat.median else f" (≤{stat.max})")


def render(result: LoopsResult) -> Group:
    """The three tables: legitimate families, loop families, targets."""
    title = (f"toolfault bench --loops · seed {result.seed} · {result.seeds} seeds per family "
             f"and path")
    legit = Table(title="legitimate work, replayed bare and guarded", box=box.SIMPLE_HEAVY,
                  title_style="bold", header_style="bold", pad_edge=False,
                  caption="harmed: a call refused, a call failed that succeeded unguarded, "
                          "or another final state", caption_style="dim")
    for header in ("family", "path", "runs", "calls", "harmed"):
        legit.add_column(header, justify="left" if header in ("family", "path") else "right")
    for row in result.legit:
        style = "bold red" if row.harmed else ""
        legit.add_row(Text(row.family), row.path, str(row.runs), f"{row.calls:,}",
                      f"{row.harmed} of {row.runs}", style=style)
    loops = Table(title="loops (median / max over seeds, in the loop's own calls)",
                  box=box.SIMPLE_HEAVY, title_style="bold", header_style="bold",
                  pad_edge=False,
                  caption=f"blocked: first terminal message, refusal, tool_blocked or "
                          f"no_progress · a loop stops on its own only at halt (else "
                          f"{LOOP_CAP} calls)", caption_style="dim")
    for header in ("family", "path", "blocked\nat call", "halted\nat call", "halt after\nblock",
                   "tool bodies\nrun"):
        loops.add_column(header, justify="left" if header in ("family", "path") else "right")
    for lrow in result.loops:
        loops.add_row(Text(lrow.family), lrow.path, _stat(lrow.block), _stat(lrow.halt),
                      _stat(lrow.after_block), _stat(lrow.bodies))
    goals = Table(title="targets", box=box.SIMPLE_HEAVY, title_style="bold",
                  header_style="bold", pad_edge=False)
    for header in ("target", "promised", "measured", ""):
        goals.add_column(header)
    for target in result.targets:
        goals.add_row(Text(target.name), target.promised, target.measured,
                      Text("met", style="green") if target.met else
                      Text("MISSED", style="bold red"))
    parts: list[Table | Text] = [Text(title, style="bold"), legit]
    examples = [e for row in result.legit for e in row.examples[:1]]
    if examples:
        parts.append(Text("first harm per family:\n  " + "\n  ".join(
            f"{row.family} ({row.path}): {row.examples[0]}" for row in result.legit
            if row.examples), style="red"))
    parts += [loops, goals]
    missed = sum(not t.met for t in result.targets)
    parts.append(Text(f"{missed} target(s) missed" if missed else "every target met",
                      style="bold red" if missed else "bold green"))
    return Group(*parts)


def print_loops(result: LoopsResult, console: Console | None = None) -> None:
    if console is None:
        console = Console(emoji=False)
        if not console.is_terminal:
            console = Console(width=120, emoji=False)
    console.print(render(result))


# -- the page ------------------------------------------------------------------------------------
def precision_card(result: LoopsResult) -> str:
    """One card: legitimate runs harmed (x of N), and per loop family the calls until it
    was blocked and until the turn halted (median bar, maximum tick), as an inline SVG."""
    rows = [r for r in result.loops if r.path == "sync"] or result.loops
    width, label_w, value_w, row_h, top = 560, 178, 122, 38, 30
    plot_w = width - label_w - value_w
    top_value = _nice_max(max([r.halt.max or 0 for r in rows] +
                              [r.block.max or 0 for r in rows] + [1]))
    height = top + row_h * len(rows) + 26
    parts = [f'<svg class="chart" data-chart="loops_precision" viewBox="0 0 {width} {height}" '
             f'width="100%" role="img" aria-label="calls until a loop was blocked and halted" '
             f'xmlns="http://www.w3.org/2000/svg">']
    parts.append(f'<rect x="{label_w}" y="4" width="12" height="10" rx="2" fill="{_OK}"/>'
                 f'<text x="{label_w + 17}" y="13" font-size="11" fill="{_MUTED}">blocked</text>'
                 f'<rect x="{label_w + 80}" y="4" width="12" height="10" rx="2" '
                 f'fill="{_HALT}"/><text x="{label_w + 97}" y="13" font-size="11" '
                 f'fill="{_MUTED}">halted (median; tick: max)</text>')
    n = _ticks(top_value)
    for i in range(n + 1):
        x = label_w + plot_w * i / n
        parts.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" '
                     f'y2="{top + row_h * len(rows)}" stroke="{_GRID}" stroke-width="1"/>')
        parts.append(f'<text x="{x:.1f}" y="{height - 8}" font-size="11" fill="{_MUTED}" '
                     f'text-anchor="middle">{_e(_tick(top_value * i / n, False))}</text>')

    def x_of(value: float) -> float:
        return label_w + plot_w * min(value, top_value) / top_value

    for i, row in enumerate(rows):
        y = top + i * row_h
        parts.append(f'<text x="{label_w - 10}" y="{y + row_h / 2 + 4:.1f}" font-size="13" '
                     f'fill="{_INK}" text-anchor="end">{_e(row.family)}</text>')
        for k, (stat, colour, what) in enumerate(((row.block, _OK, "blocked"),
                                                  (row.halt, _HALT, "halted"))):
            if stat.median is None or stat.max is None:
                continue
            by = y + 7 + k * 12
            w = x_of(stat.median) - label_w
            parts.append(f'<rect class="bar" data-family="{_e(row.family)}" '
                         f'data-series="{what}" data-value="{stat.median:g}" '
                         f'data-max="{stat.max}" x="{label_w}" y="{by}" width="{w:.1f}" '
                         f'height="10" rx="3" fill="{colour}"><title>{_e(row.family)} · '
                         f'{what} at call {stat.median:g} (median), {stat.max} at most'
                         f'</title></rect>')
            mx = x_of(stat.max)
            parts.append(f'<line x1="{mx:.1f}" y1="{by - 1}" x2="{mx:.1f}" y2="{by + 11}" '
                         f'stroke="{_INK}" stroke-width="1.5"/>')
        text = f"block {_short(row.block)} · halt {_short(row.halt)}"
        parts.append(f'<text x="{width - value_w + 8}" y="{y + row_h / 2 + 4:.1f}" '
                     f'font-size="12" font-weight="600" fill="{_INK}">{_e(text)}</text>')
    parts.append("</svg>")
    harmed, runs = result.harmed, result.legit_runs
    colour = _OK if harmed == 0 else _BAD
    met = sum(t.met for t in result.targets)
    head = (f'<span class="better">{met} of {len(result.targets)} targets met</span>'
            f'<h3>Precision: loops stopped, good work never</h3>'
            f'<p class="note">{result.seeds} seeds per family and path · legitimate '
            f'families replayed bare and guarded · loops never stop on their own</p>'
            f'<p class="harmed" data-harmed="{harmed}" data-runs="{runs}" '
            f'style="margin:6px 0 2px;font-size:15px"><b style="font-size:26px;color:'
            f'{colour}">{harmed}</b> of {runs:,} legitimate runs harmed</p>'
            + (f'<p class="note" style="color:{_BAD}">' + _e(" · ".join(
                f"{r.family} ({r.path}): {r.harmed} of {r.runs}" for r in result.legit
                if r.harmed)) + "</p>" if harmed else
               f'<p class="note">{len(result.legit)} families and paths, every call '
               f'answered as the bare tool answered it</p>') +
            '<p class="note">calls until each loop was blocked · until the turn halted '
            '(median / max)</p>')
    return f'<figure class="card">{head}{"".join(parts)}</figure>'


def render_page(result: LoopsResult) -> str:
    """A self-contained page holding the precision card and its definitions."""
    rows = "".join(f"<tr><td>{_e(t.name)}</td><td>{_e(t.promised)}</td>"
                   f"<td>{_e(t.measured)}</td><td>{'met' if t.met else '<b>MISSED</b>'}"
                   f"</td></tr>" for t in result.targets)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>toolfault bench --loops</title><style>{_CSS}</style></head>
<body><main>
<header><h1><span>toolfault</span> bench --loops</h1>
<p>seed {result.seed} · {result.seeds} seeds per family and path · default Limits unless
stated</p></header>
<h2>Precision</h2><p class="lead">Legitimate work done redundantly must never be refused;
loops must be stopped early.</p>
<section class="grid">{precision_card(result)}</section>
<h2>Targets</h2>
<div class="scroll"><table><thead><tr><th>target</th><th>promised</th><th>measured</th>
<th></th></tr></thead><tbody>{rows}</tbody></table></div>
<footer>Generated by toolfault. This page is self-contained: no scripts, no external
stylesheets, fonts or images, nothing loaded over the network.</footer>
</main></body></html>
"""


def loops_command(args: Any) -> int:
    """``toolfault bench --loops``: the table (or ``--json``), the page (``--report``);
    exit status 1 when a target is missed."""
    import sys

    from rich.console import Console

    from toolfault._usage import error

    other = [flag for flag, on in (("--overhead", getattr(args, "overhead", False)),
                                   ("--stores", getattr(args, "stores", False)),
                                   ("--trace", getattr(args, "trace", None)),
                                   ("--model-url", getattr(args, "model_url", None)))
             if on]
    if other:
        error("bench", f"{other[0]} does not apply to --loops")
        return 2
    seeds = getattr(args, "episodes", None) or \
        (QUICK_SEEDS if getattr(args, "quick", False) else DEFAULT_SEEDS)
    seed = int(getattr(args, "seed", 7) or 0)
    err = Console(stderr=True, highlight=False, emoji=False)
    with err.status("loops") as status:
        result = run_loops(seeds=int(seeds), seed=seed,
                           progress=lambda name: status.update(f"loops · {name}"))
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        print_loops(result)
    report = getattr(args, "report", None)
    if report:
        try:
            with open(report, "w", encoding="utf-8") as page:
                page.write(render_page(result))
        except OSError as exc:
            error("bench", f"cannot write {report}: {exc.strerror or exc}")
            return 2
        err.print(f"wrote {report}", markup=False)
    return 0 if result.ok else 1
