"""``toolfault proxy``: the guard in front of an MCP server the user did not write.

The upstream runs as a subprocess over stdio (or is reached over streamable HTTP); the
client talks to the proxy exactly as it would to the upstream.  Every ``tools/call`` goes
through a :class:`~toolfault.Guard` configured by the upstream's tool annotations and an
optional TOML file; everything else is relayed.  Needs ``pip install 'toolfault[proxy]'``.
"""

try:
    import mcp  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a venv without the extra
    raise ImportError("toolfault.proxy needs the MCP SDK: pip install 'toolfault[proxy]'"
                      ) from exc

from toolfault.proxy._config import ProxyConfig, ToolConfig, load_config, parse_config
from toolfault.proxy._run import HttpServing, run_proxy, serve
from toolfault.proxy._server import SEP_FAILURE_META_KEY, Proxy
from toolfault.proxy._upstream import Upstream, UpstreamGone, UpstreamSpec, UpstreamStartError

__all__ = [
    "SEP_FAILURE_META_KEY",
    "HttpServing",
    "Proxy",
    "ProxyConfig",
    "ToolConfig",
    "Upstream",
    "UpstreamGone",
    "UpstreamSpec",
    "UpstreamStartError",
    "load_config",
    "parse_config",
    "run_proxy",
    "serve",
]
