package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Row is one proxy under one load: a line of the results file.
type Row struct {
	Proxy string `json:"proxy"`
	Row   string `json:"row"` // the spec: held:9900, idle:50000@8, nat:4000
	Kind  string `json:"kind"`
	N     int    `json:"n"`
	Addrs int    `json:"addrs"`
	// Status is empty for a measured row; otherwise why there are no
	// figures (skipped, failed, n/a) and Note says more.
	Status string   `json:"status,omitempty"`
	Note   string   `json:"note,omitempty"`
	Notes  []string `json:"notes,omitempty"`
	Time   string   `json:"time,omitempty"`

	// fast.test before any load: the same clients, the same way.
	BaseServed int     `json:"base_served"`
	BaseFailed int     `json:"base_failed"`
	BaseP50Ms  float64 `json:"base_p50_ms"`
	BaseP99Ms  float64 `json:"base_p99_ms"`

	// The proxy's descriptors (every process of it, /proc/PID/fd) and RSS
	// (VmRSS summed): before the load, the most sampled under it, and after
	// it left (at the end of the recovery wait).
	FDBase      int   `json:"fd_base"`
	FDPeak      int   `json:"fd_peak"`
	FDAfter     int   `json:"fd_after"`
	RSSBaseKiB  int64 `json:"rss_base_kib"`
	RSSPeakKiB  int64 `json:"rss_peak_kib"`
	RSSAfterKiB int64 `json:"rss_after_kib"`

	// The load going in: how long it took to place, how many connections
	// were attempted, and (held, h2) how many requests reached the slow
	// application and were waiting there when the window began and at its
	// end.
	RampSeconds    float64 `json:"ramp_s"`
	Attempted      int     `json:"attempted"`
	AppHeldAtStart int64   `json:"app_held_at_start"`
	AppHeld        int64   `json:"app_held"`
	AppPeak        int64   `json:"app_peak"`

	// fast.test during the window: 4 keep-alive clients (fresh connections
	// at the window's start, reopened after a failure), the requests they
	// started in the window.
	FastServed   int     `json:"fast_served"`
	FastFailed   int     `json:"fast_failed"`
	FastFailures Counts  `json:"fast_failures,omitempty"`
	FastP50Ms    float64 `json:"fast_p50_ms"`
	FastP99Ms    float64 `json:"fast_p99_ms"`
	FastMaxMs    float64 `json:"fast_max_ms"`
	// The same clients over the whole attack, as a visitor meets it: from
	// the load's start (a natheld row: its NAT's) to the window's end,
	// FastAttackSeconds long, the ramp and the window's requests included.
	FastAttackServed   int     `json:"fast_attack_served"`
	FastAttackFailed   int     `json:"fast_attack_failed"`
	FastAttackFailures Counts  `json:"fast_attack_failures,omitempty"`
	FastAttackP50Ms    float64 `json:"fast_attack_p50_ms"`
	FastAttackP99Ms    float64 `json:"fast_attack_p99_ms"`
	FastAttackMaxMs    float64 `json:"fast_attack_max_ms"`
	FastAttackSeconds  float64 `json:"fast_attack_s"`
	// New visitors: a new connection to fast.test every 250 ms of the
	// window, served 200 within 1 s or not.
	NewOK       int    `json:"new_ok"`
	NewTotal    int    `json:"new_total"`
	NewFailures Counts `json:"new_failures,omitempty"`
	// NewP99Ms and NewMaxMs: how long the new visitors answered within
	// their 1 s took; NewSlow, how many took longer than 1 s in all
	// (answered late or not at all).
	NewP99Ms float64 `json:"new_p99_ms"`
	NewMaxMs float64 `json:"new_max_ms"`
	NewSlow  int     `json:"new_slow"`
	// From the ramp's start to the window's end: the box's kernel counters
	// of connections its accept queues dropped (nstat's TcpExtListenOverflows
	// and TcpExtListenDrops, for every listener on the box, not the proxy's
	// alone), and scafo-edge's scafo_edge_accept_pauses_total.
	ListenOverflows int64 `json:"listen_overflows"`
	ListenDrops     int64 `json:"listen_drops"`
	AcceptPauses    int64 `json:"accept_pauses"`
	// The admin listener's /healthz every 500 ms of the window, answered
	// 200 within 1 s; AdminTotal 0 where there is none (not scafo-edge).
	AdminOK    int `json:"admin_ok"`
	AdminTotal int `json:"admin_total"`

	// What the load's own requests got (held, h2: the held requests; idle:
	// each connection's one request), and which of them came before the
	// release; idle: connections the proxy closed before the release, and
	// those open at it.
	Outcomes      Counts `json:"outcomes"`
	Early         Counts `json:"early"`
	ClosedEarly   int    `json:"closed_early"`
	OpenAtRelease int    `json:"open_at_release"`
	// The browsers behind a NAT, of a nat row (Outcomes above) or beside
	// a natheld row's held requests: what each of their requests got, from
	// the NAT's first to the release (natheld: NATOutcomes; the NAT is in
	// place before the held requests come), and how long they waited.
	NATOutcomes Counts    `json:"nat_outcomes,omitempty"`
	NAT         *NATTimes `json:"nat,omitempty"`

	// After the release: seconds until the proxy's descriptors (and for
	// scafo-edge its go_goroutines and process_open_fds) are back to
	// baseline (Settled), -1 if not within the recovery wait.
	RecoverySeconds float64 `json:"recovery_s"`
	// scafo-edge's admin /metrics: before, most sampled, after.
	GoroutinesBase  int `json:"goroutines_base,omitempty"`
	GoroutinesPeak  int `json:"goroutines_peak,omitempty"`
	GoroutinesAfter int `json:"goroutines_after,omitempty"`
	EdgeFDsBase     int `json:"edge_fds_base,omitempty"`
	EdgeFDsPeak     int `json:"edge_fds_peak,omitempty"`
	EdgeFDsAfter    int `json:"edge_fds_after,omitempty"`

	// The CPU the load processes and the proxy (its whole tree) used over
	// the window, in cores: on a small box the load's own share is CPU the
	// proxy did not have.
	LoadCPU  float64 `json:"load_cpu"`
	ProxyCPU float64 `json:"proxy_cpu"`

	ProxyExited   bool    `json:"proxy_exited,omitempty"`
	WindowSeconds float64 `json:"window_s"`
}

type rowConfig struct {
	results, proxy, addr, loadAddr, tlsAddr, fastHost, slowHost, admin, self string
	control                                                                  []string
	spec                                                                     Spec
	fastSrc                                                                  string
	pid, fastClients, perProc, concurrency                                   int
	baseline, window, ramp, recovery, timeout                                time.Duration
}

func rowCmd(args []string) error {
	fs := flag.NewFlagSet("row", flag.ContinueOnError)
	var c rowConfig
	var spec, control string
	fs.StringVar(&c.results, "results", "", "results file (JSON lines), appended to")
	fs.StringVar(&c.proxy, "proxy", "", "proxy name, for the table")
	fs.StringVar(&spec, "spec", "", "the row: KIND:N[@A], KIND one of held, idle, h2, h3, nat, natheld, slow")
	fs.IntVar(&c.pid, "pid", 0, "the proxy's process (its whole tree is measured)")
	fs.StringVar(&c.addr, "addr", "", "the proxy's HTTP address, 127.0.0.1:PORT")
	fs.StringVar(&c.loadAddr, "load-addr", "", "where the load of the held, idle, nat, natheld and slow rows goes (default: -addr, the proxy); an overload sink here measures the box's floor")
	fs.StringVar(&c.tlsAddr, "tls-addr", "", "the proxy's HTTPS address (h2 rows; h3 rows: its UDP port too)")
	fs.StringVar(&c.fastHost, "fast-host", "fast.test", "the fast application's host")
	fs.StringVar(&c.slowHost, "slow-host", "slow.test", "the slow application's host")
	fs.StringVar(&control, "control", "", "comma list of the upstream processes' control addresses")
	fs.StringVar(&c.admin, "admin", "", "scafo-edge's admin base URL (/healthz, /metrics); empty for other proxies")
	fs.StringVar(&c.self, "self", "", "this program, run as the load processes (default: os.Executable)")
	fs.IntVar(&c.fastClients, "fast-clients", 4, "keep-alive clients of fast.test")
	fs.StringVar(&c.fastSrc, "fast-src", "127.0.0.200", "source address of fast.test's keep-alive clients (new visitors: 127.0.1.1 onwards, one each); never one the load uses")
	fs.IntVar(&c.perProc, "per-proc", 4000, "most connections per load process (well below the descriptor limit)")
	fs.IntVar(&c.concurrency, "concurrency", 1000, "connections each load process opens at once")
	fs.DurationVar(&c.baseline, "baseline", 3*time.Second, "fast.test alone, before the load")
	fs.DurationVar(&c.window, "window", 8*time.Second, "the measured window under the load")
	fs.DurationVar(&c.ramp, "ramp", 60*time.Second, "longest wait for the load to be in place")
	fs.DurationVar(&c.recovery, "recovery", 30*time.Second, "longest wait for the proxy to come back to baseline")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "every client request's timeout (fast.test, connects)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if c.spec, err = ParseSpec(spec); err != nil {
		return err
	}
	if c.results == "" || c.proxy == "" || c.pid <= 0 || c.addr == "" || control == "" {
		return errors.New("need -results, -proxy, -pid, -addr and -control")
	}
	c.control = strings.Split(control, ",")
	if c.loadAddr == "" {
		c.loadAddr = c.addr
	}
	if (c.spec.Kind == "h2" || c.spec.Kind == "h3") && c.tlsAddr == "" {
		return fmt.Errorf("an %s row needs -tls-addr", c.spec.Kind)
	}
	if c.self == "" {
		if c.self, err = os.Executable(); err != nil {
			return err
		}
	}
	row := measureRow(c)
	return appendRow(c.results, row)
}

func appendRow(path string, r Row) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(r)
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "overload: "+format+"\n", args...)
}

// ---------------------------------------------------------- the row itself

func measureRow(c rowConfig) Row {
	proc := procFS{Dir: "/proc"}
	tree := func() []int {
		t, err := proc.Tree(c.pid)
		if err != nil {
			return []int{c.pid}
		}
		return t
	}
	r := Row{Proxy: c.proxy, Row: c.spec.String(), Kind: c.spec.Kind, N: c.spec.N, Addrs: c.spec.Addrs,
		Time: time.Now().UTC().Format(time.RFC3339), WindowSeconds: c.window.Seconds(), RecoverySeconds: -1}
	note := func(format string, args ...any) {
		r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
	}

	// 1. fast.test alone.
	base := fastLoad(c.fastURL(), c.fastHost, c.fastSrc, c.fastClients, c.baseline, c.timeout)
	r.BaseServed, r.BaseFailed = base.served, base.failed
	bl := Summarise(base.ms)
	r.BaseP50Ms, r.BaseP99Ms = bl.P50, bl.P99
	time.Sleep(500 * time.Millisecond) // the clients' connections close
	t := tree()
	r.FDBase, r.RSSBaseKiB = proc.FDs(t), proc.RSSKiB(t)
	r.FDPeak, r.RSSPeakKiB = r.FDBase, r.RSSBaseKiB
	if c.admin != "" {
		if m, err := scrape(c.admin); err == nil {
			r.GoroutinesBase, r.EdgeFDsBase = int(m["go_goroutines"]), int(m["process_open_fds"])
			r.GoroutinesPeak, r.EdgeFDsPeak = r.GoroutinesBase, r.EdgeFDsBase
		} else {
			note("admin /metrics before the load: %v", err)
		}
	}

	// 2. The load, spread over processes, sampled from its first connection.
	var peakMu sync.Mutex
	sctx, stopSampling := context.WithCancel(context.Background())
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			t := tree()
			fds, rss := proc.FDs(t), proc.RSSKiB(t)
			peakMu.Lock()
			r.FDPeak, r.RSSPeakKiB = max(r.FDPeak, fds), max(r.RSSPeakKiB, rss)
			peakMu.Unlock()
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	if c.admin != "" {
		sampling.Add(1)
		go func() {
			defer sampling.Done()
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				if m, err := scrape(c.admin); err == nil {
					peakMu.Lock()
					r.GoroutinesPeak = max(r.GoroutinesPeak, int(m["go_goroutines"]))
					r.EdgeFDsPeak = max(r.EdgeFDsPeak, int(m["process_open_fds"]))
					peakMu.Unlock()
				}
				select {
				case <-sctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}

	// Every load connection lives at most this long: the ramp, the window
	// and a margin for the answers after the release.
	connLife := c.ramp + c.window + 20*time.Second
	// fast.test's keep-alive clients ask from the attack's start to the
	// window's end, one set of clients throughout: a visitor meets the
	// ramp as much as the window.
	var fast *fastClients
	var attackStart time.Time
	startFastClients := func() {
		attackStart = time.Now()
		fast = startFast(c.fastURL(), c.fastHost, c.fastSrc, c.fastClients, c.timeout)
	}
	// A natheld row's NAT comes first, each browser having asked once, as
	// an office is at work before an attack begins: what the row asks is
	// whether the active keep their place, and their connects are not the
	// attack's (the kernel's counters start after them).
	var nat *loadProcs
	if c.spec.Kind == "natheld" {
		startFastClients()
		var err error
		if nat, err = startLoad(c, c.natLoad(), connLife); err != nil {
			fast.stopAt(time.Now())
			stopSampling()
			sampling.Wait()
			r.Status, r.Note = "failed", "starting the NAT's load process: "+err.Error()
			return r
		}
		defer nat.kill()
		if ready := nat.waitReady(time.Now().Add(c.ramp)); ready.Attempted < NATConns {
			note("the NAT's ramp ended (%s) with %s of %s browsers attempted", c.ramp, thousands(ready.Attempted), thousands(NATConns))
		}
	}
	overflows0, drops0, nerr := proc.ListenDrops()
	if nerr != nil {
		note("kernel listen counters: %v", nerr)
	}
	var pauses0 float64
	if c.admin != "" {
		if m, err := scrape(c.admin); err == nil {
			pauses0 = m["scafo_edge_accept_pauses_total"]
		}
	}
	if fast == nil {
		startFastClients()
	}
	rampStart := time.Now()
	load, err := startLoad(c, c.load(), connLife)
	if err != nil {
		fast.stopAt(time.Now())
		stopSampling()
		sampling.Wait()
		r.Status, r.Note = "failed", "starting the load processes: "+err.Error()
		return r
	}
	defer load.kill()
	// Every load process's CPU is the load's, the NAT's included.
	loadPIDs := func() []int {
		if nat == nil {
			return load.pids()
		}
		return append(load.pids(), nat.pids()...)
	}
	rampEnd := rampStart.Add(c.ramp)
	ready := load.waitReady(rampEnd)
	r.Attempted = ready.Attempted
	if ready.Attempted < c.spec.N {
		note("the ramp ended (%s) with %s of %s connections attempted", c.ramp, thousands(ready.Attempted), thousands(c.spec.N))
	}
	if c.spec.Holds() {
		// Until the held requests reaching the application stop growing for
		// a second (or all are there, or the ramp's time is up).
		var last int64 = -1
		stableSince := time.Now()
		for time.Now().Before(rampEnd) {
			s, err := appStats(c.control)
			if err == nil && s.Held != last {
				last, stableSince = s.Held, time.Now()
			}
			if err == nil && (s.Held >= int64(c.spec.N) || time.Since(stableSince) >= time.Second) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if s, err := appStats(c.control); err == nil {
			r.AppHeldAtStart = s.Held
		}
	}
	r.RampSeconds = time.Since(rampStart).Seconds()
	logf("%s %s: load in place after %.1fs (%s attempted, %s held at the app); measuring %s",
		c.proxy, r.Row, r.RampSeconds, thousands(r.Attempted), thousands(int(r.AppHeldAtStart)), c.window)

	// 3. The window: fast.test's keep-alive clients, new visitors, admin.
	// The clients reconnect before the window's clock is read, so that each
	// of its requests is on a connection opened under the load, as a
	// client arriving now would be.
	fast.reconnect()
	windowStart, proxyTree := time.Now(), tree()
	windowEnd := windowStart.Add(c.window)
	fast.stopAt(windowEnd)
	loadTicks0, proxyTicks0 := proc.CPUTicks(loadPIDs()), proc.CPUTicks(proxyTree)
	var wg sync.WaitGroup
	var fastSamples []fastSample
	wg.Add(1)
	go func() {
		defer wg.Done()
		fastSamples = fast.wait()
	}()
	var newOK, newTotal, newSlow atomic.Int64
	newFail := Counts{}
	var newMs []float64
	var newMu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		end := time.Now().Add(c.window)
		var probes sync.WaitGroup
		for i := 0; time.Now().Before(end); i++ {
			probes.Add(1)
			newTotal.Add(1)
			// Each a new person: an address of its own.
			src := fmt.Sprintf("127.0.1.%d", 1+i%250)
			go func() {
				defer probes.Done()
				// Waited for as long as any request, to see how late
				// the late ones are; served within 1 s or not.
				o, took := newVisitor(c.fastURL(), c.fastHost, src, c.timeout)
				if took > time.Second {
					newSlow.Add(1)
				}
				newMu.Lock()
				defer newMu.Unlock()
				switch {
				case o == "" && took <= time.Second:
					newOK.Add(1)
				case o == "":
					newFail["late"]++
				default:
					newFail[o]++
				}
				if o == "" {
					newMs = append(newMs, float64(took.Microseconds())/1000)
				}
			}()
			time.Sleep(250 * time.Millisecond)
		}
		probes.Wait()
	}()
	if c.admin != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			end := time.Now().Add(c.window)
			for time.Now().Before(end) {
				r.AdminTotal++
				if healthz(c.admin) {
					r.AdminOK++
				}
				time.Sleep(500 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if secs := time.Since(windowStart).Seconds(); secs > 0 {
		r.LoadCPU = float64(proc.CPUTicks(loadPIDs())-loadTicks0) / 100 / secs
		r.ProxyCPU = float64(proc.CPUTicks(proxyTree)-proxyTicks0) / 100 / secs
	}
	fw := fastBetween(fastSamples, windowStart, windowEnd)
	r.FastServed, r.FastFailed, r.FastFailures = fw.served, fw.failed, fw.failures
	fl := Summarise(fw.ms)
	r.FastP50Ms, r.FastP99Ms, r.FastMaxMs = fl.P50, fl.P99, fl.Max
	fa := fastBetween(fastSamples, attackStart, windowEnd)
	r.FastAttackServed, r.FastAttackFailed, r.FastAttackFailures = fa.served, fa.failed, fa.failures
	al := Summarise(fa.ms)
	r.FastAttackP50Ms, r.FastAttackP99Ms, r.FastAttackMaxMs = al.P50, al.P99, al.Max
	r.FastAttackSeconds = windowEnd.Sub(attackStart).Seconds()
	r.NewOK, r.NewTotal, r.NewFailures, r.NewSlow = int(newOK.Load()), int(newTotal.Load()), newFail, int(newSlow.Load())
	nl := Summarise(newMs)
	r.NewP99Ms, r.NewMaxMs = nl.P99, nl.Max
	if overflows, drops, err := proc.ListenDrops(); err == nil && nerr == nil {
		r.ListenOverflows, r.ListenDrops = overflows-overflows0, drops-drops0
	}
	if c.admin != "" {
		if m, err := scrape(c.admin); err == nil {
			r.AcceptPauses = int64(m["scafo_edge_accept_pauses_total"] - pauses0)
		}
	}

	// 4. The release: the slow application answers what it holds (and
	// anything after at once); idle connections close.
	if s, err := appStats(c.control); err == nil {
		r.AppHeld, r.AppPeak = s.Held, s.PeakHeld
	} else {
		note("upstream /stats: %v", err)
	}
	stopSampling()
	sampling.Wait()
	// The load processes first (an answer after this is not "early"),
	// then, once they have read it, the application.
	load.release()
	if nat != nil {
		nat.release()
	}
	time.Sleep(200 * time.Millisecond)
	releaseAt := time.Now()
	if err := appRelease(c.control); err != nil {
		note("upstream /release: %v", err)
	}

	// 5. Recovery: from the release until the proxy is back to baseline.
	recDone := make(chan struct{})
	go func() {
		defer close(recDone)
		for time.Since(releaseAt) < c.recovery {
			fds := proc.FDs(tree())
			ok := Settled(fds, r.FDBase, r.FDPeak, 16)
			if ok && c.admin != "" {
				m, err := scrape(c.admin)
				ok = err == nil &&
					Settled(int(m["go_goroutines"]), r.GoroutinesBase, r.GoroutinesPeak, 32) &&
					Settled(int(m["process_open_fds"]), r.EdgeFDsBase, r.EdgeFDsPeak, 16)
			}
			if ok {
				r.RecoverySeconds = time.Since(releaseAt).Seconds()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	// Until every load process reported, which each does by the end of its
	// connections' life (connections the proxy left in its backlog are
	// accepted and answered only now); at least 30 s after the release.
	resDeadline := rampStart.Add(connLife + c.timeout + 12*time.Second)
	if d := releaseAt.Add(30 * time.Second); d.After(resDeadline) {
		resDeadline = d
	}
	res := load.waitResults(resDeadline)
	r.Outcomes, r.Early = res.Outcomes, res.Early
	r.ClosedEarly, r.OpenAtRelease = res.ClosedEarly, res.OpenAtRelease
	if n := res.Outcomes.Total(); n < c.spec.N {
		note("%s of %s load connections reported no end (a load process did not finish)", thousands(c.spec.N-n), thousands(c.spec.N))
	}
	switch {
	case c.spec.Kind == "nat":
		r.NAT = &res.NAT
	case nat != nil:
		nres := nat.waitResults(resDeadline)
		r.NATOutcomes, r.NAT = nres.Outcomes, &nres.NAT
		if nres.Attempted < NATConns {
			note("the NAT reported %s of its %s browsers (its load process did not finish, or the ramp ended first)", thousands(nres.Attempted), thousands(NATConns))
		}
	}
	<-recDone
	time.Sleep(time.Second)
	t = tree()
	r.FDAfter, r.RSSAfterKiB = proc.FDs(t), proc.RSSKiB(t)
	if c.admin != "" {
		if m, err := scrape(c.admin); err == nil {
			r.GoroutinesAfter, r.EdgeFDsAfter = int(m["go_goroutines"]), int(m["process_open_fds"])
		} else {
			note("admin /metrics after the load: %v", err)
		}
	}
	if !proc.Alive(c.pid) {
		r.ProxyExited = true
		note("the proxy exited during the row")
	}
	return r
}
