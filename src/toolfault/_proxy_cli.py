"""``toolfault proxy``: arguments checked before anything starts, then the proxy runs.

Why its own module: the command line stays importable (and ``--help`` fast) without the MCP
SDK; only this verb needs it, and its absence is answered with the install line that fixes it.

Why in the library and not in ``toolfault-cli`` with the other verbs: a client config line
``toolfault proxy -- <server>`` needs ``toolfault[proxy]`` only, not the bench.  The
``toolfault`` stub (:mod:`toolfault._main`) runs :func:`main` here whether or not the command
line is installed, and the command line registers the same arguments
(:func:`add_proxy_arguments`) and runs the same :func:`proxy_command`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from toolfault._usage import error, input_problem, output_problem

#: What fixes a missing MCP SDK.
INSTALL_HINT = "pip install 'toolfault[proxy]'"

#: The verb's parser settings, the same whether it stands alone (:func:`main`) or is a
#: subcommand of the full command line.
PROXY_PARSER = {
    "help": "guard any MCP server: toolfault proxy -- CMD [ARGS...]",
    "usage": "toolfault proxy [options] -- CMD [ARGS...]\n"
             "       toolfault proxy [options] --upstream-url URL",
    "description": "Run CMD as the upstream MCP server and serve it over stdio (or "
                   "--http), every tool call guarded: four-part errors, capped identical "
                   "failures, side effects from the tools' annotations. Change one line of "
                   "the client's config.",
}


def add_proxy_arguments(proxy: argparse.ArgumentParser) -> None:
    """The ``toolfault proxy`` options, added to ``proxy``."""
    proxy.add_argument("--config", metavar="TOML", help="[proxy], [limits], [tools.NAME]")
    proxy.add_argument("--trace", metavar="JSONL", help="append every call to a JSONL trace")
    proxy.add_argument("--upstream-url", metavar="URL",
                       help="a streamable-HTTP upstream instead of a command")
    proxy.add_argument("--http", metavar="HOST:PORT",
                       help="serve streamable HTTP instead of stdio (loopback unless "
                       "--token-env is given)")
    proxy.add_argument("--token-env", metavar="VAR",
                       help="with --http: environment variable holding the bearer token")
    proxy.add_argument("upstream", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]",
                       help="the upstream server's command line")


def main(argv: Sequence[str]) -> int:
    """``toolfault proxy ARGV``: parse, run, and answer an interrupt the way every verb does."""
    parser = argparse.ArgumentParser(prog="toolfault proxy", usage=PROXY_PARSER["usage"],
                                     description=PROXY_PARSER["description"])
    add_proxy_arguments(parser)
    args = parser.parse_args(list(argv))
    try:
        return proxy_command(args)
    except KeyboardInterrupt:
        error("proxy", "interrupted")
        return 130
    except BrokenPipeError:  # the client closed stdout: say nothing more
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1


def proxy_command(args: argparse.Namespace) -> int:
    """Run ``toolfault proxy`` from parsed arguments; 2 for a usage error, 1 for a failure."""
    command = list(args.upstream or [])
    if command and command[0] == "--":
        command = command[1:]
    problem = _argument_problem(args, command)
    http = None
    if problem is None and args.http:
        http, problem = _http(args.http, args.token_env)
    if problem is None and not _has_mcp():
        problem = f"the proxy needs the MCP SDK, which is not installed: {INSTALL_HINT}"
    if problem is not None:
        error("proxy", problem)
        return 2
    return _serve(args, command, http)


def _argument_problem(args: argparse.Namespace, command: list[str]) -> str | None:
    """What is wrong with the arguments, checked before anything starts, or ``None``."""
    if bool(command) == bool(args.upstream_url):
        return "give the upstream server as a command after --, or as --upstream-url URL " \
            "(not both)"
    if args.upstream_url:
        parts = urlsplit(args.upstream_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return f"--upstream-url must be an http(s) URL, got {args.upstream_url!r}"
    if args.config and (problem := input_problem(args.config, "TOML file")):
        return f"--config: {problem}"
    if args.trace and (problem := output_problem(args.trace)):
        return f"--trace: {problem}"
    return None


def _has_mcp() -> bool:
    """Whether the MCP SDK (the ``proxy`` extra) is installed."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return False
    return True


def _serve(args: argparse.Namespace, command: list[str], http: Any) -> int:
    """Load the config and run the proxy until the client or the upstream ends it."""
    from toolfault._errors import ConfigurationError
    from toolfault.proxy._config import ProxyConfig, load_config
    from toolfault.proxy._run import run_proxy
    from toolfault.proxy._upstream import UpstreamSpec, UpstreamStartError

    try:
        config = load_config(args.config) if args.config else ProxyConfig()
    except ConfigurationError as exc:
        error("proxy", str(exc))
        return 2
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(name)s: %(levelname)s: %(message)s")
    spec = UpstreamSpec(command=tuple(command), url=args.upstream_url or None)
    try:
        run_proxy(spec, config, trace=args.trace, http=http)
    except UpstreamStartError as exc:
        error("proxy", str(exc))
        return 1
    except BaseExceptionGroup as group:  # anyio task groups wrap what ended them
        start = group.subgroup(lambda e: isinstance(e, UpstreamStartError))
        if start is None:
            raise
        error("proxy", str(start.exceptions[0]))
        return 1
    return 0


def _http(value: str, token_env: str | None):  # type: ignore[no-untyped-def]
    """``HOST:PORT`` as :class:`HttpServing`, or why it cannot serve there."""
    from toolfault.proxy._run import HttpServing, token_from_env

    host, sep, port_text = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None, f"--http must be HOST:PORT such as 127.0.0.1:8765, got {value!r}"
    token = token_from_env(token_env) if token_env else None
    if token_env and token is None:
        return None, f"--token-env: environment variable {token_env} is not set or empty"
    serving = HttpServing(host=host, port=int(port_text), token=token)
    if not serving.loopback and token is None:
        return None, (f"--http {value} is reachable from the network: set --token-env VAR "
                      "to an environment variable holding a bearer token clients must send")
    return serving, None
