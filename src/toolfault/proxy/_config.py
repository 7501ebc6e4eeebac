"""The proxy's TOML file: guard limits, per-tool overrides and the proxy's own settings.

``[limits]`` keys are :class:`~toolfault.Limits` field names, mapped generically (a field the
guard gains later works without a change here); an unknown key is a configuration error that
names the known ones, so a typo never silently leaves a limit at its default.  A key set to the
string ``"none"`` is ``None`` (TOML has no null)::

    [proxy]
    idle_turn_seconds = 300   # a gap this long between calls starts a new turn
    max_restarts = 3          # upstream restarts before calls are refused for good
    deadline = 120            # seconds one call may take, retries included

    [limits]
    retry_limit = 2
    halt_after_terminal = "none"
    backoff = { attempts = 3, initial = 0.2 }
    retry_limits = { transient = 3 }

    [tools.write_file]
    side_effect = true
    timeout = 30

    [tools.send_invoice]
    idempotency_key = ["invoice_id"]   # Stripe's meaning: one invoice_id, one action

    [tools.job_status]
    progress_exempt = true
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolfault._errors import ConfigurationError
from toolfault._limits import Limits

__all__ = ["ProxyConfig", "ToolConfig", "load_config", "parse_config"]

_TOOL_KEYS = frozenset({"side_effect", "timeout", "retry_limit", "idempotency_key",
                        "progress_exempt"})


@dataclass(frozen=True, slots=True)
class ToolConfig:
    """What the user says about one upstream tool, over what its annotations say.

    ``side_effect=None`` keeps the annotations' verdict; ``idempotency_key`` names the
    arguments that identify one logical action, with Stripe's meaning: after a success the
    same key is answered from the ledger (a replay), never run again, and the same key with
    other arguments is an ``idempotency_conflict``.
    """

    side_effect: bool | None = None
    timeout: float | None = None
    retry_limit: int | None = None
    idempotency_key: tuple[str, ...] | None = None
    progress_exempt: bool = False


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """Everything ``toolfault proxy`` can be told, with the defaults a user who writes no file
    gets."""

    limits: Limits = field(default_factory=Limits)
    tools: Mapping[str, ToolConfig] = field(default_factory=dict)
    #: Seconds without a call after which the next call starts a new turn (``None``: never).
    idle_turn_seconds: float | None = 300.0
    #: Times the upstream may be restarted after it died; each restart is an incident.
    max_restarts: int = 3
    #: Seconds one guarded call may take, in-proxy retries and backoff included.
    deadline: float = 120.0
    #: Also send the failure fields under the SEP draft's ``_meta`` key (a namespace MCP
    #: reserves: off until the SEP is accepted).
    sep_failure_meta: bool = False

    def tool(self, name: str) -> ToolConfig:
        """The overrides for ``name`` (none configured: all defaults)."""
        return self.tools.get(name) or ToolConfig()


def load_config(path: str | Path) -> ProxyConfig:
    """Read a proxy TOML file; every mistake is a :class:`ConfigurationError` naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}") from None
    return parse_config(data, source=str(path))


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> ProxyConfig:
    """A :class:`ProxyConfig` from parsed TOML (``[proxy]``, ``[limits]``, ``[tools.NAME]``)."""
    unknown = set(data) - {"proxy", "limits", "tools"}
    if unknown:
        raise ConfigurationError(f"{source}: unknown section [{sorted(unknown)[0]}] (known: "
                                 "[proxy], [limits], [tools.NAME])")
    tools = {name: _tool(name, row, source) for name, row in _table(data, "tools", source).items()}
    limits = _limits(_table(data, "limits", source), source)
    exempt = frozenset(name for name, tool in tools.items() if tool.progress_exempt)
    if exempt:
        limits = dataclasses.replace(limits, progress_exempt=limits.progress_exempt | exempt)
    settings = _table(data, "proxy", source)
    known = {f.name for f in dataclasses.fields(ProxyConfig)} - {"limits", "tools"}
    bad = set(settings) - known
    if bad:
        raise ConfigurationError(f"{source}: unknown key {sorted(bad)[0]!r} in [proxy] "
                                 f"(known: {', '.join(sorted(known))})")
    values = {key: _none(value) for key, value in settings.items()}
    config = ProxyConfig(limits=limits, tools=tools, **values)
    _check(config, source)
    return config


def _table(data: Mapping[str, Any], key: str, source: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigurationError(f"{source}: [{key}] must be a table")
    return value


def _none(value: Any) -> Any:
    """TOML has no null: the string ``"none"`` stands for ``None``."""
    return None if isinstance(value, str) and value.lower() == "none" else value


def _limits(table: Mapping[str, Any], source: str) -> Limits:
    """``Limits`` from its field names, each value shaped like the field's default."""
    defaults = Limits()
    names = {f.name for f in dataclasses.fields(Limits)}
    values: dict[str, Any] = {}
    for key, raw in table.items():
        if key not in names:
            raise ConfigurationError(f"{source}: unknown key {key!r} in [limits] "
                                     f"(Limits fields: {', '.join(sorted(names))})")
        values[key] = _like(getattr(defaults, key), _none(raw), f"{source}: [limits] {key}")
    try:
        return Limits(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{source}: [limits]: {exc}") from None


def _like(default: Any, value: Any, where: str) -> Any:
    """``value`` (a TOML value) in the shape of ``default`` (a field's default value)."""
    if value is None:
        return None
    try:
        if isinstance(default, (frozenset, set)):
            return frozenset(value)
        if isinstance(default, tuple) and isinstance(value, list):
            return tuple(value)
        if dataclasses.is_dataclass(default) and isinstance(value, dict):
            return dataclasses.replace(default, **value)  # type: ignore[type-var]
        if isinstance(default, Mapping) and isinstance(value, dict):
            key_type = type(next(iter(default))) if default else str
            return {**default, **{key_type(k): v for k, v in value.items()}}
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    return value


def _tool(name: str, row: Any, source: str) -> ToolConfig:
    where = f"{source}: [tools.{name}]"
    if not isinstance(row, dict):
        raise ConfigurationError(f"{where} must be a table")
    bad = set(row) - _TOOL_KEYS
    if bad:
        raise ConfigurationError(f"{where}: unknown key {sorted(bad)[0]!r} "
                                 f"(known: {', '.join(sorted(_TOOL_KEYS))})")
    timeout = _positive_seconds(_none(row.get("timeout")), f"{where}: timeout")
    return ToolConfig(side_effect=_flag(row.get("side_effect"), f"{where}: side_effect"),
                      timeout=timeout,
                      retry_limit=_at_least_one(row.get("retry_limit"), f"{where}: retry_limit"),
                      progress_exempt=bool(_flag(row.get("progress_exempt", False),
                                                 f"{where}: progress_exempt")),
                      idempotency_key=_argument_names(row.get("idempotency_key"),
                                                      f"{where}: idempotency_key"))


def _flag(value: Any, what: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(f"{what} must be true or false")
    return value


def _positive_seconds(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigurationError(f"{what} must be a positive number of seconds")
    return float(value)


def _at_least_one(value: Any, what: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ConfigurationError(f"{what} must be a whole number of at least 1")
    return value


def _argument_names(value: Any, what: str) -> tuple[str, ...] | None:
    if isinstance(value, str):
        value = [value]
    if value is None:
        return None
    if not (isinstance(value, list) and all(isinstance(k, str) for k in value)):
        raise ConfigurationError(f"{what} must be argument names")
    return tuple(value)


def _check(config: ProxyConfig, source: str) -> None:
    idle = config.idle_turn_seconds
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float))
                             or idle <= 0):
        raise ConfigurationError(f"{source}: [proxy] idle_turn_seconds must be positive or "
                                 "\"none\"")
    if isinstance(config.max_restarts, bool) or not isinstance(config.max_restarts, int) \
            or config.max_restarts < 0:
        raise ConfigurationError(f"{source}: [proxy] max_restarts must be a whole number >= 0")
    if isinstance(config.deadline, bool) or not isinstance(config.deadline, (int, float)) \
            or config.deadline <= 0:
        raise ConfigurationError(f"{source}: [proxy] deadline must be a positive number")
    if not isinstance(config.sep_failure_meta, bool):
        raise ConfigurationError(f"{source}: [proxy] sep_failure_meta must be true or false")
