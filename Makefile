# scopeplane — run `make help` for the targets.
#
# Tools are pinned here and built from the Go module proxy into a cache outside
# the checkout (one binary per version), so a fresh clone reuses them.

CONTROLLER_TOOLS_VERSION ?= v0.23.0
GOLANGCI_LINT_VERSION    ?= v2.15.0
ACTIONLINT_VERSION       ?= v1.7.12

CACHE    ?= $(or $(SCOPEPLANE_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/scopeplane)
TOOLBIN  := $(CACHE)/bin
CONTROLLER_GEN := $(TOOLBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
GOLANGCI_LINT  := $(TOOLBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
ACTIONLINT     := $(TOOLBIN)/actionlint-$(ACTIONLINT_VERSION)

# VERSION is the binary's version: the Helm chart's appVersion, so they agree.
VERSION ?= $(shell awk '/^appVersion:/ { gsub(/"/, "", $$2); print $$2 }' charts/scopeplane/Chart.yaml)

# FUZZ_TRANSLATE and FUZZ_REQUESTS are how many inputs `make test` fuzzes
# beyond the seed corpora (about 10 s each here); FUZZ_TRANSLATE counts for
# FuzzTranslate and for FuzzConvertTranslate (Kubernetes objects to the wire). Counts, not durations: a
# time limit can end the fuzzer in the middle of minimizing an input, which
# go test reports as a failure that found nothing.
FUZZ_TRANSLATE ?= 20000x
FUZZ_REQUESTS  ?= 2000x

# TEST_TIMEOUT bounds each test binary. The image test cross-builds the
# binary for two architectures, which on a cold build cache and 2 cores takes
# longer than go test's 10-minute default.
TEST_TIMEOUT ?= 30m

# Nothing here needs a C toolchain: every build, test and tool is pure Go.
export CGO_ENABLED := 0

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

##@ General

.PHONY: help
help: ## Show every target with one line each.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
	  /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code for the API types, and the Dockerfile from the image's recipe (hack/image).
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	go run ./hack/image -dockerfile -version $(VERSION) > Dockerfile

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD and RBAC manifests from the kubebuilder markers.
	$(CONTROLLER_GEN) crd rbac:roleName=scopeplane paths=./... \
	  output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	rm -f charts/scopeplane/files/crds/*.yaml && cp config/crd/bases/*.yaml charts/scopeplane/files/crds/
	cp config/rbac/role.yaml charts/scopeplane/files/role.yaml

.PHONY: fmt
fmt: ## Format the Go code.
	gofmt -s -w $$(git ls-files --cached --others --exclude-standard '*.go')

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint with .golangci.yml.
	$(GOLANGCI_LINT) run ./...

.PHONY: actionlint
actionlint: $(ACTIONLINT) ## Check the forge's workflows (.github/workflows) with actionlint (and shellcheck, when it is on PATH).
	$(ACTIONLINT) -color=false

.PHONY: tidy
tidy: ## Tidy go.mod and go.sum of the module and its tool modules.
	go mod tidy
	cd hack/tools/apiserver && go mod tidy
	cd hack/tools/etcd && go mod tidy
	cd hack/tools/helm && go mod tidy
	cd hack/tools/containerd && go mod tidy
	cd hack/tools/coredns && go mod tidy

.PHONY: verify
verify: ## Regenerate everything, then fail if the tree changed; gofmt, vet, lint and actionlint.
	$(MAKE) tidy generate manifests
	@test -z "$$(gofmt -s -l $$(git ls-files --cached --others --exclude-standard '*.go'))" || \
	  { echo "gofmt -s would change:"; gofmt -s -l $$(git ls-files --cached --others --exclude-standard '*.go'); exit 1; }
	@git diff --exit-code --stat || { echo "generated files, go.mod or go.sum are stale: run 'make tidy generate manifests' and commit"; exit 1; }
	@test -z "$$(git status --porcelain --untracked-files=all)" || \
	  { git status --porcelain --untracked-files=all; echo "generation left untracked files: commit them"; exit 1; }
	$(MAKE) vet lint actionlint

##@ Test

.PHONY: envtest
envtest: ## Build (once, cached) kube-apiserver and etcd; print the KUBEBUILDER_ASSETS directory.
	@hack/envtest.sh

.PHONY: test
test: ## Run every test against a real API server (builds the envtest binaries on first use).
	assets=$$(hack/envtest.sh); helm=$$(hack/helm.sh); \
	KUBEBUILDER_ASSETS=$$assets HELM=$$helm go test -count=1 -timeout $(TEST_TIMEOUT) ./...
	go test -run '^$$' -fuzz '^FuzzTranslate$$' -fuzztime $(FUZZ_TRANSLATE) -fuzzminimizetime 200x ./xds/translate/
	go test -run '^$$' -fuzz '^FuzzConvertTranslate$$' -fuzztime $(FUZZ_TRANSLATE) -fuzzminimizetime 200x ./controllers/convert/
	go test -run '^$$' -fuzz '^FuzzRequests$$' -fuzztime $(FUZZ_REQUESTS) -fuzzminimizetime 200x ./xds/server/
	$(MAKE) demo DEMO_ONCE=1

.PHONY: test-clients
test-clients: ## Run the client matrix: grpc-go, grpc-js-xds and gRPC C-core through its scenarios, and through a scope moving to another shard (as root: network namespaces, npm ci, python3-grpcio, iproute2).
	@command -v node >/dev/null && command -v npm >/dev/null || { echo "test-clients needs Node.js and npm on PATH for the grpc-js-xds client"; exit 1; }
	@if ! /usr/bin/python3 -c 'import grpc' 2>/dev/null || ! command -v ip >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's python3-grpcio (the gRPC C-core client) and iproute2 (the clients' network namespaces)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-grpcio iproute2 >/dev/null; \
	  else \
	    echo "test-clients needs Debian's python3-grpcio (the gRPC C-core client) and iproute2: run 'apt-get install python3-grpcio iproute2' as root, or run this target as root"; exit 1; \
	  fi; \
	fi
	cd test/clients && npm ci --no-audit --no-fund --loglevel=error
	assets=$$(hack/envtest.sh); \
	SCOPEPLANE_CLIENT_MATRIX=1 KUBEBUILDER_ASSETS=$$assets go test -count=1 -v -timeout 15m -run '^TestClientMatrix(ShardMove)?$$' ./test/clients/

.PHONY: e2e
e2e: ## Build a single-node Kubernetes on this machine (as root; no container engine) and run the chart and the quickstart on real Pods.
	@[ "$$(id -u)" = 0 ] || { echo "e2e needs root: it runs a kubelet and containerd (hack/cluster/node.sh)"; exit 1; }
	@missing=; for t in runc iptables conntrack openssl ip; do command -v $$t >/dev/null || missing=1; done; \
	[ -x /usr/lib/cni/bridge ] || missing=1; \
	if [ -n "$$missing" ]; then \
	  command -v apt-get >/dev/null || { echo "e2e needs runc, iptables, conntrack, openssl, iproute2 and the CNI plugins (Debian: containernetworking-plugins)"; exit 1; }; \
	  echo "installing Debian's runc, CNI plugins, iptables, conntrack, openssl and iproute2 for the node"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    runc containernetworking-plugins iptables conntrack openssl iproute2 >/dev/null; \
	fi
	hack/cluster/build.sh >/dev/null
	go run ./hack/image -version $(VERSION) -platforms linux/amd64 -out dist/e2e/scopeplane.oci.tar
	go run ./hack/image -image scopeplane-demo -version $(VERSION) -platforms linux/amd64 -out dist/e2e/scopeplane-demo.oci.tar
	go build -o dist/e2e/kubectl-scopeplane ./cmd/kubectl-scopeplane
	helm=$$(hack/helm.sh); \
	PATH=$(CURDIR)/dist/e2e:$$PATH HELM=$$helm SCOPEPLANE_E2E_LOGS=$(CURDIR)/dist/e2e/logs hack/cluster/node.sh \
	  --sandbox ghcr.io/scopeplane/scopeplane-demo:$(VERSION) \
	  --import dist/e2e/scopeplane.oci.tar --import dist/e2e/scopeplane-demo.oci.tar -- \
	  go test -count=1 -v -timeout 30m -run '^TestQuickstartOnANode$$' ./test/e2e/

.PHONY: helm
helm: ## Build (once, cached) the pinned Helm that tests the chart; print its path.
	@hack/helm.sh

.PHONY: bench
bench: ## Benchmark scopeplane against stock go-control-plane, every cell of docs/performance.md (events up to 10,000 proxies, a minute of sustained churn), and redraw its charts in docs/bench (about 40 minutes; BENCH_FLAGS adds flags).
	go run ./hack/bench -preset full $(BENCH_FLAGS)
	go run ./hack/bench -preset sweep -plots docs/bench $(BENCH_FLAGS)

.PHONY: bench-world
bench-world: ## Benchmark the whole operator against a real API server holding 10,000 and then 100,000 Services: 100 team scopes with 1,000 proxies and 10,000 tenant scopes with a proxy each, both protocols (memory by layer, cold start, events, status writes; the first run builds and caches each world under ~/.cache/scopeplane, minutes at S=100,000).
	assets=$$(hack/envtest.sh); \
	KUBEBUILDER_ASSETS=$$assets go run ./hack/bench -preset world $(BENCH_FLAGS)

.PHONY: bench-quick
bench-quick: ## The same benchmark on a small world (S=500, N=50, every cell and 5 s of churn, under 2 minutes); fails if any proxy is wrong or a figure for the other protocol disagrees.
	go run ./hack/bench -preset quick $(BENCH_FLAGS)

##@ Run

.PHONY: build
build: ## Build the scopeplane binary and the kubectl-scopeplane plugin into bin/.
	go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o bin/scopeplane .
	go build -trimpath -ldflags "-s -w" -o bin/kubectl-scopeplane ./cmd/kubectl-scopeplane

.PHONY: image
image: ## Build the multi-arch (linux/amd64, linux/arm64) OCI image archives dist/scopeplane-<version>.oci.tar and the quickstart's dist/scopeplane-demo-<version>.oci.tar, no container engine needed.
	go run ./hack/image -version $(VERSION) -out dist/scopeplane-$(VERSION).oci.tar
	go run ./hack/image -image scopeplane-demo -version $(VERSION) -out dist/scopeplane-demo-$(VERSION).oci.tar
	@echo "dist/scopeplane-$(VERSION).oci.tar, dist/scopeplane-demo-$(VERSION).oci.tar: docker load -i, or kind load image-archive"

.PHONY: dist
dist: ## Write the packaged chart and install.yaml (the chart rendered with its defaults) into dist/.
	HELM=$$(hack/helm.sh) hack/dist.sh dist

.PHONY: release
release: ## Write everything a release publishes into dist/ for VERSION=x.y.z (docs/release.md): image archive with its SBOM attached, the SBOM, chart package, install.yaml, kubectl plugin archives and their krew manifest, SHA256SUMS.
	@test -n "$(filter command line,$(origin VERSION))" || { echo "make release needs VERSION=x.y.z (see CHANGELOG.md for the versioning policy)"; exit 2; }
	HELM=$$(hack/helm.sh) hack/release.sh $(VERSION) dist

.PHONY: demo
demo: ## Run scopeplane end to end: local API server, operator, backends, scopes, a gRPC xDS client (DEMO_ONCE=1: one pass).
	assets=$$(hack/envtest.sh); \
	go build -o bin/kubectl-scopeplane ./cmd/kubectl-scopeplane; \
	PATH=$(CURDIR)/bin:$$PATH KUBEBUILDER_ASSETS=$$assets go run ./hack/demo

##@ Tools

$(CONTROLLER_GEN):
	mkdir -p $(TOOLBIN)
	GOBIN=$(TOOLBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(TOOLBIN)/controller-gen $@

$(GOLANGCI_LINT):
	mkdir -p $(TOOLBIN)
	GOBIN=$(TOOLBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(TOOLBIN)/golangci-lint $@

$(ACTIONLINT):
	mkdir -p $(TOOLBIN)
	GOBIN=$(TOOLBIN) go install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)
	mv $(TOOLBIN)/actionlint $@
