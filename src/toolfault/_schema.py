"""Validating arguments before the call, from type hints or a given JSON Schema.

Validators are built once per tool and cached, so the hot path is one pydantic (or
jsonschema) validation.  A failed validation never calls the tool; it becomes an
``invalid_argument`` naming the parameter and the expected type.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    NotRequired,
    Protocol,
    Required,
    get_args,
    get_origin,
    get_type_hints,
)

import pydantic
import pydantic_core
from pydantic import ConfigDict, TypeAdapter
from typing_extensions import TypedDict

from toolfault._fingerprint import MAX_CANONICAL_BYTES

if TYPE_CHECKING:
    import jsonschema


@dataclass(frozen=True, slots=True)
class ArgumentProblem:
    """Why one argument was rejected, in words the model can act on."""

    param: str
    kind: str  # "missing" | "unexpected" | "type" | "constraint"
    reason: str
    expected: str
    next_action: str


class ArgumentValidator(Protocol):
    """Validates and coerces a tool's arguments; returns problems instead of raising."""

    schema: dict[str, Any]
    params: tuple[str, ...]

    def validate(self, args: dict[str, Any]) -> tuple[dict[str, Any], list[ArgumentProblem]]:
        """Coerced arguments, or the problems that stop the call."""
        ...


def describe(schema: Mapping[str, Any]) -> str:
    """A JSON Schema fragment as the words a model understands: ``an integer greater than 0``."""
    choice = _choice_words(schema)
    if choice is not None:
        return choice
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(_TYPE_WORDS.get(str(k), str(k)) for k in kind)
    base = _TYPE_WORDS.get(str(kind), "a valid value") if kind else "a valid value"
    bounds = _bounds(schema)
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        base = _list_words(schema["items"], base)
    return " ".join([base, *bounds])


_TYPE_WORDS = {
    "integer": "an integer", "number": "a number", "string": "a string",
    "boolean": "true or false", "array": "a list", "object": "an object", "null": "null",
}


def _choice_words(schema: Mapping[str, Any]) -> str | None:
    """The words for a schema that lists its values (``enum``, ``const``) or its alternatives
    (``anyOf``, ``oneOf``, null left out) instead of a type; ``None`` for any other."""
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    if "const" in schema:
        return f"exactly {schema['const']!r}"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [describe(s) for s in schema[key] if s.get("type") != "null"]
            return " or ".join(parts) if parts else "null"
    return None


def _list_words(items: Mapping[str, Any], base: str) -> str:
    """``a list of integers`` when the items say something, else the plain ``base``."""
    inner = describe(items)
    return base if inner == "a valid value" else f"a list of {_plural(inner)}"


_BOUND_WORDS = (
    ("exclusiveMinimum", "greater than"), ("minimum", "at least"),
    ("exclusiveMaximum", "less than"), ("maximum", "at most"),
    ("minLength", "of at least {} characters"), ("maxLength", "of at most {} characters"),
    ("pattern", "matching {}"),
)


def _bounds(schema: Mapping[str, Any]) -> list[str]:
    """A schema's constraints in words: ``from 1 to 5``, ``greater than 0``."""
    bounds = []
    if "minimum" in schema and "maximum" in schema:
        bounds.append(f"from {schema['minimum']} to {schema['maximum']}")
        schema = {k: v for k, v in schema.items() if k not in ("minimum", "maximum")}
    for key, word in _BOUND_WORDS:
        if key in schema:
            bounds.append(word.format(schema[key]) if "{}" in word else f"{word} {schema[key]}")
    return bounds


def _plural(phrase: str) -> str:
    for article in ("an ", "a "):
        if phrase.startswith(article):
            return phrase[len(article):] + "s"
    return phrase


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's auto titles: they cost tokens in every tool definition."""
    def walk(node: Any, parent_key: str | None = None) -> Any:
        if isinstance(node, dict):
            return {
                k: walk(v, k) for k, v in node.items()
                if not (k == "title" and isinstance(v, str) and parent_key != "properties")
            }
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    cleaned: dict[str, Any] = walk(schema)
    cleaned.setdefault("type", "object")
    cleaned.setdefault("properties", {})
    return cleaned


def context_params(fn: Callable[..., Any], context_type: type) -> set[str]:
    """Parameters the guard fills in itself (annotated with the ToolContext type)."""
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception:
        hints = {}
    out = set()
    for name, hint in hints.items():
        base = get_args(hint)[0] if get_origin(hint) is Annotated else hint
        if base is context_type:
            out.add(name)
    return out


def _fields_of(fn: Callable[..., Any], sig: inspect.Signature, skip: set[str]
               ) -> tuple[dict[str, Any], bool]:
    """The TypedDict fields of a signature, and whether ``**kwargs`` allows extra keys."""
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception:
        hints = {}
    fields: dict[str, Any] = {}
    extra_allowed = False
    for name, param in sig.parameters.items():
        if name in skip or name == "self":
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra_allowed = True
            continue
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        hint = hints.get(name, Any)
        required = param.default is inspect.Parameter.empty
        fields[name] = Required[hint] if required else NotRequired[hint]
    return fields, extra_allowed


def _add_defaults(properties: dict[str, Any], sig: inspect.Signature) -> None:
    """Parameter defaults into the schema the model sees (where JSON can say them)."""
    for name, param in sig.parameters.items():
        prop = properties.get(name)
        if prop is not None and param.default is not inspect.Parameter.empty:
            try:
                prop.setdefault("default", TypeAdapter(Any).dump_python(param.default,
                                                                        mode="json"))
            except Exception:
                pass


def _number_params(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The parameters whose schema has a number anywhere (or a ``$ref`` that may hold one):
    only there can pydantic have widened an int the model sent."""
    props = schema.get("properties", {})
    return tuple(name for name, prop in props.items()
                 if '"number"' in repr(prop).replace("'", '"') or "$ref" in repr(prop))


class PydanticValidator:
    """Validator derived from a function signature (one cached pydantic TypeAdapter)."""

    __slots__ = ("_adapter", "_numbers", "_tool", "_validate", "fast_validate", "list_params",
                 "open_validate", "params", "plain_validate", "plain_validate_json", "required",
                 "schema")

    #: Validates plain arguments, refuses the rest (raises): see :func:`_plain_schema`.
    plain_validate: Callable[[dict[str, Any]], dict[str, Any]] | None
    plain_validate_json: Callable[[str], dict[str, Any]] | None
    open_validate: Callable[[dict[str, Any]], dict[str, Any]] | None
    list_params: tuple[str, ...]

    def __init__(self, tool: str, fn: Callable[..., Any], *, skip: set[str]) -> None:
        self._tool = tool
        sig = inspect.signature(fn)
        fields, extra_allowed = _fields_of(fn, sig, skip)
        factory: Any = TypedDict  # built at runtime, so mypy cannot see the keys
        typed: Any = factory(f"{tool}_arguments", fields)
        typed.__pydantic_config__ = ConfigDict(  # pydantic reads config off the TypedDict
            extra="allow" if extra_allowed else "forbid", allow_inf_nan=False
        )
        self._adapter: TypeAdapter[dict[str, Any]] = TypeAdapter(typed)
        #: pydantic-core's own entry point: raises ValidationError, skips TypeAdapter's wrapper.
        raw_validate = self._adapter.validator.validate_python
        self._validate = raw_validate
        self.schema = _clean_schema(self._adapter.json_schema())
        #: pydantic turns an int sent for a ``float`` into a float; the tool gets what was
        #: sent.  Only parameters whose schema has a number anywhere need that walk.
        numbers = _number_params(self.schema)
        self._numbers = numbers
        self.fast_validate: Callable[[dict[str, Any]], dict[str, Any]] = (
            self._validate_kept if numbers else raw_validate)
        self._set_twins(_plain_schema(self._adapter.core_schema))
        if extra_allowed:
            self.schema.pop("additionalProperties", None)
        else:
            self.schema["additionalProperties"] = False
        _add_defaults(self.schema["properties"], sig)
        self.params = tuple(fields)
        self.required = frozenset(n for n, f in fields.items() if get_origin(f) is Required)

    def _set_twins(self, plain: dict[str, Any] | None) -> None:
        """The strict twin's entry points (see :func:`_plain_schema`), all ``None`` for a tool
        whose arguments are not all plain JSON values."""
        if plain is None:
            self.plain_validate = self.plain_validate_json = self.open_validate = None
            self.list_params = ()
            return
        twin = pydantic_core.SchemaValidator(plain)
        self.plain_validate = twin.validate_python
        self.plain_validate_json = twin.validate_json
        #: The twin that drops keys it does not know instead of refusing them (a quarter
        #: faster: pydantic-core looks no key up twice).  Its caller compares counts (see
        #: ``_validated_plain`` in the pipeline): a result with fewer keys is no answer.
        #: JSON text has no count to compare with, so it goes to the strict twin.
        self.open_validate = pydantic_core.SchemaValidator(_opened(plain)).validate_python
        self.list_params = tuple(
            name for name, field in plain["fields"].items() if _holds_list(field["schema"]))

    def _validate_kept(self, args: dict[str, Any]) -> dict[str, Any]:
        """Validated arguments with the numbers the model sent (raises pydantic's
        ValidationError): see :func:`_keep_sent`."""
        validated: dict[str, Any] = self._validate(args)
        for name in self._numbers:
            value = validated.get(name)
            if value is not None and name in args:
                kept = _keep_sent(args[name], value, 1)
                if kept is not value:
                    validated[name] = kept
        return validated

    def validate(self, args: dict[str, Any]) -> tuple[dict[str, Any], list[ArgumentProblem]]:
        try:
            return self.fast_validate(args), []
        except pydantic.ValidationError as exc:
            return args, self.problems(exc)

    def problems(self, exc: pydantic_core.ValidationError) -> list[ArgumentProblem]:
        """What a validation error says, in the guard's words (one problem per error)."""
        return [self._problem(err) for err in exc.errors(include_url=False)]

    def _problem(self, err: Any) -> ArgumentProblem:
        param, where = error_place(err)
        expected = expected_words(self.schema["properties"].get(param, {}))
        kind = err.get("type", "")
        if kind == "missing":
            return ArgumentProblem(
                param, "missing", f"{where} is required ({expected})", expected,
                f"call {self._tool} again and include {param} as {expected}",
            )
        if kind == "extra_forbidden":
            valid = _names(self.params)
            return ArgumentProblem(
                param, "unexpected", f"{where} is not a parameter of {self._tool} "
                f"(parameters: {valid})", expected,
                f"call {self._tool} again without {param}",
            )
        message = str(err.get("msg", "is invalid")).split(", unable to", 1)[0]
        message = re.sub(r"^Input should", "should", message)
        message = message[0].lower() + message[1:] if message else "is invalid"
        constraint = kind in {
            "greater_than", "greater_than_equal", "less_than", "less_than_equal",
            "string_too_short", "string_too_long", "too_short", "too_long",
            "string_pattern_mismatch", "literal_error", "enum", "multiple_of",
        }
        return ArgumentProblem(
            param, "constraint" if constraint else "type", f"{where} {message}", expected,
            f"call {self._tool} again with {param} as {expected}",
        )


def error_place(err: Mapping[str, Any]) -> tuple[str, str]:
    """A pydantic error's parameter (the first step of its location) and its whole dotted
    location (``dates.0``); ``arguments`` for both when it has none."""
    loc = [str(p) for p in err.get("loc", ())]
    return (loc[0], ".".join(loc)) if loc else ("arguments", "arguments")


def expected_words(prop: Any) -> str:
    """What a parameter's schema expects, in words (``a valid value`` without a schema)."""
    return describe(prop) if isinstance(prop, Mapping) else "a valid value"


class JsonSchemaValidator:
    """Validator for a raw JSON Schema given by the user (jsonschema, checked once)."""

    __slots__ = ("_tool", "_validator", "params", "schema")

    def __init__(self, tool: str, schema: Mapping[str, Any]) -> None:
        self._tool = tool
        self.schema = dict(schema)
        import jsonschema  # only tools given a raw JSON Schema pay for importing it

        cls = jsonschema.validators.validator_for(self.schema)
        cls.check_schema(self.schema)
        self._validator = cls(self.schema)
        self.params = tuple(self.schema.get("properties", {}))

    def validate(self, args: dict[str, Any]) -> tuple[dict[str, Any], list[ArgumentProblem]]:
        problems: list[ArgumentProblem] = []
        if _has_non_finite(args):
            problems.append(ArgumentProblem(
                "arguments", "type", "arguments contain NaN or Infinity, which is not a number "
                "JSON allows", "a finite number",
                f"call {self._tool} again with finite numbers only",
            ))
            return args, problems
        errors = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
        for error in errors[:3]:
            problems.append(self._problem(error))
        return args, problems

    def _problem(self, error: jsonschema.ValidationError) -> ArgumentProblem:
        path = [str(p) for p in error.absolute_path]
        props = self.schema.get("properties", {})
        if error.validator == "required":
            match = re.match(r"'([^']+)'", error.message)
            param = match.group(1) if match else "arguments"
            expected = describe(props.get(param, {}))
            return ArgumentProblem(
                param, "missing", f"{param} is required ({expected})", expected,
                f"call {self._tool} again and include {param} as {expected}",
            )
        if error.validator == "additionalProperties":
            extra = re.findall(r"'([^']+)'", error.message)
            param = extra[0] if extra else "arguments"
            valid = _names(self.params)
            return ArgumentProblem(
                param, "unexpected",
                f"{param} is not a parameter of {self._tool} (parameters: {valid})",
                "no such parameter", f"call {self._tool} again without {param}",
            )
        param = path[0] if path else "arguments"
        where = ".".join(path) if path else "arguments"
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        expected = describe(schema)
        kind = "type" if error.validator == "type" else "constraint"
        return ArgumentProblem(
            param, kind, f"{where} must be {expected}", expected,
            f"call {self._tool} again with {param} as {expected}",
        )


#: What plain arguments may hold: characters in all their strings, items in one list
#: (their canonical text stays far below the limit).  ``_plain`` in the pipeline checks the
#: same bounds value by value where a tool has no twin.
PLAIN_CHARS = MAX_CANONICAL_BYTES // 4
PLAIN_ITEMS = 1_000
#: Ints a float holds exactly (beyond them the tool's validator makes an int a float).
_EXACT_INT = 2 ** 53
#: Bounds a number's schema may carry (they apply to an int sent for a ``float`` too).
_NUMBER_BOUNDS = frozenset({"gt", "ge", "lt", "le", "multiple_of"})


def _plain_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """A strict twin of a tool's arguments schema (pydantic-core's), accepting exactly the
    arguments that are plain JSON values of bounded size; ``None`` unless every field is a
    string, a number, a boolean, a literal, ``None`` or a list of those, extra keys are
    refused and no function of the user's validates anything.

    Where it accepts arguments, the tool's own validator accepts them too and returns the
    same values (an int sent for a ``float`` stays an int, as the tool's validator keeps
    it), so the guard validates once: strictly, before admission, instead of checking each
    value for the deferred fingerprint (``_plain`` in the pipeline) and validating after.
    The length bounds split ``PLAIN_CHARS`` between the fields; a longer value is not
    refused by the guard, only validated the usual way.  Its fields are in sorted order, and
    so are the arguments it returns.
    """
    if schema.get("type") != "typed-dict" or schema.get("extra_behavior") != "forbid":
        return None
    fields: dict[str, Any] = {}
    strings = sum(1 for f in schema.get("fields", {}).values() if _holds_text(f["schema"]))
    share = PLAIN_CHARS // max(strings, 1)
    # In sorted order: the twin returns its fields in this order, so arguments it validated
    # from JSON text are in the fingerprint's order already.
    for name, field in sorted(schema.get("fields", {}).items()):
        inner = _plain_value(field.get("schema", {}), share)
        if inner is None:
            return None
        fields[name] = {**field, "schema": inner}
    return {**schema, "fields": fields, "config": {**schema.get("config", {}), "strict": True}}


def _opened(twin: Mapping[str, Any]) -> dict[str, Any]:
    """The twin with unknown keys ignored: it returns a field for each parameter it found,
    so arguments it returns as many keys for as they have hold no other key."""
    return {**twin, "extra_behavior": "ignore",
            "config": {**twin.get("config", {}), "extra_fields_behavior": "ignore"}}


def _holds_text(schema: Mapping[str, Any]) -> bool:
    if schema.get("type") == "nullable":
        schema = schema.get("schema", {})
    if schema.get("type") == "list":
        schema = schema.get("items_schema", {})
    return schema.get("type") == "str"


def _holds_list(schema: Mapping[str, Any]) -> bool:
    if schema.get("type") == "nullable":
        schema = schema.get("schema", {})
    return schema.get("type") == "list"


def _plain_value(schema: Mapping[str, Any], share: int) -> dict[str, Any] | None:
    """One field's strict schema, bounded, or ``None`` when it is not plain JSON."""
    kind = schema.get("type")
    if kind == "nullable":
        inner = _plain_value(schema.get("schema", {}), share)
        return None if inner is None else {**schema, "schema": inner}
    if kind == "list":
        items = _plain_scalar(schema.get("items_schema", {}), share // PLAIN_ITEMS)
        if items is None:
            return None
        return {**schema, "items_schema": items,
                "max_length": min(schema.get("max_length", PLAIN_ITEMS), PLAIN_ITEMS)}
    return _plain_scalar(schema, share)


def _plain_scalar(schema: Mapping[str, Any], chars: int) -> dict[str, Any] | None:
    """One scalar's strict schema (a string bounded to ``chars``), or ``None`` when it is
    not plain JSON."""
    strict = _PLAIN_SCALARS.get(schema.get("type"))
    return None if strict is None else strict(schema, chars)


def _plain_str(schema: Mapping[str, Any], chars: int) -> dict[str, Any]:
    """A string, strict and at most ``chars`` long (its share of ``PLAIN_CHARS``)."""
    return {**schema, "strict": True, "max_length": min(schema.get("max_length", chars), chars)}


def _plain_float(schema: Mapping[str, Any], chars: int) -> dict[str, Any] | None:
    """A float that takes an int as it was sent, within the same bounds; ``None`` when the
    schema says more than bounds."""
    if not set(schema) <= _NUMBER_BOUNDS | {"type", "metadata", "strict"}:
        return None
    # An int is taken as it was sent, within the same bounds (the tool's validator keeps
    # an int a float holds exactly: see _keep_sent).  Numbers beyond 2**53, where that
    # depends on the int, are left to the usual validation.
    bounds = {k: v for k, v in schema.items() if k in _NUMBER_BOUNDS}
    exact_int = {"type": "int", "strict": True, **bounds,
                 "ge": max(bounds.get("ge", -_EXACT_INT), -_EXACT_INT),
                 "le": min(bounds.get("le", _EXACT_INT), _EXACT_INT)}
    # (strictly within: a bigger int sent here would be rounded to 2**53 first)
    number = {**schema, "strict": True, "gt": max(bounds.get("gt", -_EXACT_INT), -_EXACT_INT),
              "lt": min(bounds.get("lt", _EXACT_INT), _EXACT_INT)}
    # A strict float still takes a Decimal from Python (pydantic-core 2.50): only a float is.
    a_float = {"type": "json-or-python", "json_schema": number, "python_schema": {
        "type": "chain", "steps": [{"type": "is-instance", "cls": float}, number]}}
    return {"type": "union", "mode": "left_to_right", "choices": [exact_int, a_float]}


def _plain_strict(schema: Mapping[str, Any], chars: int) -> dict[str, Any]:
    """An int or a bool, strict: no ``"3"`` for 3, no 1 for true."""
    return {**schema, "strict": True}


def _plain_none(schema: Mapping[str, Any], chars: int) -> dict[str, Any]:
    """``None`` only: nothing to tighten."""
    return dict(schema)


def _plain_literal(schema: Mapping[str, Any], chars: int) -> dict[str, Any] | None:
    """A literal of JSON scalars (not of enum members or other objects), as it is."""
    if all(type(v) in (str, int, bool, type(None)) for v in schema.get("expected", ())):
        return dict(schema)
    return None


#: The strict schema of each plain scalar type, by its pydantic-core ``type``.
_PLAIN_SCALARS: dict[Any, Callable[[Mapping[str, Any], int], dict[str, Any] | None]] = {
    "str": _plain_str, "float": _plain_float, "int": _plain_strict, "bool": _plain_strict,
    "none": _plain_none, "literal": _plain_literal,
}


def _keep_sent(sent: Any, validated: Any, depth: int = 0) -> Any:
    """The value the model sent wherever pydantic only widened it (an int for a ``float``).

    An int already satisfies a ``float`` annotation, so the tool receives the int, as a plain
    call would pass it; everything else pydantic produced (models, parsed dates) is kept.
    """
    kind = type(validated)
    if kind is float:
        return sent if type(sent) is int and sent == validated else validated
    if depth > 32:
        return validated
    if kind is dict and type(sent) is dict:
        return _keep_sent_dict(sent, validated, depth)
    if _item_for_item(sent, validated, kind):
        return _keep_sent_items(sent, validated, depth)
    return validated


def _item_for_item(sent: Any, validated: Any, kind: type) -> bool:
    """Whether ``validated`` is a list or tuple made from ``sent`` item by item (a tuple may
    have been sent as a list; a list only as a list)."""
    return kind in (list, tuple) and isinstance(sent, (list, tuple)) \
        and len(sent) == len(validated) and (kind is tuple or type(sent) is list)


def _keep_sent_items(sent: list[Any] | tuple[Any, ...],
                     validated: list[Any] | tuple[Any, ...], depth: int) -> Any:
    """:func:`_keep_sent` item by item; the validated list itself when no item changed."""
    items = [_keep_sent(a, b, depth + 1) for a, b in zip(sent, validated, strict=True)]
    if type(validated) is tuple:
        return tuple(items)
    return validated if all(x is y for x, y in zip(items, validated, strict=True)) else items


def _keep_sent_dict(sent: dict[str, Any], validated: dict[str, Any], depth: int) -> Any:
    changed = None
    for key, value in validated.items():
        if key in sent:
            kept = _keep_sent(sent[key], value, depth + 1)
            if kept is not value:
                if changed is None:
                    changed = dict(validated)
                changed[key] = kept
    return validated if changed is None else changed


def _names(params: tuple[str, ...], limit: int = 6) -> str:
    """Parameter names for a message, bounded so a wide tool keeps the message short."""
    if not params:
        return "none"
    shown = ", ".join(params[:limit])
    return shown + (f", … ({len(params)} in all)" if len(params) > limit else "")


def _has_non_finite(value: Any, depth: int = 0) -> bool:
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if depth > 200:
        return False
    if isinstance(value, Mapping):
        return any(_has_non_finite(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v, depth + 1) for v in value)
    return False
