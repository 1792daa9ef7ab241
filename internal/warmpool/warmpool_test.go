package warmpool

import (
	"testing"
	"time"
)

func TestRefillWaitLocked(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name          string
		serving       int
		servedAgo     time.Duration // 0: never served
		deferredSince time.Duration // how long ago the deferral began; 0: none
		want          time.Duration
	}{
		{name: "never served, idle", want: 0},
		{name: "served long ago", servedAgo: time.Minute, want: 0},
		{name: "served just now", servedAgo: time.Millisecond, want: RefillDelay - time.Millisecond},
		{name: "served at the delay", servedAgo: RefillDelay, want: 0},
		{name: "request in progress", serving: 1, want: RefillDelay},
		{name: "request in progress, deferring for a while", serving: 2, deferredSince: maxRefillDeferral - 10*time.Millisecond, want: 10 * time.Millisecond},
		{name: "request in progress, deferred too long", serving: 1, deferredSince: maxRefillDeferral, want: 0},
		{name: "served just now, deferred too long", servedAgo: time.Millisecond, deferredSince: 2 * maxRefillDeferral, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Pool{serving: tc.serving}
			if tc.servedAgo > 0 {
				p.servedAt = now.Add(-tc.servedAgo)
			}
			if tc.deferredSince > 0 {
				p.deferredSince = now.Add(-tc.deferredSince)
			}
			if got := p.refillWaitLocked(now); got != tc.want {
				t.Errorf("refillWaitLocked = %v, want %v", got, tc.want)
			}
			if tc.want == 0 && !p.deferredSince.IsZero() {
				t.Errorf("a refill that may start now left the deferral begun at %v", p.deferredSince)
			}
			if tc.want > 0 && p.deferredSince.IsZero() {
				t.Errorf("a deferred refill did not record when its deferral began")
			}
		})
	}
}

// TestRefillDeferralEnds checks that requests that keep coming never defer a
// needed refill for more than maxRefillDeferral.
func TestRefillDeferralEnds(t *testing.T) {
	p := &Pool{}
	start := time.Unix(1000, 0)
	now := start
	for {
		// A request was served just now, every time the refiller looks.
		p.servedAt = now
		wait := p.refillWaitLocked(now)
		if wait == 0 {
			break
		}
		now = now.Add(wait)
		if now.Sub(start) > 2*maxRefillDeferral {
			t.Fatalf("still deferring after %v", now.Sub(start))
		}
	}
	if got := now.Sub(start); got < maxRefillDeferral || got > maxRefillDeferral+RefillDelay {
		t.Errorf("the refill started after %v of deferral, want %v", got, maxRefillDeferral)
	}
}
