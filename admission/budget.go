package admission

import (
	"cmp"
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
	MaxConns int // the descriptors spent on client and upstream connections
	// ConnsPerClient and RequestsPerClient are one client address's (an
	// IPv4 address, an IPv6 /64) shares of connections and of requests in
	// flight.
	ConnsPerClient, RequestsPerClient int
	// AppShare is the share of what other applications leave of the request
	// budget that one application may hold (0 < AppShare ≤ 1); QueueTimeout
	// is how long a request past it waits for a slot.
	AppShare     float64
	QueueTimeout time.Duration
	// ClientRate, if positive, is the requests a second one client address
	// may start, with bursts of ClientBurst.
	ClientRate  float64
	ClientBurst int
	// Overdraft is how far past MaxConns the upstream connections of
	// admitted requests may go.
	Overdraft int
	// MemoryLimit is the memory the process may use, in bytes (0: none
	// known); MemoryFrom says where it came from (MemoryFromFlag, …),
	// MemoryFile the file it was read from, if any.
	MemoryLimit            int64
	MemoryFrom, MemoryFile string
	// AdminConns is the admin listener's pool, out of the reserve, not
	// MaxConns. Zero in New: 8.
	AdminConns int
}

// Facts are what Derive read off the process, for the start-up log and the
// status page.
type Facts struct {
	// Descriptors is RLIMIT_NOFILE's soft limit, raised to the hard one;
	// RaisedFrom is the soft limit before (0: not raised here).
	Descriptors, RaisedFrom uint64
	Reserved                int // kept out of MaxConns for the edge's own work
	// MemTotal is the box's memory (0: unknown). Cgroup is the tightest
	// limit of the edge's cgroup and its ancestors (0: none), CgroupFile
	// the file that set it; CgroupErr reports one that could not be read.
	MemTotal, Cgroup int64
	CgroupFile       string
	CgroupErr        error
	GoLimit          int64 // the Go memory limit Derive set; 0: left to GOMEMLIMIT
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

// The rules these size, and why: docs/design.md, admission table.
const (
	// Measured: an idle keep-alive client connection holds about 20 KiB, a
	// proxied request two descriptors and about 60 KiB.
	connMemory = 32 << 10
	// Measured: about 21 KiB of heap and stack a descriptor with 7,000 long
	// polls in flight; baseHeap is the edge with no traffic, with room.
	heapPerConn         = 24 << 10
	baseHeap            = 64 << 20
	minGoLimit          = 256 << 20
	memoryForConns      = 0.5
	perClientDivisor    = 16
	minPerClient        = 64
	DefaultAppShare     = 0.75
	DefaultQueueTimeout = time.Second
)

// Derive fills the zero fields of want from the process's descriptor and
// memory limits, raising the descriptor soft limit to the hard one first,
// and sets the Go memory limit (docs/design.md, admission table). It errors
// only for limits that cannot work.
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
	l.Overdraft = cmp.Or(l.Overdraft, f.Reserved/2)
	l.AdminConns = cmp.Or(l.AdminConns, max(f.Reserved/adminReserveDivisor, minAdminConns))
	memoryBinds := false // the memory limit, not the descriptors or a flag, sets MaxConns
	if l.MaxConns == 0 {
		l.MaxConns = int(min(f.Descriptors, math.MaxInt32)) - f.Reserved
		if byMemory := int(float64(l.MemoryLimit) * memoryForConns / connMemory); l.MemoryLimit > 0 && byMemory < l.MaxConns {
			l.MaxConns, memoryBinds = byMemory, true
		}
	}
	if l.MaxConns < 16 {
		return l, f, fmt.Errorf("connection budget %d is too small to serve (descriptor limit %d, %d reserved, memory limit %d from %s)",
			l.MaxConns, f.Descriptors, f.Reserved, l.MemoryLimit, cmp.Or(l.MemoryFrom, "none"))
	}
	if uint64(l.MaxConns)+uint64(f.Reserved) > f.Descriptors {
		return l, f, fmt.Errorf("--max-conns %d and the %d descriptors the edge keeps for its own work exceed the descriptor limit %d", l.MaxConns, f.Reserved, f.Descriptors)
	}
	l.ConnsPerClient = cmp.Or(l.ConnsPerClient, max(minPerClient, l.MaxConns/perClientDivisor))
	l.RequestsPerClient = cmp.Or(l.RequestsPerClient, l.ConnsPerClient)
	l.AppShare = cmp.Or(l.AppShare, DefaultAppShare)
	l.QueueTimeout = cmp.Or(l.QueueTimeout, DefaultQueueTimeout)
	if l.ClientRate > 0 && l.ClientBurst == 0 {
		l.ClientBurst = max(1, int(math.Ceil(2*l.ClientRate)))
	}
	if err := l.validate(); err != nil {
		return l, f, err
	}
	// minGoLimit: a small --max-conns must not starve the routing table
	// and the certificate cache.
	budgetGo := max(int64(l.MaxConns)*heapPerConn+baseHeap, minGoLimit)
	switch {
	case goMemLimit != "":
		// GOMEMLIMIT (or =off) is the operator's word: the runtime set it.
	case l.MemoryLimit > 0 && memoryBinds:
		// A tenth left for the binary, thread stacks, socket buffers.
		f.GoLimit = l.MemoryLimit / 10 * 9
	case l.MemoryLimit > 0:
		f.GoLimit = min(l.MemoryLimit/10*9, budgetGo)
	default:
		f.GoLimit = budgetGo
	}
	if f.GoLimit > 0 {
		debug.SetMemoryLimit(f.GoLimit)
	}
	return l, f, nil
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

// reserveFor is the descriptors kept for the edge's own work (listeners,
// edge.db, the poll, certificate storage, the admin pool, the handover
// socket): a few dozen at most, and slack for bursts of them.
func reserveFor(descriptors uint64) int {
	return int(min(max(descriptors/20, 64), 1024))
}

// raiseDescriptorLimit raises RLIMIT_NOFILE's soft limit to the hard one
// (Go's runtime usually has at start).
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
