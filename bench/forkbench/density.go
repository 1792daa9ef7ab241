package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/forkvisor/forkvisor/internal/memstat"
	"github.com/forkvisor/forkvisor/internal/sandbox"
)

// DensityResult is one runtime's density ceiling: clones of one parked
// sandbox added one at a time until their total memory passes a budget.
type DensityResult struct {
	Runtime   string `json:"runtime"`
	HeapMiB   int    `json:"heap_mib"`
	BudgetMiB int    `json:"budget_mib"`
	// Clones is the most clones whose total Pss stayed within the budget
	// (MaxClones if the budget was never passed).
	Clones    int `json:"clones"`
	MaxClones int `json:"max_clones"`
	// PssMiB[i] is the total Pss with i+1 clones.
	PssMiB []float64 `json:"pss_mib"`
	// MarginalMiB is what each clone after the first added, on average;
	// ClonesPerGiB is 1024 / MarginalMiB: clones per GiB beyond the first.
	MarginalMiB  float64 `json:"marginal_mib"`
	ClonesPerGiB float64 `json:"clones_per_gib"`
	// PerCloneByKindMiB is the total Pss by kind of memory (memstat.Kind*)
	// at the last count, divided by the number of clones.
	PerCloneByKindMiB map[string]float64 `json:"per_clone_by_kind_mib"`
}

// density parks a heapMiB tick workload with each runtime and restores
// clones of it one at a time until the group's total Pss passes budgetMiB
// or maxClones run. The clones idle: a tick a second, reading 8 MiB of
// their heap; the first reads its whole heap before the next one starts, so
// that the image's pages (forkvisor: the base's) are counted once, and the
// group is measured after each clone's first tick.
func density(dir string, runtimes []runtimeConfig, heapMiB, budgetMiB, maxClones int) []DensityResult {
	return eachRuntime(dir, "density", runtimes, func(base string, rt runtimeConfig) DensityResult {
		return densityOne(base, rt, heapMiB, budgetMiB, maxClones)
	})
}

func densityOne(base string, rt runtimeConfig, heapMiB, budgetMiB, maxClones int) DensityResult {
	// Idle clones: a tick a second, reading 8 MiB of the heap each.
	const checkMiB = 8
	p := parkTick(base, "density", rt, "-mib", fmt.Sprint(heapMiB), "-interval", "1s", "-check-mib", fmt.Sprint(checkMiB))
	r := p.r
	defer os.RemoveAll(base)
	defer r.Cleanup()

	res := DensityResult{Runtime: rt.name, HeapMiB: heapMiB, BudgetMiB: budgetMiB, MaxClones: maxClones, Clones: maxClones}
	var ids []string
	var m sandbox.FleetMemory
	for i := 0; i < maxClones; i++ {
		id, out := fmt.Sprintf("clone%d", i), filepath.Join(base, fmt.Sprintf("clone%d.out", i))
		_, _, err := r.RestoreFirstTick(p.bundle, id, p.image, out, rt.restoreArgs...)
		must(err)
		ids = append(ids, id)
		if i == 0 {
			// The first clone reads its whole heap, so that every page
			// of the image (for forkvisor, of the base) is counted once;
			// later clones idle after their first tick.
			waitFullPass(out, heapMiB, checkMiB)
		}
		m, err = r.Memory(ids...)
		must(err)
		pss := float64(m.All.Total()) / 1024
		res.PssMiB = append(res.PssMiB, pss)
		if pss > float64(budgetMiB) {
			res.Clones = i
			break
		}
	}
	if n := len(res.PssMiB); n > 1 {
		res.MarginalMiB = (res.PssMiB[n-1] - res.PssMiB[0]) / float64(n-1)
		res.ClonesPerGiB = 1024 / res.MarginalMiB
	}
	res.PerCloneByKindMiB = kindsMiB(m.ByKind, len(ids))
	return res
}

func printDensity(results []DensityResult) {
	if len(results) == 0 {
		return
	}
	r0 := results[0]
	fmt.Printf("\ndensity: clones of one parked %d MiB sandbox added until their total memory passes %d MiB (at most %d)\n", r0.HeapMiB, r0.BudgetMiB, r0.MaxClones)
	fmt.Printf("%-11s %7s %10s %13s %13s   %10s %10s %10s %10s %10s  (per clone at the last count, MiB)\n", "runtime", "clones", "first_MiB", "marginal_MiB", "clones/GiB",
		memstat.KindGuest, memstat.KindBase, memstat.KindPlatform, memstat.KindAnon, memstat.KindFile)
	for _, r := range results {
		clones := fmt.Sprint(r.Clones)
		if r.Clones == r.MaxClones {
			clones = ">=" + clones // the budget was not reached
		}
		fmt.Printf("%-11s %7s %10.1f %13.1f %13.1f   %s\n", r.Runtime, clones, r.PssMiB[0], r.MarginalMiB, r.ClonesPerGiB, kindColumns(r.PerCloneByKindMiB))
	}
}
