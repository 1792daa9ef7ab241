// Command seccompgen writes runsc's precompiled seccomp-bpf programs into a
// copy of a filter_precompiled.go, as gVisor's own (Bazel) build does: the Go
// module of gVisor ships those files with no programs, so every sandbox start
// and restore compiles its filters from scratch (about 60 ms for the sentry's
// and 25 ms for the gofer's on this machine). The Makefile builds runsc with
// the results as a build overlay (go build -overlay), for upstream's runsc and
// the fork's alike.
//
// Usage: seccompgen -for sentry|gofer -in TREE/.../filter_precompiled.go -out FILE
// (run in a module whose gvisor.dev/gvisor is TREE; tools/seccomp.sh). The
// sentry's file is runsc/boot/filter/filter_precompiled.go, the gofer's
// runsc/fsgofer/filter/filter_precompiled.go.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/forkvisor/forkvisor/tools/precompiledfile"
	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	sentryconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

// disabledConst is the constant of the sentry's and the gofer's files that
// says whether the build precompiled their programs.
const disabledConst = "PrecompilationDisabledAtBuildTime"

func main() {
	which := flag.String("for", "sentry", "whose programs: sentry or gofer")
	in := flag.String("in", "", "filter_precompiled.go of the tree")
	out := flag.String("out", "", "where to write the file with the programs")
	flag.Parse()
	src, err := os.ReadFile(*in)
	if err != nil {
		fatal(err)
	}
	programs, err := precompiled(*which)
	if err != nil {
		fatal(err)
	}
	gen, err := precompiledfile.Generate("tools/seccompgen", string(src), disabledConst, programs)
	if err != nil {
		fatal(fmt.Errorf("%s: %w", *in, err))
	}
	if err := os.WriteFile(*out, []byte(gen), 0o644); err != nil {
		fatal(err)
	}
	fmt.Fprintf(os.Stderr, "seccompgen: %d %s programs in %s\n", len(programs), *which, *out)
}

// precompiled returns the programs to precompile for which.
func precompiled(which string) ([]precompiledseccomp.Program, error) {
	switch which {
	case "sentry":
		all, err := sentryconfig.PrecompiledPrograms()
		if err != nil {
			return nil, err
		}
		// Device proxies (nvproxy, tpuproxy, rdmaproxy) multiply the
		// variants by dozens; a sandbox that uses one compiles its filter
		// at start, as before.
		var programs []precompiledseccomp.Program
		for _, p := range all {
			if strings.Contains(p.Name, "NVProxy=false") && strings.Contains(p.Name, "TPUProxy=false") && strings.Contains(p.Name, "RDMAProxy=false") {
				programs = append(programs, p)
			}
		}
		return programs, nil
	case "gofer":
		// Every variant the gofer's configuration lists (host UDS, cgo,
		// directfs and lisafs on and off).
		return goferconfig.PrecompiledPrograms()
	default:
		return nil, fmt.Errorf("-for %q: want sentry or gofer", which)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "seccompgen: %v\n", err)
	os.Exit(1)
}
