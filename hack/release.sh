#!/usr/bin/env bash
# release.sh VERSION [OUT_DIR] writes everything a release of scopeplane
# publishes into OUT_DIR (default dist/), for version VERSION (x.y.z, no v):
#   scopeplane-VERSION.oci.tar   the multi-arch image archive (hack/image)
#   scopeplane-VERSION.tgz       the Helm chart, version and appVersion VERSION
#   install.yaml                 that chart rendered with its defaults, CRD included
#   scopeplane-VERSION.cdx.json  a CycloneDX SBOM of the binary (hack/sbom)
#   SHA256SUMS                   the SHA-256 of each of them
# The chart in the checkout is not edited: a copy is stamped with VERSION.
set -euo pipefail

version=${1:?usage: hack/release.sh VERSION [OUT_DIR]}
if ! [[ ${version} =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "release: VERSION ${version} is not a semantic version x.y.z[-pre] (without a leading v)" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(mkdir -p "${2:-${root}/dist}" && cd "${2:-${root}/dist}" && pwd)
helm=${HELM:-$("${root}/hack/helm.sh")}
# Reproducible: the image's files, the SBOM's timestamp (and the chart's) come
# from the last commit unless SOURCE_DATE_EPOCH says otherwise.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "${root}" log -1 --format=%ct 2>/dev/null || echo 0)}
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT

echo "release ${version} into ${out}"
rm -f "${out}/scopeplane-${version}.oci.tar" "${out}/scopeplane-${version}.tgz" "${out}/install.yaml" \
  "${out}/scopeplane-${version}.cdx.json" "${out}/SHA256SUMS"

# The chart, stamped with the version.
cp -R "${root}/charts/scopeplane" "${work}/scopeplane"
sed -i -e "s/^version:.*/version: ${version}/" -e "s/^appVersion:.*/appVersion: \"${version}\"/" "${work}/scopeplane/Chart.yaml"
CHART="${work}/scopeplane" HELM="${helm}" "${root}/hack/dist.sh" "${out}" >/dev/null

# The SBOM of the binary, built as the image builds it.
mkdir -p "${work}/bin"
(cd "${root}" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "-s -w -X main.version=${version}" -o "${work}/bin/scopeplane" .)
(cd "${root}" && go run ./hack/sbom -binary "${work}/bin/scopeplane" -version "v${version}" -modroot "${root}" -out "${out}/scopeplane-${version}.cdx.json")

# The image archive.
(cd "${root}" && go run ./hack/image -version "${version}" -out "${out}/scopeplane-${version}.oci.tar")

(cd "${out}" && sha256sum "scopeplane-${version}.oci.tar" "scopeplane-${version}.tgz" install.yaml "scopeplane-${version}.cdx.json" > SHA256SUMS)
cat "${out}/SHA256SUMS"
