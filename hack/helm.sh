#!/usr/bin/env bash
# helm.sh prints the path of the pinned Helm CLI that lints, renders and tests
# charts/scopeplane. Helm is not installed and cannot be downloaded where
# scopeplane is developed, so it builds it once from the module pinned in
# hack/tools/helm through the Go module proxy (the same way hack/envtest.sh
# builds kube-apiserver and etcd) and caches it outside the checkout, keyed by
# version, so that every clone on the machine reuses it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mod="${here}/tools/helm"
version_of() { awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"; }
helm=$(version_of "${mod}/go.mod" helm.sh/helm/v3)
client_go=$(version_of "${mod}/go.mod" k8s.io/client-go)
cache=${SCOPEPLANE_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/scopeplane}
bin="${cache}/bin/helm-${helm}"

if [[ ! -x "${bin}" ]]; then
  echo "helm: building ${helm} from hack/tools/helm (cold: a few minutes on 2 cores)" >&2
  # The same link-time variables as Helm's own Makefile: the version that
  # `helm version` reports, and the Kubernetes version (from the client-go
  # Helm is built with, v0.X.Y -> v1.X) that `helm template` and `helm lint`
  # assume as .Capabilities.KubeVersion and check deprecations against.
  minor=$(cut -d. -f2 <<<"${client_go}")
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${helm}"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${minor}"
  done
  mkdir -p "${cache}/bin"
  tmp=$(mktemp "${cache}/bin/.helm.XXXXXX")
  trap 'rm -f "${tmp}"' EXIT
  (cd "${mod}" && CGO_ENABLED=0 go build -trimpath -ldflags="${ldflags}" -o "${tmp}" helm.sh/helm/v3/cmd/helm)
  mv "${tmp}" "${bin}"
  trap - EXIT
fi
echo "${bin}"
