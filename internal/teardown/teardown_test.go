package teardown

import (
	"slices"
	"testing"
)

func TestRunLatestFirstOnce(t *testing.T) {
	var order []int
	for i := 1; i <= 3; i++ {
		Add(func() { order = append(order, i) })
	}
	Run()
	Run()
	if want := []int{3, 2, 1}; !slices.Equal(order, want) {
		t.Fatalf("clean-ups ran in the order %v, want %v, once each", order, want)
	}
}
