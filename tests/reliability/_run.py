"""The suite's profiles, its run, and the figures table it prints and publishes."""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path
from typing import Any

from . import _canary, _crash, _hostile, _ordinary, _redos

PROFILES: dict[str, dict[str, Any]] = {
    # CI: a sample of every part, well under two minutes on a small shared runner.
    "ci": {"name": "ci", "examples": 150, "per_example": 20, "kinds": 9,
           "placements": ("argument", "return_value", "exception_text", "unknown_tool_name",
                          "bytes_argument", "exception_chain"),
           "kill9": 2, "outage_calls": 10, "redos_sizes": (16_000, 64_000, 256_000)},
    # Nightly: the full counts.
    "full": {"name": "full", "examples": 5_000, "per_example": 20, "kinds": 9,
             "placements": _canary.PLACEMENTS, "kill9": 30, "outage_calls": 100,
             "redos_sizes": (16_000, 256_000, 1_000_000)},
}
DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"


def run(profile: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Every part of the suite under one profile; returns the figures."""
    tally = _hostile.Tally()
    started = time.monotonic()
    _hostile.generated_calls(profile["examples"], profile["per_example"], tally)
    generated_s = time.monotonic() - started
    matrix = _canary.run_matrix(workdir / "canary", kinds=profile["kinds"],
                                placements=profile["placements"])
    crash = _crash.CrashFigures()
    (workdir / "kill9").mkdir()
    _crash.kill9_sqlite(workdir / "kill9", profile["kill9"], crash)
    redis_skipped = False
    try:
        _crash.redis_outage(profile["outage_calls"], crash)
    except (FileNotFoundError, RuntimeError):  # no redis-server binary here
        redis_skipped = True
    redos = _redos.scaling(profile["redos_sizes"])
    precision = _ordinary.measure()
    clean = (precision.echo_intact >= 0.99 * precision.values
             and precision.result_intact >= 0.99 * precision.values
             and tally.raises == tally.hangs == tally.over_budget == tally.malformed == 0
             and tally.leaks == 0 and not any(matrix.leaks.values())
             and crash.kill9_duplicates == 0 and crash.outage_raises == 0
             and crash.outage_hangs == 0 and crash.outage_duplicates == 0
             and redos["slow"] == [])
    return {"profile": profile["name"], "tally": tally, "generated_s": generated_s,
            "matrix": matrix, "crash": crash, "redis_skipped": redis_skipped,
            "redos": redos, "precision": precision, "clean": clean,
            "python": platform.python_version()}


def render(f: dict[str, Any]) -> str:
    """The figures as Markdown (the block docs/reliability.md publishes)."""
    t: _hostile.Tally = f["tally"]
    m: _canary.Matrix = f["matrix"]
    c: _crash.CrashFigures = f["crash"]
    r = f["redos"]
    p: _ordinary.Precision = f["precision"]
    lines = [
        f"Profile `{f['profile']}`, Python {f['python']}, "
        f"{f.get('seconds', '?')} s in all.",
        "",
        "| Hostile generated calls | Figure |",
        "|---|---|",
        f"| inputs tried (calls, sync and async) | {t.calls:,} |",
        f"| raised into the caller | {t.raises} |",
        f"| returned past the deadline ({_hostile.DEADLINE} s + 2 s slack) | {t.hangs} |",
        f"| slowest call | {t.slowest:.2f} s |",
        f"| messages over twice the token budget | {t.over_budget} |",
        f"| malformed messages (not the four-part or terminal shape) | {t.malformed} |",
        f"| canary secret in text, tool name or data | {t.leaks} |",
        "",
        f"Canary matrix: {len(_canary.KINDS[:9])} secret kinds (registered and environment) "
        f"and {len(_canary.SHAPES)} credential shapes nobody registered "
        f"({', '.join(_canary.SHAPE_LABELS[kind] for kind, _, _ in _canary.SHAPES)}) x "
        f"{len(_canary.FORMS)} forms (shapes: all but "
        f"{' and '.join(_canary.CASE_FORMS)}) x placements = {m.trials:,} trials "
        f"({m.groups['registered']:,} registered, {m.groups['environment']:,} environment, "
        f"{m.groups['shape']:,} shape), each searched for in {len(_canary.CHANNELS)} channels.",
        "",
        "| Channel | Leaks |",
        "|---|---|",
        *(f"| {channel} | {count} |" for channel, count in m.leaks.items()),
        "",
        "Leaks per channel x form (0 is the bar in every cell):",
        "",
        "| Channel | " + " | ".join(_canary.FORMS) + " |",
        "|---|" + "---|" * len(_canary.FORMS),
        *(f"| {channel} | " + " | ".join(str(m.cells.get((channel, form), 0))
                                       for form in _canary.FORMS) + " |"
          for channel in _canary.CHANNELS),
        "",
        "| Ordinary values (precision) | Figure |",
        "|---|---|",
        f"| corpus: slugs, words holding key prefixes, names, UUIDs, git SHAs, ISBNs, flight "
        f"numbers, URLs without passwords, base64 images, everyday values | "
        f"{p.values} |",
        f"| intact in the echo (`Rejected arguments`) | {p.echo_intact} of {p.values} "
        f"({100 * p.echo_intact / p.values:.1f} %) |",
        f"| intact in results | {p.result_intact} of {p.values} "
        f"({100 * p.result_intact / p.values:.1f} %) |",
        f"| benign argument names (`token_count`, `boarding_pass`, `auth_method`, …) whose "
        f"value stays visible | {p.names_intact} of {p.names} |",
        "",
        "| Crashes and outages | Figure |",
        "|---|---|",
        f"| SQLite, worker killed with SIGKILL mid-call: trials | {c.kill9_trials} |",
        f"| duplicate side effects after the kill | {c.kill9_duplicates} |",
        f"| integrity_check ok and the retry refused | {c.kill9_integrity_ok} |",
        ("| Redis outage | skipped (no redis-server) |" if f["redis_skipped"] else
         f"| Redis killed mid-run (fail open and fail closed): calls | {c.outage_calls} |"),
        f"| raised during the outage | {c.outage_raises} |",
        f"| past the deadline during the outage | {c.outage_hangs} |",
        f"| duplicate side effects | {c.outage_duplicates} |",
        "",
        "| Redactor on hostile text (linear time) | Figure |",
        "|---|---|",
        f"| adversarial families | {r['families']} |",
        f"| sizes | {', '.join(f'{s:,}' for s in r['sizes'])} characters |",
        f"| worst growth in time between the two largest sizes | {r['worst_ratio']:.1f}x "
        f"for {r['sizes'][-1] / r['sizes'][-2]:.3g}x the input (quadratic: "
        f"{(r['sizes'][-1] / r['sizes'][-2]) ** 2:.3g}x) |",
        f"| slowest redaction of the largest size | {r['slowest_s']:.2f} s |",
    ]
    problems = [*t.examples, *m.examples, *p.damaged[:8]]
    if problems:  # published as found, so a regression is visible rather than hidden
        lines += ["", "First problems seen:", ""]
        lines += ["- `" + p[:200].replace("`", "'").replace("\n", " / ") + "`"
                  for p in problems]
    return "\n".join(lines)


def write_doc(text: str) -> None:
    """Replace the figures block of docs/reliability.md with ``text``."""
    doc = DOC.read_text(encoding="utf-8")
    block = f"{BEGIN}\n{text}\n{END}"
    doc = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, doc, flags=re.S)
    DOC.write_text(doc, encoding="utf-8")
