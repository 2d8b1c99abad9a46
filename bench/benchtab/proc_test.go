package main

import (
	"os"
	"slices"
	"testing"
)

// testdata/proc is a recorded-shape /proc: 100 (nginx master, two
// threads) → 103 (a worker whose name holds spaces and parentheses) → 107,
// and 200, unrelated.
var fakeProc = procFS{Dir: "testdata/proc"}

func TestTree(t *testing.T) {
	tests := []struct {
		name string
		root int
		want []int
	}{
		{"a master's tree holds its workers and their children", 100, []int{100, 103, 107}},
		{"a leaf is its own tree", 107, []int{107}},
		{"a pid that is not there is still its own tree", 999, []int{999}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := fakeProc.Tree(tt.root)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Tree(%d) = %v, want %v", tt.root, got, tt.want)
			}
		})
	}
}

func TestSample(t *testing.T) {
	tests := []struct {
		name string
		pids []int
		want Sample
	}{
		{"every thread's context switches and every process's figures are summed", []int{100, 103, 107},
			Sample{CPUTicks: 50 + 25 + 300 + 100 + 1 + 1, CtxSwitches: 5 + 1 + 7 + 2 + 40 + 4 + 1, RWSyscalls: 10 + 20 + 1000 + 2000,
				RSSKiB: 2048 + 1024 + 512, HWMKiB: 4096 + 3072 + 512}},
		{"a process that has gone counts as zero", []int{107, 4242}, Sample{CPUTicks: 2, CtxSwitches: 1, RSSKiB: 512, HWMKiB: 512}},
		{"no process, no figures", nil, Sample{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fakeProc.Sample(tt.pids); got != tt.want {
				t.Errorf("Sample(%v) = %+v, want %+v", tt.pids, got, tt.want)
			}
		})
	}
}

// TestSampleLive reads this test's own process from the real /proc: the
// fields the fixture imitates are where the kernel puts them.
func TestSampleLive(t *testing.T) {
	live := procFS{Dir: "/proc"}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	tree, err := live.Tree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if tree[0] != os.Getpid() {
		t.Fatalf("Tree(self) = %v, want it to start with %d", tree, os.Getpid())
	}
	before := live.Sample([]int{os.Getpid()})
	// Burn CPU until the kernel has charged at least one tick, bounded.
	x := 0
	for i := 0; i < 5e9 && live.Sample([]int{os.Getpid()}).CPUTicks == before.CPUTicks; i++ {
		x += i
	}
	after := live.Sample([]int{os.Getpid()})
	if after.CPUTicks <= before.CPUTicks {
		t.Errorf("CPU ticks did not grow: %d then %d", before.CPUTicks, after.CPUTicks)
	}
	if after.RSSKiB <= 0 || after.HWMKiB < after.RSSKiB {
		t.Errorf("RSS %d KiB, peak %d KiB: want 0 < RSS <= peak", after.RSSKiB, after.HWMKiB)
	}
	if after.CtxSwitches <= 0 {
		t.Errorf("context switches = %d, want > 0", after.CtxSwitches)
	}
}
