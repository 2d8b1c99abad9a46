package admission

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Derive changes process-wide state (the Go memory limit, the descriptor
// soft limit): its tests do not run in parallel, and each puts back what it
// changed.

// keepGoMemoryLimit restores the Go memory limit when the test ends and
// returns it.
func keepGoMemoryLimit(t *testing.T) int64 {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	return prev
}

// cgroupRoot returns a fake cgroup mount holding files (path relative to
// the mount: content).
func cgroupRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func env(kv ...string) func(string) string {
	return func(k string) string {
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i] == k {
				return kv[i+1]
			}
		}
		return ""
	}
}

func softDescriptorLimit(t *testing.T) uint64 {
	t.Helper()
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	return r.Cur
}

const mib = 1 << 20

func TestDeriveSetsTheBudgetFromTheDescriptorAndMemoryLimits(t *testing.T) {
	const v1 = "memory/memory.limit_in_bytes"
	cases := []struct {
		name    string
		getenv  func(string) string
		goLimit int64 // the Go memory limit the runtime set at start from GOMEMLIMIT; 0: leave it
		cgroup  map[string]string
		want    Limits // overrides, as flags give them

		wantMemory int64
		wantSource string
		wantSetGo  bool // the Go memory limit was set to 90% of the cgroup's
		// The Go memory limit was set from the connection budget: no memory
		// limit is known and GOMEMLIMIT says nothing.
		wantBudgetGo bool
	}{
		{name: "no memory limit anywhere: the descriptors alone decide, and the Go limit follows the budget", getenv: env(), wantBudgetGo: true},
		{
			name: "a cgroup v2 memory.max caps the budget and sets the Go memory limit", getenv: env(),
			cgroup:     map[string]string{"memory.max": "536870912\n"},
			wantMemory: 512 * mib, wantSource: "cgroup", wantSetGo: true,
		},
		{
			name: "a cgroup v1 memory.limit_in_bytes caps the budget", getenv: env(),
			cgroup:     map[string]string{v1: "536870912\n"},
			wantMemory: 512 * mib, wantSource: "cgroup", wantSetGo: true,
		},
		{
			name: "cgroup v2 max is no limit", getenv: env(),
			cgroup: map[string]string{"memory.max": "max\n"}, wantBudgetGo: true,
		},
		{
			name: "cgroup v1's huge page-rounded number is no limit", getenv: env(),
			cgroup: map[string]string{v1: "9223372036854771712\n"}, wantBudgetGo: true,
		},
		{
			name: "an unreadable cgroup limit is no limit", getenv: env(),
			cgroup: map[string]string{"memory.max": "lots\n"}, wantBudgetGo: true,
		},
		{
			name:   "GOMEMLIMIT wins over the cgroup and leaves the Go memory limit as the runtime set it",
			getenv: env("GOMEMLIMIT", "768MiB"), goLimit: 768 * mib,
			cgroup:     map[string]string{"memory.max": "536870912"},
			wantMemory: 768 * mib, wantSource: "GOMEMLIMIT",
		},
		{
			name: "GOMEMLIMIT=off falls through to the cgroup", getenv: env("GOMEMLIMIT", "off"),
			cgroup:     map[string]string{"memory.max": "536870912"},
			wantMemory: 512 * mib, wantSource: "cgroup", wantSetGo: true,
		},
		{
			name: "GOMEMLIMIT=off with no cgroup limit leaves the Go memory limit alone", getenv: env("GOMEMLIMIT", "off"),
		},
		{
			name:   "a memory limit flag wins over GOMEMLIMIT and the cgroup and leaves the Go limit alone",
			getenv: env("GOMEMLIMIT", "768MiB"), goLimit: 768 * mib,
			cgroup:     map[string]string{"memory.max": "536870912"},
			want:       Limits{MemoryLimit: 256 * mib},
			wantMemory: 256 * mib, wantSource: "flag",
		},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			prevGo := keepGoMemoryLimit(t)
			if tt.goLimit != 0 {
				debug.SetMemoryLimit(tt.goLimit)
				prevGo = tt.goLimit
			}
			l, f, err := Derive(tt.want, tt.getenv, cgroupRoot(t, tt.cgroup))
			if err != nil {
				t.Fatalf("Derive: %v", err)
			}
			if l.MemoryLimit != tt.wantMemory || f.MemorySource != tt.wantSource || f.SetGoLimit != tt.wantSetGo {
				t.Errorf("memory = %d from %q (set Go limit %v), want %d from %q (%v)",
					l.MemoryLimit, f.MemorySource, f.SetGoLimit, tt.wantMemory, tt.wantSource, tt.wantSetGo)
			}
			goLimit := debug.SetMemoryLimit(-1)
			budgetGo := int64(l.MaxConns)*(24<<10) + 64*mib
			switch {
			case tt.wantSetGo && goLimit != tt.wantMemory/10*9:
				t.Errorf("Go memory limit = %d, want 90%% of the cgroup's %d", goLimit, tt.wantMemory)
			case tt.wantBudgetGo && (goLimit != budgetGo || f.GoLimit != budgetGo):
				t.Errorf("Go memory limit = %d (Facts.GoLimit %d), want 24 KiB for each of %d connections and 64 MiB: %d",
					goLimit, f.GoLimit, l.MaxConns, budgetGo)
			case !tt.wantSetGo && !tt.wantBudgetGo && goLimit != prevGo:
				t.Errorf("Go memory limit = %d, want it left at %d", goLimit, prevGo)
			}
			if !tt.wantBudgetGo && f.GoLimit != 0 {
				t.Errorf("Facts.GoLimit = %d with a memory limit or GOMEMLIMIT known, want 0", f.GoLimit)
			}

			if soft := softDescriptorLimit(t); f.Descriptors != soft {
				t.Errorf("Facts.Descriptors = %d, the soft limit is %d", f.Descriptors, soft)
			}
			if f.Reserved < 64 || f.Reserved > 1024 || uint64(f.Reserved) != min(max(f.Descriptors/20, 64), 1024) {
				t.Errorf("Facts.Reserved = %d for %d descriptors, want a twentieth within [64, 1024]", f.Reserved, f.Descriptors)
			}
			wantMax := int(min(f.Descriptors, math.MaxInt32)) - f.Reserved
			if tt.wantMemory > 0 {
				wantMax = min(wantMax, int(tt.wantMemory/2/(32<<10)))
			}
			if l.MaxConns != wantMax {
				t.Errorf("MaxConns = %d, want %d (descriptors %d less %d reserved, memory %d at 32 KiB a connection for half of it)",
					l.MaxConns, wantMax, f.Descriptors, f.Reserved, tt.wantMemory)
			}
			if uint64(l.MaxConns)+uint64(f.Reserved) > f.Descriptors {
				t.Errorf("MaxConns %d + reserve %d exceed the descriptor limit %d", l.MaxConns, f.Reserved, f.Descriptors)
			}
			if want := max(64, l.MaxConns/16); l.ConnsPerClient != want || l.RequestsPerClient != want {
				t.Errorf("per client = %d connections, %d requests; want max(64, MaxConns/16) = %d for both", l.ConnsPerClient, l.RequestsPerClient, want)
			}
			if l.AppShare != DefaultAppShare || l.QueueTimeout != DefaultQueueTimeout || l.ClientRate != 0 || l.ClientBurst != 0 {
				t.Errorf("share %g, queue timeout %v, rate %g/%d; want the defaults and no rate", l.AppShare, l.QueueTimeout, l.ClientRate, l.ClientBurst)
			}
		})
	}
}

func TestDeriveKeepsEveryLimitAFlagSets(t *testing.T) {
	cases := []struct {
		name  string
		want  Limits
		check func(t *testing.T, l Limits)
	}{
		{
			name: "connection budget, shares and queue timeout",
			want: Limits{MaxConns: 100, ConnsPerClient: 7, RequestsPerClient: 3, AppShare: 0.5, QueueTimeout: 2 * time.Second},
			check: func(t *testing.T, l Limits) {
				if l.MaxConns != 100 || l.ConnsPerClient != 7 || l.RequestsPerClient != 3 || l.AppShare != 0.5 || l.QueueTimeout != 2*time.Second {
					t.Errorf("Derive = %+v, want the flags' values", l)
				}
			},
		},
		{
			name: "the connection budget wins over the cgroup's memory",
			want: Limits{MaxConns: 10000},
			check: func(t *testing.T, l Limits) {
				if l.MaxConns != 10000 || l.MemoryLimit != 512*mib {
					t.Errorf("MaxConns = %d with memory %d, want the flag's 10000 beside the cgroup's 512 MiB", l.MaxConns, l.MemoryLimit)
				}
			},
		},
		{
			name: "requests per client follow a connections-per-client flag",
			want: Limits{MaxConns: 100, ConnsPerClient: 9},
			check: func(t *testing.T, l Limits) {
				if l.ConnsPerClient != 9 || l.RequestsPerClient != 9 {
					t.Errorf("per client = %d connections, %d requests; want 9 and 9", l.ConnsPerClient, l.RequestsPerClient)
				}
			},
		},
		{
			name: "a rate without a burst gets two seconds' worth",
			want: Limits{MaxConns: 100, ClientRate: 10},
			check: func(t *testing.T, l Limits) {
				if l.ClientRate != 10 || l.ClientBurst != 20 {
					t.Errorf("rate %g burst %d, want 10 and 20", l.ClientRate, l.ClientBurst)
				}
			},
		},
		{
			name: "a slow rate gets a burst of at least one",
			want: Limits{MaxConns: 100, ClientRate: 0.2},
			check: func(t *testing.T, l Limits) {
				if l.ClientBurst != 1 {
					t.Errorf("burst %d for 0.2 a second, want 1", l.ClientBurst)
				}
			},
		},
		{
			name: "a burst flag is kept",
			want: Limits{MaxConns: 100, ClientRate: 10, ClientBurst: 3},
			check: func(t *testing.T, l Limits) {
				if l.ClientBurst != 3 {
					t.Errorf("burst %d, want the flag's 3", l.ClientBurst)
				}
			},
		},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			keepGoMemoryLimit(t)
			l, _, err := Derive(tt.want, env(), cgroupRoot(t, map[string]string{"memory.max": "536870912"}))
			if err != nil {
				t.Fatalf("Derive: %v", err)
			}
			tt.check(t, l)
		})
	}
}

func TestDeriveRefusesLimitsThatCannotWork(t *testing.T) {
	soft := softDescriptorLimit(t)
	reserve := int(min(max(soft/20, 64), 1024))
	cases := []struct {
		name    string
		want    Limits
		wantErr string
	}{
		{"a budget under 16 connections", Limits{MaxConns: 15}, "too small"},
		{"a negative budget", Limits{MaxConns: -1}, "too small"},
		{"a memory limit too small for 16 connections", Limits{MemoryLimit: 512 << 10}, "too small"},
		{"a budget that leaves no reserve", Limits{MaxConns: int(soft) - reserve + 1}, "exceed the descriptor limit"},
		{"a budget past the descriptor limit", Limits{MaxConns: int(soft) + 1}, "exceed the descriptor limit"},
		{"negative connections per client", Limits{MaxConns: 100, ConnsPerClient: -1}, "connections per client"},
		{"negative requests per client", Limits{MaxConns: 100, RequestsPerClient: -1}, "requests per client"},
		{"an application share past one", Limits{MaxConns: 100, AppShare: 1.5}, "application share"},
		{"a negative application share", Limits{MaxConns: 100, AppShare: -0.25}, "application share"},
		{"a negative queue timeout", Limits{MaxConns: 100, QueueTimeout: -time.Second}, "queue timeout"},
		{"a negative rate", Limits{MaxConns: 100, ClientRate: -1}, "rate and burst"},
		{"a negative burst", Limits{MaxConns: 100, ClientBurst: -1}, "rate and burst"},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			keepGoMemoryLimit(t)
			_, _, err := Derive(tt.want, env(), t.TempDir())
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Derive(%+v) error = %v, want one about %q", tt.want, err, tt.wantErr)
			}
		})
	}
}

func TestDeriveRaisesTheDescriptorSoftLimitToTheHardOne(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	if orig.Max <= 2048 || orig.Max == math.MaxUint64 {
		t.Skipf("hard descriptor limit %d: nothing to lower the soft one from", orig.Max)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	low := orig
	low.Cur = 2048
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	keepGoMemoryLimit(t)
	l, f, err := Derive(Limits{}, env(), t.TempDir())
	if err != nil {
		t.Fatalf("Derive: %v", err)
	}
	if f.RaisedFrom != 2048 || f.Descriptors != orig.Max {
		t.Errorf("Facts = raised from %d to %d, want from 2048 to the hard limit %d", f.RaisedFrom, f.Descriptors, orig.Max)
	}
	if soft := softDescriptorLimit(t); soft != orig.Max {
		t.Errorf("soft limit after Derive = %d, want the hard limit %d", soft, orig.Max)
	}
	if uint64(l.MaxConns)+uint64(f.Reserved) > orig.Max || l.MaxConns <= 2048 {
		t.Errorf("MaxConns = %d (%d reserved), want the raised limit's budget", l.MaxConns, f.Reserved)
	}
}
