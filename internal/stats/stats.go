// Package stats summarizes benchmark samples.
package stats

import "sort"

// Median returns the median of v (the mean of the two middle values for an
// even count), or 0 for no samples. v is not modified.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
