#!/usr/bin/env bash
# release.sh VERSION [OUT_DIR] writes everything a release of scopeplane
# publishes into OUT_DIR (default dist/), for version VERSION (x.y.z, no v);
# docs/release.md says what each file is and how to verify it:
#   scopeplane-VERSION.oci.tar      the multi-arch image archive (hack/image), its SBOM attached
#                                   as an OCI referrer of the image index
#   scopeplane-VERSION.cdx.json     that SBOM (CycloneDX JSON), the same bytes as in the archive
#   scopeplane-VERSION.tgz          the Helm chart, version and appVersion VERSION
#   install.yaml                    that chart rendered with its defaults, CRD included
#   kubectl-scopeplane_VERSION_OS_ARCH.tar.gz|.zip
#                                   the kubectl plugin for linux, darwin, windows × amd64, arm64
#   kubectl-scopeplane.krew.yaml    the krew manifest of those archives (hack/plugin)
#   SHA256SUMS                      the SHA-256 of each of them, for sha256sum -c
# The chart in the checkout is not edited: a copy is stamped with VERSION.
# The builds run niced, one after the other.
set -euo pipefail

version=${1:?usage: hack/release.sh VERSION [OUT_DIR]}
if ! [[ ${version} =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "release: VERSION ${version} is not a semantic version x.y.z[-pre] (without a leading v)" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(mkdir -p "${2:-${root}/dist}" && cd "${2:-${root}/dist}" && pwd)
helm=${HELM:-$("${root}/hack/helm.sh")}
# Reproducible: the image's files, the archives' entries, the SBOM's timestamp
# (and the chart's) come from the last commit unless SOURCE_DATE_EPOCH says otherwise.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "${root}" log -1 --format=%ct 2>/dev/null || echo 0)}
# RELEASE_DOWNLOAD is where the release's assets are downloaded from, for the
# krew manifest's URLs; RELEASE_PLUGIN_PLATFORMS narrows the plugin's platforms
# (a test's shortcut: a release publishes all six).
download=${RELEASE_DOWNLOAD:-https://github.com/scopeplane/scopeplane/releases/download/v${version}}
plugin_platforms=${RELEASE_PLUGIN_PLATFORMS:-linux/amd64,linux/arm64,darwin/amd64,darwin/arm64,windows/amd64,windows/arm64}
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT

echo "release ${version} into ${out}"
rm -f "${out}/scopeplane-${version}.oci.tar" "${out}/scopeplane-${version}.tgz" "${out}/install.yaml" \
  "${out}/scopeplane-${version}.cdx.json" "${out}"/kubectl-scopeplane_"${version}"_* \
  "${out}/kubectl-scopeplane.krew.yaml" "${out}/SHA256SUMS"

# The chart, stamped with the version.
cp -R "${root}/charts/scopeplane" "${work}/scopeplane"
sed -i -e "s/^version:.*/version: ${version}/" -e "s/^appVersion:.*/appVersion: \"${version}\"/" "${work}/scopeplane/Chart.yaml"
CHART="${work}/scopeplane" HELM="${helm}" "${root}/hack/dist.sh" "${out}" >/dev/null

# The image archive, and the SBOM of the image, attached to it.
(cd "${root}" && nice -n 10 go run ./hack/image -version "${version}" \
  -out "${out}/scopeplane-${version}.oci.tar" -sbom "${out}/scopeplane-${version}.cdx.json")

# The kubectl plugin's archives and their krew manifest.
(cd "${root}" && nice -n 10 go run ./hack/plugin -version "${version}" -download "${download}" \
  -platforms "${plugin_platforms}" -out "${out}")

(cd "${out}" && sha256sum "scopeplane-${version}.oci.tar" "scopeplane-${version}.cdx.json" "scopeplane-${version}.tgz" \
  install.yaml kubectl-scopeplane_"${version}"_* kubectl-scopeplane.krew.yaml > SHA256SUMS)
cat "${out}/SHA256SUMS"
