package admission

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"runtime/debug"
	"syscall"
	"time"
)

// Limits are the numbers a Controller enforces. Derive fills every zero
// field from the process's limits; a flag that sets one wins.
type Limits struct {
	// MaxConns is the descriptors the edge spends on traffic: client and
	// upstream connections together.
	MaxConns int
	// ConnsPerClient is how many connections one client address (an IPv4
	// address, an IPv6 /64) may hold while the box is under pressure.
	ConnsPerClient int
	// RequestsPerClient is how many requests one client address may have
	// in flight while its application is contended (or, over HTTP/2 and
	// HTTP/3, while the box is); past it, 429.
	RequestsPerClient int
	// AppShare is the share of what other applications leave of the request
	// budget that one application may hold in flight to its upstreams
	// (0 < AppShare ≤ 1); QueueTimeout is how long a request past it waits
	// for a slot before it is answered 503.
	AppShare     float64
	QueueTimeout time.Duration
	// ClientRate, if positive, is the requests a second one client address
	// may start, with bursts of ClientBurst; past it, 429.
	ClientRate  float64
	ClientBurst int
	// Overdraft is how far past MaxConns the upstream connections of
	// admitted requests may go before a request is refused (503): its
	// client was accepted while there was room. Derive sets it to half the
	// reserve; the other half stays the edge's own.
	Overdraft int
	// MemoryLimit is the memory the process may use, in bytes (0: none
	// known); MemoryFrom says where it came from (MemoryFromFlag, …; ""
	// with none), MemoryFile the file it was read from ("" for a flag or
	// GOMEMLIMIT). Derive sets them.
	MemoryLimit            int64
	MemoryFrom, MemoryFile string
	// AdminConns is how many connections the admin listener holds at most
	// (admin.go): out of the reserve, not MaxConns. Zero in New: 8.
	AdminConns int
}

// Facts are what Derive read off the process, for the start-up log and the
// status page.
type Facts struct {
	// Descriptors is RLIMIT_NOFILE's soft limit, raised to the hard one;
	// RaisedFrom is the soft limit before (0: not raised here).
	Descriptors, RaisedFrom uint64
	// Reserved is the descriptors kept out of MaxConns for the edge's own
	// work (reserveFor).
	Reserved int
	// MemTotal is the box's memory (0: unknown). Cgroup is the tightest
	// limit of the edge's cgroup and its ancestors (0: none), CgroupFile
	// the file that set it; CgroupErr reports one that could not be read.
	MemTotal, Cgroup int64
	CgroupFile       string
	CgroupErr        error
	// GoLimit is the Go memory limit Derive set (0: left alone, as
	// GOMEMLIMIT asks).
	GoLimit int64
}

// System is what Derive reads the limits off.
type System struct {
	Getenv func(string) string // reads GOMEMLIMIT
	// Files is the root file system, os.DirFS("/") on a real box: /proc and
	// the cgroup mounts are read from it.
	Files fs.FS
	// Descriptors returns the descriptor limit and the soft limit it was
	// raised from (0: not raised). Nil: raise RLIMIT_NOFILE's soft limit to
	// the hard one.
	Descriptors func() (limit, raisedFrom uint64, err error)
}

const (
	// connMemory is what one descriptor of traffic costs, measured: an idle
	// keep-alive client connection about 20 KiB (goroutine stack, read and
	// write buffers); a proxied request two descriptors and about 60 KiB.
	connMemory = 32 << 10
	// heapPerConn and baseHeap size the Go memory limit when the
	// descriptors bind the budget before memory does, or no memory limit is
	// known: what a connection of the budget holds in heap and stack at
	// most, measured (about 21 KiB a descriptor with 7,000 long polls in
	// flight), and what the edge holds with no traffic, with room. Without
	// it the collector lets garbage grow as large as the live heap.
	heapPerConn = 24 << 10
	baseHeap    = 64 << 20
	minGoLimit  = 256 << 20
	// memoryForConns is the share of the memory limit the connection budget
	// may take; the rest is the routing table, certificates, the heap's
	// growth between collections.
	memoryForConns = 0.5
	// perClientDivisor: on a 20,000-descriptor box a client address may
	// hold about 1,200: a NAT in front of hundreds of browsers (six
	// HTTP/1.1 connections each, one for HTTP/2) fits.
	perClientDivisor = 16
	minPerClient     = 64
	// DefaultAppShare lets one application hold three quarters of what the
	// others leave: all of an idle box but a quarter, and always room for
	// another application to start.
	DefaultAppShare     = 0.75
	DefaultQueueTimeout = time.Second
)

// Derive fills the zero fields of want from the process's descriptor and
// memory limits, raising the descriptor soft limit to the hard one first.
// It errors only for limits that cannot work.
//
// The memory limit is, first that says one: want.MemoryLimit (a flag),
// GOMEMLIMIT, the tightest limit of the edge's cgroup and its ancestors
// (if under the box's memory: past it, it limits nothing), a quarter of
// the box's memory. Unless GOMEMLIMIT is set, the Go memory limit is set
// to 90 % of it, as automemlimit does, or, when the descriptors bind the
// budget before memory does, to what the budget can hold if that is less.
func Derive(want Limits, sys System) (Limits, Facts, error) {
	var f Facts
	var err error
	descriptors := sys.Descriptors
	if descriptors == nil {
		descriptors = raiseDescriptorLimit
	}
	if f.Descriptors, f.RaisedFrom, err = descriptors(); err != nil {
		return want, f, err
	}
	l := want
	goMemLimit := sys.Getenv("GOMEMLIMIT")
	f.MemTotal = memTotal(sys.Files)
	cg, cgErr := cgroupMemoryLimit(sys.Files)
	f.Cgroup, f.CgroupFile, f.CgroupErr = cg.bytes, cg.file, cgErr
	switch {
	case l.MemoryLimit > 0:
		l.MemoryFrom, l.MemoryFile = MemoryFromFlag, ""
	case goMemLimit != "" && goMemLimit != "off":
		l.MemoryLimit, l.MemoryFrom, l.MemoryFile = debug.SetMemoryLimit(-1), MemoryFromGOMEMLIMIT, ""
	case cg.bytes > 0 && (f.MemTotal == 0 || cg.bytes < f.MemTotal):
		l.MemoryLimit, l.MemoryFrom, l.MemoryFile = cg.bytes, cg.version, cg.file
	case f.MemTotal > 0:
		l.MemoryLimit, l.MemoryFrom, l.MemoryFile = f.MemTotal/memTotalShare, MemoryFromMemTotal, "/proc/meminfo"
	default:
		l.MemoryLimit, l.MemoryFrom, l.MemoryFile = 0, "", ""
	}
	f.Reserved = reserveFor(f.Descriptors)
	if l.Overdraft == 0 {
		l.Overdraft = f.Reserved / 2
	}
	if l.AdminConns == 0 {
		l.AdminConns = max(f.Reserved/adminReserveDivisor, minAdminConns)
	}
	memoryBinds := false // the memory limit, not the descriptors or a flag, sets MaxConns
	if l.MaxConns == 0 {
		l.MaxConns = int(min(f.Descriptors, math.MaxInt32)) - f.Reserved
		if byMemory := int(float64(l.MemoryLimit) * memoryForConns / connMemory); l.MemoryLimit > 0 && byMemory < l.MaxConns {
			l.MaxConns, memoryBinds = byMemory, true
		}
	}
	if l.MaxConns < 16 {
		return l, f, fmt.Errorf("connection budget %d is too small to serve (descriptor limit %d, %d reserved, memory limit %d from %s)",
			l.MaxConns, f.Descriptors, f.Reserved, l.MemoryLimit, orNone(l.MemoryFrom))
	}
	if uint64(l.MaxConns)+uint64(f.Reserved) > f.Descriptors {
		return l, f, fmt.Errorf("--max-conns %d and the %d descriptors the edge keeps for its own work exceed the descriptor limit %d", l.MaxConns, f.Reserved, f.Descriptors)
	}
	if l.ConnsPerClient == 0 {
		l.ConnsPerClient = max(minPerClient, l.MaxConns/perClientDivisor)
	}
	if l.RequestsPerClient == 0 {
		l.RequestsPerClient = l.ConnsPerClient
	}
	if l.AppShare == 0 {
		l.AppShare = DefaultAppShare
	}
	if l.QueueTimeout == 0 {
		l.QueueTimeout = DefaultQueueTimeout
	}
	if l.ClientRate > 0 && l.ClientBurst == 0 {
		l.ClientBurst = max(1, int(math.Ceil(2*l.ClientRate)))
	}
	if err := l.validate(); err != nil {
		return l, f, err
	}
	// A small --max-conns must not starve the routing table and the
	// certificate cache: never under minGoLimit.
	budgetGo := max(int64(l.MaxConns)*heapPerConn+baseHeap, minGoLimit)
	switch {
	case goMemLimit != "":
		// GOMEMLIMIT (or =off) is the operator's word: the runtime set it.
	case l.MemoryLimit > 0 && memoryBinds:
		// The collector works harder before the OOM killer ends the
		// process; a tenth is left for what Go does not count (the binary,
		// thread stacks, the kernel's socket buffers).
		f.GoLimit = l.MemoryLimit / 10 * 9
	case l.MemoryLimit > 0:
		// The descriptors (or --max-conns) bind first: a Go limit near the
		// memory limit would let garbage grow as large as the live heap.
		f.GoLimit = min(l.MemoryLimit/10*9, budgetGo)
	default:
		f.GoLimit = budgetGo
	}
	if f.GoLimit > 0 {
		debug.SetMemoryLimit(f.GoLimit)
	}
	return l, f, nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func (l Limits) validate() error {
	switch {
	case l.ConnsPerClient < 1:
		return errors.New("connections per client must be at least 1")
	case l.RequestsPerClient < 1:
		return errors.New("requests per client must be at least 1")
	case l.AppShare <= 0 || l.AppShare > 1:
		return fmt.Errorf("application share %g is not in (0, 1]", l.AppShare)
	case l.QueueTimeout < 0:
		return errors.New("queue timeout must not be negative")
	case l.ClientRate < 0 || l.ClientBurst < 0:
		return errors.New("client rate and burst must not be negative")
	case l.AdminConns < 0:
		return errors.New("admin connections must not be negative")
	}
	return nil
}

// reserveFor keeps a twentieth of the descriptors for the edge's own work
// (listeners, edge.db, the poll, certificate storage, the admin pool, the
// handover socket), at least 64 and at most 1,024: a few dozen at most,
// and slack for bursts of them.
func reserveFor(descriptors uint64) int {
	return int(min(max(descriptors/20, 64), 1024))
}

// raiseDescriptorLimit raises RLIMIT_NOFILE's soft limit to the hard one.
// Go's runtime does at start, so there is usually nothing left to raise.
func raiseDescriptorLimit() (limit, raisedFrom uint64, err error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, 0, fmt.Errorf("read descriptor limit: %w", err)
	}
	if r.Cur >= r.Max {
		return r.Cur, 0, nil
	}
	before := r.Cur
	r.Cur = r.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return before, 0, nil // keep the soft limit; the budget follows it
	}
	return r.Max, before, nil
}
