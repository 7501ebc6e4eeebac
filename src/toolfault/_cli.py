"""``toolfault docs | lint | bench | report | demo``: the command line.

Each verb lives in its own module; this one only parses arguments, so ``toolfault --help``
stays fast and a missing optional extra only breaks the verb that needs it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolfault",
        description="Tool errors an LLM agent can act on, and loops it cannot get into.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    docs = sub.add_parser("docs", help="generate the Markdown error reference from a catalog",
                          description="Render docs/errors.md from the catalog, with the same "
                          "templates the guard uses; --check fails when the committed file "
                          "drifted.")
    docs.add_argument("catalog", nargs="?", help="catalog TOML (default: the built-in one)")
    docs.add_argument("-o", "--output", default="docs/errors.md", help="file to write or check")
    docs.add_argument("--check", action="store_true", help="exit 1 if OUTPUT is out of date")

    lint = sub.add_parser(
        "lint", help="check a catalog and/or a guard's registered tools",
        description="Lint catalog rows (next action present, token budget, known placeholders) "
        "and, given module:attribute, the tools registered on a Guard (descriptions, "
        "documented parameters, concrete types, declared constraints, named alternatives). "
        "Placeholders: {tool} {code} {reason} {param} {expected} {alternative} {retry_after} "
        "{check_with} {nearest} {limit}.",
    )
    lint.add_argument("targets", nargs="*",
                      help="catalog .toml files and/or module:guard references")

    bench = sub.add_parser("bench", help="run simulated agents against injected faults",
                           description="Run the bench: toolfault against baselines on tasks "
                           "with injected faults, seeded and reproducible.")
    bench.add_argument("--seed", type=int, default=7)
    bench.add_argument("--episodes", type=int, default=None,
                       help="episodes per (task, agent, policy) cell")
    bench.add_argument("--report", metavar="HTML", help="also write a self-contained HTML page")
    bench.add_argument("--json", action="store_true", help="print machine-readable JSON")
    bench.add_argument("--trace", metavar="JSONL", help="write every call to a JSONL trace")
    bench.add_argument("--overhead", action="store_true",
                       help="run the per-call overhead micro-benchmarks instead")
    bench.add_argument("--stores", action="store_true",
                       help="measure guarded calls per second per store against a bare call")
    bench.add_argument("--redis-url", help="with --stores: also measure RedisStore at this URL")
    bench.add_argument("--quick", action="store_true", help="a tiny suite (for smoke tests)")
    bench.add_argument("--model-url", help="OpenAI-compatible base URL to drive a real model")
    bench.add_argument("--model", help="model name for --model-url")
    bench.add_argument("--api-key-env", default="OPENAI_API_KEY",
                       help="environment variable holding the API key for --model-url")

    report = sub.add_parser("report", help="summarise a JSONL trace as a table and HTML page")
    report.add_argument("trace", help="JSONL trace written by Guard(trace=...)")
    report.add_argument("--report", metavar="HTML", help="also write a self-contained HTML page")
    report.add_argument("--json", action="store_true", help="print machine-readable JSON")

    demo = sub.add_parser("demo", help="show what a model sees with and without toolfault")
    demo.add_argument("--plain", action="store_true", help="no colours or panels")
    return parser


def _version() -> str:
    from toolfault import __version__

    return f"toolfault {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toolfault`` command."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "docs":
        from toolfault._docs import docs_command

        return docs_command(args.catalog, args.output, check=args.check)
    if args.command == "lint":
        from toolfault._lint import lint_command

        return lint_command(args.targets)
    if args.command == "demo":
        from toolfault._demo import demo_command

        return demo_command(plain=args.plain)
    if args.command == "bench":
        from toolfault.bench import bench_command

        return int(bench_command(args))
    if args.command == "report":
        from toolfault.bench import report_command

        return int(report_command(args))
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
