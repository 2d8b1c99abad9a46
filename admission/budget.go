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
	// MaxConns is the descriptors the edge spends on traffic: client
	// connections and upstream connections together. At it, the edge
	// stops accepting.
	MaxConns int
	// ConnsPerClient is how many connections one client address (an IPv4
	// address, an IPv6 /64) may hold while the box is under pressure; past
	// it a new one is refused (held a second, then closed).
	ConnsPerClient int
	// RequestsPerClient is how many requests one client address may have
	// in flight; past it, 429.
	RequestsPerClient int
	// AppShare is the share of what other applications leave of the request
	// budget that one application may hold in flight to its upstreams
	// (0 < AppShare ≤ 1). On an otherwise idle box that is AppShare of the
	// whole budget.
	AppShare float64
	// QueueTimeout is how long a request past its application's share
	// waits for a slot before it is answered 503.
	QueueTimeout time.Duration
	// ClientRate, if positive, is the requests a second one client address
	// may start, with bursts of ClientBurst; past it, 429. Zero: no rate.
	ClientRate  float64
	ClientBurst int
	// Overdraft is how far past MaxConns the upstream connections of
	// admitted requests may go: the clients were accepted while there was
	// room, and a request of theirs past it is refused (503) only beyond
	// this. Derive sets it to half the reserve; the other half stays the
	// edge's own.
	Overdraft int
	// MemoryLimit is the memory the process may use, in bytes; 0 when none
	// is known. Once the live heap and stacks pass 75 % of it new requests
	// are refused (503) until they are back under 65 %.
	MemoryLimit int64
	// MemoryFrom says where MemoryLimit came from (MemoryFromFlag,
	// MemoryFromCgroupV2, …; "" with none), and MemoryFile the file it was
	// read from (the cgroup's limit file, /proc/meminfo; "" for a flag or
	// GOMEMLIMIT): the status page and scafo_edge_memory_limit_bytes say
	// both. Derive sets them.
	MemoryFrom, MemoryFile string
	// AdminConns is how many connections the admin listener holds at most
	// (AdminListener). They are the edge's own work, not traffic: not part
	// of MaxConns, but of the reserve, of which Derive gives them an
	// eighth. Zero in New: the smallest pool, 8.
	AdminConns int
}

// Facts are what Derive read off the process, for the start-up log and the
// status page.
type Facts struct {
	// Descriptors is the descriptor limit (RLIMIT_NOFILE's soft limit, after
	// raising it to the hard one); RaisedFrom is the soft limit before,
	// 0 when it was not raised here (Go's runtime raises it at start).
	Descriptors, RaisedFrom uint64
	// Reserved is the descriptors kept out of MaxConns for the edge's own
	// work: the node poll or routes file, certificate storage, edge.db,
	// the admin listener and its scrapes (Limits.AdminConns of them at
	// most), the handover socket.
	Reserved int
	// MemTotal is the box's memory (/proc/meminfo), 0 when unknown.
	// Cgroup is the tightest limit of the edge's cgroup and its ancestors
	// (0: none), CgroupFile the file that set it; CgroupErr reports a
	// cgroup limit file that could not be read.
	MemTotal, Cgroup int64
	CgroupFile       string
	CgroupErr        error
	// GoLimit is the Go memory limit Derive set (0: it left the runtime's
	// alone, as GOMEMLIMIT asks).
	GoLimit int64
}

// System is what Derive reads the limits off.
type System struct {
	// Getenv reads GOMEMLIMIT.
	Getenv func(string) string
	// Files is the root file system: /proc/self/cgroup,
	// /proc/self/mountinfo, /proc/meminfo and the cgroup mounts are read
	// from it (os.DirFS("/") on a real box).
	Files fs.FS
	// Descriptors returns the descriptor limit and the soft limit it was
	// raised from (0: not raised). Nil: raise RLIMIT_NOFILE's soft limit to
	// the hard one, as Go's runtime does at start.
	Descriptors func() (limit, raisedFrom uint64, err error)
}

const (
	// connMemory is what one descriptor of traffic costs the edge in
	// memory, from measurement: an idle keep-alive client connection costs
	// about 20 KiB (goroutine stack, read and write buffers); a proxied
	// request in flight costs two descriptors and about 60 KiB.
	connMemory = 32 << 10
	// heapPerConn and baseHeap size the Go memory limit the edge sets when
	// the descriptors bind its budget before memory does, or it knows no
	// memory limit: what one connection of the budget holds in
	// heap and stack at most, from measurement (about 21 KiB a descriptor
	// with 7,000 long polls in flight, their upstream connections beside
	// them), and what the edge holds with no traffic, with room. Without
	// it the collector lets garbage grow as large as the live heap, and a
	// box at its budget would hold twice what it uses.
	heapPerConn = 24 << 10
	baseHeap    = 64 << 20
	minGoLimit  = 256 << 20
	// memoryForConns is the share of the memory limit the connection budget
	// may take; the rest is the routing table, certificates, the heap's
	// growth between collections.
	memoryForConns = 0.5
	// perClientDivisor: one client address may hold 1/16 of the connection
	// budget. On a 20,000-descriptor box that is about 1,200: a NAT in
	// front of hundreds of browsers (six HTTP/1.1 connections each, one
	// for HTTP/2) fits; sixteen addresses at their share leave the rest.
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
// GOMEMLIMIT, the tightest limit of the edge's own cgroup and its ancestors
// (if under the box's memory: a cgroup limit past it limits nothing), a
// quarter of the box's memory (/proc/meminfo). The connection budget and the
// memory guard follow it, and, unless GOMEMLIMIT is set, the Go memory
// limit: 90 % of it, as automemlimit does, or, when the descriptors bind the
// budget before memory does, what the budget can hold if that is less.
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
		// GOMEMLIMIT (or GOMEMLIMIT=off) is the operator's word on the Go
		// memory limit: the runtime has set it.
	case l.MemoryLimit > 0 && memoryBinds:
		// Let the collector work harder before the limit's OOM killer ends
		// the process, and leave a tenth for what Go does not count
		// (the binary, thread stacks, the kernel's socket buffers).
		f.GoLimit = l.MemoryLimit / 10 * 9
	case l.MemoryLimit > 0:
		// The descriptors (or --max-conns) bind first: what the budget
		// holds is far under the memory limit, and a Go limit near it
		// would let garbage grow as large as the live heap. Keep it to
		// what the budget can hold.
		f.GoLimit = min(l.MemoryLimit/10*9, budgetGo)
	default:
		// No memory limit known at all.
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

// reserveFor keeps a twentieth of the descriptors for the edge's own work,
// at least 64 and at most 1,024: its own needs are a few dozen at most
// (listeners, edge.db, the poll, certificate storage, the admin scrapes),
// and the rest is slack for bursts of them.
func reserveFor(descriptors uint64) int {
	return int(min(max(descriptors/20, 64), 1024))
}

// raiseDescriptorLimit raises RLIMIT_NOFILE's soft limit to the hard one,
// as Go's runtime does at start (so usually there is nothing left to raise).
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
