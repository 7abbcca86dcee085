#!/usr/bin/env bash
# envtest.sh prints a directory holding kube-apiserver and etcd, for
# KUBEBUILDER_ASSETS. No prebuilt envtest binaries can be downloaded here, so
# it builds them once from the pinned modules in hack/tools/{apiserver,etcd}
# through the Go module proxy and caches them outside the checkout, keyed by
# version, so that every clone on the machine reuses them. An existing
# KUBEBUILDER_ASSETS that holds both binaries is honoured as it is.
#
# Clones build and test at once, so the cached directory, once complete, is
# never replaced or removed: tests of one clone may be starting a
# kube-apiserver from it while another clone's build ends. A build goes into
# a directory of its own and is renamed into place in one step (rename(2),
# `mv -T`, which fails rather than replace a directory that is not empty); a
# build that ends after another one has put a complete directory there is
# thrown away, and that directory used.
set -euo pipefail

if [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "${KUBEBUILDER_ASSETS}/kube-apiserver" && -x "${KUBEBUILDER_ASSETS}/etcd" ]]; then
  echo "${KUBEBUILDER_ASSETS}"
  exit 0
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version_of() { awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"; }
k8s=$(version_of "${here}/tools/apiserver/go.mod" k8s.io/kubernetes)
etcd=$(version_of "${here}/tools/etcd/go.mod" go.etcd.io/etcd/server/v3)
cache=${SCOPEPLANE_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/scopeplane}
dir="${cache}/envtest/kube-apiserver-${k8s}_etcd-${etcd}"

build() { # build <module dir> <package> <output>
  echo "envtest: building $(basename "$3") from $2 (cold: about 15 minutes on 2 cores)" >&2
  (cd "$1" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$3" "$2")
}

complete() { [[ -x "$1/kube-apiserver" && -x "$1/etcd" ]]; }

if ! complete "${dir}"; then
  mkdir -p "${cache}/envtest"
  tmp=$(mktemp -d "${cache}/envtest/.build.XXXXXX")
  trap 'rm -rf "${tmp}"' EXIT
  build "${here}/tools/etcd" . "${tmp}/etcd"
  build "${here}/tools/apiserver" k8s.io/kubernetes/cmd/kube-apiserver "${tmp}/kube-apiserver"
  # The rename fails while ${dir} is not empty: another build placed it
  # (keep it), or a build of the old recipe, which removed the directory
  # before renaming, was cut short there: then each binary is renamed in,
  # so that none that is there ever goes missing.
  if ! mv -T "${tmp}" "${dir}" 2>/dev/null && ! complete "${dir}"; then
    for b in etcd kube-apiserver; do mv -f "${tmp}/${b}" "${dir}/${b}"; done
  fi
  trap - EXIT
  rm -rf "${tmp}"
fi
echo "${dir}"
