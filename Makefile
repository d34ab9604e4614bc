# Makefile for cluster-api-ipam-provider-vitistack. `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

ROOT := $(abspath .)
BIN := $(ROOT)/bin
export GOBIN := $(BIN)
export PATH := $(BIN):$(PATH)
export GOFLAGS ?= -buildvcs=false

VERSION ?= v0.2.0
IMG ?= ghcr.io/vitistack/cluster-api-ipam-provider-vitistack:$(VERSION)

# Control-plane versions for the tests, built from the Go module proxy: one tool module
# per version under hack/tools/kube/<version> and hack/tools/etcd/<version>. The suites
# run on KUBE_VERSION (default: the newest); `make test-kube KUBE_VERSION=$(KUBE_VERSION_OLDEST)`
# runs the control-plane suites on the oldest. Each Kubernetes version runs with the etcd
# it ships with.
KUBE_VERSION_NEWEST := v1.37.2
KUBE_VERSION_OLDEST := v1.33.4
KUBE_VERSION ?= $(KUBE_VERSION_NEWEST)
ETCD_VERSION_v1.37.2 := v3.7.3
ETCD_VERSION_v1.33.4 := v3.5.21
ETCD_VERSION := $(ETCD_VERSION_$(KUBE_VERSION))
ifeq ($(ETCD_VERSION),)
$(error KUBE_VERSION=$(KUBE_VERSION) is not one of the tested versions: $(KUBE_VERSION_NEWEST) $(KUBE_VERSION_OLDEST) (see hack/tools/kube))
endif
KUBE_MINOR := $(word 2,$(subst ., ,$(KUBE_VERSION)))
KUBE_LDFLAGS := $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(p).gitVersion=$(KUBE_VERSION) -X $(p).gitMajor=1 -X $(p).gitMinor=$(KUBE_MINOR))

# Tools, each pinned by its own module under hack/tools (go.mod + go.sum committed).
CONTROLLER_GEN := $(BIN)/controller-gen
GOLANGCI_LINT := $(BIN)/golangci-lint
KUSTOMIZE := $(BIN)/kustomize
CLUSTERCTL := $(BIN)/clusterctl
PROMTOOL := $(BIN)/promtool
PROMETHEUS := $(BIN)/prometheus
HELM := $(BIN)/helm
# The chart (charts/; its templates generated from config/ by make manifests) and where
# make helm-package writes its archive.
CHART := charts/cluster-api-ipam-provider-vitistack
CHART_DIR := $(ROOT)/out/charts
# kube-apiserver, kube-controller-manager, etcd and kubectl of one version, side by side.
KUBE_ASSETS := $(BIN)/k8s/$(KUBE_VERSION)
KUBE_APISERVER := $(KUBE_ASSETS)/kube-apiserver
KUBE_CONTROLLER_MANAGER := $(KUBE_ASSETS)/kube-controller-manager
ETCD := $(KUBE_ASSETS)/etcd
KUBECTL := $(KUBE_ASSETS)/kubectl

TEST_ASSETS := $(KUBE_APISERVER) $(ETCD) $(KUBE_CONTROLLER_MANAGER) $(KUBECTL)
export KUBEBUILDER_ASSETS := $(KUBE_ASSETS)

# Release artifacts (make release-manifests) and the offline clusterctl repository that
# the quickstart and the end-to-end tests install from (make local-repository).
RELEASE_DIR := $(ROOT)/out/ipam-vitistack/$(VERSION)
LOCAL_REPOSITORY := $(ROOT)/out/repository
MANAGER := $(BIN)/manager
IPAM_API_SIM := $(BIN)/ipam-api-sim
# The previous release, built from its commit in this repository's history for the
# upgrade tests: v0.1.0 is ea4d9bc (2026-11-22), the last commit on Cluster API v1.11
# before VERSION and metadata.yaml moved to v0.2 (CHANGELOG.md). Its manager, its
# release manifests and metadata.yaml land in bin/previous/<version>/ (cached).
PREVIOUS_VERSION := v0.1.0
PREVIOUS_COMMIT := ea4d9bc94e444e77d87936656f26849e0edc364f
PREVIOUS_RELEASE := $(BIN)/previous/$(PREVIOUS_VERSION)
PREVIOUS_MANAGER := $(PREVIOUS_RELEASE)/manager
# What test/e2e and hack/quickstart run; exported so that `go test ./test/e2e` finds them.
export E2E_REPOSITORY := $(LOCAL_REPOSITORY)
export E2E_CLUSTERCTL := $(CLUSTERCTL)
export E2E_KUBECTL := $(KUBECTL)
export E2E_MANAGER := $(MANAGER)
export E2E_IPAM_API_SIM := $(IPAM_API_SIM)
export E2E_QUICKSTART := $(BIN)/quickstart
METALLB := $(BIN)/metallb-controller
METALLB_CRDS := $(BIN)/metallb-crds
export E2E_METALLB := $(METALLB)
export E2E_METALLB_CRDS := $(METALLB_CRDS)
export E2E_PROMETHEUS := $(PROMETHEUS)
export E2E_HELM := $(HELM)
export E2E_PREVIOUS_RELEASE := $(PREVIOUS_RELEASE)
export E2E_RELEASE_DIR := $(RELEASE_DIR)
export E2E_VERSION := $(VERSION)
export E2E_IMAGE := $(IMG)

# The long steps (tool builds from source, test suites) say what they do, every 30 s
# while they run, and how long they took.
PROGRESS := $(ROOT)/hack/progress.sh

# Every build of this repository but the race-detector tests is static and trimmed, as the
# image's: from cold, one compile of the dependencies serves the binaries, vet and the
# generators (each other mix of cgo and -trimpath compiles them all again).
GO_STATIC := env CGO_ENABLED=0 go
# Builds also let the compiler and the linker collect garbage only as their heap nears
# 3 GiB, not each time it doubles: from cold, kube-apiserver 1.33.4 builds 11 % faster and
# etcd 21 % (2.5 GB at most per process). Not for `go run` of a long-running program (the
# manager, the stand-in, a benchmark), which would hardly collect at all; the generators
# it runs end in seconds.
GO_BUILD_GC := GOGC=off GOMEMLIMIT=3GiB
GO_BUILD := env $(GO_BUILD_GC) $(GO_STATIC)
# The tests' compiles and links do too: -toolexec runs the compiler and the linker under it,
# not the tests, and their cache keys stay the same.
GO_TEST := go test -toolexec "env $(GO_BUILD_GC)"
# The tools are linked without their symbol table and DWARF: a third faster (Helm: 8.3 s
# -> 5.4 s), and nothing debugs them. go build reads only the last -ldflags, so a tool
# that sets version variables puts its -X flags after these in the same -ldflags.
TOOL_LDFLAGS := -s -w

GO_TEST_FLAGS ?= -race -count=1
TEST_TIMEOUT ?= 40m

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-22s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code (zz_generated.deepcopy.go).
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) $(KUSTOMIZE) ## Generate CRDs, RBAC and webhook configuration under config/, docs/pool-api.md, and the chart's templates from config/.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths=./internal/... paths=./cmd/... output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) webhook paths=./internal/webhooks/... output:webhook:artifacts:config=config/webhook
	$(GO_BUILD) run -trimpath ./hack/capi-crds config/services/capi-crds
	$(GO_BUILD) run -trimpath ./hack/docgen
	$(GO_BUILD) run -trimpath ./hack/chart -kustomize $(KUSTOMIZE)

.PHONY: verify-gen
verify-gen: generate manifests ## Fail if generated files are stale.
	@if [ -n "$$(git status --porcelain -- api config docs/pool-api.md charts)" ]; then \
		echo "Generated files are stale; run 'make generate manifests' and commit:"; \
		git status --porcelain -- api config docs/pool-api.md charts; git --no-pager diff -- api config docs/pool-api.md charts | head -50; exit 1; fi

.PHONY: verify-imports
verify-imports: ## Fail if a controller package imports another, or the webhooks import a controller.
	@bad=$$(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./internal/controllers/... ./internal/webhooks/... | \
		awk '{for (i = 2; i <= NF; i++) if ($$i ~ /\/internal\/controllers/ && $$i != $$1) print $$1 " imports " $$i}'); \
	if [ -n "$$bad" ]; then echo "$$bad"; exit 1; fi

.PHONY: verify-tidy
verify-tidy: ## Fail if go.mod or go.sum are not tidy.
	@go mod tidy -diff || { echo "go.mod/go.sum are not tidy: run 'go mod tidy' and commit"; exit 1; }

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet.
	$(GO_BUILD) vet -trimpath ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint (config: .golangci.yml).
	@# It reads the dependencies' export data through go list: built as vet and the binaries
	@# build them, they come from that compile (cold: 77 s instead of 294 s, which compiled
	@# them all again with cgo and full paths).
	env CGO_ENABLED=0 GOFLAGS="$(GOFLAGS) -trimpath" $(GOLANGCI_LINT) run ./...

.PHONY: build
build: ## Build the manager and the IPAM-API stand-in into bin/ (static, as the image packages them), and the quickstart.
	@$(PROGRESS) "Building the manager, the IPAM-API stand-in and the quickstart into bin/ (~2 min the first time, then seconds)" -- bash -ec '\
		$(GO_BUILD) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(MANAGER) ./cmd/manager; \
		$(GO_BUILD) build -trimpath -o $(IPAM_API_SIM) ./cmd/ipam-api-sim; \
		$(GO_BUILD) build -trimpath -o $(BIN)/quickstart ./hack/quickstart' 

IMAGE_ARCHIVE := $(BIN)/images/manager.tar
.PHONY: image
image: ## Write the image IMG as an OCI archive, bin/images/manager.tar, without a container engine (the Dockerfile's layout; load it with ctr images import, docker load or kind load image-archive).
	GOOS=linux $(GO_STATIC) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN)/images/manager ./cmd/manager
	$(GO_STATIC) run -trimpath ./hack/image --binary $(BIN)/images/manager --tag $(IMG) --out $(IMAGE_ARCHIVE)
	@echo "Wrote $(IMG) to $(IMAGE_ARCHIVE)"

.PHONY: docker-build
docker-build: ## Build the image IMG (default ghcr.io/vitistack/cluster-api-ipam-provider-vitistack:VERSION; needs a Docker engine, which CI lacks: it checks the binary instead).
	docker build --build-arg VERSION=$(VERSION) -t $(IMG) .

##@ Release

# The image is fixed, as in every Cluster API provider: users change it with clusterctl's
# `images:` setting. A ${VARIABLE} image breaks `clusterctl generate provider --describe`.
# WRITE_IF_CHANGED FILE writes its input to FILE only if that changes it, by a rename: a
# clusterctl or a test reading the release while `make quickstart` runs never sees a file
# half written.
WRITE_IF_CHANGED = hack/write-if-changed.sh

.PHONY: release-manifests
release-manifests: $(KUSTOMIZE) ## Write out/ipam-vitistack/VERSION/: ipam-components.yaml (clusterctl), ipam-components-workload.yaml (Services) and metadata.yaml.
	mkdir -p $(RELEASE_DIR)
	$(KUSTOMIZE) build config/default | sed 's|image: controller:latest|image: $(IMG)|' | $(WRITE_IF_CHANGED) $(RELEASE_DIR)/ipam-components.yaml
	{ $(KUSTOMIZE) build config/workload; echo ---; $(KUSTOMIZE) build config/services/default-secret; } | sed 's|image: controller:latest|image: $(IMG)|' | \
		$(WRITE_IF_CHANGED) $(RELEASE_DIR)/ipam-components-workload.yaml
	$(WRITE_IF_CHANGED) $(RELEASE_DIR)/metadata.yaml <metadata.yaml

.PHONY: local-repository
local-repository: release-manifests $(KUSTOMIZE) ## Write out/repository/: an offline clusterctl repository (this release, CAPI core and kubeadm, cert-manager CRDs).
	@$(PROGRESS) "Writing the offline clusterctl repository out/repository (~1 min the first time)" -- \
		hack/local-repository.sh $(LOCAL_REPOSITORY) $(RELEASE_DIR) $(KUSTOMIZE)

##@ Testing

# The e2e suite runs on its own after the others: its processes and waits should not
# compete for the 2 cores with the envtest suites. The node suite (test/node) runs only
# through make test-node.
GO_PACKAGES_BUT_E2E = $$(go list ./... | grep -v -e /test/e2e -e /test/simulation -e /test/node)
# The packages whose tests start a control plane (envtest or test/e2e's processes): the
# ones that differ from one Kubernetes version to the next.
CONTROL_PLANE_PACKAGES_BUT_E2E = $$(go list -test -f '{{if .ForTest}}{{.ForTest}} {{join .Deps " "}}{{end}}' ./... | \
	awk '/sigs.k8s.io\/controller-runtime\/pkg\/envtest( |$$)|internal\/localcluster( |$$)/ {print $$1}' | sort -u | grep -v -e /test/e2e -e /test/node)
# The fast tier: packages with tests that start no control plane (fake clients,
# interceptors, the stand-in in process). Seconds; nothing to build first.
UNIT_PACKAGES = $$(go list -test -f '{{if .ForTest}}{{.ForTest}} {{join .Deps " "}}{{end}}' ./... | \
	awk '/sigs.k8s.io\/controller-runtime\/pkg\/envtest( |$$)|internal\/localcluster( |$$)/ {cp[$$1]=1} {all[$$1]=1} \
	END {for (p in all) if (!cp[p]) print p}' | sort -u | grep -v -e /test/e2e -e /test/simulation -e /test/node)

# The seeded simulation of every controller (test/simulation) runs without -race: one
# goroutine runs at a time there, and the race detector makes it five times slower.
# SIM_SEEDS=n runs seeds 1 to n (CI: its fixed set), SIM_SEED=n replays one.
SIM_TEST = $(GO_TEST_REPORTED) -count=1 -timeout $(TEST_TIMEOUT) ./test/simulation/

# The suites run through hack/testreport (go test -json): the log keeps go test's output
# without -v, each package's line says how many tests ran, passed, failed and skipped,
# and the log ends with what failed (CI shows its end). A test that skipped or a package
# that ran no test fails the run: a suite that skips itself (a variable not exported, a
# tool not built, a RUN that matches nothing) must not look like one that passed.
# (test/bench holds benchmarks only: make bench runs them.)
TESTREPORT := $(BIN)/testreport
GO_TEST_REPORTED = $(TESTREPORT) -require-tests -allow-no-tests '/test/bench$$' -- $(GO_TEST) -json

.PHONY: test
test: verify-gen verify-tidy verify-imports vet lint test-assets e2e-assets release $(TESTREPORT) $(PROMTOOL) $(PROMETHEUS) $(HELM) $(PREVIOUS_MANAGER) ## Everything on Kubernetes KUBE_VERSION (default the newest): generated files, go.mod tidy, vet, lint, then all tests (unit, envtest, e2e).
	@echo "Testing on Kubernetes $(KUBE_VERSION) (etcd $(ETCD_VERSION))"
	@$(PROGRESS) "Running the unit, envtest and other suites with -race (~5 min; a line per package as it ends)" -- \
		$(GO_TEST_REPORTED) $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) $(GO_PACKAGES_BUT_E2E)
	@$(PROGRESS) "Running the seeded simulation (40 seeds, ~1 min)" -- $(SIM_TEST)
	@$(PROGRESS) "Running the end-to-end suite (~6 min)" -- $(GO_TEST_REPORTED) $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) ./test/e2e/

.PHONY: test-kube
test-kube: test-assets e2e-assets $(TESTREPORT) $(PROMETHEUS) $(HELM) $(PREVIOUS_MANAGER) ## Only the suites that run a control plane (envtest, templates, e2e), on KUBE_VERSION: make test-kube KUBE_VERSION=v1.33.4; RUN=regexp picks e2e tests.
	@echo "Testing on Kubernetes $(KUBE_VERSION) (etcd $(ETCD_VERSION))"
	@$(PROGRESS) "Running the suites that start a control plane (~3 min)" -- \
		$(GO_TEST_REPORTED) $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) $(CONTROL_PLANE_PACKAGES_BUT_E2E)
	@$(PROGRESS) "Running the end-to-end suite$(if $(RUN), (the tests RUN picks))" -- \
		$(GO_TEST_REPORTED) $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) $(if $(RUN),-run '$(RUN)') ./test/e2e/

# On the oldest Kubernetes, CI runs the end-to-end tests whose outcome depends on the API
# server's version beyond what the envtest suites show: installing, upgrading, moving and
# taking over with clusterctl and Helm, and a claim's life through the real processes.
# The scenarios (chaos, MetalLB, Prometheus, the quickstart) exercise the provider's own
# logic and run on the newest: ~6 minutes less on every run. make test-kube without RUN
# runs them all.
E2E_ON_OLDEST := ^Test(Init|Clusterctl|HelmChart|ChartUpgrades|WorkloadFlavour|ClaimsOfACluster|ClaimWithoutCluster|ExhaustedZone)

.PHONY: ci
ci: ## What CI runs (.ci/run): make test on the newest Kubernetes and make test-node (as root), then make test-kube on the oldest (its e2e tests of installs, upgrades and claims).
	$(MAKE) test KUBE_VERSION=$(KUBE_VERSION_NEWEST)
	$(MAKE) test-node KUBE_VERSION=$(KUBE_VERSION_NEWEST)
	$(MAKE) test-kube KUBE_VERSION=$(KUBE_VERSION_OLDEST) RUN='$(E2E_ON_OLDEST)'

.PHONY: test-unit
test-unit: $(TESTREPORT) $(PROMTOOL) $(HELM) $(CLUSTERCTL) release ## Only the fast tier: tests that start no control plane (seconds; builds promtool, Helm and clusterctl once), and the seeded simulation.
	$(GO_TEST_REPORTED) $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) $(UNIT_PACKAGES)
	$(SIM_TEST)

.PHONY: test-go
test-go: test-assets e2e-assets release $(TESTREPORT) $(PROMTOOL) $(PROMETHEUS) $(HELM) $(PREVIOUS_MANAGER) ## All Go tests, without the generation and lint checks of make test.
	$(GO_TEST_REPORTED) $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) $(GO_PACKAGES_BUT_E2E)
	$(SIM_TEST)
	$(GO_TEST_REPORTED) $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) ./test/e2e/

FUZZTIME ?= 30s
.PHONY: fuzz
fuzz: ## Fuzz every parser of outside input for FUZZTIME each (default 30s); make test runs their seed corpora. Failing inputs land in testdata/fuzz.
	@hack/fuzz.sh $(FUZZTIME)

CHAOS_FUZZTIME ?= 30s
# How many seeds make test-chaos runs through the simulation (make test: its fixed 40).
CHAOS_SIM_SEEDS ?= 500
# The commit the chaos table is measured on ("-dirty" when the work tree has changes).
CHAOS_COMMIT = $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
.PHONY: test-chaos
test-chaos: test-assets e2e-assets $(PROMETHEUS) $(HELM) $(PREVIOUS_MANAGER) ## Every fuzz target for CHAOS_FUZZTIME, then the chaos scenarios at full size (make test runs them short); their table, with the commit, goes to out/chaos/summary.md, a row for every scenario, failed or not.
	@$(PROGRESS) "Fuzzing every parser of outside input for $(CHAOS_FUZZTIME) each" -- $(MAKE) --no-print-directory fuzz FUZZTIME=$(CHAOS_FUZZTIME)
	@rm -f $(ROOT)/out/chaos/rows.jsonl
	@export E2E_CHAOS=full CHAOS_ROWS=$(ROOT)/out/chaos/rows.jsonl CHAOS_COMMIT=$(CHAOS_COMMIT); status=0; \
	$(PROGRESS) "Running the clock-jump scenarios at full size (envtest, injected clock)" -- \
		$(GO_TEST) -count=1 -timeout 20m -v -run '^TestClock' ./internal/controllers/ || status=1; \
	$(PROGRESS) "Running the seeded simulation on $(CHAOS_SIM_SEEDS) seeds" -- \
		env SIM_SEEDS=$(CHAOS_SIM_SEEDS) $(GO_TEST) -count=1 -timeout 60m -v -run '^TestSimulation$$$$' ./test/simulation/ || status=1; \
	$(PROGRESS) "Running the chaos scenarios at full size (processes: control plane, manager replicas, stand-in)" -- \
		env E2E_CHAOS_SUMMARY=$(ROOT)/out/chaos/summary.md $(GO_TEST) -count=1 -timeout 60m -v -run '^TestChaos' ./test/e2e/ || status=1; \
	exit $$status

.PHONY: test-e2e
test-e2e: test-assets e2e-assets $(PROMETHEUS) $(HELM) $(PREVIOUS_MANAGER) ## Only the end-to-end tests (clusterctl, manager process, control planes); RUN=regexp picks some.
	$(GO_TEST) -count=1 -timeout $(TEST_TIMEOUT) -v $(if $(RUN),-run '$(RUN)') ./test/e2e/

# The node: a kubelet and kube-proxy of KUBE_VERSION_NEWEST, containerd, runc and nft
# from Debian's packages, the CNI plugins and the images it runs (see test/node).
KUBELET := $(BIN)/k8s/$(KUBE_VERSION_NEWEST)/kubelet
KUBE_PROXY := $(BIN)/k8s/$(KUBE_VERSION_NEWEST)/kube-proxy
KUBE_SCHEDULER := $(BIN)/k8s/$(KUBE_VERSION_NEWEST)/kube-scheduler
CNI_DIR := $(BIN)/cni
CNI_PLUGINS := $(addprefix $(CNI_DIR)/,bridge host-local loopback portmap)
PAUSE_IMAGE := $(BIN)/images/pause.tar
METALLB_SPEAKER := $(BIN)/metallb-speaker
METALLB_VERSION = $(shell cd hack/tools/metallb && go list -m -f '{{.Version}}' go.universe.tf/metallb)
METALLB_MANIFEST := $(BIN)/metallb-native.yaml
# The node's binaries are of the newest version, whatever KUBE_VERSION says.
NODE_LDFLAGS := $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(p).gitVersion=$(KUBE_VERSION_NEWEST) -X $(p).gitMajor=1 -X $(p).gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION_NEWEST))))
METALLB_IMAGES := $(BIN)/images/metallb-controller.tar $(BIN)/images/metallb-speaker.tar
# cert-manager of the version whose CRDs the offline repository ships: one binary
# (hack/tools/cert-manager/node) in three images with cert-manager's names, and its chart.
CERT_MANAGER := $(BIN)/cert-manager
CERT_MANAGER_VERSION = $(shell cd hack/tools/cert-manager && go list -m -f '{{.Version}}' github.com/cert-manager/cert-manager)
CERT_MANAGER_IMAGES := $(addprefix $(BIN)/images/cert-manager-,controller.tar webhook.tar cainjector.tar)
CERT_MANAGER_CHART := $(BIN)/cert-manager-chart
# The previous release's image, for clusterctl upgrade on the node.
PREVIOUS_IMAGE := $(BIN)/images/manager-$(PREVIOUS_VERSION).tar
export E2E_KUBELET := $(KUBELET)
export E2E_KUBE_PROXY := $(KUBE_PROXY)
export E2E_CNI := $(CNI_DIR)
export E2E_IMAGES := $(IMAGE_ARCHIVE) $(PREVIOUS_IMAGE) $(PAUSE_IMAGE) $(METALLB_IMAGES) $(CERT_MANAGER_IMAGES)
export E2E_METALLB_MANIFEST := $(METALLB_MANIFEST)
export E2E_CERT_MANAGER_CHART := $(CERT_MANAGER_CHART)

.PHONY: test-node
test-node: test-assets node-assets e2e-assets $(HELM) $(TESTREPORT) ## The tests on a node (kubelet, containerd, kube-proxy: the shipped image in Pods, Helm, MetalLB announcing) on the newest Kubernetes; as root, in network namespaces of their own; RUN=regexp picks some.
	@[[ "$(KUBE_VERSION)" == "$(KUBE_VERSION_NEWEST)" ]] || { echo "make test-node runs on Kubernetes $(KUBE_VERSION_NEWEST) only (KUBE_VERSION=$(KUBE_VERSION))" >&2; exit 1; }
	@$(PROGRESS) "Running the node suite (~4.5 min)" -- env KUBEBUILDER_ASSETS=$(BIN)/k8s/$(KUBE_VERSION_NEWEST) \
		$(TESTREPORT) -require-tests -times -- $(GO_TEST) -json -count=1 -timeout 20m $(if $(RUN),-run '$(RUN)') ./test/node/

.PHONY: node-assets
node-assets: image $(KUBELET) $(KUBE_PROXY) $(KUBE_SCHEDULER) $(CNI_PLUGINS) $(PAUSE_IMAGE) $(METALLB_IMAGES) $(METALLB_MANIFEST) $(CERT_MANAGER_IMAGES) $(CERT_MANAGER_CHART) $(PREVIOUS_IMAGE) ## Build what the node runs: kube-scheduler, kubelet, kube-proxy, CNI plugins, images (the manager's and its previous release's, pause, MetalLB's, cert-manager's) and cert-manager's chart; install containerd, runc and nft from Debian's packages if missing.
	@hack/node-packages.sh

.PHONY: test-assets
test-assets: $(TEST_ASSETS) ## Build kube-apiserver, kube-controller-manager and etcd into bin/ (cached).

.PHONY: e2e-assets
e2e-assets: build local-repository $(CLUSTERCTL) $(METALLB) ## Build what test/e2e and the quickstart run: binaries, release, clusterctl repository, MetalLB's controller (test/e2e also runs Prometheus: $(PROMETHEUS)).

##@ Tools (cached in bin/)

$(CONTROLLER_GEN): hack/tools/controller-gen/go.mod
	@cd hack/tools/controller-gen && $(PROGRESS) "Building controller-gen from source into bin/ (first run only, ~1 min)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS)" -o $@ sigs.k8s.io/controller-tools/cmd/controller-gen

$(GOLANGCI_LINT): hack/tools/golangci-lint/go.mod
	@cd hack/tools/golangci-lint && $(PROGRESS) "Building golangci-lint from source into bin/ (first run only, ~3 min)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS)" -o $@ github.com/golangci/golangci-lint/v2/cmd/golangci-lint

$(KUSTOMIZE): hack/tools/kustomize/go.mod
	@cd hack/tools/kustomize && $(PROGRESS) "Building kustomize from source into bin/ (first run only, ~1 min)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS)" -o $@ sigs.k8s.io/kustomize/kustomize/v5

# clusterctl reports the Cluster API version it was pinned at (`clusterctl version`). Its
# module pins the dependencies this repository's go.mod has, and it is built as the
# manager is ($(GO_BUILD), -trimpath): from cold, they are compiled once for both.
CLUSTERCTL_VERSION = $(shell awk '$$1 == "require" && $$2 == "sigs.k8s.io/cluster-api" {print $$3}' hack/tools/clusterctl/go.mod)
$(CLUSTERCTL): hack/tools/clusterctl/go.mod
	@cd hack/tools/clusterctl && $(PROGRESS) "Building clusterctl $(CLUSTERCTL_VERSION) from source into bin/ (first run only, ~2 min)" -- $(GO_BUILD) build -trimpath -ldflags "$(TOOL_LDFLAGS) -X sigs.k8s.io/cluster-api/version.gitVersion=$(CLUSTERCTL_VERSION) \
		-X sigs.k8s.io/cluster-api/version.gitMajor=1 -X sigs.k8s.io/cluster-api/version.gitMinor=$(word 2,$(subst ., ,$(CLUSTERCTL_VERSION)))" \
		-o $@ sigs.k8s.io/cluster-api/cmd/clusterctl

# promtool and the Prometheus server without service discovery (Prometheus's own
# remove_all_sd build tag): the tests use static targets, and the cloud SDKs of the
# discovery plugins are most of a build from source.
PROMETHEUS_TAGS := remove_all_sd
$(PROMTOOL): hack/tools/prometheus/go.mod
	@cd hack/tools/prometheus && $(PROGRESS) "Building promtool from source into bin/ (first run only, ~4 min)" -- \
		$(GO_BUILD) build -trimpath -tags $(PROMETHEUS_TAGS) -ldflags "$(TOOL_LDFLAGS)" -o $@ github.com/prometheus/prometheus/cmd/promtool

# The Prometheus server (no web UI assets: the e2e tests use its HTTP API); it shares
# most of its build with promtool.
$(PROMETHEUS): hack/tools/prometheus/go.mod $(PROMTOOL)
	@cd hack/tools/prometheus && $(PROGRESS) "Building the Prometheus server from source into bin/ (first run only, ~2 min)" -- \
		$(GO_BUILD) build -trimpath -tags $(PROMETHEUS_TAGS) -ldflags "$(TOOL_LDFLAGS)" -o $@ github.com/prometheus/prometheus/cmd/prometheus

.PHONY: promtool
promtool: $(PROMTOOL) ## Build promtool into bin/ (cached): it unit-tests the alert rules.

# Helm, for the chart: lint and render in make test, package in make helm-package. Its tool
# module requires the versions hack/tools/prometheus has of the modules both build from
# (the higher of the two, in either go.mod): from cold, their 424 shared packages compile
# once. Keep them equal when either is raised.
HELM_VERSION = $(shell awk '$$1 == "require" && $$2 == "helm.sh/helm/v4" {print $$3}' hack/tools/helm/go.mod)
$(HELM): hack/tools/helm/go.mod
	@cd hack/tools/helm && $(PROGRESS) "Building Helm $(HELM_VERSION) from source into bin/ (first run only, ~2 min)" -- \
		$(GO_BUILD) build -trimpath -ldflags "$(TOOL_LDFLAGS) -X helm.sh/helm/v4/internal/version.version=$(HELM_VERSION)" -o $@ helm.sh/helm/v4/cmd/helm

.PHONY: helm-package
helm-package: $(HELM) ## Write the chart's archive to out/charts/, ready for helm push to an OCI registry.
	@mkdir -p $(CHART_DIR)
	$(HELM) package $(CHART) --version $(VERSION:v%=%) --app-version $(VERSION) -d $(CHART_DIR)

# Everything a release of VERSION carries, in one folder: what clusterctl reads (the
# components, metadata.yaml), the workload install, the templates, the chart's archive,
# and their SHA-256 sums. test/release checks it is complete and its versions agree.
RELEASE_ASSETS := $(ROOT)/out/release/$(VERSION)
export E2E_RELEASE_ASSETS := $(RELEASE_ASSETS)

.PHONY: release
release: release-manifests helm-package ## Write out/release/VERSION/: the components, metadata.yaml, templates, the chart archive and SHA256SUMS.
	@rm -rf $(RELEASE_ASSETS) && mkdir -p $(RELEASE_ASSETS)
	cp $(RELEASE_DIR)/ipam-components.yaml $(RELEASE_DIR)/ipam-components-workload.yaml $(RELEASE_DIR)/metadata.yaml templates/*.yaml \
		$(CHART_DIR)/cluster-api-ipam-provider-vitistack-$(VERSION:v%=%).tgz $(RELEASE_ASSETS)/
	cd $(RELEASE_ASSETS) && sha256sum $$(ls | grep -v '^SHA256SUMS$$') >SHA256SUMS

# The previous release (PREVIOUS_*), for the upgrade tests in test/e2e.
$(PREVIOUS_MANAGER): hack/previous-release.sh | $(KUSTOMIZE)
	@$(PROGRESS) "Building the previous release $(PREVIOUS_VERSION) from $(PREVIOUS_COMMIT) into bin/previous/ (first run only, ~2 min)" -- \
		env $(GO_BUILD_GC) hack/previous-release.sh $(PREVIOUS_COMMIT) $(PREVIOUS_VERSION) $(PREVIOUS_RELEASE) $(KUSTOMIZE)

.PHONY: previous-release
previous-release: $(PREVIOUS_MANAGER) ## Build the previous release (manager and manifests) from its commit into bin/previous/, for the upgrade tests.

# MetalLB's controller and its CRDs, for the end-to-end tests and the quickstart: the
# controller alone (no speaker: nothing needs announcing on loopback).
$(METALLB): hack/tools/metallb/go.mod
	@cd hack/tools/metallb && $(PROGRESS) "Building MetalLB's controller from source into bin/ (first run only, ~3 min)" -- \
		$(GO_BUILD) build -trimpath -ldflags "$(TOOL_LDFLAGS)" -o $@ go.universe.tf/metallb/controller
	@rm -rf $(METALLB_CRDS) && mkdir -p $(METALLB_CRDS) && \
		cp "$$(cd hack/tools/metallb && go list -m -f '{{.Dir}}' go.universe.tf/metallb)"/config/crd/bases/*.yaml $(METALLB_CRDS)/ && \
		chmod u+w $(METALLB_CRDS)/*.yaml

# The Cluster API in-cluster IPAM provider, the baseline of make bench-compare.
IPAM_INCLUSTER := $(BIN)/ipam-incluster
$(TESTREPORT): $(wildcard hack/testreport/*.go)
	$(GO_BUILD) build -trimpath -o $@ ./hack/testreport

$(IPAM_INCLUSTER): hack/tools/incluster/go.mod
	@cd hack/tools/incluster && $(PROGRESS) "Building the in-cluster IPAM provider from source into bin/ (first run only, ~2 min)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS)" -o $@ sigs.k8s.io/cluster-api-ipam-provider-in-cluster

$(ETCD): hack/tools/etcd/$(ETCD_VERSION)/go.mod
	@cd hack/tools/etcd/$(ETCD_VERSION) && $(PROGRESS) "Building etcd $(ETCD_VERSION) from source into bin/ (first run only, ~2 min)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS)" -o $@ go.etcd.io/etcd/server/v3

$(KUBE_APISERVER): hack/tools/kube/$(KUBE_VERSION)/go.mod
	@cd hack/tools/kube/$(KUBE_VERSION) && $(PROGRESS) "Building kube-apiserver $(KUBE_VERSION) from source into bin/ (first run only, ~6 min on 2 cores, with its module downloads more)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS) $(KUBE_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-apiserver

$(KUBECTL): hack/tools/kube/$(KUBE_VERSION)/go.mod
	@cd hack/tools/kube/$(KUBE_VERSION) && $(PROGRESS) "Building kubectl $(KUBE_VERSION) from source into bin/ (first run only, ~1 min)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS) $(KUBE_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kubectl

$(KUBELET): hack/tools/kube/$(KUBE_VERSION_NEWEST)/go.mod
	@cd hack/tools/kube/$(KUBE_VERSION_NEWEST) && $(PROGRESS) "Building kubelet $(KUBE_VERSION_NEWEST) from source into bin/ (first run only, ~4 min on 2 cores)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS) $(NODE_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kubelet

$(KUBE_PROXY): hack/tools/kube/$(KUBE_VERSION_NEWEST)/go.mod
	@cd hack/tools/kube/$(KUBE_VERSION_NEWEST) && $(PROGRESS) "Building kube-proxy $(KUBE_VERSION_NEWEST) from source into bin/ (first run only, ~1 min)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS) $(NODE_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-proxy

$(KUBE_SCHEDULER): hack/tools/kube/$(KUBE_VERSION_NEWEST)/go.mod
	@cd hack/tools/kube/$(KUBE_VERSION_NEWEST) && $(PROGRESS) "Building kube-scheduler $(KUBE_VERSION_NEWEST) from source into bin/ (first run only, ~1 min)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS) $(NODE_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-scheduler

$(CNI_DIR)/%: hack/tools/cni/go.mod
	@cd hack/tools/cni && $(PROGRESS) "Building the CNI plugin $* from source into bin/cni/ (first run only)" -- \
		$(GO_BUILD) build -trimpath -ldflags "$(TOOL_LDFLAGS)" -o $@ github.com/containernetworking/plugins/plugins/$(CNI_PATH_$*)
CNI_PATH_bridge := main/bridge
CNI_PATH_host-local := ipam/host-local
CNI_PATH_loopback := main/loopback
CNI_PATH_portmap := meta/portmap

# MetalLB's speaker, and both its images with MetalLB's own names, which its manifest
# (copied to bin/metallb-native.yaml) runs; the speaker as root, as MetalLB's image runs it.
$(METALLB_SPEAKER): hack/tools/metallb/go.mod
	@cd hack/tools/metallb && $(PROGRESS) "Building MetalLB's speaker from source into bin/ (first run only, ~1 min)" -- \
		$(GO_BUILD) build -trimpath -ldflags "$(TOOL_LDFLAGS)" -o $@ go.universe.tf/metallb/speaker

$(METALLB_MANIFEST): hack/tools/metallb/go.mod
	@cp "$$(cd hack/tools/metallb && go list -m -f '{{.Dir}}' go.universe.tf/metallb)"/config/manifests/metallb-native.yaml $@ && chmod u+w $@

$(BIN)/images/metallb-%.tar: $(BIN)/metallb-% $(wildcard hack/image/*.go)
	@mkdir -p $(BIN)/images
	$(GO_STATIC) run -trimpath ./hack/image --binary $< --entrypoint /$* $(if $(filter speaker,$*),--user 0:0) \
		--ca-certificates "" --tag quay.io/metallb/$*:$(METALLB_VERSION) --out $@

# cert-manager's controller, webhook and cainjector: one binary, which runs what its
# name says, in three images under cert-manager's names; its chart as cert-manager
# ships it, with the version set (the module's copy says v0.0.0).
$(CERT_MANAGER): hack/tools/cert-manager/go.mod $(wildcard hack/tools/cert-manager/node/*.go)
	@cd hack/tools/cert-manager && $(PROGRESS) "Building cert-manager's controller, webhook and cainjector from source into bin/ (first run only, ~1.5 min)" -- \
		$(GO_BUILD) build -trimpath -ldflags "$(TOOL_LDFLAGS)" -o $@ ./node

$(BIN)/images/cert-manager-%.tar: $(CERT_MANAGER) $(wildcard hack/image/*.go)
	@mkdir -p $(BIN)/images
	$(GO_STATIC) run -trimpath ./hack/image --binary $< --entrypoint /$* --ca-certificates "" \
		--tag quay.io/jetstack/cert-manager-$*:$(CERT_MANAGER_VERSION) --out $@

$(CERT_MANAGER_CHART): hack/tools/cert-manager/go.mod
	@rm -rf $@ && cp -r "$$(cd hack/tools/cert-manager && go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)"/deploy/charts/cert-manager $@ && \
		chmod -R u+w $@ && sed -i 's/^version: .*/version: $(CERT_MANAGER_VERSION)/; s/^appVersion: .*/appVersion: $(CERT_MANAGER_VERSION)/' $@/Chart.yaml

$(PREVIOUS_IMAGE): $(PREVIOUS_MANAGER) $(wildcard hack/image/*.go)
	@mkdir -p $(BIN)/images
	$(GO_STATIC) run -trimpath ./hack/image --binary $< --tag ghcr.io/vitistack/cluster-api-ipam-provider-vitistack:$(PREVIOUS_VERSION) --out $@

# The node's Pod sandbox image, from hack/pause.
$(PAUSE_IMAGE): $(wildcard hack/pause/*.go) $(wildcard hack/image/*.go)
	@mkdir -p $(BIN)/images
	$(GO_STATIC) build -trimpath -ldflags "-s -w" -o $(BIN)/images/pause ./hack/pause
	$(GO_STATIC) run -trimpath ./hack/image --binary $(BIN)/images/pause --entrypoint /pause --ca-certificates "" --tag registry.k8s.io/pause:3.10 --out $@

$(KUBE_CONTROLLER_MANAGER): hack/tools/kube/$(KUBE_VERSION)/go.mod
	@cd hack/tools/kube/$(KUBE_VERSION) && $(PROGRESS) "Building kube-controller-manager $(KUBE_VERSION) from source into bin/ (first run only, ~4 min on 2 cores)" -- \
		$(GO_BUILD) build -ldflags "$(TOOL_LDFLAGS) $(KUBE_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kube-controller-manager

.PHONY: tools
tools: $(CONTROLLER_GEN) $(GOLANGCI_LINT) $(KUSTOMIZE) $(CLUSTERCTL) $(HELM) test-assets ## Build every tool into bin/.

.PHONY: clean
clean: ## Remove build output (keeps the cached tools in bin/).
	rm -rf out

##@ Running locally

# QUICKSTART_FLAGS=--no-restart leaves a dead manager dead.
QUICKSTART_FLAGS ?=
.PHONY: quickstart
quickstart: ## Everything on this machine: control plane, clusterctl init --ipam vitistack, stand-in, manager (restarted when it dies), examples. Ctrl-C stops it.
	@hack/prerequisites.sh
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory test-assets e2e-assets; \
	$(BIN)/quickstart --built-in $$(( $$(date +%s) - start ))s --dir $(ROOT)/out/quickstart --templates $(ROOT)/templates $(QUICKSTART_FLAGS)

.PHONY: quickstart-node
quickstart-node: ## The provider as a cluster runs it, as root: a node (kubelet, containerd) in network namespaces of its own, cert-manager, clusterctl init (the image in a Pod), MetalLB announcing a Service to a client host. Ctrl-C stops it.
	@[[ $$(id -u) == 0 ]] || { echo "make quickstart-node needs root (network namespaces, mounts, cgroups): sudo make quickstart-node" >&2; exit 1; }
	@[[ "$(KUBE_VERSION)" == "$(KUBE_VERSION_NEWEST)" ]] || { echo "make quickstart-node runs on Kubernetes $(KUBE_VERSION_NEWEST) only (KUBE_VERSION=$(KUBE_VERSION))" >&2; exit 1; }
	@hack/prerequisites.sh
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory test-assets e2e-assets node-assets $(HELM); \
	KUBEBUILDER_ASSETS=$(BIN)/k8s/$(KUBE_VERSION_NEWEST) $(BIN)/quickstart --node --built-in $$(( $$(date +%s) - start ))s --dir $(ROOT)/out/quickstart-node

.PHONY: status
status: ## Claims (Ready, address, pool, age), LoadBalancer Services and pools of KUBECONFIG (default: the running quickstart's) in one table.
	@$(GO_BUILD) build -trimpath -o $(BIN)/quickstart ./hack/quickstart
	@KUBECONFIG="$${KUBECONFIG:-$(ROOT)/out/quickstart/quickstart/kubeconfig}" $(BIN)/quickstart status

.PHONY: run-sim
run-sim: ## Run the IPAM-API stand-in on 127.0.0.1:3000 (state in out/ipam-api-sim.json).
	mkdir -p out
	$(GO_STATIC) run -trimpath ./cmd/ipam-api-sim --listen 127.0.0.1:3000 --state-file out/ipam-api-sim.json --debug-listen 127.0.0.1:3001

.PHONY: install-crds
install-crds: ## Apply the CAPI IPAM and Cluster CRDs (v1beta2 only, as the workload install ships them) and this provider's CRDs to the current KUBECONFIG.
	kubectl apply -k config/services/capi-crds
	kubectl apply -k config/crd

.PHONY: run
run: ## Run the manager against the current KUBECONFIG and the stand-in, without webhooks.
	$(GO_STATIC) run -trimpath ./cmd/manager --ipam-api-url http://127.0.0.1:3000 --enable-webhooks=false \
		--default-secret-namespace default --insecure-diagnostics --diagnostics-address 127.0.0.1:8080

.PHONY: bench
bench: test-assets ## Benchmarks on a real control plane with the stand-in (not part of make test).
	$(GO_TEST) ./test/bench/ -run '^$$' -bench . -benchtime 20x -count 1

# make bench-compare: this provider against the in-cluster IPAM provider, on Kubernetes
# BENCH_KUBE_VERSION. Shorter: make bench-compare BENCH_N=200 BENCH_REPS=1 BENCH_QUIET=5s
# BENCH_FLAGS="--extra-n 0 --seq-n 0 --big-n 0" (go run ./test/bench/compare --help lists the flags).
BENCH_KUBE_VERSION ?= $(KUBE_VERSION_OLDEST)
BENCH_N ?= 200,1000,3000
BENCH_REPS ?= 3
BENCH_QUIET ?= 60s
BENCH_FLAGS ?=
.PHONY: bench-compare
bench-compare: build $(IPAM_INCLUSTER) ## Compare with the in-cluster IPAM provider v1.1.0 (fresh control planes; report in out/bench/compare.md; not part of make test).
	$(MAKE) test-assets KUBE_VERSION=$(BENCH_KUBE_VERSION)
	$(GO_STATIC) run -trimpath ./test/bench/compare --n $(BENCH_N) --reps $(BENCH_REPS) --quiet $(BENCH_QUIET) \
		--assets $(BIN)/k8s/$(BENCH_KUBE_VERSION) --manager $(MANAGER) --sim $(IPAM_API_SIM) --incluster $(IPAM_INCLUSTER) \
		--incluster-crds "$$(cd hack/tools/incluster && go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api-ipam-provider-in-cluster)/config/crd/bases" \
		--out $(ROOT)/out/bench/compare.md $(BENCH_FLAGS)
