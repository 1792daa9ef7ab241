# forkvisor: gVisor's runsc as a patch series over the pinned upstream module.
# See README.md for the two commands that matter (make demo, make test).

SHELL := /bin/bash
# A pipeline fails if any command in it fails (go test | tools/test-summary.sh).
.SHELLFLAGS := -o pipefail -c
PIN := $(shell cat tools/PIN)
TREE := build/gvisor
GO ?= go
GOBUILD := CGO_ENABLED=0 $(GO) build -trimpath
UPSTREAM_DIR = $(shell GOFLAGS=-mod=mod $(GO) mod download -json gvisor.dev/gvisor@$(PIN) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p')
# Fork packages whose tests are ours: every package of the tree that holds
# a *_test.go file (upstream's module ships none), found when the recipe
# runs, so that no test of the fork is left out of make test.
FORK_TEST_PKGS = $(shell cd $(TREE) && find . -name '*_test.go' -printf '%h/\n' | sort -u)

.PHONY: oci setup all tree patches proto check-patches check-series runsc runsc-upstream tick cloneprobe kvserver clone-probe shim test test-fork test-harness vet demo flatten-table bench bench-phases bench-all faults fuzz clean

all: runsc runsc-upstream tick cloneprobe kvserver shim oci

# Machine set-up beyond Go (xfsprogs).
setup:
	tools/setup.sh

# Materialize build/gvisor: upstream at the pin + patches/series.
tree:
	tools/tree.sh
	touch $(STAMP)

# The tree is re-materialized whenever patches/ or the pin changed (tree.sh
# refuses to replace a tree holding work that patches/ does not carry).
STAMP := $(TREE)/.forkvisor-series
$(STAMP): tools/PIN patches/series $(wildcard patches/*.patch) tools/tree.sh
	tools/tree.sh
	touch $@

$(TREE)/go.mod: $(STAMP)

# Re-export patches/ from the commits in build/gvisor.
patches:
	tools/export-patches.sh

# Regenerate the Go code of the .proto files that the series adds to the
# tree (tools/protogen: protoc-gen-go pinned to upstream's release, no protoc).
proto: $(TREE)/go.mod
	tools/proto.sh

# The series applies to pristine upstream and re-exports byte-identically.
check-patches:
	tools/check-patches.sh

# Every prefix of the series builds (runsc, shim) and vets.
check-series: $(TREE)/go.mod
	tools/check-series.sh

# Both runsc binaries get the precompiled seccomp programs of the sentry and
# of the gofer as gVisor's own build does (tools/seccomp.sh; the Go module
# ships none, so a sandbox would compile both filters at every start and
# restore).
runsc: $(TREE)/go.mod
	tools/seccomp.sh $(TREE) fork
	cd $(TREE) && $(GOBUILD) -overlay=$(CURDIR)/build/seccomp/fork.json -o $(CURDIR)/bin/runsc ./runsc

# Upstream is built from a writable copy of the pinned module (an overlay
# may not replace files in the module cache); its source is not changed.
UPSTREAM_SRC := build/upstream
$(UPSTREAM_SRC)/.pin: tools/PIN
	rm -rf $(UPSTREAM_SRC) && mkdir -p $(UPSTREAM_SRC)
	cp -a "$(UPSTREAM_DIR)/." $(UPSTREAM_SRC)/ && chmod -R u+w $(UPSTREAM_SRC)
	cp tools/PIN $@

runsc-upstream: $(UPSTREAM_SRC)/.pin
	tools/seccomp.sh $(UPSTREAM_SRC) upstream
	cd $(UPSTREAM_SRC) && $(GOBUILD) -overlay=$(CURDIR)/build/seccomp/upstream.json -o $(CURDIR)/bin/runsc-upstream ./runsc

# The containerd shim, from the patched tree.
shim: $(TREE)/go.mod
	cd $(TREE) && $(GOBUILD) -o $(CURDIR)/bin/containerd-shim-runsc-v1 ./shim

# The registry companion: push and pull parked sandboxes (internal/ociartifact).
oci:
	$(GOBUILD) -o bin/forkvisor-oci ./cmd/forkvisor-oci

# The built-in workloads (static).
tick:
	$(GOBUILD) -o bin/tick ./test/workloads/tick

cloneprobe:
	$(GOBUILD) -o bin/cloneprobe ./test/workloads/cloneprobe

kvserver:
	$(GOBUILD) -o bin/kvserver ./test/workloads/kvserver

# The clone contract, upstream beside forkvisor (4 clones each).
clone-probe: all
	go run ./bench/cloneprobe

vet:
	$(GO) vet ./...
	cd tools/protogen && $(GO) vet .

# -timeout stays below CI's 90 minutes so that cleanups run; -v shows why a
# test skipped (outside CI; under CI=true a missing prerequisite fails).
# test-fork also runs the systrap stubs' program tests again with the
# generated file that bin/runsc is built with (tools/seccomp.sh), so that
# they render precompiled programs instead of compiling them.
test-fork: $(TREE)/go.mod
	cd $(TREE) && $(GO) test -count=1 -timeout 20m $(FORK_TEST_PKGS)
	tools/seccomp.sh $(TREE) fork
	cd $(TREE) && $(GO) test -count=1 -overlay=$(CURDIR)/build/seccomp/fork.json -run 'TestPrecompiledStubPrograms|TestStubProgramInstructions' ./pkg/sentry/platform/systrap/
	cd tools/protogen && $(GO) test -count=1 .
	$(MAKE) fuzz FUZZTIME=20000x

# Fuzz the decoders of the fork's formats (the seeds also run in test-fork
# as plain tests); make test runs 20000 inputs each, FUZZTIME (a count, Nx,
# or a duration) sets more.
FUZZTIME ?= 1000000x
FUZZ_TARGETS := pkg/sentry/pgalloc:FuzzDecodeSharedBaseSection pkg/sentry/pgalloc:FuzzDecodeExternalContentSection pkg/sentry/pgalloc:FuzzDecodeWriteSet runsc/sharedbase:FuzzParseDescriptor runsc/filestoreadopt:FuzzParseManifest runsc/sharedbase:FuzzParseImageFiles
fuzz: $(TREE)/go.mod
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($(FUZZTIME))"; \
		if ! (cd $(TREE) && $(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) ./$${t%%:*}/ > $(CURDIR)/build/fuzz.log 2>&1); then \
			cat build/fuzz.log; exit 1; fi; tail -1 build/fuzz.log; \
	done

test-harness: $(TREE)/go.mod
	$(GO) test -count=1 -timeout 45m -v ./... 2>&1 | tools/test-summary.sh

# Everything CI runs: patch hygiene (the series applies and re-exports,
# every prefix builds, vets and matches its .proto), the fork's tests, the
# harness's tests (which need bin/runsc and bin/runsc-upstream for the
# sandbox tests).
test: setup check-patches $(STAMP) check-series all vet test-fork test-harness

# The pgalloc flatten table: N = 1..32 clones restored over one base in one
# process (Rss, Pss, Private_Dirty), and its plot.
flatten-table: $(TREE)/go.mod
	$(GO) run ./bench/forkbench -scenarios flatten -json bench/out/flatten.json
	$(GO) run ./bench/plot bench/out/flatten.json

# The main job: park the built-in workload (256 MiB) with a shared base, fan
# out 8 clones, and print upstream runsc and forkvisor side by side.
demo: setup all
	$(GO) run ./bench/forkbench -scenarios clones256 -json bench/out/demo.json

# The fault matrix, long: tampered images and killed checkpoints, with
# FAULT_TRIALS trials per case (make test runs 3); prints one summary line
# per case. FAULT_SEED=N replays a run.
FAULT_TRIALS ?= 25
faults: setup all
	FAULT_TRIALS=$(FAULT_TRIALS) $(GO) test -count=1 -timeout 80m -v -run 'TestTamperedImageRefused|TestKilledSharedBaseCheckpoint|TestFilestoreKilledCheckpoint' ./test/e2e/ 2>&1 | tee build/faults.log | grep -E 'fault summary|FAULT_SEED|^(--- |ok|FAIL)'

# The benchmarks that fit in about 30 minutes here: readers
# and writers (30%, 100%, CPython) cloned over a shared base, a re-park,
# pre-started sandboxes (tick and CPython), a burst of 16 restores, the cost
# of verifying a base, the flatten curve and a 1 GiB base restored on a
# cold node lazily vs pulled whole; 3 repetitions of the clone
# scenarios, runtimes alternating; then the plots.
BENCH_SCENARIOS ?= clones256,writer30,writer100,cpython,repark,prestarted,prestarted-cpython,burst,verify,flatten,lazy
bench: setup all
	time $(GO) run ./bench/forkbench -scenarios $(BENCH_SCENARIOS) -repeat 3 -json bench/out/forkbench.json
	$(GO) run ./bench/plot bench/out/forkbench.json

# Where a restore's time goes, phase by phase, from runsc's debug logs of
# every runtime (debug logging slows every runtime alike, so these runs are
# apart from make bench's).
bench-phases: setup all
	rm -rf build/restore-logs
	$(GO) run ./bench/forkbench -scenarios clones256,cpython -repeat 1 -log-dir build/restore-logs -json bench/out/phases.json
	for s in clones256 cpython; do $(GO) run ./bench/restorephases build/restore-logs/$$s-upstream build/restore-logs/$$s-upstream-bg build/restore-logs/$$s-forkvisor || exit 1; done

# The long ones: every forkbench scenario (adds 2 GiB clones, writable
# layers, the registry, HTTP clones, parked storage, density and the KSM
# dedup curve), the same clone scenarios with a cold page cache and the
# restore phases.
bench-all: setup all bench-phases
	time $(GO) run ./bench/forkbench -repeat 3 -json bench/out/forkbench-all.json
	$(GO) run ./bench/plot bench/out/forkbench-all.json
	$(GO) run ./bench/forkbench -scenarios clones256,writer30,cpython -repeat 3 -cold -json bench/out/forkbench-cold.json

clean:
	rm -rf build bin
