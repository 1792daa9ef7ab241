# forkvisor: gVisor's runsc as a patch series over the pinned upstream module.
# See README.md for the two commands that matter (make demo, make test).

SHELL := /bin/bash
PIN := $(shell cat tools/PIN)
TREE := build/gvisor
GO ?= go
GOBUILD := CGO_ENABLED=0 $(GO) build -trimpath
UPSTREAM_DIR = $(shell GOFLAGS=-mod=mod $(GO) mod download -json gvisor.dev/gvisor@$(PIN) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p')
# Fork packages whose tests are ours (upstream ships no *_test.go files).
FORK_TEST_PKGS := ./pkg/sentry/pgalloc/

.PHONY: all tree patches check-patches runsc runsc-upstream test test-fork test-harness vet demo flatten-table bench clean

all: runsc runsc-upstream

# Materialize build/gvisor: upstream at the pin + patches/series.
tree:
	tools/tree.sh

$(TREE)/go.mod:
	tools/tree.sh

# Re-export patches/ from the commits in build/gvisor.
patches:
	tools/export-patches.sh

# The series applies to pristine upstream and re-exports byte-identically.
check-patches:
	tools/check-patches.sh

runsc: $(TREE)/go.mod
	cd $(TREE) && $(GOBUILD) -o $(CURDIR)/bin/runsc ./runsc

runsc-upstream:
	cd "$(UPSTREAM_DIR)" && $(GOBUILD) -o $(CURDIR)/bin/runsc-upstream ./runsc

vet:
	$(GO) vet ./...

test-fork: $(TREE)/go.mod
	cd $(TREE) && $(GO) test -count=1 $(FORK_TEST_PKGS)

test-harness: $(TREE)/go.mod
	$(GO) test -count=1 ./...

# Everything CI runs: patch hygiene, the fork's tests, the harness's tests
# (which need bin/runsc and bin/runsc-upstream for the sandbox tests).
test: check-patches tree all vet test-fork test-harness

# The pgalloc flatten table: N clones restored over one base.
flatten-table: $(TREE)/go.mod
	tools/flatten-table.sh 8 16 32

demo: flatten-table

bench: flatten-table

clean:
	rm -rf build bin
