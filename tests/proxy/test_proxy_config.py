"""The proxy's TOML file: Limits field names mapped generically, per-tool overrides, and a
clear error for every mistake."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from toolfault import ConfigurationError, FailureClass, Limits
from toolfault.proxy import ProxyConfig, ToolConfig, load_config, parse_config


def test_no_file_means_the_guards_defaults() -> None:
    """An empty config is the guard's own Limits and the proxy's documented defaults."""
    config = parse_config({})
    assert config.limits == Limits()
    assert config.idle_turn_seconds == 300.0 and config.max_restarts == 3
    assert config.tool("anything") == ToolConfig()


def test_every_limits_field_is_accepted_by_its_own_name() -> None:
    """Each Limits field, set from TOML in its default's shape, reaches Limits unchanged."""
    defaults = Limits()
    for f in dataclasses.fields(Limits):
        value = getattr(defaults, f.name)
        if isinstance(value, frozenset):
            raw: object = sorted(value)
        elif dataclasses.is_dataclass(value):
            raw = dataclasses.asdict(value)
        elif isinstance(value, dict):
            raw = {k.value: v for k, v in value.items()}
        elif value is None:
            continue
        else:
            raw = value
        assert getattr(parse_config({"limits": {f.name: raw}}).limits, f.name) == value


def test_limits_tables_and_none_are_shaped_like_the_fields() -> None:
    """backoff and retry_limits tables merge over the defaults; "none" is None."""
    config = parse_config({"limits": {
        "retry_limit": 3, "halt_after_refusals": "none",
        "backoff": {"attempts": 5}, "retry_limits": {"transient": 4},
        "progress_exempt": ["a"]}})
    assert config.limits.retry_limit == 3 and config.limits.halt_after_refusals is None
    assert config.limits.backoff.attempts == 5
    assert config.limits.backoff.initial == Limits().backoff.initial
    assert config.limits.retry_limits[FailureClass.TRANSIENT] == 4
    assert config.limits.retry_limits[FailureClass.BAD_INPUT] == 2
    assert config.limits.progress_exempt == frozenset({"a"})


def test_tools_override_annotations_and_join_progress_exempt(tmp_path: Path) -> None:
    """[tools.NAME] settings are kept per tool; progress_exempt joins the Limits set."""
    path = tmp_path / "proxy.toml"
    path.write_text('[proxy]\nidle_turn_seconds = "none"\nmax_restarts = 0\n'
                    '[tools.write_file]\nside_effect = true\ntimeout = 30\n'
                    'idempotency_key = ["path"]\nretry_limit = 1\n'
                    '[tools.job_status]\nprogress_exempt = true\n')
    config = load_config(path)
    assert config.tool("write_file") == ToolConfig(side_effect=True, timeout=30.0,
                                                   retry_limit=1, idempotency_key=("path",))
    assert "job_status" in config.limits.progress_exempt
    assert config.idle_turn_seconds is None and config.max_restarts == 0
    assert isinstance(config, ProxyConfig)


@pytest.mark.parametrize(("data", "words"), [
    ({"limits": {"retry_limt": 2}}, "unknown key 'retry_limt' in [limits]"),
    ({"limits": {"retry_limit": 0}}, "retry_limit"),
    ({"limits": {"backoff": {"tries": 2}}}, "backoff"),
    ({"tools": {"x": {"side_efect": True}}}, "unknown key 'side_efect'"),
    ({"tools": {"x": {"timeout": -1}}}, "timeout must be a positive"),
    ({"tools": {"x": {"idempotency_key": [1]}}}, "argument names"),
    ({"proxy": {"restarts": 1}}, "unknown key 'restarts' in [proxy]"),
    ({"proxy": {"max_restarts": -1}}, "max_restarts"),
    ({"limit": {}}, "unknown section [limit]"),
])
def test_every_mistake_is_a_configuration_error_naming_it(data: dict[str, object],
                                                          words: str) -> None:
    """Typos and bad values never fall back to a default silently."""
    with pytest.raises(ConfigurationError, match=None) as caught:
        parse_config(data)
    assert words in str(caught.value)


def test_a_file_that_is_not_toml_says_so(tmp_path: Path) -> None:
    """A syntax error names the file."""
    path = tmp_path / "bad.toml"
    path.write_text("[limits\n")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        load_config(path)
