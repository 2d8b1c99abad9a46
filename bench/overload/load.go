package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The load of a row: `overload conns` processes, started, released and
// heard from.

type loadProcs struct {
	procs   []*exec.Cmd
	stdins  []io.WriteCloser
	ready   chan ConnsReport
	results chan ConnsReport
	exited  chan struct{}
}

// loadPart is one load of a row: what its `overload conns` processes do,
// where, from which addresses, and at most how many connections each.
type loadPart struct {
	mode, target, host, path string
	n, per                   int
	srcs                     []string
	every                    time.Duration // -interval; 0: the process's default
}

// load is the row's load: for a natheld row its held requests, whose NAT
// is natLoad.
func (c rowConfig) load() loadPart {
	p := loadPart{mode: c.spec.Kind, target: c.loadAddr, host: c.slowHost, path: "/hold",
		n: c.spec.N, per: c.perProc, srcs: c.spec.SourceAddrs(), every: c.spec.Every}
	switch c.spec.Kind {
	case "idle", "nat", "slow":
		p.host, p.path = c.fastHost, "/"
	case "h2", "h3":
		// One process opens every connection (the scenario: one client);
		// its descriptors are the connections, N/100.
		p.target, p.per = c.tlsAddr, 0
	case "natheld":
		// The attack: held:N@A as it is; the row's pace (/EVERY) is its
		// NAT's.
		p.mode, p.every = "held", 0
	}
	return p
}

// natLoad is a natheld row's NAT: nat:NATConns from NATAddr alone, at the
// row's pace.
func (c rowConfig) natLoad() loadPart {
	return loadPart{mode: "nat", target: c.loadAddr, host: c.fastHost, path: "/",
		n: NATConns, per: c.perProc, srcs: []string{NATAddr}, every: c.spec.Every}
}

// startLoad runs a load as `overload conns` processes, each at most
// part.per connections, so that none nears the descriptor limit.
func startLoad(c rowConfig, part loadPart, life time.Duration) (*loadProcs, error) {
	parts := Split(part.n, part.per)
	l := &loadProcs{ready: make(chan ConnsReport, len(parts)), results: make(chan ConnsReport, len(parts)),
		exited: make(chan struct{})}
	srcs := strings.Join(part.srcs, ",")
	offset := 0
	var waits sync.WaitGroup
	for _, n := range parts {
		cmd := exec.Command(c.self, "conns", "-mode", part.mode, "-target", part.target, "-host", part.host,
			"-path", part.path, "-n", strconv.Itoa(n), "-src", srcs, "-offset", strconv.Itoa(offset),
			"-dial-timeout", c.timeout.String(), "-timeout", life.String(),
			"-concurrency", strconv.Itoa(c.concurrency))
		if part.every > 0 {
			cmd.Args = append(cmd.Args, "-interval", part.every.String())
		}
		offset += n
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			l.kill()
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			l.kill()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			l.kill()
			return nil, err
		}
		l.procs = append(l.procs, cmd)
		l.stdins = append(l.stdins, in)
		waits.Add(1)
		go func() {
			defer waits.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var rep ConnsReport
				if json.Unmarshal(sc.Bytes(), &rep) != nil {
					continue
				}
				switch rep.Event {
				case "ready":
					l.ready <- rep
				case "result":
					l.results <- rep
				}
			}
			cmd.Wait()
		}()
	}
	go func() { waits.Wait(); close(l.exited) }()
	return l, nil
}

// waitReady merges the processes' ready reports until all came or the
// deadline.
func (l *loadProcs) waitReady(deadline time.Time) ConnsReport {
	var sum ConnsReport
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for range l.procs {
		select {
		case rep := <-l.ready:
			sum.Merge(rep)
		case <-t.C:
			return sum
		}
	}
	return sum
}

// pids are the load processes'.
func (l *loadProcs) pids() []int {
	var ps []int
	for _, p := range l.procs {
		if p.Process != nil {
			ps = append(ps, p.Process.Pid)
		}
	}
	return ps
}

func (l *loadProcs) release() {
	for _, in := range l.stdins {
		io.WriteString(in, "release\n")
		in.Close()
	}
}

// waitResults merges the processes' final reports until all came or the
// deadline.
func (l *loadProcs) waitResults(deadline time.Time) ConnsReport {
	sum := ConnsReport{Outcomes: Counts{}, Early: Counts{}}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for range l.procs {
		select {
		case rep := <-l.results:
			sum.Merge(rep)
		case <-t.C:
			return sum
		}
	}
	return sum
}

// kill ends every load process still running and waits (bounded) for
// them to be reaped.
func (l *loadProcs) kill() {
	for _, p := range l.procs {
		if p.Process != nil {
			p.Process.Kill()
		}
	}
	if l.exited != nil && len(l.procs) > 0 {
		select {
		case <-l.exited:
		case <-time.After(5 * time.Second):
		}
	}
}
