//go:build forkvisor_tree

package main

import "gvisor.dev/gvisor/pkg/sentry/platform/systrap"

// The systrap stubs' programs exist only in the fork's tree (patch 0049).
func init() {
	targets["systrap"] = target{disabledConst: "stubPrecompilationDisabledAtBuildTime", programs: systrap.PrecompiledStubPrograms}
}
