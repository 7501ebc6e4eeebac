"""An adapter imported without its framework says which extra to install (in a fresh process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from toolfault.adapters._extras import missing_extra

#: Imports the adapter with its framework's packages hidden; prints what happened.
PROBE = textwrap.dedent("""
    import importlib, importlib.abc, sys
    hidden = sys.argv[2].split(",")

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == h or name.startswith(h + ".") for h in hidden):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Hide())
    for name in list(sys.modules):
        if any(name == h or name.startswith(h + ".") for h in hidden):
            del sys.modules[name]
    try:
        module = importlib.import_module(sys.argv[1])
    except ModuleNotFoundError as exc:
        print("missing:", exc)
    else:
        print("imported")
        exec(sys.argv[3] if len(sys.argv) > 3 else "", {"module": module})
""")

ADAPTERS = [  # (adapter module, packages its extra installs, the extra)
    ("agents", "agents", "agents"),
    ("langchain", "langchain_core,langgraph,langchain", "langchain"),
    ("mcp", "mcp,mcp_types", "mcp"),
    ("pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ("adk", "google.adk,google.genai", "adk"),
]


def _probe(module: str, hidden: str, then: str = "") -> str:
    proc = subprocess.run([sys.executable, "-c", PROBE, module, hidden, then],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize(("adapter", "hidden", "extra"), ADAPTERS, ids=[a[0] for a in ADAPTERS])
def test_an_adapter_without_its_framework_names_the_extra(
        adapter: str, hidden: str, extra: str) -> None:
    """Importing the adapter fails with a ModuleNotFoundError naming the pip command."""
    out = _probe(f"toolfault.adapters.{adapter}", hidden)
    assert out.startswith(f"missing: toolfault.adapters.{adapter} needs "), out
    assert out.endswith(f"pip install 'toolfault[{extra}]'"), out


@pytest.mark.parametrize(("adapter", "hidden"), [("openai", "openai"),
                                                 ("anthropic", "anthropic")])
def test_the_loop_adapters_need_no_sdk(adapter: str, hidden: str) -> None:
    """The OpenAI and Anthropic adapters read dicts as well as SDK objects: no SDK needed."""
    out = _probe(f"toolfault.adapters.{adapter}", hidden, "import toolfault")
    assert out == "imported"


def test_toolfault_itself_imports_no_framework() -> None:
    """``import toolfault`` works with every framework hidden."""
    hidden = ",".join(h for _, hs, _ in ADAPTERS for h in hs.split(",")) + ",openai,anthropic"
    assert _probe("toolfault", hidden) == "imported"


def test_a_module_missing_inside_a_framework_keeps_its_own_error() -> None:
    """Only the framework's own packages get the extra's message; anything else is re-raised."""
    inner = ModuleNotFoundError("No module named 'httpx'", name="httpx")
    with pytest.raises(ModuleNotFoundError) as caught:
        missing_extra(inner, "pydantic_ai", "pydantic-ai", "pydantic_ai")
    assert caught.value is inner
    namespace = ModuleNotFoundError("No module named 'google'", name="google")
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'toolfault\[adk\]'") as named:
        missing_extra(namespace, "adk", "adk", "google.adk")
    assert named.value.name == "google"
    assert named.value.__cause__ is namespace
