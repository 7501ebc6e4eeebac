"""Each part of the guard is built from what it uses and works alone, without a ``Guard``;
and no module of the library imports one that imports it back (TYPE_CHECKING included)."""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import Any

from toolfault._admission import Counter, LazyFingerprint
from toolfault._budget import Budgets
from toolfault._call import _Call, resolve_fp
from toolfault._catalog import Catalog
from toolfault._classify import from_entry
from toolfault._degrading import DegradingStore
from toolfault._emission import Emitter
from toolfault._failing import Failures
from toolfault._ladder import Ladder, Repeat
from toolfault._limits import Limits
from toolfault._progress import Progress
from toolfault._redact import Redactor
from toolfault._settings import Scope, Settings
from toolfault._shaping import Shaper
from toolfault._tokens import estimate_tokens
from toolfault._tool import ToolSpec, build_spec
from toolfault._trace import CallEvent
from toolfault.stores import MemoryStore

ROOT = Path(__file__).resolve().parents[1]
#: The library, and the command line's package beside it.
PACKAGES = (ROOT / "src" / "toolfault", ROOT / "cli" / "src" / "toolfault_cli")


def _settings(**limits: Any) -> Settings:
    return Settings(limits=Limits(**limits), catalog=Catalog.default(), deadline=None,
                    isolate_sync_tools=False, count_tokens=estimate_tokens,
                    capture_content=False, error_result=None, idempotency_retention=60.0)


def _spec(name: str = "get_order") -> ToolSpec:
    def get_order(order_id: str) -> dict[str, str]:
        """Look an order up by id. Use it before changing an order."""
        return {"order_id": order_id}

    return build_spec(get_order, name=name, description=None, alternatives=(), normalize=None,
                      schema=None, cost=1.0, side_effect=False, postcondition=None,
                      timeout=None, idempotency_key=None, check_with=None, retry_limit=None,
                      error_result=None)


def _call(spec: ToolSpec, args: dict[str, Any]) -> _Call:
    call = _Call(spec, spec.name, args, "call-1", time.monotonic())
    call.kwargs = dict(args)
    return call


def _keyed_call(parts: _Parts, args: dict[str, Any]) -> _Call:
    """A call of ``get_order`` fingerprinted in the parts' scope, as the pipeline admits it."""
    call = _call(parts.tools["get_order"], args)
    resolve_fp(call, parts.scope)
    return call


class _Parts:
    """The parts of one scope, wired by hand as the facade wires them."""

    def __init__(self, **limits: Any) -> None:
        self.settings, self.scope = _settings(**limits), Scope("task-1", "enforce")
        self.store = DegradingStore(MemoryStore())
        self.redactor = Redactor(["s3cr3t-value-42"], scan_env=False)
        self.events: list[CallEvent] = []
        self.tools = {"get_order": _spec()}
        self.shaper = Shaper(self.settings, self.scope, self.tools, self.redactor)
        self.emitter = Emitter(self.settings, self.scope, self.shaper, self.store,
                               self.redactor, [self.events.append], None)
        self.ladder = Ladder(self.settings, self.scope, Progress(), self.store, self.shaper,
                             self.emitter, time.monotonic)
        self.failures = Failures(self.settings, self.scope, self.tools, self.store,
                                 self.shaper, self.ladder, self.emitter)


def test_the_shaper_alone_words_a_failure_in_four_parts_and_redacts_it() -> None:
    parts = _Parts()
    call = _call(parts.tools["get_order"], {"order_id": "s3cr3t-value-42"})
    failure = from_entry(parts.settings.catalog.get("not_found"), "no order s3cr3t-value-42")
    result = parts.shaper.four_part(call, failure)
    assert result.code == "not_found" and not result.ok
    assert "s3cr3t-value-42" not in result.text
    assert "Next action:" in result.text


def test_the_ladder_alone_notes_a_repeat_then_no_progress_at_the_configured_count() -> None:
    parts = _Parts(no_progress_repeats=3)

    def read() -> Repeat:
        call = _keyed_call(parts, {"order_id": "A1"})
        parts.ladder.started(call)
        return parts.ladder.note_success(call, '{"status": "open"}')

    assert [read() for _ in range(3)] == [Repeat.NEW, Repeat.SAME, Repeat.NO_PROGRESS]
    parts.scope.turn += 1  # the scope is shared: the next turn starts over
    assert read() is Repeat.NEW


def test_failures_alone_count_identical_failures_to_the_terminal_message() -> None:
    parts = _Parts(retry_limit=2)
    results = [parts.failures.fail(_keyed_call(parts, {"order_id": "B2"}), from_entry(
        parts.settings.catalog.get("not_found"), "no order B2")) for _ in range(2)]
    assert [r.terminal for r in results] == [False, True]
    assert [i.kind.value for i in parts.store.incidents("task-1")] == ["retry_cap"]


def test_budgets_alone_build_the_ceilings_from_the_limits_they_were_given() -> None:
    parts = _Parts(max_calls_per_turn=7, max_spend_per_task=3.0)
    budgets = Budgets(parts.settings, parts.scope, parts.store, failures=parts.failures,
                      emitter=parts.emitter)
    request = budgets.request(parts.tools["get_order"], LazyFingerprint("fp"))
    assert (request.task, request.turn, request.cost) == ("task-1", 0, 1.0)
    assert {c.counter: c.limit for c in request.ceilings} == {
        Counter.IDENTICAL_RUNNING: 2.0, Counter.CALLS_IN_TURN: 7.0, Counter.SPEND_IN_TASK: 3.0}


def test_the_emitter_alone_seals_a_result_and_tells_its_observers() -> None:
    parts = _Parts()
    call = _call(parts.tools["get_order"], {"order_id": "C3"})
    failure = from_entry(parts.settings.catalog.get("not_found"), "no order C3")
    result = parts.emitter.emit(call, parts.shaper.four_part(call, failure))
    assert [(e.tool, e.code, e.task, e.turn) for e in parts.events] == \
        [("get_order", "not_found", "task-1", 0)]
    assert result.code == "not_found"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports, anywhere in it (TYPE_CHECKING included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.startswith("toolfault"):  # toolfault and toolfault_cli
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("toolfault"))
    return found & modules


def _module_graph() -> dict[str, set[str]]:
    paths = {}
    for package, path in ((p, path) for p in PACKAGES for path in p.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        paths[name] = path
    names = set(paths)
    return {name: _imports(path, names) - {name} for name, path in paths.items()}


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path of imports from ``start`` back to itself, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for dep in graph.get(node, ()):
            if dep == start:
                return [*path, start]
            if dep not in seen:
                seen.add(dep)
                stack.append((dep, [*path, dep]))
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = _module_graph()
    cycles = [cycle for module in sorted(graph)
              if (cycle := _cycle_through(graph, module)) is not None]
    assert cycles == []
