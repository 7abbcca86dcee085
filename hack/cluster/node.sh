#!/usr/bin/env bash
# node.sh runs a command against a single-node Kubernetes cluster that it
# makes on this machine and removes afterwards:
#
#   hack/cluster/node.sh --sandbox ref [--import image.oci.tar]... -- command [args]...
#
# The node is etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# containerd 2 (Debian's runc), kubelet, kube-proxy (iptables) and CoreDNS,
# all built by hack/cluster/build.sh, as processes of this script. It needs
# root and a real kernel, and no container engine, registry or internet:
# images come from OCI archives imported into containerd's k8s.io namespace,
# and --sandbox names the one of them that is the Pods' sandbox ("pause")
# image, since Kubernetes' own cannot be pulled.
#
# Everything stays on this machine and in 198.18.0.0/15 (RFC 2544, never
# routed): the node's address is 198.19.0.1 on its own bridge, Pods get
# 198.19.0.0/24 and Services 198.19.128.0/20. A trap stops every process the
# script started, by PID, and removes what it made — Pods' sandboxes and
# mounts, network namespaces, the bridge, the iptables chains, cgroups, the
# sysctls it changed — also when the command or the node fails.
#
# The command runs with KUBECONFIG set to a cluster-admin kubeconfig,
# SCOPEPLANE_E2E=1 and SCOPEPLANE_E2E_NODE set to the node's name; its exit
# status is the script's. Logs are copied to $SCOPEPLANE_E2E_LOGS when set.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage="usage: node.sh --sandbox ref [--import archive]... -- command..."
imports=() sandbox=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --import) imports+=("$(realpath "$2")"); shift 2 ;;
    --sandbox) sandbox=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "node: unknown argument $1 (${usage})" >&2; exit 2 ;;
  esac
done
if [[ $# -eq 0 || -z ${sandbox} ]]; then
  echo "node: no command or no --sandbox image (${usage})" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "node: needs root (it runs a kubelet and containerd)" >&2
  exit 2
fi
for tool in runc iptables iptables-save ip6tables ip6tables-save conntrack openssl ip; do
  command -v "${tool}" >/dev/null || { echo "node: ${tool} not found (apt-get install containerd runc containernetworking-plugins iptables conntrack openssl iproute2)" >&2; exit 2; }
done
cni_bin=/usr/lib/cni
for p in bridge host-local loopback portmap; do
  [[ -x "${cni_bin}/${p}" ]] || { echo "node: ${cni_bin}/${p} not found (apt-get install containernetworking-plugins)" >&2; exit 2; }
done

bin=$("${here}/build.sh")
export PATH="${bin}:${PATH}"

readonly node=scopeplane-e2e
readonly node_ip=198.19.0.1 pod_cidr=198.19.0.0/24 service_cidr=198.19.128.0/20
readonly kubernetes_ip=198.19.128.1 bridge=spe2e0
readonly etcd_port=12379 etcd_peer_port=12380 api_port=16443
readonly sysctls=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

state=$(mktemp -d /tmp/scopeplane-node.XXXXXX)
mkdir -p "${state}/logs" "${state}/pki"
declare -A pids=()
declare -A sysctl_was=()
netns_before=$(ls /run/netns 2>/dev/null || true)
netns_dir_existed=$([[ -d /run/netns ]] && echo yes || echo no)
nft_tables_before=$(nft list tables 2>/dev/null || true)
containers_log_existed=$([[ -d /var/log/containers ]] && echo yes || echo no)
containers_logs_before=$(ls /var/log/containers 2>/dev/null || true)
iptables_before="${state}/iptables-before"
ip6tables_before="${state}/ip6tables-before"
iptables-save >"${iptables_before}"
ip6tables-save >"${ip6tables_before}"

log() { echo "node: $*" >&2; }

# start <name> <command...>: runs a component in the background, logging to
# ${state}/logs/<name>.log, and remembers its PID for the trap.
start() {
  local name=$1
  shift
  "$@" >"${state}/logs/${name}.log" 2>&1 &
  pids[${name}]=$!
  log "started ${name} (pid ${pids[${name}]})"
}

# stop <name>...: stops components by PID, waiting up to 20s before SIGKILL.
stop() {
  local name pid i
  for name in "$@"; do
    pid=${pids[${name}]:-}
    [[ -n "${pid}" ]] || continue
    unset "pids[${name}]"
    kill -TERM "${pid}" 2>/dev/null || continue
    for ((i = 0; i < 40; i++)); do
      kill -0 "${pid}" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL "${pid}" 2>/dev/null || true
    wait "${pid}" 2>/dev/null || true
  done
}

# wait_for <what> <seconds> <command...>: polls until the command succeeds.
wait_for() {
  local what=$1 deadline=$((SECONDS + $2))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      log "${what}: not ready in time"
      return 1
    fi
    sleep 1
  done
}

# chains_of <iptables-save output>: "table chain" per chain.
chains_of() { awk '/^\*/ { t = substr($0, 2) } /^:/ { print t, substr($1, 2) }' "$1" | sort; }

# rules_of <iptables-save output>: "table<TAB>rule" per rule.
rules_of() { awk '/^\*/ { t = substr($0, 2) } /^-A / { print t "\t" $0 }' "$1" | sort; }

# remove_new_chains <iptables|ip6tables> <snapshot>: deletes every rule and
# chain that was not in the snapshot: first the new rules in chains that stay
# (the jumps into ours), then the new chains.
remove_new_chains() {
  local cmd=$1 before=$2 after="${state}/$1-after" t c rule entry
  "${cmd}-save" >"${after}" 2>/dev/null || return 0
  local -a new=()
  mapfile -t new < <(comm -13 <(chains_of "${before}") <(chains_of "${after}"))
  while IFS=$'\t' read -r t rule; do
    [[ -n "${rule}" ]] || continue
    c=${rule#-A }
    c=${c%% *}
    printf '%s\n' "${new[@]}" | grep -qx "${t} ${c}" && continue
    eval "${cmd} -t ${t} -D ${rule#-A }" 2>/dev/null || true
  done < <(comm -13 <(rules_of "${before}") <(rules_of "${after}"))
  for entry in "${new[@]}"; do
    read -r t c <<<"${entry}"
    "${cmd}" -t "${t}" -F "${c}" 2>/dev/null || true
  done
  for entry in "${new[@]}"; do
    read -r t c <<<"${entry}"
    "${cmd}" -t "${t}" -X "${c}" 2>/dev/null || true
  done
}

cleanup() {
  local status=$?
  set +e
  trap - EXIT INT TERM
  log "tearing the node down"
  local kubectl=(kubectl --kubeconfig "${state}/admin.kubeconfig" --request-timeout=10s)
  # No controller recreates what goes; the kubelet still stops the Pods'
  # sandboxes, which releases their addresses and network namespaces.
  stop kube-controller-manager kube-scheduler
  if [[ -n "${pids[kubelet]:-}" ]]; then
    "${kubectl[@]}" delete pods --all-namespaces --all --grace-period=1 --wait=true --timeout=90s >/dev/null 2>&1
  fi
  stop kubelet kube-proxy
  kube-proxy --cleanup >"${state}/logs/kube-proxy-cleanup.log" 2>&1
  if [[ -n "${pids[containerd]:-}" ]]; then
    local ctr_=(ctr --address "${state}/containerd.sock" -n k8s.io) id
    for id in $("${ctr_[@]}" tasks ls -q 2>/dev/null); do
      "${ctr_[@]}" tasks kill -s KILL "${id}" >/dev/null 2>&1
      "${ctr_[@]}" tasks delete -f "${id}" >/dev/null 2>&1
    done
    for id in $("${ctr_[@]}" containers ls -q 2>/dev/null); do
      "${ctr_[@]}" containers rm "${id}" >/dev/null 2>&1
    done
  fi
  stop containerd coredns kube-apiserver etcd
  # Shims outlive containerd by design; these are ours (they name our socket).
  local pid
  for pid in $(pgrep -f -- "-address ${state}/containerd.sock" 2>/dev/null); do
    kill -KILL "${pid}" 2>/dev/null
  done
  # Mounts: the kubelet's volumes, containerd's snapshots and sandboxes.
  local m
  for m in $(awk -v s="${state}" 'index($2, s) == 1 { print $2 }' /proc/mounts | sort -r); do
    umount -l "${m}" 2>/dev/null
  done
  # Only the Pods' network namespaces (containerd names them cni-<uuid>):
  # others made meanwhile belong to other programs on the machine (the
  # client matrix makes its own), and are theirs to remove.
  for m in $(ls /run/netns 2>/dev/null); do
    if [[ ${m} == cni-* ]] && ! grep -qx "${m}" <<<"${netns_before}"; then
      umount -l "/run/netns/${m}" 2>/dev/null
      rm -f "/run/netns/${m}"
    fi
  done
  ip link del "${bridge}" 2>/dev/null
  remove_new_chains iptables "${iptables_before}"
  remove_new_chains ip6tables "${ip6tables_before}"
  # iptables-nft makes the tables it first writes to; they are empty now.
  local table
  while read -r table; do
    [[ -n "${table}" ]] && ! grep -qxF "${table}" <<<"${nft_tables_before}" && nft delete ${table} 2>/dev/null
  done < <(nft list tables 2>/dev/null)
  if [[ "${netns_dir_existed}" == no ]]; then umount /run/netns 2>/dev/null; rmdir /run/netns 2>/dev/null; fi
  local k
  for k in "${!sysctl_was[@]}"; do
    sysctl -qw "${k}=${sysctl_was[${k}]}" >/dev/null 2>&1
  done
  # The kubelet's Pod cgroups (cgroupfs driver), deepest first.
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/unified/kubepods; do
    [[ -d "${d}" ]] && find "${d}" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  if [[ "${containers_log_existed}" == no ]]; then
    rm -rf /var/log/containers
  else
    for m in $(ls /var/log/containers 2>/dev/null); do
      grep -qx "${m}" <<<"${containers_logs_before}" || rm -f "/var/log/containers/${m}"
    done
  fi
  if [[ -n "${SCOPEPLANE_E2E_LOGS:-}" ]]; then
    mkdir -p "${SCOPEPLANE_E2E_LOGS}" && cp -r "${state}/logs/." "${SCOPEPLANE_E2E_LOGS}/"
  fi
  if [[ ${status} -ne 0 ]]; then
    for f in "${state}"/logs/*.log; do
      echo "----- $(basename "${f}") (last 15 lines)" >&2
      tail -n 15 "${f}" >&2
    done
  fi
  rm -rf "${state}"
  log "removed (exit status ${status})"
  exit "${status}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- host networking: a bridge of our own and the sysctls a node needs.
for k in "${sysctls[@]}"; do
  sysctl_was[${k}]=$(sysctl -n "${k}")
done
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1
ip link add "${bridge}" type bridge
ip addr add "${node_ip}/24" dev "${bridge}"
ip link set "${bridge}" up

# ---- PKI: one CA; the API server's serving certificate; client
# certificates for the admin (everything on the control plane uses it) and
# for the kubelet as its Node; the service-account signing key.
pki=${state}/pki
openssl_quiet() { openssl "$@" >/dev/null 2>&1; }
openssl_quiet req -x509 -newkey rsa:2048 -nodes -keyout "${pki}/ca.key" -out "${pki}/ca.crt" -days 2 -subj "/CN=scopeplane-e2e-ca"
cert() { # cert <name> <subject> [SANs]
  openssl_quiet req -newkey rsa:2048 -nodes -keyout "${pki}/$1.key" -out "${pki}/$1.csr" -subj "$2"
  local ext="${pki}/$1.ext"
  echo "basicConstraints=CA:FALSE" >"${ext}"
  echo "keyUsage=digitalSignature,keyEncipherment" >>"${ext}"
  if [[ -n "${3:-}" ]]; then
    echo "extendedKeyUsage=serverAuth,clientAuth" >>"${ext}"
    echo "subjectAltName=$3" >>"${ext}"
  else
    echo "extendedKeyUsage=clientAuth" >>"${ext}"
  fi
  openssl_quiet x509 -req -in "${pki}/$1.csr" -CA "${pki}/ca.crt" -CAkey "${pki}/ca.key" -CAcreateserial -out "${pki}/$1.crt" -days 2 -extfile "${ext}"
}
cert apiserver "/CN=kube-apiserver" "IP:${node_ip},IP:${kubernetes_ip},IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert admin "/O=system:masters/CN=scopeplane-e2e-admin"
cert kubelet "/O=system:nodes/CN=system:node:${node}"
cert kubelet-serving "/CN=${node}" "IP:${node_ip},DNS:${node}"
openssl_quiet genrsa -out "${pki}/sa.key" 2048
openssl_quiet rsa -in "${pki}/sa.key" -pubout -out "${pki}/sa.pub"
kubeconfig() { # kubeconfig <file> <cert name>
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: "https://${node_ip}:${api_port}", certificate-authority: "${pki}/ca.crt"}
users:
- name: e2e
  user: {client-certificate: "${pki}/$2.crt", client-key: "${pki}/$2.key"}
contexts:
- name: e2e
  context: {cluster: e2e, user: e2e}
current-context: e2e
EOF
}
kubeconfig "${state}/admin.kubeconfig" admin
kubeconfig "${state}/kubelet.kubeconfig" kubelet
kubectl=(kubectl --kubeconfig "${state}/admin.kubeconfig")

# ---- control plane
start etcd etcd --name e2e --data-dir "${state}/etcd" \
  --listen-client-urls "http://127.0.0.1:${etcd_port}" --advertise-client-urls "http://127.0.0.1:${etcd_port}" \
  --listen-peer-urls "http://127.0.0.1:${etcd_peer_port}" --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer_port}" \
  --initial-cluster "e2e=http://127.0.0.1:${etcd_peer_port}" --unsafe-no-fsync
start kube-apiserver kube-apiserver \
  --etcd-servers "http://127.0.0.1:${etcd_port}" \
  --bind-address "${node_ip}" --advertise-address "${node_ip}" --secure-port "${api_port}" \
  --tls-cert-file "${pki}/apiserver.crt" --tls-private-key-file "${pki}/apiserver.key" \
  --client-ca-file "${pki}/ca.crt" \
  --kubelet-client-certificate "${pki}/admin.crt" --kubelet-client-key "${pki}/admin.key" \
  --kubelet-certificate-authority "${pki}/ca.crt" --kubelet-preferred-address-types InternalIP \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "${pki}/sa.pub" --service-account-signing-key-file "${pki}/sa.key" \
  --service-cluster-ip-range "${service_cidr}" \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
  --allow-privileged=true
wait_for kube-apiserver 120 "${kubectl[@]}" get --raw /readyz
start kube-controller-manager kube-controller-manager \
  --kubeconfig "${state}/admin.kubeconfig" --authentication-kubeconfig "${state}/admin.kubeconfig" \
  --authorization-kubeconfig "${state}/admin.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 11257 --leader-elect=false \
  --service-account-private-key-file "${pki}/sa.key" --root-ca-file "${pki}/ca.crt" \
  --cluster-signing-cert-file "${pki}/ca.crt" --cluster-signing-key-file "${pki}/ca.key" \
  --service-cluster-ip-range "${service_cidr}" --use-service-account-credentials=true
start kube-scheduler kube-scheduler \
  --kubeconfig "${state}/admin.kubeconfig" --authentication-kubeconfig "${state}/admin.kubeconfig" \
  --authorization-kubeconfig "${state}/admin.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 11259 --leader-elect=false

# ---- CoreDNS on the node's address: Pods resolve through it (clusterDNS).
cat >"${state}/Corefile" <<EOF
.:53 {
    bind ${node_ip}
    errors
    health 127.0.0.1:11280
    ready 127.0.0.1:11281
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig ${state}/admin.kubeconfig e2e
        pods insecure
    }
    cache 5
    loadbalance
}
EOF
start coredns coredns -conf "${state}/Corefile"

# ---- containerd 2 with Debian's runc and CNI plugins, all state in ${state}.
mkdir -p "${state}/cni/net.d"
cat >"${state}/cni/net.d/10-e2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "scopeplane-e2e",
  "plugins": [
    {"type": "bridge", "bridge": "${bridge}", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "${state}/cni/ipam",
              "ranges": [[{"subnet": "${pod_cidr}", "gateway": "${node_ip}", "rangeStart": "198.19.0.10"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
cat >"${state}/containerd.toml" <<EOF
version = 3
root = "${state}/containerd/root"
state = "${state}/containerd/state"
[grpc]
  address = "${state}/containerd.sock"
[ttrpc]
  address = "${state}/containerd.ttrpc.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "${sandbox}"
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = false
  # Without CAP_SYS_RESOURCE (as in some VMs) no process may lower its
  # oom_score_adj, and the kubelet asks -998 for every sandbox: keep them at
  # containerd's own score or above, or no Pod starts.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "${state}/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["${cni_bin}"]
    conf_dir = "${state}/cni/net.d"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.internal.v1.opt']
  path = "${state}/containerd/opt"
EOF
start containerd containerd --config "${state}/containerd.toml"
wait_for containerd 60 ctr --address "${state}/containerd.sock" version
for archive in "${imports[@]}"; do
  log "importing ${archive}"
  ctr --address "${state}/containerd.sock" -n k8s.io images import --all-platforms=false --platform linux/amd64 "${archive}" >&2
done

# ---- kubelet and kube-proxy
mkdir -p "${state}/kubelet" "${state}/pod-logs"
cat >"${state}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://${state}/containerd.sock
address: ${node_ip}
port: 11250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 11248
tlsCertFile: ${pki}/kubelet-serving.crt
tlsPrivateKeyFile: ${pki}/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${pki}/ca.crt}
authorization: {mode: Webhook}
clusterDNS: [${node_ip}]
clusterDomain: cluster.local
podLogsDir: ${state}/pod-logs
failSwapOn: false
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
maxPods: 60
EOF
start kubelet kubelet --config "${state}/kubelet.yaml" --kubeconfig "${state}/kubelet.kubeconfig" \
  --root-dir "${state}/kubelet" --hostname-override "${node}" --node-ip "${node_ip}"
cat >"${state}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: ${state}/admin.kubeconfig}
hostnameOverride: ${node}
bindAddress: ${node_ip}
clusterCIDR: ${pod_cidr}
metricsBindAddress: 127.0.0.1:11249
healthzBindAddress: 127.0.0.1:11256
nodePortAddresses: ["${node_ip}/32"]
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
start kube-proxy kube-proxy --config "${state}/kube-proxy.yaml"

wait_for "node ${node}" 120 "${kubectl[@]}" wait --for=condition=Ready "node/${node}" --timeout=5s
wait_for coredns 60 curl -sf http://127.0.0.1:11281/ready
log "node ${node} is Ready; running: $*"

set +e
KUBECONFIG="${state}/admin.kubeconfig" SCOPEPLANE_E2E=1 SCOPEPLANE_E2E_NODE="${node}" "$@"
status=$?
set -e
exit "${status}"
