// Command seccompgen writes runsc's precompiled seccomp-bpf programs into a
// copy of a filter_precompiled.go, as gVisor's own (Bazel) build does: the Go
// module of gVisor ships those files with no programs, so every sandbox start
// and restore compiles its filters from scratch (about 60 ms for the sentry's
// and 25 ms for the gofer's on this machine). The Makefile builds runsc with
// the results as a build overlay (go build -overlay), for upstream's runsc and
// the fork's alike.
//
// Usage: seccompgen -for sentry|gofer|systrap -in TREE/.../FILE.go -out FILE
// (run in a module whose gvisor.dev/gvisor is TREE; tools/seccomp.sh). The
// sentry's file is runsc/boot/filter/filter_precompiled.go, the gofer's
// runsc/fsgofer/filter/filter_precompiled.go. With the build tag
// forkvisor_tree (TREE is the fork's), -for systrap writes the systrap
// stubs' programs of patch 0049 into
// pkg/sentry/platform/systrap/stub_seccomp_precompiled.go (systrap.go).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	sentryconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

// target is a file of precompiled programs that seccompgen writes.
type target struct {
	// disabledConst is the file's constant that says whether the build
	// precompiled its programs.
	disabledConst string
	// programs returns the programs to precompile.
	programs func() ([]precompiledseccomp.Program, error)
}

// targets are the files seccompgen writes, by -for.
var targets = map[string]target{
	"sentry": {disabledConst: "PrecompilationDisabledAtBuildTime", programs: sentryPrograms},
	// Every variant the gofer's configuration lists (host UDS, cgo,
	// directfs and lisafs on and off).
	"gofer": {disabledConst: "PrecompilationDisabledAtBuildTime", programs: goferconfig.PrecompiledPrograms},
}

func main() {
	which := flag.String("for", "sentry", "whose programs: sentry, gofer, or (built with -tags forkvisor_tree) systrap")
	in := flag.String("in", "", "filter_precompiled.go of the tree")
	out := flag.String("out", "", "where to write the file with the programs")
	flag.Parse()
	src, err := os.ReadFile(*in)
	if err != nil {
		fatal(err)
	}
	t, ok := targets[*which]
	if !ok {
		fatal(fmt.Errorf("-for %q: not a target of this build", *which))
	}
	programs, err := t.programs()
	if err != nil {
		fatal(err)
	}
	gen, err := generate(string(src), t.disabledConst, programs)
	if err != nil {
		fatal(fmt.Errorf("%s: %w", *in, err))
	}
	if err := os.WriteFile(*out, []byte(gen), 0o644); err != nil {
		fatal(err)
	}
	fmt.Fprintf(os.Stderr, "seccompgen: %d %s programs in %s\n", len(programs), *which, *out)
}

// sentryPrograms returns the sentry's programs to precompile. Device
// proxies (nvproxy, tpuproxy, rdmaproxy) multiply the variants by dozens; a
// sandbox that uses one compiles its filter at start, as before.
func sentryPrograms() ([]precompiledseccomp.Program, error) {
	all, err := sentryconfig.PrecompiledPrograms()
	if err != nil {
		return nil, err
	}
	var programs []precompiledseccomp.Program
	for _, p := range all {
		if strings.Contains(p.Name, "NVProxy=false") && strings.Contains(p.Name, "TPUProxy=false") && strings.Contains(p.Name, "RDMAProxy=false") {
			programs = append(programs, p)
		}
	}
	return programs, nil
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "seccompgen: %v\n", err)
	os.Exit(1)
}
