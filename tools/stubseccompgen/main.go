//go:build forkvisor_tree

// Command stubseccompgen writes the systrap stubs' precompiled seccomp-bpf
// programs (systrap.PrecompiledStubPrograms) into a copy of the fork's
// pkg/sentry/platform/systrap/stub_seccomp_precompiled.go, which registers
// none as shipped, for a go build -overlay (tools/seccomp.sh). Without it,
// every sandbox compiles the three programs at start.
//
// Usage: stubseccompgen -in TREE/pkg/sentry/platform/systrap/stub_seccomp_precompiled.go -out FILE
// (run in a module whose gvisor.dev/gvisor is the fork's TREE; upstream's
// tree has no such file and no PrecompiledStubPrograms).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/forkvisor/forkvisor/tools/precompiledfile"
	"gvisor.dev/gvisor/pkg/sentry/platform/systrap"
)

// disabledConst is the file's constant that says whether the build
// precompiled the programs.
const disabledConst = "stubPrecompilationDisabledAtBuildTime"

func main() {
	in := flag.String("in", "", "stub_seccomp_precompiled.go of the tree")
	out := flag.String("out", "", "where to write the file with the programs")
	flag.Parse()
	src, err := os.ReadFile(*in)
	if err != nil {
		fatal(err)
	}
	programs, err := systrap.PrecompiledStubPrograms()
	if err != nil {
		fatal(err)
	}
	gen, err := precompiledfile.Generate("tools/stubseccompgen", string(src), disabledConst, programs)
	if err != nil {
		fatal(fmt.Errorf("%s: %w", *in, err))
	}
	if err := os.WriteFile(*out, []byte(gen), 0o644); err != nil {
		fatal(err)
	}
	fmt.Fprintf(os.Stderr, "stubseccompgen: %d systrap stub programs in %s\n", len(programs), *out)
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "stubseccompgen: %v\n", err)
	os.Exit(1)
}
