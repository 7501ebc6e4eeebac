"""A self-contained HTML report: inline SVG charts drawn here, in Python.

No script, no stylesheet link, no font or CDN download: the page is one file that opens
offline and phones nobody.  Every chart is an ``<svg class="chart" data-chart=…>`` whose bars
carry ``data-policy`` and ``data-value``, so a test (or a curious person) can read the numbers
back out of the DOM; hovering a bar shows its exact value through a plain SVG ``<title>``.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolfault_cli.bench._metrics import Metrics, Summary
from toolfault_cli.bench._policies import POLICIES, policy_labels
from toolfault_cli.bench._runner import CRASH_PREFIX, SILENT_PREFIX
from toolfault_cli.bench._table import (
    INFERRED_NOTE,
    STAGE_COLUMNS,
    cells,
    has_model_errors,
    legend,
    stage_cells,
    stages,
)

PALETTE: Mapping[str, str] = {
    "toolfault": "#0f9d8a",
    "traceback": "#e8a33d",
    "error_failed": "#9aa5b5",
    "blind_retry": "#e0594b",
    "langchain": "#6c6fd8",
}
#: The guard's modes in a user's trace, each its own colour (enforce keeps toolfault's teal).
MODE_PALETTE: Mapping[str, str] = {
    "toolfault (observe)": "#3b82c4",
    "toolfault (shape)": "#c05bb4",
}
_EXTRA = ("#7a9a3a", "#d07a2e", "#5b6b7f", "#3b82c4", "#c05bb4", "#b45309")
_INK = "#1e293b"
_MUTED = "#64748b"
_GRID = "#e2e8f0"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def colours(policies: Sequence[str]) -> dict[str, str]:
    """A stable colour per policy: the bench's own, one per guard mode, then a palette for a
    trace's other policies (never a colour already taken, while the palette lasts)."""
    out: dict[str, str] = {}
    fixed = {**PALETTE, **MODE_PALETTE}
    taken = {fixed[n] for n in policies if n in fixed}
    extra = iter([c for c in _EXTRA if c not in taken] + list(_EXTRA) * 4)
    for name in policies:
        out[name] = fixed.get(name) or next(extra)
    return out


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    for power in range(-2, 9):
        for step in (1, 2, 2.5, 4, 5):
            top = step * 10.0 ** power
            if top >= value:
                return top
    return value


@dataclass(frozen=True, slots=True)
class Bar:
    key: str
    label: str
    value: float
    text: str
    colour: str


def hbar_chart(chart: str, title: str, note: str, bars: Sequence[Bar], *,
               max_value: float | None = None, percent: bool = False,
               markers: Sequence[tuple[float, str]] = (), better: str = "") -> str:
    """Horizontal bars, one per policy, with optional reference lines (a cap, a limit)."""
    width, label_w, value_w, row_h, top = 560, 150, 74, 34, 16
    plot_w = width - label_w - value_w
    top_value = max_value or _nice_max(max([b.value for b in bars] + [m[0] for m in markers]))
    if not percent and top_value < 4 and all(b.value == int(b.value) for b in bars):
        top_value = 4.0  # counts: whole-number ticks (0 1 2 3 4), never 0.2 of a duplicate
    height = top + row_h * len(bars) + 26
    parts = [f'<svg class="chart" data-chart="{_e(chart)}" viewBox="0 0 {width} {height}" '
             f'width="100%" role="img" aria-label="{_e(title)}" '
             f'xmlns="http://www.w3.org/2000/svg">']
    n = _ticks(top_value)
    for i in range(n + 1):
        x = label_w + plot_w * i / n
        parts.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" '
                     f'y2="{top + row_h * len(bars)}" stroke="{_GRID}" stroke-width="1"/>')
        tick = top_value * i / n
        parts.append(f'<text x="{x:.1f}" y="{height - 8}" font-size="11" fill="{_MUTED}" '
                     f'text-anchor="middle">{_e(_tick(tick, percent))}</text>')
    for row, bar in enumerate(bars):
        y = top + row * row_h
        w = 0.0 if top_value <= 0 else plot_w * min(bar.value, top_value) / top_value
        parts.append(f'<text x="{label_w - 10}" y="{y + row_h / 2 + 4:.1f}" font-size="13" '
                     f'fill="{_INK}" text-anchor="end">{_e(bar.label)}</text>')
        parts.append(
            f'<rect class="bar" data-policy="{_e(bar.key)}" data-value="{bar.value:g}" '
            f'x="{label_w}" y="{y + 6}" width="{max(w, 2.5 if bar.value else 0):.1f}" '
            f'height="{row_h - 12}" rx="4" fill="{bar.colour}">'
            f'<title>{_e(bar.label)}: {_e(bar.text)}</title></rect>')
        parts.append(f'<text x="{label_w + w + 8:.1f}" y="{y + row_h / 2 + 4:.1f}" '
                     f'font-size="13" font-weight="600" fill="{_INK}">{_e(bar.text)}</text>')
    for value, text in markers:
        if value > top_value:
            continue
        x = label_w + plot_w * value / top_value
        parts.append(f'<line class="marker" x1="{x:.1f}" y1="{top - 10}" x2="{x:.1f}" '
                     f'y2="{top + row_h * len(bars) + 2}" stroke="{_INK}" stroke-width="1.5" '
                     f'stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{x + 4:.1f}" y="{top - 2}" font-size="11" fill="{_INK}">'
                     f'{_e(text)}</text>')
    parts.append("</svg>")
    head = f'<h3>{_e(title)}</h3><p class="note">{_e(note)}</p>'
    if better:
        head = f'<span class="better">{_e(better)}</span>' + head
    return f'<figure class="card">{head}{"".join(parts)}</figure>'


def stacked_chart(chart: str, title: str, note: str, rows: Sequence[tuple[str, str]],
                  segments: Sequence[tuple[str, str, str]],
                  value: Callable[[str, str], float]) -> str:
    """100% stacked horizontal bars: how each policy's episodes ended."""
    width, label_w, row_h, top = 1080, 150, 34, 8
    plot_w = width - label_w - 16
    # The legend's entries, wrapped onto as many lines as the width needs.
    keys: list[tuple[float, int]] = []
    lx, line = float(label_w), 0
    for _, seg_label, _ in segments:
        step = 26 + 7.2 * len(seg_label)
        if lx + step > width and lx > label_w:
            lx, line = float(label_w), line + 1
        keys.append((lx, line))
        lx += step
    height = top + row_h * len(rows) + 34 + 20 * line
    parts = [f'<svg class="chart" data-chart="{_e(chart)}" viewBox="0 0 {width} {height}" '
             f'width="100%" role="img" aria-label="{_e(title)}" '
             f'xmlns="http://www.w3.org/2000/svg">']
    for ri, (key, label) in enumerate(rows):
        y = top + ri * row_h
        total = sum(value(key, seg) for seg, _, _ in segments) or 1.0
        parts.append(f'<text x="{label_w - 10}" y="{y + row_h / 2 + 4:.1f}" font-size="13" '
                     f'fill="{_INK}" text-anchor="end">{_e(label)}</text>')
        x = float(label_w)
        for seg, seg_label, colour in segments:
            v = value(key, seg)
            if not v:
                continue
            w = plot_w * v / total
            share = f"{v / total * 100:.0f}%"
            parts.append(
                f'<rect class="bar segment" data-policy="{_e(key)}" data-group="{_e(seg)}" '
                f'data-value="{v:g}" x="{x:.1f}" y="{y + 5}" width="{w:.1f}" '
                f'height="{row_h - 10}" fill="{colour}"><title>{_e(label)} · '
                f'{_e(seg_label)}: {v:g} episodes ({share})</title></rect>')
            if w >= 34:
                ink = _INK if seg == "missed" else "#ffffff"
                parts.append(f'<text x="{x + w / 2:.1f}" y="{y + row_h / 2 + 4:.1f}" '
                             f'font-size="11.5" font-weight="600" fill="{ink}" '
                             f'text-anchor="middle">{_e(share)}</text>')
            x += w
    for (_, seg_label, colour), (kx, kline) in zip(segments, keys, strict=True):
        ky = top + row_h * len(rows) + 14 + 20 * kline
        parts.append(f'<rect x="{kx:.1f}" y="{ky}" width="11" height="11" rx="2" '
                     f'fill="{colour}"/>')
        parts.append(f'<text x="{kx + 16:.1f}" y="{ky + 9}" font-size="12" '
                     f'fill="{_INK}">{_e(seg_label)}</text>')
    parts.append("</svg>")
    return (f'<figure class="card wide"><h3>{_e(title)}</h3><p class="note">{_e(note)}</p>'
            f'{"".join(parts)}</figure>')


def _tick(value: float, percent: bool) -> str:
    if percent:
        return f"{value * 100:.0f}%"
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _ticks(top_value: float) -> int:
    """4 or 5 intervals, whichever gives round tick labels for this axis maximum."""
    lead = top_value / 10 ** len(str(int(top_value))) * 10 if top_value >= 1 else top_value
    return 5 if round(lead, 3) in (2.5, 5.0, 0.5, 0.25) else 4


def grouped_chart(chart: str, title: str, note: str, groups: Sequence[str],
                  series: Sequence[tuple[str, str, str]],
                  value: Callable[[str, str], float | None],
                  fmt: Callable[[float], str], *, max_value: float | None = None,
                  percent: bool = False) -> str:
    """Vertical bars: a cluster per group (agent), a bar per series (policy)."""
    width, left, bottom, top, height = 1080, 44, 40, 18, 250
    plot_h = height - top - bottom
    plot_w = width - left - 10
    values = [v for g in groups for s in series if (v := value(g, s[0])) is not None]
    top_value = max_value or _nice_max(max(values, default=0.0))
    cluster = plot_w / max(1, len(groups))
    bar_w = min(30.0, (cluster - 24) / max(1, len(series)))
    parts = [f'<svg class="chart" data-chart="{_e(chart)}" viewBox="0 0 {width} {height}" '
             f'width="100%" role="img" aria-label="{_e(title)}" '
             f'xmlns="http://www.w3.org/2000/svg">']
    n = _ticks(top_value)
    for i in range(n + 1):
        y = top + plot_h - plot_h * i / n
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" '
                     f'stroke="{_GRID}"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" fill="{_MUTED}" '
                     f'text-anchor="end">{_e(_tick(top_value * i / n, percent))}</text>')
    for gi, group in enumerate(groups):
        x0 = left + gi * cluster + (cluster - bar_w * len(series)) / 2
        for si, (key, label, colour) in enumerate(series):
            v = value(group, key)
            if v is None:
                continue
            h = plot_h * min(v, top_value) / top_value if top_value else 0.0
            h = max(h, 2.0 if v else 0.0)
            x = x0 + si * bar_w
            parts.append(
                f'<rect class="bar" data-policy="{_e(key)}" data-group="{_e(group)}" '
                f'data-value="{v:g}" x="{x + 2:.1f}" y="{top + plot_h - h:.1f}" '
                f'width="{bar_w - 4:.1f}" height="{h:.1f}" rx="3" fill="{colour}">'
                f'<title>{_e(group)} · {_e(label)}: {_e(fmt(v))}</title></rect>')
            if bar_w >= 22:
                parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{top + plot_h - h - 4:.1f}" '
                             f'font-size="10" fill="{_MUTED}" text-anchor="middle">'
                             f'{_e(fmt(v))}</text>')
        parts.append(f'<text x="{left + gi * cluster + cluster / 2:.1f}" '
                     f'y="{height - 14}" font-size="13" fill="{_INK}" text-anchor="middle" '
                     f'font-weight="600">{_e(group)}</text>')
    parts.append("</svg>")
    return (f'<figure class="card wide"><h3>{_e(title)}</h3><p class="note">{_e(note)}</p>'
            f'{"".join(parts)}</figure>')


def heatmap(chart: str, title: str, note: str, rows: Sequence[str],
            columns: Sequence[tuple[str, str]], cell: Callable[[str, str], Metrics | None]
            ) -> str:
    """Scenario × policy: colour is the success rate, text the loop and duplicates."""
    width, label_w, top, row_h = 1080, 230, 34, 40
    col_w = (width - label_w - 10) / max(1, len(columns))
    height = top + row_h * len(rows) + 8
    parts = [f'<svg class="chart" data-chart="{_e(chart)}" viewBox="0 0 {width} {height}" '
             f'width="100%" role="img" aria-label="{_e(title)}" '
             f'xmlns="http://www.w3.org/2000/svg">']
    for ci, (_, label) in enumerate(columns):
        parts.append(f'<text x="{label_w + ci * col_w + col_w / 2:.1f}" y="{top - 12}" '
                     f'font-size="12" font-weight="600" fill="{_INK}" text-anchor="middle">'
                     f'{_e(label)}</text>')
    for ri, row in enumerate(rows):
        y = top + ri * row_h
        parts.append(f'<text x="{label_w - 12}" y="{y + row_h / 2 + 4:.1f}" font-size="12.5" '
                     f'fill="{_INK}" text-anchor="end">{_e(row)}</text>')
        for ci, (key, label) in enumerate(columns):
            m = cell(row, key)
            x = label_w + ci * col_w
            if m is None:
                continue
            fill = _heat(m.success_rate)
            ink = "#ffffff" if m.success_rate >= 0.6 else _INK
            text = f"{m.success_rate * 100:.0f}%"
            extra = f"loop {m.longest_identical_run} · dup {m.duplicate_side_effects}"
            parts.append(
                f'<rect class="cell" data-policy="{_e(key)}" data-group="{_e(row)}" '
                f'data-value="{m.success_rate:g}" x="{x + 3:.1f}" y="{y + 3}" '
                f'width="{col_w - 6:.1f}" height="{row_h - 6}" rx="5" fill="{fill}">'
                f'<title>{_e(row)} · {_e(label)}: success {text}, longest loop '
                f'{m.longest_identical_run}, duplicate side effects '
                f'{m.duplicate_side_effects}</title></rect>')
            parts.append(f'<text x="{x + col_w / 2:.1f}" y="{y + row_h / 2 + 1:.1f}" '
                         f'font-size="12.5" font-weight="700" fill="{ink}" '
                         f'text-anchor="middle">{_e(text)}</text>')
            warn = m.duplicate_side_effects > 0
            parts.append(f'<text x="{x + col_w / 2:.1f}" y="{y + row_h / 2 + 13:.1f}" '
                         f'font-size="10" fill="{"#b91c1c" if warn and ink == _INK else ink}" '
                         f'text-anchor="middle" font-weight="{700 if warn else 400}">'
                         f'{_e(extra)}</text>')
    parts.append("</svg>")
    return (f'<figure class="card wide"><h3>{_e(title)}</h3><p class="note">{_e(note)}</p>'
            f'{"".join(parts)}</figure>')


def _heat(rate: float) -> str:
    """White-ish (0%) to teal (100%)."""
    lo, hi = (0xF6, 0xE7, 0xE4), (0x0F, 0x9D, 0x8A)
    rate = max(0.0, min(1.0, rate))
    rgb = tuple(round(a + (b - a) * rate) for a, b in zip(lo, hi, strict=True))
    return "#{:02x}{:02x}{:02x}".format(*rgb)


_CSS = """
:root { --ink:#1e293b; --muted:#64748b; --line:#e2e8f0; --bg:#f4f6f9; --teal:#0f9d8a; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink); font: 15px/1.5 system-ui,
  -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 32px 28px 60px; }
header h1 { font-size: 30px; margin: 0 0 4px; letter-spacing: -0.02em; }
header h1 span { color: var(--teal); }
header p { margin: 0; color: var(--muted); }
h2 { font-size: 19px; margin: 38px 0 4px; }
h2 + p.lead { margin: 0 0 14px; color: var(--muted); }
.kpis { display:grid; grid-template-columns: repeat(4, 1fr); gap:14px; margin-top:22px; }
.kpi { background:#fff; border-radius:12px; padding:16px 18px; border:1px solid var(--line);
  box-shadow: 0 1px 2px rgba(15,23,42,.04); }
.kpi .label { font-size:12.5px; text-transform:uppercase; letter-spacing:.06em;
  color:var(--muted); }
.kpi .value { font-size:32px; font-weight:700; color:var(--teal); line-height:1.15;
  margin-top:4px; display:flex; align-items:baseline; justify-content:space-between; gap:8px; }
.kpi .mode { font-size:17px; font-weight:700; display:flex; align-items:baseline;
  justify-content:space-between; gap:8px; margin-top:2px; }
.kpi .who { font-size:12px; font-weight:600; color:var(--muted); white-space:nowrap;
  display:inline-flex; align-items:center; gap:5px; order:-1; }
.kpi .who i, i.swatch { width:9px; height:9px; border-radius:2px; display:inline-block; }
i.swatch { margin-right:7px; }
section.alert { background:#fdf4ff; border:1px solid #f0abfc; border-left:5px solid #a21caf;
  border-radius:12px; padding:4px 18px 10px; margin-top:22px; }
section.alert h2 { margin-top:10px; color:#86198f; }
section.alert code { font-size:12px; }
.kpi .vs { font-size:13px; color:var(--muted); margin-top:2px; }
.kpi .vs b { color:#b45309; }
.grid { display:grid; grid-template-columns: 1fr 1fr; gap:16px; }
.card { background:#fff; margin:0; border-radius:12px; padding:16px 18px 10px;
  border:1px solid var(--line); box-shadow: 0 1px 2px rgba(15,23,42,.04); position:relative; }
.card.wide { grid-column: 1 / -1; }
.card h3 { margin:0; font-size:15.5px; }
.card p.note { margin:2px 0 8px; color:var(--muted); font-size:12.5px; }
.better { position:absolute; right:16px; top:16px; font-size:11.5px; color:var(--muted);
  background:#f1f5f9; border-radius:99px; padding:2px 9px; }
.legend { display:flex; flex-wrap:wrap; gap:8px 18px; margin:10px 0 14px; font-size:13px; }
.legend span { display:inline-flex; align-items:center; gap:7px; }
.legend i { width:12px; height:12px; border-radius:3px; display:inline-block; }
table { width:100%; border-collapse:collapse; background:#fff; border-radius:12px;
  overflow:hidden; border:1px solid var(--line); font-size:13px; }
.scroll { overflow-x:auto; }
th, td { padding:8px 6px; text-align:right; border-bottom:1px solid var(--line); }
td { white-space:nowrap; }
th:first-child, td:first-child { text-align:left; }
th { background:#f8fafc; font-weight:600; font-size:12px; color:var(--muted); }
tr.toolfault td { font-weight:600; color:#0b7a6b; }
.examples { display:grid; grid-template-columns: 1fr 1fr; gap:14px; }
.example { background:#fff; border-radius:12px; border:1px solid var(--line); overflow:hidden; }
.example header { display:flex; justify-content:space-between; align-items:center;
  padding:9px 14px; font-weight:600; font-size:13.5px; border-bottom:1px solid var(--line); }
.example header i { width:10px; height:10px; border-radius:3px; display:inline-block;
  margin-right:8px; }
.example header small { color:var(--muted); font-weight:400; }
.example pre { margin:0; padding:12px 14px;
  font: 12px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  white-space:pre-wrap; word-break:break-word; background:#fbfcfd; }
.example.crash pre { color:#b91c1c; font-style:italic; }
dl.defs { display:grid; grid-template-columns: 160px 1fr; gap:6px 16px; font-size:13.5px;
  background:#fff; border:1px solid var(--line); border-radius:12px; padding:16px 18px; }
dl.defs dt { font-weight:600; } dl.defs dd { margin:0; color:var(--muted); }
header p.tokens { font-size:13px; margin-top:4px; }
p.lead.inferred { margin-top:10px; font-size:13px; }
table caption { text-align:left; font-weight:600; padding:8px 9px; color:var(--ink); }
.bytool { margin-top:16px; }
footer { margin-top:36px; color:var(--muted); font-size:12.5px; }
"""


def _legend(policies: Sequence[str], labels: Mapping[str, str], colour: Mapping[str, str]
            ) -> str:
    items = "".join(f'<span><i style="background:{colour[p]}"></i>{_e(labels[p])}</span>'
                    for p in policies)
    return f'<div class="legend">{items}</div>'


def _kpis(summary: Summary, labels: Mapping[str, str], colour: Mapping[str, str]) -> str:
    """The headline cards: toolfault's figure per mode, each labelled and in its colour, then
    the baselines (best, median, worst).  Enforce leads: it is what a user ships."""
    ours = stages(summary) or {p: m for p, m in summary.policies.items()
                               if p.startswith("toolfault")}
    others = {p: m for p, m in summary.policies.items() if p not in ours}
    if not ours:
        return ""
    order = sorted(ours, key=lambda p: p != "toolfault")  # enforce first, then rollout order
    lead = order[0]

    def versus(key: Callable[[Metrics], float], fmt: Callable[[float], str], *,
               lower_is_better: bool) -> str:
        """Every baseline at once: the best, the median and the worst, each named."""
        if not others:
            return ""
        ranked = sorted(others, key=lambda p: key(others[p]), reverse=not lower_is_better)
        if len(ranked) == 1:
            only = ranked[0]
            return f"baseline: <b>{_e(fmt(key(others[only])))}</b> ({_e(labels[only])})"
        values = sorted(key(others[p]) for p in ranked)
        mid = len(values) // 2
        median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
        best, worst = ranked[0], ranked[-1]
        return (f"baselines: best <b>{_e(fmt(key(others[best])))}</b> "
                f"({_e(labels[best])}) · median <b>{_e(fmt(median))}</b> · worst "
                f"<b>{_e(fmt(key(others[worst])))}</b> ({_e(labels[worst])})")

    def figure(policy: str, text: str, *, main: bool) -> str:
        tag = "value" if main else "mode"
        return (f'<div class="{tag}" data-policy="{_e(policy)}" style="color:{colour[policy]}">'
                f'<span class="who"><i style="background:{colour[policy]}"></i>'
                f'{_e(labels[policy])}</span> {_e(text)}</div>')

    def card(chart: str, label: str, value: Callable[[Metrics], str], vs: str) -> str:
        figures = "".join(figure(p, value(ours[p]), main=p == lead) for p in order)
        return (f'<div class="kpi" data-kpi="{chart}"><div class="label">{_e(label)}</div>'
                f'{figures}<div class="vs">{vs}</div></div>')

    def count(v: float) -> str:
        return f"{v:.0f}"

    def pct(v: float) -> str:
        return f"{v * 100:.0f}%"

    out = []
    dup_vs = versus(lambda m: m.duplicate_side_effects, count, lower_is_better=True)
    where = [s for s, m in summary.scenarios.get(lead, {}).items()
             if m.duplicate_side_effects and s != "(trace)"]
    if where:
        dup_vs += f"<br>toolfault's: all in {_e(', '.join(where))}"
    out.append(card("duplicate_side_effects", "duplicate side effects",
                    lambda m: f"{m.duplicate_side_effects}"
                              f"{'' if m.duplicates_measured else '*'}", dup_vs))
    out.append(card("longest_identical_run", "longest identical loop",
                    lambda m: str(m.longest_identical_run),
                    versus(lambda m: m.longest_identical_run, count, lower_is_better=True)))
    out.append(card("success_rate", "task success",
                    lambda m: f"{pct(m.success_rate)}{'' if m.success_measured else '*'}",
                    versus(lambda m: m.success_rate, pct, lower_is_better=False)))
    out.append(card("error_tokens_per_task", "error tokens per task",
                    lambda m: count(m.error_tokens_per_task),
                    versus(lambda m: m.error_tokens_per_task, count, lower_is_better=True)))
    return f'<section class="kpis">{"".join(out)}</section>'


def _stage_table(summary: Summary, labels: Mapping[str, str], colour: Mapping[str, str]
                 ) -> str:
    """The terminal's "what enforce would change" table, one row per mode in rollout order."""
    found = stages(summary)
    if not found:
        return ""
    head = "".join(f'<th title="{_e(doc)}">{_e(h.replace(chr(10), " "))}</th>'
                   for h, doc in STAGE_COLUMNS)
    rows = "".join(
        f'<tr data-policy="{_e(p)}"><td><i class="swatch" style="background:{colour[p]}">'
        f'</i>{_e(labels[p])}</td>{"".join(f"<td>{_e(c)}</td>" for c in stage_cells(m))}</tr>'
        for p, m in found.items())
    return ('<h2 id="stages">Rollout stages: what enforce would change</h2><p class="lead">'
            'Observe and shape record what enforce would have done (the trace\'s shadow marks); '
            'enforce records what it did.</p>'
            f'<div class="scroll"><table data-table="stages"><thead><tr><th>mode</th>{head}'
            f'</tr></thead><tbody>{rows}</tbody></table></div>')


def _model_errors(summary: Summary) -> str:
    """A banner naming each model endpoint that failed, and how many episodes it ended."""
    if not summary.model_errors:
        return ""
    items = "".join(
        f'<li data-endpoint="{_e(e.endpoint)}"><b>{_e(e.endpoint)}</b> failed in '
        f'<b>{e.episodes}</b> of {summary.episodes} episodes; first error: '
        f'<code>{_e(e.first_error)}</code></li>' for e in summary.model_errors)
    return ('<section class="alert" data-alert="model_errors"><h2>Model endpoint errors</h2>'
            '<p>These episodes ended because the model endpoint failed, not because of the '
            'tools or any policy: they are counted apart ("model endpoint error") and say '
            f'nothing about error handling.</p><ul>{items}</ul></section>')


def _table(summary: Summary, labels: Mapping[str, str], colour: Mapping[str, str], *,
           trace: bool = False) -> str:
    errors = has_model_errors(summary)
    head = "".join(f'<th title="{_e(doc)}">{_e(h)}</th>'
                   for h, doc in legend(trace=trace, model_errors=errors))
    rows = []
    for policy, m in summary.policies.items():
        cls = ' class="toolfault"' if policy.startswith("toolfault") else ""
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells(m, model_errors=errors))
        rows.append(f'<tr{cls}><td><i class="swatch" style="background:{colour[policy]}"></i>'
                    f'{_e(labels[policy])}</td>{tds}</tr>')
    return f'<div class="scroll"><table><thead><tr><th>policy</th>{head}</tr></thead>' \
           f'<tbody>{"".join(rows)}</tbody></table></div>'


def _tool_table(summary: Summary, labels: Mapping[str, str]) -> str:
    """The by-tool numbers as a table: the same cells the terminal's "by tool" table shows."""
    rows = []
    for policy, inner in summary.tools.items():
        for tool, m in inner.items():
            success = f"{m.success_rate * 100:.0f}%" + ("" if m.success_measured else "*")
            dups = f"{m.duplicate_side_effects}" + ("" if m.duplicates_measured else "*")
            rows.append(f"<tr><td>{_e(tool)}</td><td>{_e(labels[policy])}</td>"
                        f"<td>{m.calls}</td><td>{_e(success)}</td>"
                        f"<td>{m.longest_identical_run}</td><td>{_e(dups)}</td>"
                        f"<td>{m.error_tokens}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("tool", "policy", "calls", "success",
                                              "longest loop", "dup. effects", "error tokens"))
    return (f'<div class="scroll bytool"><table data-table="by_tool"><caption>By tool'
            f'</caption><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
            f'</table></div>')


def _examples(examples: Mapping[str, Mapping[str, str]], labels: Mapping[str, str],
              colour: Mapping[str, str], policies: Sequence[str]) -> str:
    from toolfault._tokens import count_tokens

    picks = [s for s in ("flights.bad_input", "flights.timeout_after_booking",
                         "files.read_only_archive") if s in examples] or list(examples)[:2]
    out = []
    for scenario in picks:
        cards = []
        for policy in policies:
            text = examples[scenario].get(policy)
            if text is None:
                continue
            crash = text.startswith((CRASH_PREFIX, SILENT_PREFIX))
            size = ("run aborted" if text.startswith(CRASH_PREFIX) else "silent duplicate"
                    if crash else f"{count_tokens(text)} tokens")
            cards.append(
                f'<div class="example{" crash" if crash else ""}"><header><span>'
                f'<i style="background:{colour[policy]}"></i>{_e(labels[policy])}</span>'
                f'<small>{size}</small></header><pre>{_e(text.rstrip())}</pre></div>')
        if cards:
            out.append(f'<h3 class="scenario">{_e(scenario)}</h3>'
                       f'<div class="examples">{"".join(cards)}</div>')
    return "".join(out)


def _trace_policy(name: str) -> str:
    """What a policy name from a user's trace stands for (the guard's mode)."""
    if name == "toolfault":
        return "calls through your Guard in enforce mode"
    if name.startswith("toolfault (") and name.endswith(")"):
        return f"calls through your Guard in {name[len('toolfault ('):-1]} mode"
    return "calls recorded under this policy name"


def render_html(summary: Summary, *, title: str = "toolfault bench", subtitle: str = "",
                examples: Mapping[str, Mapping[str, str]] | None = None,
                notes: Sequence[str] = (), source: Literal["bench", "trace"] = "bench",
                tokens_note: str = "") -> str:
    """The whole page as one string.

    ``source="bench"`` describes the bench's own seeded runs; ``source="trace"`` a user's
    trace, in its words: what was read from the calls (measured) and what was inferred from
    them (success and duplicates, marked ``*`` as in the terminal table).  ``tokens_note``
    names the token counter behind the error-token figures.
    """
    policies = list(summary.policies)
    labels = policy_labels(policies)
    colour = colours(policies)
    bench = source == "bench"
    success_measured = all(m.success_measured for m in summary.policies.values())
    dups_measured = all(m.duplicates_measured for m in summary.policies.values())
    inferred = not (success_measured and dups_measured)
    star_s = "" if success_measured else " *"
    star_d = "" if dups_measured else " *"

    def bars(metric: Callable[[Metrics], float], text: Callable[[Metrics], str]) -> list[Bar]:
        return [Bar(p, labels[p], metric(m), text(m), colour[p])
                for p, m in summary.policies.items()]

    charts = [
        hbar_chart("success_rate", f"Task success{star_s}",
                   "goal reached and the agent finished" if success_measured else
                   "inferred: the task's last call succeeded",
                   bars(lambda m: m.success_rate, lambda m: f"{m.success_rate * 100:.0f}%"),
                   max_value=1.0, percent=True, better="higher is better"),
        hbar_chart("duplicate_side_effects", f"Duplicate side effects{star_d}",
                   "second bookings and charges, counted by the tools themselves"
                   if dups_measured else "inferred: a side-effect call with the same "
                   "arguments that landed more than once",
                   bars(lambda m: m.duplicate_side_effects,
                        lambda m: str(m.duplicate_side_effects)), better="lower is better"),
        hbar_chart("longest_identical_run", "Longest identical-retry loop",
                   "identical failing calls in a row that reached the tool",
                   bars(lambda m: m.longest_identical_run,
                        lambda m: str(m.longest_identical_run)),
                   markers=[(3, "retry cap (2–3)")] if bench else [],
                   better="lower is better"),
        hbar_chart("error_tokens_per_task", "Error tokens per task",
                   "error text added to the model's context (re-sent every later turn)"
                   + (f"; {tokens_note}" if tokens_note else ""),
                   bars(lambda m: m.error_tokens_per_task,
                        lambda m: f"{m.error_tokens_per_task:.0f}"), better="lower is better"),
        hbar_chart("executions_per_task", "Tool runs per task",
                   "times a tool actually executed, in-wrapper retries included",
                   bars(lambda m: m.executions_per_task,
                        lambda m: f"{m.executions_per_task:.1f}"), better="lower is better"),
        hbar_chart("calls_per_task", "Model tool calls per task" if bench else
                   "Tool calls per task",
                   "calls the model made, blocked and refused ones included" if bench else
                   "calls recorded in the trace, blocked and refused ones included",
                   bars(lambda m: m.calls_per_task, lambda m: f"{m.calls_per_task:.1f}"),
                   better="lower is better"),
    ]
    model_errors = has_model_errors(summary)
    endings = [("success", "goal reached", "#0f9d8a"),
               ("missed", "finished, goal missed", "#f3c98b"),
               ("halted", "halted by the guard", "#1e3a5f"),
               ("budget", "budget stop", "#5b7fa6"),
               ("step_cap", "looped to the step cap", "#e0594b"),
               ("crash", "crashed", "#475569")] + \
        [("model_error", "model endpoint error", "#a21caf")] * model_errors
    ending_of: dict[str, Callable[[Metrics], float]] = {
        "success": lambda m: m.successes, "missed": lambda m: m.gave_up,
        "halted": lambda m: m.halts, "budget": lambda m: m.budget_stops,
        "step_cap": lambda m: m.step_cap_hits, "crash": lambda m: m.crashes,
        "model_error": lambda m: m.model_errors,
    }
    measured = success_measured
    ended = stacked_chart(
        "endings", "How the episodes ended",
        "every episode of every policy, from the agent's point of view",
        [(p, labels[p]) for p in policies], endings,
        lambda p, seg: ending_of[seg](summary.policies[p])) if measured else ""
    agents = {p: v for p, v in summary.agents.items() if set(v) != {"(trace)"}}
    agent_names: list[str] = []
    for inner in agents.values():
        agent_names.extend(a for a in inner if a not in agent_names)
    series = [(p, labels[p], colour[p]) for p in policies if p in agents]
    real_models = [a for a in agent_names if a.startswith("model:")]
    agents_lead = ("Simulated models with known behaviours." if not real_models else
                   "The model behind the endpoint" + (", beside simulated models with known "
                   "behaviours." if len(real_models) < len(agent_names) else "."))

    def per_agent(metric: Callable[[Metrics], float]) -> Callable[[str, str], float | None]:
        def value(agent: str, policy: str) -> float | None:
            m = agents.get(policy, {}).get(agent)
            return None if m is None else metric(m)
        return value

    agent_charts = ""
    if agent_names:
        agent_charts = "".join([
            grouped_chart("agent_success_rate", "Task success by agent",
                          "the same agents against every policy" if real_models else
                          "the same seeded agents against every policy", agent_names, series,
                          per_agent(lambda m: m.success_rate),
                          lambda v: f"{v * 100:.0f}%", max_value=1.0, percent=True),
            grouped_chart("agent_longest_loop", "Longest identical-retry loop by agent",
                          "a stubborn model cannot loop through toolfault; it can through the "
                          "others", agent_names, series,
                          per_agent(lambda m: m.longest_identical_run), lambda v: f"{v:.0f}"),
            grouped_chart("agent_error_tokens", "Error tokens per task by agent",
                          "context spent on error text; a model that ignores every message "
                          "still gets one per call", agent_names, series,
                          per_agent(lambda m: m.error_tokens_per_task), lambda v: f"{v:.0f}"),
            grouped_chart("agent_duplicates", "Duplicate side effects by agent",
                          "every agent, every policy, same worlds", agent_names, series,
                          per_agent(lambda m: m.duplicate_side_effects), lambda v: f"{v:.0f}"),
        ])
    scenarios = {p: v for p, v in summary.scenarios.items() if set(v) != {"(trace)"}}
    heat = ""
    if scenarios:
        rows: list[str] = []
        for inner in scenarios.values():
            rows.extend(s for s in inner if s not in rows)
        heat = heatmap("scenario_heatmap", "Success by scenario",
                       "colour: task success · small print: longest loop and duplicate side "
                       "effects", rows, [(p, labels[p]) for p in policies if p in scenarios],
                       lambda s, p: scenarios.get(p, {}).get(s))
    elif summary.tools:
        rows = []
        for inner in summary.tools.values():
            rows.extend(t for t in inner if t not in rows)
        heat = heatmap("tool_heatmap", f"Success by tool{star_s}",
                       f"colour: share of tasks whose last call of the tool succeeded{star_s}"
                       f" · small print: longest identical loop and duplicate side effects"
                       f"{star_d}", rows, [(p, labels[p]) for p in policies],
                       lambda t, p: summary.tools.get(p, {}).get(t))
    described = "".join(
        f"<dt>{_e(labels[p])}</dt><dd>{_e(POLICIES[p].description)}</dd>"
        for p in policies if p in POLICIES) if bench else "".join(
        f"<dt>{_e(labels[p])}</dt><dd>{_e(_trace_policy(p))}</dd>" for p in policies)
    words_of_trace = not success_measured
    defs = "".join(f"<dt>{_e(h)}</dt><dd>{_e(doc)}</dd>"
                   for h, doc in legend(trace=words_of_trace,
                                        model_errors=has_model_errors(summary)))
    if inferred:
        defs += f"<dt>*</dt><dd>{_e(INFERRED_NOTE.removeprefix('* '))}</dd>"
    if tokens_note:
        defs += f"<dt>error tokens</dt><dd>{_e(tokens_note.removeprefix('error tokens: '))}</dd>"
    star_note = (f'<p class="lead inferred">{_e(INFERRED_NOTE)}</p>' if inferred else "")
    token_line = f'<p class="tokens">{_e(tokens_note)}</p>' if tokens_note else ""
    if bench:
        agents_words = (f"the same model{'s' if len(real_models) > 1 else ''} "
                        f"({', '.join(m.removeprefix('model:') for m in real_models)})"
                        if real_models else "same seeded agents")
        intro = (f'<h2>Per policy</h2><p class="lead">Same tools, same injected faults, '
                 f'{_e(agents_words)}.</p>')
    else:
        calls = sum(m.calls for m in summary.policies.values())
        tasks = sum(m.tasks for m in summary.policies.values())
        kinds = ["task success"] * (not success_measured) + \
            ["duplicate side effects"] * (not dups_measured)
        intro = (f'<h2>What your trace shows</h2><p class="lead">{calls} calls in {tasks} '
                 f'tasks. Measured, read from each call record: calls, tool runs, errors and '
                 f'their tokens, identical-retry loops, blocked calls, cap hits.'
                 + (f' Inferred from the calls, marked *: {" and ".join(kinds)} (the trace '
                    f'has no episode records saying whether a task reached its goal).'
                    if kinds else "") + '</p>')
    if scenarios:
        breakdown = (f'<h2 id="scenarios">Per scenario</h2><p class="lead">Where each policy '
                     f'wins and loses.</p><section class="grid">{heat}</section>')
    elif heat:
        breakdown = (f'<h2 id="tools">By tool</h2><p class="lead">Each tool\'s calls, per '
                     f'policy.</p><section class="grid">{heat}</section>'
                     f'{_tool_table(summary, labels)}')
    else:
        breakdown = ""
    seen = ""
    if examples:
        seen = (f'<h2 id="seen">What the model saw</h2><p class="lead">The first error each '
                f'policy showed the instruction-following agent, for the same fault.</p>'
                f'{_examples(examples, labels, colour, policies)}')
    note_html = "".join(f"<p class=\"lead\">{_e(n)}</p>" for n in notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title><style>{_CSS}</style></head>
<body><main>
<header><h1><span>toolfault</span> {_e(title.removeprefix("toolfault").strip())}</h1>
<p>{_e(subtitle)}</p>{token_line}</header>
{_model_errors(summary)}
{_kpis(summary, labels, colour)}
{intro}
{note_html}
{_legend(policies, labels, colour)}
<section class="grid">{ended}{"".join(charts)}</section>
{f'<h2 id="agents">Per agent</h2><p class="lead">{agents_lead}</p>'
 f'{_legend([p for p in policies if p in agents], labels, colour)}'
 f'<section class="grid">{agent_charts}</section>' if agent_charts else ""}
{_stage_table(summary, labels, colour)}
{breakdown}
{seen}
<h2 id="numbers">All numbers</h2><p class="lead">Hover a header for its definition.</p>
{_table(summary, labels, colour, trace=words_of_trace)}
{star_note}
<h2>Definitions</h2>
<dl class="defs">{described}{defs}</dl>
<footer>Generated by toolfault. This page is self-contained: no scripts, no external
stylesheets, fonts or images, nothing loaded over the network.</footer>
</main></body></html>
"""


def write_html(path: str | Path, summary: Summary, **kw: Any) -> Path:
    """Write :func:`render_html` to ``path`` (UTF-8) and return the path."""
    target = Path(path)
    target.write_text(render_html(summary, **kw), encoding="utf-8")
    return target
