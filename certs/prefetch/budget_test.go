package prefetch

import (
	"testing"
	"time"
)

func TestBudget(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	type step struct {
		at       time.Duration // after t0
		name     string
		wantWait time.Duration // 0: spent
	}
	for _, tc := range []struct {
		name               string
		perHour, perDomain int
		steps              []step
	}{
		{
			name: "a full bucket gives perHour orders at once, then one per 3600/perHour seconds", perHour: 2, perDomain: 100,
			steps: []step{
				{0, "a.one.test", 0},
				{0, "b.two.test", 0},
				{0, "c.three.test", 30*time.Minute + time.Millisecond},
				{30 * time.Minute, "c.three.test", 0},
				{30 * time.Minute, "d.four.test", 30*time.Minute + time.Millisecond},
			},
		},
		{
			name: "a registered domain gets perDomain orders in any seven days", perHour: 100, perDomain: 2,
			steps: []step{
				{0, "a.shop.example.com", 0},
				{time.Hour, "b.shop.example.com", 0},
				{2 * time.Hour, "c.example.com", 7*24*time.Hour - 2*time.Hour},
				{2 * time.Hour, "other.example.org", 0},
				{7 * 24 * time.Hour, "c.example.com", 0},
				{7 * 24 * time.Hour, "d.example.com", time.Hour},
			},
		},
		{
			name: "a name under a public suffix counts against its own registered domain", perHour: 100, perDomain: 1,
			steps: []step{
				{0, "alice.github.io", 0},
				{0, "bob.github.io", 0},
				{0, "www.bob.github.io", 7 * 24 * time.Hour},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBudget(tc.perHour, tc.perDomain, t0)
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				got := b.take(s.name, now)
				if got != s.wantWait {
					t.Fatalf("step %d: take(%q) at +%v = %v, want %v", i, s.name, s.at, got, s.wantWait)
				}
				if got == 0 {
					b.spend(s.name, now)
				}
			}
		})
	}
}

func TestBudgetShares(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	b := newBudget(2, 100, t0)
	if d := b.take("a.test", t0); d != 0 {
		t.Fatalf("first take = %v, want 0", d)
	}
	if d := b.take("b.test", t0); d != 0 {
		t.Fatalf("second take = %v, want 0", d)
	}
	if d := b.take("c.test", t0); d != shareWait {
		t.Fatalf("take with the bucket's two orders taken = %v, want %v (names at work hold them)", d, shareWait)
	}
	b.giveBack("a.test")
	if d := b.take("c.test", t0); d != 0 {
		t.Fatalf("take after a share came back = %v, want 0", d)
	}
	b.spend("b.test", t0)
	b.spend("c.test", t0)
	if got := b.remaining(t0); got != 0 {
		t.Errorf("remaining after two orders = %v, want 0", got)
	}
	if d := b.take("d.test", t0); d != 30*time.Minute+time.Millisecond {
		t.Errorf("take with the bucket empty = %v, want 30m0.001s", d)
	}
}

func TestBudgetAdmit(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	b := newBudget(100, 2, t0)
	if d := b.take("a.example.com", t0); d != 0 {
		t.Fatalf("take = %v, want 0", d)
	}
	// One order recorded by another edge a day ago: room for this one.
	elsewhere := []time.Time{t0.Add(-24 * time.Hour)}
	if d := b.admit("a.example.com", elsewhere, t0); d != 0 {
		t.Fatalf("admit with one of two recorded = %v, want 0", d)
	}
	b.spend("a.example.com", t0)
	// Its own order comes back from storage too: counted once.
	recorded := append(elsewhere, t0)
	if d := b.take("b.example.com", t0); d != 6*24*time.Hour {
		t.Fatalf("take with the week full = %v, want 144h", d)
	}
	b2 := newBudget(100, 2, t0) // after a restart
	if d := b2.take("b.example.com", t0); d != 0 {
		t.Fatalf("take after a restart = %v, want 0 (nothing known yet)", d)
	}
	if d := b2.admit("b.example.com", recorded, t0); d != 6*24*time.Hour {
		t.Errorf("admit after a restart with the week recorded = %v, want 144h", d)
	}
	b2.giveBack("b.example.com")
	if d := b2.take("c.example.com", t0.Add(time.Hour)); d != 6*24*time.Hour-time.Hour {
		t.Errorf("take once the recorded week is known = %v, want 143h", d)
	}
}
