#!/usr/bin/env bash
# dist.sh OUT_DIR writes the release's install artifacts into OUT_DIR: the
# packaged Helm chart (scopeplane-<version>.tgz) and install.yaml, the chart
# rendered with its default values into namespace scopeplane-system, the CRD
# (a template of the chart, so that it upgrades with it) and the Namespace
# included, for `kubectl apply --server-side -f install.yaml`.
# The image archive is `make image`.
set -euo pipefail

out=${1:?usage: hack/dist.sh OUT_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
helm=${HELM:-$("${root}/hack/helm.sh")}
# CHART overrides the chart (make release passes a copy stamped with its version).
chart=${CHART:-"${root}/charts/scopeplane"}
version=$(awk '/^version:/ { print $2; exit }' "${chart}/Chart.yaml")
ns=scopeplane-system

mkdir -p "${out}"
# Helm keeps no state for package and template, but give it a home of its own.
home=$(mktemp -d)
trap 'rm -rf "${home}"' EXIT
export HELM_CONFIG_HOME="${home}/config" HELM_CACHE_HOME="${home}/cache" HELM_DATA_HOME="${home}/data"

"${helm}" package "${chart}" --destination "${out}" >/dev/null
{
  cat <<YAML
# scopeplane ${version}: kubectl apply --server-side -f install.yaml
# (the Helm chart rendered with its default values; helm install gives you values and upgrades).
apiVersion: v1
kind: Namespace
metadata:
  name: ${ns}
  labels:
    pod-security.kubernetes.io/enforce: restricted
YAML
  "${helm}" template scopeplane "${chart}" --namespace "${ns}"
} > "${out}/install.yaml"
echo "${out}/scopeplane-${version}.tgz"
echo "${out}/install.yaml"
