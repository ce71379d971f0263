#!/usr/bin/env bash
# Installs what benches/load/run.py needs, idempotently, from Debian and npm only:
#   * wrk (Debian)            HTTP/1.1 load, closed loop, Lua POST script
#   * h2load (nghttp2-client) gRPC (h2c) load, and constant-rate runs (--rps) for latency
#   * cerbos (npm @cerbos/cerbos-linux-x64) the peer PDP, unpacked into a cache dir
#   * vegeta, ghz (Go module proxy, `go install`)  open-loop HTTP and gRPC load at a constant,
#     evenly spaced rate, for the latency-at-half-rate runs (skipped when Go is missing)
# The cerbos binary lives in $SVC_BENCH_CACHE (default ~/.cache/svc-bench), never in the repo.
# Usage: bash benches/load/setup.sh   (prints the path of the cerbos binary on its last line)
set -euo pipefail

CACHE="${SVC_BENCH_CACHE:-$HOME/.cache/svc-bench}"
CERBOS_VERSION="${CERBOS_VERSION:-0.55.0}"   # the npm package's version = cerbos's release

need_apt=()
command -v wrk >/dev/null || need_apt+=(wrk)
command -v h2load >/dev/null || need_apt+=(nghttp2-client)
command -v taskset >/dev/null || need_apt+=(util-linux)
if ((${#need_apt[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

bin="$CACHE/node_modules/@cerbos/cerbos-linux-x64/cerbos-linux-x64"
if [ ! -x "$bin" ] || ! "$bin" --version 2>/dev/null | grep -q "$CERBOS_VERSION"; then
  command -v npm >/dev/null || { echo "setup: npm is needed to fetch cerbos" >&2; exit 1; }
  mkdir -p "$CACHE"
  npm install --prefix "$CACHE" --no-save --no-audit --no-fund --silent \
    "@cerbos/cerbos-linux-x64@$CERBOS_VERSION" >/dev/null
  chmod +x "$bin"
fi

VEGETA_VERSION="${VEGETA_VERSION:-v12.12.0}"
GHZ_VERSION="${GHZ_VERSION:-v0.121.0}"
if command -v go >/dev/null; then
  export GOPATH="$CACHE/go" GOBIN="$CACHE/bin"
  [ -x "$GOBIN/vegeta" ] || go install "github.com/tsenart/vegeta/v12@$VEGETA_VERSION"
  [ -x "$GOBIN/ghz" ] || go install "github.com/bojand/ghz/cmd/ghz@$GHZ_VERSION"
  echo "vegeta: $("$GOBIN/vegeta" -version 2>&1 | head -1)"
  echo "ghz:    $("$GOBIN/ghz" --version 2>&1 | head -1)"
else
  echo "setup: no Go toolchain; the open-loop latency runs (vegeta, ghz) will be skipped" >&2
fi

echo "wrk:    $(command -v wrk) ($(wrk -v 2>&1 | head -1 | cut -c1-40))"
echo "h2load: $(command -v h2load) ($(h2load --version 2>&1 | head -1))"
echo "cerbos: $("$bin" --version 2>&1 | head -1)"
echo "$bin"
