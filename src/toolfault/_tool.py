"""A registered tool: the function plus everything declared about it, resolved once.

Everything the hot path needs (validator, normalizers, context parameter, whether it is a
coroutine) is computed at registration, so a call does no per-call re-derivation.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolfault._errors import ConfigurationError, Outcome
from toolfault._fingerprint import Normalizer, NormalizeSpec, compile_normalizers
from toolfault._result import ToolContext
from toolfault._schema import (
    ArgumentValidator,
    JsonSchemaValidator,
    PydanticValidator,
    context_params,
)

#: ``postcondition(args) -> bool | Outcome``: did the side effect land?
Postcondition = Callable[[dict[str, Any]], Any]
#: ``error_result(value) -> reason | None``: recognises errors a tool returns instead of raising.
ErrorDetector = Callable[[Any], "str | None"]


@dataclass(frozen=True, slots=True)
class Alternative:
    """A tool the model may call instead, and when it applies."""

    name: str
    when: str = ""

    def phrase(self) -> str:
        return f"call {self.name} {self.when}".rstrip() if self.when else f"call {self.name}"


def alternatives_from(
    value: Sequence[str | Alternative] | Mapping[str, str],
) -> tuple[Alternative, ...]:
    """Accept ``["a", "b"]``, ``{"a": "if …"}`` or ``Alternative`` objects."""
    if isinstance(value, Mapping):
        return tuple(Alternative(str(k), str(v)) for k, v in value.items())
    out = []
    for item in value:
        out.append(item if isinstance(item, Alternative) else Alternative(str(item)))
    return tuple(out)


_ARGS_HEADER = re.compile(r"^(Args|Arguments|Parameters|Params)\s*:?\s*$")
_OTHER_HEADER = re.compile(r"^(Returns?|Raises|Yields|Examples?|Notes?)\s*:?\s*$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:\S+\s+)?(\w+):\s*(.*)$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description and per-parameter docs from a Google/NumPy/Sphinx-style docstring."""
    if not doc:
        return "", {}
    params: dict[str, str] = {}
    desc_lines: list[str] = []
    section = None
    for line in inspect.cleandoc(doc).splitlines():
        stripped = line.strip()
        header = _section_of(stripped)
        if header is not None:
            section = header
            continue
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx:  # ``:param name: words`` belongs to no section
            params[sphinx.group(1)] = sphinx.group(2)
        elif section == "args":
            _read_arg_line(stripped, params)
        elif section is None and not stripped.startswith(":"):
            desc_lines.append(line)
    description = " ".join(" ".join(desc_lines).split())
    return description, params


def _section_of(stripped: str) -> str | None:
    """``"args"`` or ``"other"`` for a section heading (``Args:``, ``Returns:``), else None:
    the heading decides where the lines below it belong."""
    if _ARGS_HEADER.match(stripped):
        return "args"
    if _OTHER_HEADER.match(stripped):
        return "other"
    return None


def _read_arg_line(stripped: str, params: dict[str, str]) -> None:
    """A line of an ``Args:`` section: a parameter's first line (``name (type): words``), or
    more words for the parameter above it (a wrapped description)."""
    m = _ARG_LINE.match(stripped)
    if m:
        params[m.group(1).lstrip("*")] = m.group(2)
    elif stripped and params:
        last = list(params)[-1]
        params[last] = f"{params[last]} {stripped}".strip()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """Everything the guard knows about one tool.

    Frozen: what is derived from it (whether the fingerprint may wait, whether the tool runs
    on the caller's thread, its validators) is decided once and can never go stale.  To
    change a tool, register it again (``guard.tool(...)``), or build a changed copy with
    ``dataclasses.replace(spec, timeout=0.1)`` and give it to :meth:`Guard.add_spec`.
    """

    name: str
    fn: Callable[..., Any]
    description: str
    validator: ArgumentValidator
    normalizers: dict[str, tuple[Normalizer, ...]]
    alternatives: tuple[Alternative, ...] = ()
    cost: float = 0.0
    side_effect: bool = False
    postcondition: Postcondition | None = None
    timeout: float | None = None
    idempotency_key: Callable[[dict[str, Any]], str] | None = None
    check_with: str | None = None
    retry_limit: int | None = None
    error_result: ErrorDetector | None = None
    is_async: bool = False
    context_param: str | None = None
    param_docs: dict[str, str] = field(default_factory=dict)
    explicit_schema: bool = False
    #: A sync, side-effect-free tool without timeout or context: its fingerprint may wait.
    plain: bool = field(init=False, default=False)
    #: A sync tool without timeout or context: the driver calls it with ``call.kwargs`` on
    #: the caller's thread (unless the guard isolates sync tools or the deadline passed).
    direct: bool = field(init=False, default=False)
    #: The raw pydantic-core validator (raises on bad input); or None.
    fast_validate: Callable[[dict[str, Any]], dict[str, Any]] | None = field(
        init=False, default=None, repr=False)

    #: Validates arguments that are plain JSON values of the declared types, raises for
    #: others (see ``_schema._plain_schema``); or None for other tools.
    plain_validate: Callable[[dict[str, Any]], dict[str, Any]] | None = field(
        init=False, default=None, repr=False)

    #: :attr:`plain_validate` for JSON text (parses and validates in one pass); or None.
    plain_validate_json: Callable[[str], dict[str, Any]] | None = field(
        init=False, default=None, repr=False)
    #: The same twin ignoring keys it does not know: the pipeline compares counts instead
    #: of having pydantic-core check each key's name (see ``_schema._opened``).
    open_validate: Callable[[dict[str, Any]], dict[str, Any]] | None = field(
        init=False, default=None, repr=False)
    #: The parameters that take a list (copied for the tool where the guard keeps the
    #: arguments it validated).
    list_params: tuple[str, ...] = field(init=False, default=(), repr=False)

    def __post_init__(self) -> None:
        derive = object.__setattr__  # frozen: derived once, here, from the fields above
        direct = not (self.is_async or self.timeout is not None
                      or self.context_param is not None)
        plain = direct and not self.side_effect
        derive(self, "direct", direct)
        derive(self, "plain", plain)
        derive(self, "fast_validate", getattr(self.validator, "fast_validate", None))
        if plain and not self.normalizers:
            for name in ("plain_validate", "plain_validate_json", "open_validate"):
                derive(self, name, getattr(self.validator, name, None))
            derive(self, "list_params", getattr(self.validator, "list_params", ()))

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the tool's parameters (what adapters publish)."""
        return self.validator.schema

    @property
    def params(self) -> tuple[str, ...]:
        return self.validator.params


def _key_function(
    spec: Callable[[dict[str, Any]], str] | Sequence[str] | str | None, name: str
) -> Callable[[dict[str, Any]], str] | None:
    if spec is None:
        return None
    if callable(spec):
        return spec
    fields = (spec,) if isinstance(spec, str) else tuple(spec)

    def from_fields(args: dict[str, Any]) -> str:
        return name + ":" + "|".join(f"{f}={args.get(f)!r}" for f in fields)

    return from_fields


#: A tool name: 1-64 letters, digits, ``_ . -``, starting with a letter or ``_``.
_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


def _tool_name(fn: Callable[..., Any], name: str | None) -> str:
    """The name the model calls ``fn`` by (given, else the function's own), if providers
    accept it."""
    if not callable(fn):
        raise ConfigurationError(f"tool {name!r} is not callable")
    tool_name = name or getattr(fn, "__name__", None)
    if not tool_name or not _TOOL_NAME.match(tool_name):
        raise ConfigurationError(f"tool name {tool_name!r} must be 1-64 letters, digits, _ . -")
    return tool_name


def _check_declaration(tool_name: str, *, side_effect: bool,
                       postcondition: Postcondition | None, timeout: float | None,
                       cost: float) -> None:
    """Refuse options that contradict each other or could never hold, at registration
    rather than at the first call."""
    if postcondition is not None and not side_effect:
        raise ConfigurationError(f"{tool_name}: postcondition= only applies with side_effect=True")
    if timeout is not None and timeout <= 0:
        raise ConfigurationError(f"{tool_name}: timeout must be positive")
    if cost < 0:
        raise ConfigurationError(f"{tool_name}: cost must not be negative")


def _validator_for(tool_name: str, fn: Callable[..., Any], schema: Mapping[str, Any] | None,
                   ctx: set[str], param_docs: dict[str, str]) -> ArgumentValidator:
    """The given JSON Schema's validator, else one from the signature, its parameters
    described by the docstring where their hints say nothing (the model reads both)."""
    if schema is not None:
        return JsonSchemaValidator(tool_name, schema)
    validator = PydanticValidator(tool_name, fn, skip=ctx)
    props = validator.schema.get("properties", {})
    for pname, pdoc in param_docs.items():
        if pname in props and "description" not in props[pname]:
            props[pname]["description"] = pdoc
    return validator


def build_spec(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    alternatives: Sequence[str | Alternative] | Mapping[str, str],
    normalize: NormalizeSpec | None,
    schema: Mapping[str, Any] | None,
    cost: float,
    side_effect: bool,
    postcondition: Postcondition | None,
    timeout: float | None,
    idempotency_key: Callable[[dict[str, Any]], str] | Sequence[str] | str | None,
    check_with: str | None,
    retry_limit: int | None,
    error_result: ErrorDetector | None,
) -> ToolSpec:
    """Resolve a tool declaration once; raises ``ConfigurationError`` for contradictions."""
    tool_name = _tool_name(fn, name)
    _check_declaration(tool_name, side_effect=side_effect, postcondition=postcondition,
                       timeout=timeout, cost=cost)
    doc_desc, param_docs = parse_docstring(inspect.getdoc(fn))
    ctx = context_params(fn, ToolContext)
    validator = _validator_for(tool_name, fn, schema, ctx, param_docs)
    key_fn = _key_function(idempotency_key, tool_name)
    return ToolSpec(
        name=tool_name,
        fn=fn,
        description=description or doc_desc,
        validator=validator,
        normalizers=compile_normalizers(normalize),
        alternatives=alternatives_from(alternatives),
        cost=float(cost),
        side_effect=side_effect,
        postcondition=postcondition,
        timeout=timeout,
        idempotency_key=key_fn,
        check_with=check_with,
        retry_limit=retry_limit,
        error_result=error_result,
        is_async=_is_coroutine_callable(fn),
        context_param=next(iter(ctx), None),
        param_docs=param_docs,
        explicit_schema=schema is not None,
    )


def _is_coroutine_callable(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(inspect.unwrap(fn)):
        return True
    dunder = getattr(type(fn), "__call__", None)  # noqa: B004 - async callable objects
    return inspect.iscoroutinefunction(dunder)


def verdict_of(value: Any) -> Outcome | None:
    """A postcondition's answer as an ``Outcome`` (``None`` when it said nothing usable)."""
    if isinstance(value, Outcome):
        return value
    if isinstance(value, bool):
        return Outcome.APPLIED if value else Outcome.NO_EFFECT
    return None
