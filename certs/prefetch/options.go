package prefetch

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/clock"
)

// Defaults for zero Options fields.
const (
	DefaultPerHour          = 20
	DefaultPerDomainPerWeek = 10
	DefaultWorkers          = 2
	DefaultRetryBase        = time.Minute
	DefaultRetryMax         = time.Hour
	// An order usually completes within seconds (1.3 s from document to
	// certificate against Pebble, a few more against Let's Encrypt), so an
	// edge that lost the fleet lock looks again soon rather than listing
	// the name as "elsewhere" long after the certificate is stored; a look
	// costs a storage read and a try-lock, and the wait doubles while the
	// holder works.
	DefaultBusyRetry    = 5 * time.Second
	DefaultReachTimeout = 10 * time.Second
	// DefaultPollInterval is the edge's own default (--poll-interval).
	DefaultPollInterval = 5 * time.Second
)

// Certs is what the queue asks of certificate management. All are
// required and must be safe for concurrent use.
type Certs struct {
	// Certifiable reports whether on-demand issuance would approve name,
	// a back-off after a failed issuance aside (HeldBack), and no wildcard
	// certificate covers it. Asked at the name's turn, and again just
	// before ordering.
	Certifiable func(name string) bool
	// HeldBack returns until when on-demand issuance holds name back after
	// a failed issuance; the zero time when it does not. The queue keeps
	// such a name and orders nothing for it before then. Nil: never.
	HeldBack func(name string) time.Time
	// Held reports whether a certificate for name is held in memory or in
	// storage.
	Held func(ctx context.Context, name string) bool
	// Obtain orders a certificate for name, stores it and loads it into
	// memory. It is called at most once per name at a time on an edge.
	Obtain func(ctx context.Context, name string) error
	// Storage keeps reachability tokens, the record of orders placed (for
	// the per-domain budget) and the fleet's prefetch locks. It should be
	// a certmagic.TryLocker; without one, edges sharing it do not split
	// the work (each still checks storage before ordering).
	Storage certmagic.Storage
}

// Options tunes a Queue. The zero value uses the defaults above.
type Options struct {
	// PerHour is the order budget: a bucket of PerHour orders, refilled at
	// PerHour an hour, so at most twice PerHour in any hour and PerHour an
	// hour sustained. Zero means DefaultPerHour.
	PerHour int
	// PerDomainPerWeek bounds orders per registered domain in any seven
	// days, counting those recorded in Certs.Storage: this edge's before a
	// restart, and every edge's in the fleet store. Zero means
	// DefaultPerDomainPerWeek.
	PerDomainPerWeek int
	// Workers bounds the names worked on at once (reachability checks and
	// orders). Zero means DefaultWorkers.
	Workers int
	// RetryBase and RetryMax shape the back-off of a name that does not
	// reach the fleet, or whose order failed: RetryBase, doubling with
	// each failure in a row, at most RetryMax. Zero means the defaults.
	RetryBase, RetryMax time.Duration
	// BusyRetry is how long an edge waits before looking again at a name
	// another edge of the fleet is working on. Zero means DefaultBusyRetry.
	BusyRetry time.Duration
	// ReachTimeout bounds one reachability check. Zero means
	// DefaultReachTimeout.
	ReachTimeout time.Duration
	// PollInterval is how often the fleet's edges poll the routing
	// document. An edge polls on its own clock, so the one a name's DNS
	// leads to may name it up to one interval after the edge checking it:
	// a check that finds only such edges (Propagating) is tried again
	// after about one interval, with jitter, up to maxNotYet times, before
	// the name's RetryBase back-off. Zero means DefaultPollInterval.
	PollInterval time.Duration
	// LookupNetIP resolves a name for its reachability check, as
	// net.Resolver.LookupNetIP: called once for its A records ("ip4") and
	// once for its AAAA records ("ip6"), an error failing that family
	// alone. Only the public addresses of the family asked for count, as
	// at the CA. Nil means the system's DNS servers through the Go
	// resolver, and no look-up of a special-use name (such as one under
	// .test), which no public CA validates.
	LookupNetIP func(ctx context.Context, network, host string) ([]netip.Addr, error)
	// DialContext connects a reachability check to "<address>:80", for
	// each public address LookupNetIP returned. Nil means a net.Dialer
	// that connects to public addresses only. Tests map the public-looking
	// addresses to loopback.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// Clock is the queue's time for turns, back-offs and the budget, and
	// what it waits on between turns. Nil means the wall clock.
	Clock clock.Clock
	// Log receives the queue's decisions; the zero value logs nothing.
	Log zerolog.Logger
	// Registerer receives the queue's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// State is where a name stands in the queue.
type State string

const (
	// Waiting: the name's turn has not come (workers busy, or newer names first).
	Waiting State = "waiting"
	// Working: the name is being checked or ordered.
	Working State = "working"
	// Budget: the order budget holds the name back.
	Budget State = "budget"
	// Unreachable: the name did not reach the fleet at one of its addresses;
	// it is checked again at Next.
	Unreachable State = "unreachable"
	// Propagating: at one of the name's addresses an edge of this fleet
	// answered that its document does not name the host yet; it is
	// checked again at Next, about one poll interval later.
	Propagating State = "propagating"
	// NoIPv6: the name reached the fleet at its IPv4 addresses, but it
	// publishes an AAAA record and this box has no IPv6 route to check
	// that the CA's IPv6 validation would reach the fleet too; it is
	// checked again at Next, never ordered blindly.
	NoIPv6 State = "no_ipv6"
	// Failed: the order failed; it is tried again at Next, once on-demand
	// issuance's back-off for it has ended too.
	Failed State = "failed"
	// Elsewhere: another edge of the fleet is working on the name.
	Elsewhere State = "elsewhere"
)

// Entry describes one queued name, for the status page.
type Entry struct {
	Name  string
	State State
	// Added is when the document added the name.
	Added time.Time
	// Next is the earliest time of the name's next turn.
	Next time.Time
	// Failures counts failed checks or orders in a row.
	Failures int
	// Error is the last check's or order's failure, if any.
	Error string
}
