package backoff

import (
	"testing"
	"time"
)

func TestDoublingDoublesUpToTheCeiling(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{
		{0, time.Second},
		{1, time.Second},
		{2, 2 * time.Second},
		{3, 4 * time.Second},
		{5, 10 * time.Second},
		{1000, 10 * time.Second}, // no overflow however long the run
	} {
		if got := Doubling(time.Second, 10*time.Second, tc.n); got != tc.want {
			t.Errorf("Doubling(1s, 10s, %d) = %v, want %v", tc.n, got, tc.want)
		}
	}
	if got := Doubling(5*time.Second, time.Second, 1); got != time.Second {
		t.Errorf("a ceiling below the base caps the base: got %v", got)
	}
}

func TestJitterStaysWithinItsSpread(t *testing.T) {
	const d = 10 * time.Second
	lo, hi := d, d
	for range 10000 {
		got := Jitter(d, RetrySpread)
		if got < d/2 || got > d*3/2 {
			t.Fatalf("Jitter(10s, 0.5) = %v, outside [5s, 15s]", got)
		}
		lo, hi = min(lo, got), max(hi, got)
	}
	// 10,000 draws cover most of the range; a spread that collapsed to a
	// point, or to one side, fails here.
	if lo > 6*time.Second || hi < 14*time.Second {
		t.Errorf("Jitter(10s, 0.5) drew only [%v, %v]", lo, hi)
	}
	if got := Jitter(d, 0); got != d {
		t.Errorf("Jitter(10s, 0) = %v, want exactly 10s", got)
	}
	if got := Jitter(1, PollSpread); got != 1 {
		t.Errorf("Jitter of a wait too short to spread = %v, want it unchanged", got)
	}
}

func TestBackoffStartsOverAfterASuccess(t *testing.T) {
	b := Backoff{Base: time.Millisecond, Max: 4 * time.Millisecond}
	var got []time.Duration
	for range 4 {
		got = append(got, b.Failed())
	}
	want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 4 * time.Millisecond}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits %v, want %v", got, want)
		}
	}
	if n := b.Succeeded(); n != 4 {
		t.Errorf("Succeeded ended %d failures, want 4", n)
	}
	if n := b.Succeeded(); n != 0 {
		t.Errorf("a second Succeeded ended %d failures, want 0", n)
	}
	if d := b.Failed(); d != time.Millisecond {
		t.Errorf("first wait after a success = %v, want the base", d)
	}
}
