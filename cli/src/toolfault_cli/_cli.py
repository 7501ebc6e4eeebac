"""``toolfault docs | lint | bench | report | calibrate | demo | proxy``: the command line.

This package (``toolfault-cli``, installed by ``pip install 'toolfault[cli]'``) holds every
verb but ``proxy``, which lives in the library (:mod:`toolfault._proxy_cli`) so that
``toolfault[proxy]`` runs it without the bench; its arguments and its code are the library's,
registered here too.  The ``toolfault`` command itself is the library's stub,
:func:`toolfault._main.main`, which hands everything but ``proxy`` to :func:`main`.

Each verb lives in its own module; this one only parses arguments, so ``toolfault --help``
stays fast and a missing optional extra only breaks the verb that needs it.  Bad input is
caught here, before any work starts, and answered the way pytest and ruff answer it: one line
on stderr (``toolfault VERB: error: ...``) and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from toolfault._proxy_cli import PROXY_PARSER, add_proxy_arguments
from toolfault._usage import error, input_problem, output_problem, shown_url


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}"
                                         ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text}")
    return value


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
                          "drifted or is missing.")
    docs.add_argument("catalog", nargs="?", help="catalog TOML (default: the built-in one)")
    docs.add_argument("-o", "--output", default="docs/errors.md", help="file to write or check")
    docs.add_argument("--check", action="store_true",
                      help="exit 1 if OUTPUT is missing or out of date (writes nothing)")

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
    bench.add_argument("--seed", type=int, default=7, help="seed for worlds and agents")
    bench.add_argument("--episodes", type=_positive_int, default=None, metavar="N",
                       help="episodes per (task, agent, policy) cell (a positive number)")
    bench.add_argument("--report", metavar="HTML", help="also write a self-contained HTML page")
    bench.add_argument("--json", action="store_true", help="print machine-readable JSON")
    bench.add_argument("--trace", metavar="JSONL", help="write every call to a JSONL trace")
    bench.add_argument("--overhead", action="store_true",
                       help="run the per-call overhead micro-benchmarks instead")
    bench.add_argument("--stores", action="store_true",
                       help="measure guarded calls per second per store against a bare call")
    bench.add_argument("--loops", action="store_true",
                       help="run the loop-precision suite instead: legitimate runs harmed, "
                       "calls until loops are blocked and halted (--episodes: seeds)")
    bench.add_argument("--redis-url", help="with --stores: also measure RedisStore at this URL")
    bench.add_argument("--update-docs", metavar="MARKDOWN",
                       help="run the default and loop suites with fixed settings and write "
                       "their figures between the <!-- bench:begin/end --> markers")
    bench.add_argument("--check-docs", metavar="MARKDOWN",
                       help="exit 1 if the figures in MARKDOWN differ from a fresh run "
                       "(writes nothing)")
    bench.add_argument("--quick", action="store_true", help="a tiny suite (for smoke tests)")
    bench.add_argument("--model-url", metavar="URL",
                       help="OpenAI-compatible base URL (…/v1) to drive a real model")
    bench.add_argument("--model", help="model name for --model-url")
    bench.add_argument("--api-key-env", metavar="VAR",
                       help="environment variable holding the API key for --model-url "
                       "(default: OPENAI_API_KEY)")

    report = sub.add_parser("report", help="summarise a JSONL trace as a table and HTML page")
    report.add_argument("trace", help="JSONL trace written by Guard(trace=...)")
    report.add_argument("--report", metavar="HTML", help="also write a self-contained HTML page")
    report.add_argument("--json", action="store_true", help="print machine-readable JSON")

    calibrate = sub.add_parser(
        "calibrate", help="replay a trace through the ladder's current and candidate Limits",
        description="Replay a JSONL trace (Guard(trace=...)) through the current and a "
        "candidate Limits: which calls each would block or halt, which of those look like "
        "polls, re-reads or recovered mistakes, and the least strict thresholds that refuse "
        "none of them. Settings are Limits field names: --set no_progress_repeats=8.")
    calibrate.add_argument("trace", help="JSONL trace written by Guard(trace=...)")
    calibrate.add_argument("--current", action="append", default=[], metavar="NAME=VALUE",
                           help="the Limits you run today (default: the defaults)")
    calibrate.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                           dest="candidate", help="a candidate setting (repeatable)")
    calibrate.add_argument("--json", action="store_true", help="print machine-readable JSON")
    calibrate.add_argument("--plain", action="store_true", help="no colours")

    demo = sub.add_parser("demo", help="show what a model sees with and without toolfault")
    demo.add_argument("--plain", action="store_true", help="no colours or panels")

    add_proxy_arguments(sub.add_parser("proxy", help=PROXY_PARSER["help"],
                                       usage=PROXY_PARSER["usage"],
                                       description=PROXY_PARSER["description"]))
    return parser


def _version() -> str:
    from toolfault import __version__

    return f"toolfault {__version__}"


def _bench_problem(args: argparse.Namespace) -> str | None:
    """Options that contradict each other or cannot work, found before the bench starts."""
    given = {"--report": args.report, "--trace": args.trace, "--episodes": args.episodes,
             "--quick": args.quick, "--model-url": args.model_url, "--model": args.model}
    docs = [(flag, value) for flag, value in (("--update-docs", args.update_docs),
                                              ("--check-docs", args.check_docs)) if value]
    if docs:
        flag = docs[0][0]
        if len(docs) > 1:
            return "--update-docs and --check-docs are separate runs: pick one"
        extra = [name for name, value in {
            **given, "--json": args.json, "--overhead": args.overhead, "--stores": args.stores,
            "--loops": args.loops, "--redis-url": args.redis_url,
            "--api-key-env": args.api_key_env, "--seed": args.seed != 7}.items() if value]
        if extra:
            return f"{extra[0]} does not apply to {flag} (its settings are fixed)"
        return None
    for mode, on in (("--overhead", args.overhead), ("--stores", args.stores)):
        if not on:
            continue
        if args.overhead and args.stores:
            return "--overhead and --stores are separate runs: pick one"
        extra = [flag for flag, value in given.items() if value]
        if extra:
            return f"{extra[0]} does not apply to {mode}"
    if args.redis_url and not args.stores:
        return "--redis-url only applies with --stores"
    if args.redis_url:
        scheme = urlsplit(args.redis_url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            return (f"--redis-url must start with redis://, rediss:// or unix://, "
                    f"got {shown_url(args.redis_url)!r}")
    if args.api_key_env and not args.model_url:
        return "--api-key-env only applies with --model-url"
    if args.model and not args.model_url:
        return "--model needs --model-url (the server's OpenAI-compatible base URL)"
    if args.model_url:
        parts = urlsplit(args.model_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return (f"--model-url must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                    f"got {shown_url(args.model_url)!r}")
        if not args.model:
            return "--model-url needs --model (the model name the server serves)"
    for flag, path in (("--report", args.report), ("--trace", args.trace)):
        if path is not None and (problem := output_problem(path)):
            return f"{flag}: {problem}"
    if args.report and args.trace and Path(args.report).resolve() == Path(args.trace).resolve():
        return "--report and --trace name the same file"
    return None


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command == "docs":
        from toolfault_cli._docs import docs_command

        return docs_command(args.catalog, args.output, check=args.check)
    if args.command == "lint":
        from toolfault_cli._lint import lint_command

        return lint_command(args.targets)
    if args.command == "demo":
        from toolfault_cli._demo import demo_command

        return demo_command(plain=args.plain)
    if args.command == "proxy":
        from toolfault._proxy_cli import proxy_command

        return proxy_command(args)
    if args.command == "bench":
        if problem := _bench_problem(args):
            error("bench", problem)
            return 2
        if args.update_docs or args.check_docs:
            from toolfault_cli.bench._docs_block import docs_block_command

            return docs_block_command(args.update_docs or args.check_docs,
                                      check=bool(args.check_docs))
        from toolfault_cli.bench import bench_command

        return int(bench_command(args))
    if args.command == "calibrate":
        if problem := input_problem(args.trace, "JSONL trace"):
            error("calibrate", problem)
            return 2
        from toolfault_cli._calibrate import calibrate_command

        return calibrate_command(args.trace, args.current, args.candidate,
                                 as_json=args.json, plain=args.plain)
    if args.command == "report":
        problem = input_problem(args.trace, "JSONL trace")
        if problem is None and args.report is not None:
            problem = output_problem(args.report)
            problem = f"--report: {problem}" if problem else None
        if problem:
            error("report", problem)
            return 2
        from toolfault_cli.bench import report_command

        return int(report_command(args))
    parser.error(f"unknown command {args.command!r}")
    return 2


#: Verbs that print with rich (the ``cli`` extra); ``docs`` and ``proxy`` need nothing more.
_NEEDS_CLI_EXTRA = frozenset({"lint", "bench", "report", "calibrate", "demo"})


def _missing_cli_extra(verb: str) -> str | None:
    """What to install when ``verb`` needs the ``cli`` extra and it is missing."""
    if verb not in _NEEDS_CLI_EXTRA:
        return None
    import importlib

    missing = []
    for name in ("rich", "tenacity"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if not missing:
        return None
    return (f"{verb} needs {' and '.join(missing)}, which the library does not: "
            "pip install 'toolfault[cli]'")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toolfault`` command."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if problem := _missing_cli_extra(args.command):
        error(args.command, problem)
        return 2
    try:
        return _run(args, parser)
    except KeyboardInterrupt:
        error(args.command, "interrupted")
        return 130
    except BrokenPipeError:  # `toolfault bench | head`: the reader left; say nothing more
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
