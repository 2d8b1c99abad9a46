package admission

import (
	"math"
	"net/http/httptest"
	"runtime/debug"
	"strings"
	"sync/atomic"
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

// fixedDescriptors is a descriptor limit for System.Descriptors: the budget
// comes out the same on every machine.
func fixedDescriptors(n uint64) func() (uint64, uint64, error) {
	return func() (uint64, uint64, error) { return n, 0, nil }
}

// testSystem is a box with 20,000 descriptors (a budget of 19,000 before
// memory), the environment getenv and the files.
func testSystem(getenv func(string) string, files map[string]string) System {
	return System{Getenv: getenv, Files: box(files), Descriptors: fixedDescriptors(20000)}
}

const (
	meminfo24GiB = "MemTotal:       25165824 kB\nMemFree:        23566372 kB\n"
)

// inCgroupV2 is a box with 24 GiB whose edge runs in the cgroup v2
// system.slice/scafo-edge.service, its memory.max set to max.
func inCgroupV2(max string) map[string]string {
	return map[string]string{
		"/proc/meminfo":        meminfo24GiB,
		"/proc/self/cgroup":    "0::/system.slice/scafo-edge.service\n",
		"/proc/self/mountinfo": mountV2,
		"/sys/fs/cgroup/system.slice/scafo-edge.service/memory.max": max,
	}
}

func TestDeriveTakesTheMemoryLimitFromTheFirstSourceThatGivesOne(t *testing.T) {
	const serviceMax = "/sys/fs/cgroup/system.slice/scafo-edge.service/memory.max"
	cases := []struct {
		name    string
		getenv  func(string) string
		goLimit int64 // the Go memory limit the runtime set at start from GOMEMLIMIT; 0: leave it
		files   map[string]string
		want    Limits // overrides, as flags give them

		wantMemory int64
		wantFrom   string
		wantFile   string
		// How the Go memory limit was set: "limit" to 90 % of the memory
		// limit (memory binds the budget), "budget" from the connection
		// budget (the descriptors bind it, or no memory limit is known),
		// "" left as the runtime had it.
		wantGo    string
		wantCgErr bool
	}{
		{
			name: "nothing but the box's memory: a quarter of MemTotal, and the Go limit what the budget of descriptors holds", getenv: env(),
			files:      map[string]string{"/proc/meminfo": meminfo24GiB},
			wantMemory: 6 << 30, wantFrom: MemoryFromMemTotal, wantFile: "/proc/meminfo", wantGo: "budget",
		},
		{
			name: "no memory known at all: the descriptors alone decide, and the Go limit follows the budget", getenv: env(),
			wantGo: "budget",
		},
		{
			name: "--max-conns binds before memory: the Go limit is what the budget holds", getenv: env(),
			files:      inCgroupV2("4294967296"),
			want:       Limits{MaxConns: 1000},
			wantMemory: 4 << 30, wantFrom: MemoryFromCgroupV2, wantFile: serviceMax, wantGo: "budget",
		},
		{
			name: "a cgroup v2 memory.max of the edge's own cgroup", getenv: env(),
			files:      inCgroupV2("536870912\n"),
			wantMemory: 512 * mib, wantFrom: MemoryFromCgroupV2, wantFile: serviceMax, wantGo: "limit",
		},
		{
			name: "a cgroup v1 memory.limit_in_bytes of the edge's own cgroup", getenv: env(),
			files: map[string]string{
				"/proc/meminfo":        meminfo24GiB,
				"/proc/self/cgroup":    "4:memory:/scafo-edge\n0::/\n",
				"/proc/self/mountinfo": mountV1Memory + mountUnified,
				"/sys/fs/cgroup/memory/scafo-edge/memory.limit_in_bytes": "536870912\n",
			},
			wantMemory: 512 * mib, wantFrom: MemoryFromCgroupV1, wantFile: "/sys/fs/cgroup/memory/scafo-edge/memory.limit_in_bytes", wantGo: "limit",
		},
		{
			name: "a cgroup at max: a quarter of MemTotal", getenv: env(),
			files:      inCgroupV2("max\n"),
			wantMemory: 6 << 30, wantFrom: MemoryFromMemTotal, wantFile: "/proc/meminfo", wantGo: "budget",
		},
		{
			name: "a cgroup limit past the box's memory limits nothing: a quarter of MemTotal", getenv: env(),
			files:      inCgroupV2("34359738368\n"),
			wantMemory: 6 << 30, wantFrom: MemoryFromMemTotal, wantFile: "/proc/meminfo", wantGo: "budget",
		},
		{
			name: "an unreadable cgroup limit is reported and no limit", getenv: env(),
			files:      inCgroupV2("lots\n"),
			wantMemory: 6 << 30, wantFrom: MemoryFromMemTotal, wantFile: "/proc/meminfo", wantGo: "budget", wantCgErr: true,
		},
		{
			name:   "GOMEMLIMIT wins over the cgroup and leaves the Go memory limit as the runtime set it",
			getenv: env("GOMEMLIMIT", "768MiB"), goLimit: 768 * mib,
			files:      inCgroupV2("536870912"),
			wantMemory: 768 * mib, wantFrom: MemoryFromGOMEMLIMIT,
		},
		{
			name: "GOMEMLIMIT=off: the cgroup's limit, and no Go memory limit", getenv: env("GOMEMLIMIT", "off"),
			files:      inCgroupV2("536870912"),
			wantMemory: 512 * mib, wantFrom: MemoryFromCgroupV2, wantFile: serviceMax,
		},
		{
			name: "GOMEMLIMIT=off and no cgroup limit: a quarter of MemTotal, and no Go memory limit", getenv: env("GOMEMLIMIT", "off"),
			files:      map[string]string{"/proc/meminfo": meminfo24GiB},
			wantMemory: 6 << 30, wantFrom: MemoryFromMemTotal, wantFile: "/proc/meminfo",
		},
		{
			name:   "the flag wins over GOMEMLIMIT and the cgroup, and leaves the Go limit as GOMEMLIMIT set it",
			getenv: env("GOMEMLIMIT", "768MiB"), goLimit: 768 * mib,
			files:      inCgroupV2("536870912"),
			want:       Limits{MemoryLimit: 256 * mib},
			wantMemory: 256 * mib, wantFrom: MemoryFromFlag,
		},
		{
			name: "the flag without GOMEMLIMIT sets the Go memory limit", getenv: env(),
			files:      inCgroupV2("536870912"),
			want:       Limits{MemoryLimit: 256 * mib},
			wantMemory: 256 * mib, wantFrom: MemoryFromFlag, wantGo: "limit",
		},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			prevGo := keepGoMemoryLimit(t)
			if tt.goLimit != 0 {
				debug.SetMemoryLimit(tt.goLimit)
				prevGo = tt.goLimit
			}
			l, f, err := Derive(tt.want, testSystem(tt.getenv, tt.files))
			if err != nil {
				t.Fatalf("Derive: %v", err)
			}
			if l.MemoryLimit != tt.wantMemory || l.MemoryFrom != tt.wantFrom || l.MemoryFile != tt.wantFile {
				t.Errorf("memory = %d from %q %q, want %d from %q %q", l.MemoryLimit, l.MemoryFrom, l.MemoryFile, tt.wantMemory, tt.wantFrom, tt.wantFile)
			}
			if (f.CgroupErr != nil) != tt.wantCgErr {
				t.Errorf("Facts.CgroupErr = %v, want one: %v", f.CgroupErr, tt.wantCgErr)
			}
			goLimit := debug.SetMemoryLimit(-1)
			budgetGo := max(int64(l.MaxConns)*(24<<10)+64*mib, 256*mib)
			switch tt.wantGo {
			case "limit":
				if goLimit != tt.wantMemory/10*9 || f.GoLimit != goLimit {
					t.Errorf("Go memory limit = %d (Facts.GoLimit %d), want 90%% of %d", goLimit, f.GoLimit, tt.wantMemory)
				}
			case "budget":
				if goLimit != budgetGo || f.GoLimit != budgetGo {
					t.Errorf("Go memory limit = %d (Facts.GoLimit %d), want 24 KiB for each of %d connections and 64 MiB, at least 256 MiB: %d",
						goLimit, f.GoLimit, l.MaxConns, budgetGo)
				}
			default:
				if goLimit != prevGo || f.GoLimit != 0 {
					t.Errorf("Go memory limit = %d (Facts.GoLimit %d), want it left at %d", goLimit, f.GoLimit, prevGo)
				}
			}
			if f.Descriptors != 20000 || f.Reserved != 1000 {
				t.Errorf("Facts = %d descriptors, %d reserved; want 20000 and a twentieth", f.Descriptors, f.Reserved)
			}
			wantMax := 19000
			if tt.want.MaxConns > 0 {
				wantMax = tt.want.MaxConns
			} else if tt.wantMemory > 0 {
				wantMax = min(wantMax, int(tt.wantMemory/2/(32<<10)))
			}
			if l.MaxConns != wantMax {
				t.Errorf("MaxConns = %d, want %d (19,000 descriptors, or memory %d at 32 KiB a connection for half of it)", l.MaxConns, wantMax, tt.wantMemory)
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

// On the boxes the edge ships to, systemd's LimitNOFILE=1048576 or Docker's
// default: the descriptors would allow a million connections, and the box's
// memory is what must bound them.
func TestDeriveOnAMillionDescriptorsTheBudgetFollowsMemory(t *testing.T) {
	const descriptors = 1 << 20
	cases := []struct {
		name      string
		files     map[string]string
		want      Limits
		wantFrom  string
		wantLimit int64
		wantConns int
	}{
		{
			name:     "a 4 GiB box, no cgroup limit: a quarter of it",
			files:    map[string]string{"/proc/meminfo": "MemTotal:        4194304 kB\n"},
			wantFrom: MemoryFromMemTotal, wantLimit: 1 << 30, wantConns: 16384,
		},
		{
			name: "4 GiB of cgroup v2 memory.max (the unit's MemoryMax=4G) on a 64 GiB box",
			files: map[string]string{
				"/proc/meminfo":        "MemTotal:       67108864 kB\n",
				"/proc/self/cgroup":    "0::/system.slice/scafo-edge.service\n",
				"/proc/self/mountinfo": mountV2,
				"/sys/fs/cgroup/system.slice/scafo-edge.service/memory.max": "4294967296\n",
			},
			wantFrom: MemoryFromCgroupV2, wantLimit: 4 << 30, wantConns: 65536,
		},
		{
			name: "4 GiB of cgroup v1 memory.limit_in_bytes (compose's mem_limit) on a 64 GiB box",
			files: map[string]string{
				"/proc/meminfo":                               "MemTotal:       67108864 kB\n",
				"/proc/self/cgroup":                           "4:memory:/docker/abc\n",
				"/proc/self/mountinfo":                        "900 800 0:31 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
				"/sys/fs/cgroup/memory/memory.limit_in_bytes": "4294967296\n",
			},
			wantFrom: MemoryFromCgroupV1, wantLimit: 4 << 30, wantConns: 65536,
		},
		{
			name:     "--memory-limit 4GiB",
			files:    map[string]string{"/proc/meminfo": "MemTotal:       67108864 kB\n"},
			want:     Limits{MemoryLimit: 4 << 30},
			wantFrom: MemoryFromFlag, wantLimit: 4 << 30, wantConns: 65536,
		},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			keepGoMemoryLimit(t)
			sys := System{Getenv: env(), Files: box(tt.files), Descriptors: fixedDescriptors(descriptors)}
			l, f, err := Derive(tt.want, sys)
			if err != nil {
				t.Fatalf("Derive: %v", err)
			}
			if f.Reserved != 1024 || descriptors-f.Reserved != 1047552 {
				t.Fatalf("reserve %d, want 1,024: the descriptors alone would allow 1,047,552 connections", f.Reserved)
			}
			if l.MemoryLimit != tt.wantLimit || l.MemoryFrom != tt.wantFrom {
				t.Errorf("memory limit %d from %q, want %d from %q", l.MemoryLimit, l.MemoryFrom, tt.wantLimit, tt.wantFrom)
			}
			// Half the memory at 32 KiB a connection.
			if l.MaxConns != tt.wantConns || l.ConnsPerClient != tt.wantConns/16 || l.RequestsPerClient != tt.wantConns/16 {
				t.Errorf("budget %d, %d connections and %d requests per address; want %d and %d",
					l.MaxConns, l.ConnsPerClient, l.RequestsPerClient, tt.wantConns, tt.wantConns/16)
			}
			if g := debug.SetMemoryLimit(-1); g != tt.wantLimit/10*9 {
				t.Errorf("Go memory limit %d, want 90%% of %d", g, tt.wantLimit)
			}

			// The memory guard follows the same limit: past three quarters
			// of it live, new requests are refused.
			var use atomic.Int64
			c, err := New(Options{Limits: l, MemoryInUse: use.Load})
			if err != nil {
				t.Fatal(err)
			}
			use.Store(tt.wantLimit * 74 / 100)
			c.sampleMemory()
			if c.Snapshot().MemoryHigh {
				t.Errorf("memory high at 74 %% of %d", tt.wantLimit)
			}
			use.Store(tt.wantLimit * 76 / 100)
			c.sampleMemory()
			if !c.Snapshot().MemoryHigh {
				t.Errorf("memory not high at 76 %% of %d", tt.wantLimit)
			}
			if _, why := c.Admit(httptest.NewRequest("GET", "http://app.test/", nil), "app"); why != RefusedMemory {
				t.Errorf("a request at 76 %% of the memory limit = %v, want %v", why, RefusedMemory)
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
			l, _, err := Derive(tt.want, testSystem(env(), inCgroupV2("536870912")))
			if err != nil {
				t.Fatalf("Derive: %v", err)
			}
			tt.check(t, l)
		})
	}
}

func TestDeriveRefusesLimitsThatCannotWork(t *testing.T) {
	const soft = 20000
	const reserve = 1000
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
			_, _, err := Derive(tt.want, testSystem(env(), nil))
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
	l, f, err := Derive(Limits{}, System{Getenv: env(), Files: box(nil)})
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
