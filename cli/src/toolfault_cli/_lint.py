"""``toolfault lint``: the catalog rows and the tool definitions, checked before a model is.

The model's first mistake usually starts at the tool definition, and a catalog row without a
next action produces a message without one.  Findings are numbered, each with its fix, and
the exit status makes it a CI gate.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolfault._catalog import PLACEHOLDERS, Catalog, template_fields
from toolfault._errors import CatalogError, FailureClass
from toolfault._tokens import count_tokens

_WHEN_WORDS = re.compile(r"(?i)\b(use|when|if|for|before|after|instead|only|unless)\b")
_CALL_NAME = re.compile(r"\bcall\s+([A-Za-z_][A-Za-z0-9_.\-]*)")
_NOT_TOOL_WORDS = {"it", "this", "that", "again", "one", "the", "a", "an", "later", "back"}


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem, where it is, and how to fix it."""

    where: str
    problem: str
    fix: str
    severity: str = "error"


def lint_catalog(catalog: Catalog, *, codes: Iterable[str] | None = None) -> list[Finding]:
    """Rows without a next action, unknown placeholders, messages over the token budget.

    ``codes`` limits the check to a user's own rows while rendering with the merged catalog.
    """
    from toolfault_cli._docs import example_message

    wanted = set(codes) if codes is not None else None
    findings: list[Finding] = []
    for entry in catalog:
        if wanted is not None and entry.code not in wanted:
            continue
        where = f"{catalog.source} [{entry.code}]"
        if not entry.next_action.strip():
            findings.append(Finding(where, "row has no next action",
                                    'add next_action = "call {tool} again with …" or '
                                    '"stop and report this failure to the user"'))
        for key, template in (("reason", entry.reason), ("next_action", entry.next_action)):
            try:
                names = template_fields(template)
            except CatalogError as exc:
                findings.append(Finding(where, str(exc), f"fix the braces in {key}"))
                continue
            for name in names:
                if name not in PLACEHOLDERS:
                    known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                    findings.append(Finding(where, f"{key} uses unknown placeholder {{{name}}}",
                                            f"use one of {known}"))
        if entry.retryable and entry.failure_class is not FailureClass.TRANSIENT:
            findings.append(Finding(
                where, f"retryable = true on a {entry.failure_class.value} failure",
                "only transient failures are retried; set retryable = false or class = "
                '"transient"', severity="warning"))
        try:
            message = example_message(catalog, entry)
        except CatalogError as exc:
            findings.append(Finding(where, str(exc), "fix the template"))
            continue
        tokens = count_tokens(message)
        if tokens > catalog.token_budget:
            findings.append(Finding(
                where, f"message is {tokens} tokens, over the budget of {catalog.token_budget}",
                "shorten summary/next_action, or move the explanation behind a link"))
    return findings


def _property_issues(name: str, prop: dict[str, Any]) -> list[str]:
    issues = []
    concrete = any(k in prop for k in ("type", "enum", "const", "$ref", "anyOf", "oneOf",
                                        "allOf"))
    if not concrete:
        issues.append("has no concrete type (bare Any)")
    elif prop.get("type") == "object" and "properties" not in prop and not isinstance(
        prop.get("additionalProperties"), dict
    ):
        issues.append("is a bare dict with no schema for its contents")
    elif prop.get("type") == "array" and not prop.get("items"):
        issues.append("is a list with no item type")
    return issues


_RANGE_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
               "maxLength", "enum", "const", "pattern")


def _has_constraint(prop: dict[str, Any]) -> bool:
    if any(k in prop for k in _RANGE_KEYS):
        return True
    return any(_has_constraint(p) for p in prop.get("anyOf", []) if isinstance(p, dict))


def _checked_params(fn: Any, params: Iterable[str]) -> dict[str, str]:
    """Parameters the tool body compares against constants (so the schema should say so)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return {}
    names = set(params)
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Name)
            and node.left.id in names
            and all(isinstance(c, (ast.Constant, ast.Tuple, ast.List, ast.Set))
                    for c in node.comparators)
        ):
            found.setdefault(node.left.id, ast.unparse(node))
    return found


def _next_action_strings(fn: Any) -> list[str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "next_action" and isinstance(kw.value, ast.Constant) and \
                        isinstance(kw.value.value, str):
                    out.append(kw.value.value)
    return out


def lint_guard(guard: Any) -> list[Finding]:
    """Tool definitions: descriptions, documented and concrete parameters, declared
    constraints, and alternative tools that exist."""
    findings: list[Finding] = []
    names = set(guard.tools)
    for name, spec in sorted(guard.tools.items()):
        where = f"tool {name}"
        desc = (spec.description or "").strip()
        if not desc:
            findings.append(Finding(where, "has no description",
                                    "add a docstring saying what it does and when to use it"))
        elif len(desc.split()) < 6 or not _WHEN_WORDS.search(desc):
            findings.append(Finding(where, f"description {desc[:60]!r} does not say when to "
                                    "use it", 'add a sentence like "Use it when …"'))
        props = spec.schema.get("properties", {})
        for pname, prop in props.items():
            if not isinstance(prop, dict):
                continue
            if not prop.get("description"):
                findings.append(Finding(f"{where}, parameter {pname}", "is not documented",
                                        f"document {pname} in the docstring's Args: section "
                                        "or with Annotated[..., Field(description=...)]"))
            for issue in _property_issues(pname, prop):
                findings.append(Finding(f"{where}, parameter {pname}", issue,
                                        "give it a concrete type (a TypedDict, pydantic model, "
                                        "list[str], …)"))
        if not spec.explicit_schema:
            for pname, check in _checked_params(spec.fn, props).items():
                prop = props.get(pname, {})
                if isinstance(prop, dict) and not _has_constraint(prop):
                    findings.append(Finding(
                        f"{where}, parameter {pname}",
                        f"the code checks `{check}` but the schema declares no range or enum",
                        f"declare it, e.g. Annotated[int, Field(gt=0)] or Literal[...] for "
                        f"{pname}, so the model sees the rule before it calls"))
        for alt in spec.alternatives:
            if alt.name not in names:
                findings.append(Finding(where, f"alternative {alt.name!r} is not a registered "
                                        "tool", f"register {alt.name} or remove it from "
                                        "alternatives="))
        if not spec.is_async and spec.timeout is None and guard.deadline is not None \
                and not getattr(guard, "isolate_sync_tools", False):
            findings.append(Finding(
                where, f"is a sync tool without timeout=, so under Guard.call it runs on the "
                f"caller's thread and cannot be stopped at the guard's deadline "
                f"({guard.deadline:g}s)",
                "give it @guard.tool(timeout=...) (seconds) so it runs in a worker thread "
                "the deadline can abandon, or build the guard with isolate_sync_tools=True",
                severity="warning"))
        if spec.check_with and spec.check_with not in names:
            findings.append(Finding(where, f"check_with={spec.check_with!r} is not a "
                                    "registered tool", "register that read tool"))
        for text in _next_action_strings(spec.fn):
            for target in _CALL_NAME.findall(text):
                if target.lower() not in _NOT_TOOL_WORDS and target not in names:
                    findings.append(Finding(where, f"a next action names {target!r}, which is "
                                            "not a registered tool",
                                            f"register {target} or reword the next action"))
    return findings


def load_guard(reference: str) -> Any:
    """Import ``module:attribute`` (a ``Guard``) the way ``uvicorn`` imports apps."""
    module_name, _, attr = reference.partition(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    module = importlib.import_module(module_name)
    target: Any = module
    for part in (attr or "guard").split("."):
        target = getattr(target, part)
    if callable(target) and not hasattr(target, "tools"):
        target = target()
    if not hasattr(target, "tools"):
        raise TypeError(f"{reference} is not a toolfault Guard")
    return target


def _load_problem(target: str) -> str | None:
    """Why ``target`` cannot be linted, before importing anything (one line), or ``None``."""
    from toolfault._usage import input_problem

    path = Path(target)
    if target.endswith(".py"):
        return (f"{target} is a Python file: name the guard as module:attribute, e.g. "
                f"{path.stem}:guard, run from the directory that holds it")
    if target.endswith(".toml") or path.exists() or "/" in target or "\\" in target:
        return input_problem(target, "catalog .toml file")
    module_name, _, attr = target.partition(":")
    if not module_name or not all(p.isidentifier() for p in module_name.split(".")):
        return (f"{target!r} is neither a catalog .toml file nor a module:guard reference "
                f"(like myapp.tools:guard)")
    if attr and not all(p.isidentifier() for p in attr.split(".")):
        return f"{attr!r} in {target!r} is not an attribute name"
    return None


def lint_command(targets: list[str]) -> int:
    """Print numbered findings; exit 1 when any is an error, 2 when a target cannot load."""
    from rich.console import Console
    from rich.markup import escape

    from toolfault._usage import error

    console = Console(highlight=False, emoji=False)
    findings: list[Finding] = []
    if not targets:
        targets = ["<built-in>"]
    for target in targets:
        if target != "<built-in>" and (problem := _load_problem(target)):
            error("lint", problem)
            return 2
        try:
            if target == "<built-in>":
                findings += lint_catalog(Catalog.default())
            elif target.endswith(".toml") or Path(target).is_file():
                own = Catalog.load(target)
                findings += lint_catalog(Catalog.default().merged(own),
                                         codes=[e.code for e in own])
            else:
                findings += lint_guard(load_guard(target))
        except CatalogError as exc:
            error("lint", f"cannot load {target}: {exc}")
            return 2
        except ModuleNotFoundError as exc:
            error("lint", f"cannot load {target}: no module named {exc.name!r}"
                  f"{' (is it on sys.path?)' if exc.name == target.partition(':')[0] else ''}")
            return 2
        except (AttributeError, TypeError) as exc:
            error("lint", f"cannot load {target}: {exc}")
            return 2
        except Exception as exc:  # the user's module failed to import: say how, in one line
            error("lint", f"cannot load {target}: {type(exc).__name__}: {exc}")
            return 2
    if not findings:
        console.print(f"[green]✓[/green] no findings in {escape(', '.join(targets))}")
        return 0
    for number, f in enumerate(findings, 1):
        colour = "red" if f.severity == "error" else "yellow"
        console.print(f"{number}. [{colour}]{f.severity}[/{colour}] [bold]{escape(f.where)}"
                      f"[/bold]: {escape(f.problem)}\n   fix: {escape(f.fix)}")
    errors = sum(f.severity == "error" for f in findings)
    console.print(f"\n{len(findings)} finding(s), {errors} error(s).")
    if any(" tokens, over the budget" in f.problem for f in findings):
        from toolfault._tokens import token_counter_name

        console.print("tokens: exact cl100k_base counts" if token_counter_name() == "cl100k_base"
                      else "tokens: estimated counts (install toolfault[tokens] for exact "
                      "cl100k_base counts)", style="dim", markup=False)
    return 1 if errors else 0
