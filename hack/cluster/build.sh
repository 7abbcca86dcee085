#!/usr/bin/env bash
# build.sh prints a directory holding every binary of the single-node
# Kubernetes that `make e2e` runs: kube-apiserver and etcd (hack/envtest.sh),
# kube-controller-manager, kube-scheduler, kubelet, kube-proxy and kubectl
# (k8s.io/kubernetes, pinned with kube-apiserver in hack/tools/apiserver so
# that they share its compiled packages), containerd 2 with its runc shim
# (hack/tools/containerd) and CoreDNS (hack/tools/coredns). None of them can
# be downloaded prebuilt where scopeplane is developed, so each is built once
# through the Go module proxy and cached outside the checkout, keyed by
# version, like the envtest binaries. Builds run one after another at low
# priority: on a small machine they would otherwise starve everything else.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version_of() { awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"; }
k8s=$(version_of "${here}/tools/apiserver/go.mod" k8s.io/kubernetes)
containerd=$(version_of "${here}/tools/containerd/go.mod" github.com/containerd/containerd/v2)
coredns=$(version_of "${here}/tools/coredns/go.mod" github.com/coredns/coredns)
cache=${SCOPEPLANE_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/scopeplane}
envtest=$("${here}/envtest.sh")
# The recipe (this script) is part of the key: a changed flag rebuilds.
recipe=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-8)
dir="${cache}/cluster/k8s-${k8s}_containerd-${containerd}_coredns-${coredns}_${recipe}"

# Versions stamped as the upstream release builds stamp them, so that the
# node reports them (kubectl get nodes, the skew checks) rather than
# v0.0.0-master.
minor=${k8s#v1.}; minor=${minor%%.*}
k8s_version="-X k8s.io/component-base/version.gitVersion=${k8s} -X k8s.io/component-base/version.gitMajor=1
  -X k8s.io/component-base/version.gitMinor=${minor} -X k8s.io/component-base/version.gitTreeState=clean
  -X k8s.io/client-go/pkg/version.gitVersion=${k8s} -X k8s.io/client-go/pkg/version.gitMajor=1
  -X k8s.io/client-go/pkg/version.gitMinor=${minor} -X k8s.io/client-go/pkg/version.gitTreeState=clean"
containerd_version="-X github.com/containerd/containerd/v2/version.Version=${containerd}"

# build <module dir> <output> <package> [ldflags]: one binary, timed, into the cache.
build() {
  local out="${dir}/$2"
  [[ -x "${out}" ]] && return 0
  echo "cluster: building $2 from $3" >&2
  local start=${SECONDS}
  # Into a file of its own, then renamed over: a binary in the cache is
  # never missing or half written, even while another checkout builds it.
  local tmp
  tmp=$(mktemp "${out}.XXXXXX")
  (cd "${here}/tools/$1" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags="-s -w ${4:-}" -o "${tmp}" "$3")
  mv -f "${tmp}" "${out}"
  echo "cluster: built $2 in $((SECONDS - start))s" >&2
}

mkdir -p "${dir}"
# The links are made beside and renamed over (ln -sf removes the old one
# first), and only when they point elsewhere.
for b in kube-apiserver etcd; do
  if [[ "$(readlink "${dir}/${b}" || true)" != "${envtest}/${b}" ]]; then
    ln -sfn "${envtest}/${b}" "${dir}/.${b}.$$"
    mv -fT "${dir}/.${b}.$$" "${dir}/${b}"
  fi
done
for b in kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
  build apiserver "${b}" "k8s.io/kubernetes/cmd/${b}" "${k8s_version}"
done
for b in containerd containerd-shim-runc-v2 ctr; do
  build containerd "${b}" "github.com/containerd/containerd/v2/cmd/${b}" "${containerd_version}"
done
build coredns coredns .
echo "${dir}"
