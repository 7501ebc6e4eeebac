"""`import toolfault` stays light: heavy packages load only where they are used."""

from __future__ import annotations

import json
import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=60)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_import_does_not_load_jsonschema_rich_otel_or_a_tokenizer() -> None:
    """The core import leaves out jsonschema, rich, OpenTelemetry and the exact tokenizers."""
    loaded = _modules_after("import toolfault")
    for heavy in ("jsonschema", "rich", "bpe_openai", "tiktoken", "opentelemetry",
                  "opentelemetry.sdk"):
        assert heavy not in loaded, heavy


def test_calls_and_traces_without_a_provider_never_import_opentelemetry() -> None:
    """An application that installed no tracer provider never loads OpenTelemetry at all."""
    loaded = _modules_after(
        "import io, toolfault\n"
        "g = toolfault.Guard(scan_env_secrets=False, tokenizer='estimate', trace=io.StringIO())\n"
        "def f(n: int) -> int:\n"
        "    return 1 // n\n"
        "g.tool(f)\n"
        "assert g.call('f', {'n': 1}).ok and not g.call('f', {'n': 0}).ok\n"
    )
    assert not any(m.startswith("opentelemetry") for m in loaded)


def test_the_command_line_parser_loads_no_rich() -> None:
    """``toolfault --help`` parses arguments without loading rich (each verb loads its own)."""
    loaded = _modules_after("import toolfault._main, toolfault_cli")
    assert "rich" not in loaded and "toolfault_cli.bench" not in loaded


def test_the_library_never_imports_the_command_line() -> None:
    """``import toolfault`` (and the stub's module) leave the command line out: the library
    does not depend on ``toolfault_cli``; only running the ``toolfault`` command loads it."""
    loaded = _modules_after("import toolfault, toolfault._main, toolfault._proxy_cli")
    assert not [m for m in loaded if m.split(".")[0] == "toolfault_cli"]


def test_import_does_not_load_tenacity() -> None:
    """The pipeline's own retry loop needs no tenacity: the core import does not load it."""
    assert "tenacity" not in _modules_after("import toolfault")


def test_a_raw_json_schema_tool_loads_jsonschema_when_registered() -> None:
    """Giving a raw JSON Schema is what brings jsonschema in, and it validates."""
    loaded = _modules_after(
        "import toolfault\n"
        "g = toolfault.Guard(scan_env_secrets=False)\n"
        "g.tool(name='f', schema={'type': 'object', 'properties': {'n': {'type': 'integer'}},"
        " 'required': ['n']})(lambda n: n)\n"
        "assert g.call('f', {'n': 'x'}).code == 'invalid_argument'\n"
    )
    assert "jsonschema" in loaded


def test_a_first_failure_imports_no_tokenizer() -> None:
    """Whatever counter the guard chose at construction, its first failure imports nothing."""
    code = (
        "import toolfault\n"
        "g = toolfault.Guard(scan_env_secrets=False)\n"
        "@g.tool\n"
        "def f(n: int) -> int:\n"
        "    raise ValueError('n is wrong')\n"
        "before = set(sys.modules)\n"
        "assert g.call('f', {'n': 1}).code\n"
        "assert not [m for m in set(sys.modules) - before if 'bpe' in m or 'tiktoken' in m]\n"
    )
    _modules_after(code)


def test_an_estimating_guard_never_loads_a_vocabulary() -> None:
    """tokenizer='estimate' keeps the vocabulary out of the process entirely."""
    loaded = _modules_after(
        "import toolfault\n"
        "g = toolfault.Guard(scan_env_secrets=False, tokenizer='estimate')\n"
        "@g.tool\n"
        "def f(n: int) -> int:\n"
        "    raise ValueError('n is wrong')\n"
        "assert g.call('f', {'n': 1}).code\n"
    )
    assert "bpe_openai" not in loaded and "tiktoken" not in loaded


def test_an_exact_tokenizer_is_loaded_at_construction() -> None:
    """tokenizer='exact' loads the vocabulary when the guard is built, not at a failure."""
    loaded = _modules_after(
        "import toolfault\n"
        "g = toolfault.Guard(scan_env_secrets=False, tokenizer='exact')\n"
        "assert 'bpe_openai' in sys.modules or 'tiktoken' in sys.modules\n"
    )
    assert "bpe_openai" in loaded or "tiktoken" in loaded


def test_import_loads_no_asyncio_toml_or_email_and_a_sync_failure_no_asyncio() -> None:
    """asyncio comes with the first ``acall``, the catalog's TOML with the first ``Guard()``,
    ``email.utils`` with a Retry-After date, ``tempfile`` (and the compressors ``shutil``
    brings) with the exact tokenizer's cache: ``import toolfault`` loads none of them."""
    at_import = _modules_after("import toolfault")
    assert not {"asyncio", "tomllib", "email.utils", "tempfile",
                "lzma"} & at_import
    code = (
        "from toolfault import Guard\n"
        "guard = Guard(scan_env_secrets=False)\n"
        "def add(a: int) -> int:\n"
        "    '''Add one. Use it to count.'''\n"
        "    raise ValueError('no')\n"
        "guard.tool(add)\n"
        "assert guard.call('add', {'a': 'x'}).code == 'invalid_argument'\n"
        "assert guard.call('add', {'a': 1}).ok is False\n"
    )
    after_sync = _modules_after(code)
    assert "asyncio" not in after_sync and "tomllib" in after_sync
    after_async = _modules_after(
        code + "import asyncio\nassert asyncio.run(guard.acall('add', {'a': 'y'})).code == "
               "'invalid_argument'\n")
    assert "toolfault._async_driver" in after_async
