#!/usr/bin/env bash
# The helm binary the chart's checks use (helm/svc; docs/deploy.md, tests/test_helm.py).
#
#   scripts/dev-helm.sh install   build helm from its Go module when the pinned version is missing
#   scripts/dev-helm.sh path      print the binary's path (exit 1 when not installed)
#   scripts/dev-helm.sh version   print the pinned version
#
# helm is built with `go install helm.sh/helm/v3/cmd/helm@VERSION` (the Go module proxy serves
# helm's source; no prebuilt binary is downloaded). Everything lives under ~/.cache, so CI and
# later runs reuse the build:
#   SVC_HELM_DIR   where the binary goes    (default $HOME/.cache/svc-helm/VERSION/bin)
#   GOPATH         Go's module and build dirs (default $HOME/.cache/svc-helm/gopath)
#   GOMODCACHE     downloaded modules         (default $GOPATH/pkg/mod)
#   GOCACHE        compiled packages          (default $HOME/.cache/svc-helm/gocache)
# Building needs the Go toolchain (go 1.24 or later) on PATH or in /usr/local/go/bin.
set -euo pipefail

VERSION=v3.22.0
CACHE="${HOME:-/tmp}/.cache/svc-helm"
BIN_DIR="${SVC_HELM_DIR:-$CACHE/$VERSION/bin}"
HELM="$BIN_DIR/helm"

die() { echo "dev-helm: $*" >&2; exit 1; }

find_go() {
    if command -v go >/dev/null; then command -v go; return 0; fi
    if [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go; return 0; fi
    return 1
}

installed() { [[ -x "$HELM" ]] && "$HELM" version --short 2>/dev/null | grep -q "^$VERSION" && [[ -f "$HELM.k8s" ]]; }

install() {
    if installed; then return 0; fi
    local go
    go="$(find_go)" || die "the Go toolchain is missing (https://go.dev/doc/install); helm is built from its module"
    mkdir -p "$BIN_DIR"
    export GOPATH="${GOPATH:-$CACHE/gopath}"
    export GOMODCACHE="${GOMODCACHE:-$GOPATH/pkg/mod}"
    export GOCACHE="${GOCACHE:-$CACHE/gocache}"
    export GOFLAGS="${GOFLAGS:-} -modcacherw"
    echo "dev-helm: building helm $VERSION with $("$go" version) (a few minutes the first time)" >&2
    # The Kubernetes version helm assumes without a cluster (`helm template`, `helm lint`, a
    # chart's kubeVersion) is the one of the client-go it is built with; helm's Makefile passes
    # it as ldflags, read here from helm's go.mod as its Makefile does.
    local gomod client_go k8s_minor
    gomod="$("$go" mod download -json "helm.sh/helm/v3@$VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    [[ -f "$gomod" ]] || die "cannot read helm $VERSION's go.mod from the module proxy"
    client_go="$(awk '$1 == "k8s.io/client-go" { print $2 }' "$gomod")"
    k8s_minor="$(echo "$client_go" | sed -n 's/^v0\.\([0-9]*\)\..*/\1/p')"
    [[ -n "$k8s_minor" ]] || die "no k8s.io/client-go version in $gomod"
    local x="-X helm.sh/helm/v3"
    # -trimpath and the ldflags as helm's own Makefile sets them, so `helm version` names it.
    GOBIN="$BIN_DIR" CGO_ENABLED=0 "$go" install -trimpath \
        -ldflags "-s -w $x/internal/version.version=$VERSION \
            $x/pkg/lint/rules.k8sVersionMajor=1 $x/pkg/lint/rules.k8sVersionMinor=$k8s_minor \
            $x/pkg/chartutil.k8sVersionMajor=1 $x/pkg/chartutil.k8sVersionMinor=$k8s_minor" \
        "helm.sh/helm/v3/cmd/helm@$VERSION"
    echo "1.$k8s_minor" > "$HELM.k8s"
    installed || die "built $HELM but \`helm version\` does not report $VERSION"
}

case "${1:-}" in
    install) install; echo "$HELM" ;;
    path) installed || exit 1; echo "$HELM" ;;
    version) echo "$VERSION" ;;
    *) echo "usage: $0 install|path|version" >&2; exit 2 ;;
esac
