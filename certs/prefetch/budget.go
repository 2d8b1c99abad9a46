package prefetch

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"golang.org/x/net/publicsuffix"
	"golang.org/x/time/rate"

	"github.com/scafo/scafo-edge/certs/internal/stamps"
)

// week is the window of the per-registered-domain budget, as Let's
// Encrypt counts its certificates per registered domain.
const week = 7 * 24 * time.Hour

// budget is the queue's order budget: a token bucket of perHour orders an
// hour, and at most perDomain orders per registered domain in any week.
// A name takes its share before its turn (take), so names at work at once
// never count on the same order; the share is spent just before ordering
// (spend) or given back when the turn places no order (giveBack), so a
// name that turns out to be held or unreachable costs nothing.
type budget struct {
	hour      *rate.Limiter
	perDomain int

	mu sync.Mutex
	// spent holds, per registered domain, when its orders of the last
	// week were placed, oldest first.
	spent map[string][]time.Time
	// taken counts shares taken and not yet spent or given back, in all
	// and per registered domain.
	taken       int
	takenDomain map[string]int
}

func newBudget(perHour, perDomain int, now time.Time) *budget {
	lim := rate.NewLimiter(rate.Limit(float64(perHour)/3600), perHour)
	// Start the bucket full at the queue's now, so an injected clock and
	// time.Now are never mixed.
	lim.SetLimitAt(now, lim.Limit())
	return &budget{hour: lim, perDomain: perDomain, spent: map[string][]time.Time{}, takenDomain: map[string]int{}}
}

// registeredDomain returns the registered domain (eTLD+1) of name, or
// name itself when it has none (a bare suffix, an address).
func registeredDomain(name string) string {
	if d, err := publicsuffix.EffectiveTLDPlusOne(name); err == nil {
		return d
	}
	return name
}

// shareWait is how long a name waits when the budget is there but names
// at work hold it: they spend or give it back within their turn.
const shareWait = time.Second

// take takes a share of the budget for name at now and returns zero, or
// returns how long until one may be free.
func (b *budget) take(name string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	domain := registeredDomain(name)
	times := b.pruneLocked(domain, now)
	tokens := b.hour.TokensAt(now)
	var d time.Duration
	if len(times) >= b.perDomain {
		d = times[len(times)-b.perDomain].Add(week).Sub(now)
	}
	if tokens < 1 {
		// Rounded up, so a wait is never zero while the bucket is short.
		d = max(d, time.Duration((1-tokens)/float64(b.hour.Limit())*float64(time.Second))+time.Millisecond)
	}
	if d > 0 {
		return d
	}
	if len(times)+b.takenDomain[domain] >= b.perDomain || tokens-float64(b.taken) < 1 {
		return shareWait
	}
	b.taken++
	b.takenDomain[domain]++
	return 0
}

// spend places the order name's share was taken for.
func (b *budget) spend(name string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	domain := registeredDomain(name)
	b.releaseLocked(domain)
	b.hour.AllowN(now, 1)
	b.spent[domain] = append(b.spent[domain], now)
}

// giveBack returns name's share: no order was placed.
func (b *budget) giveBack(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.releaseLocked(registeredDomain(name))
}

func (b *budget) releaseLocked(domain string) {
	b.taken--
	if b.takenDomain[domain]--; b.takenDomain[domain] <= 0 {
		delete(b.takenDomain, domain)
	}
}

// admit is asked with name's share taken, just before its order, with
// the domain's orders recorded in storage (by this edge before a restart,
// or by other edges of the fleet). It reports how long name must wait
// when those orders and the shares taken fill the registered domain's
// week; zero: the order may go ahead.
func (b *budget) admit(name string, recorded []time.Time, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	domain := registeredDomain(name)
	b.mergeLocked(domain, recorded)
	times := b.pruneLocked(domain, now)
	// takenDomain counts name's own share.
	if len(times)+b.takenDomain[domain] <= b.perDomain {
		return 0
	}
	if len(times) >= b.perDomain {
		return times[len(times)-b.perDomain].Add(week).Sub(now)
	}
	return shareWait
}

// mergeLocked adds recorded to domain's orders, once each: this edge's
// own orders are recorded too.
func (b *budget) mergeLocked(domain string, recorded []time.Time) {
	if len(recorded) == 0 {
		return
	}
	times := append(slices.Clone(b.spent[domain]), recorded...)
	slices.SortFunc(times, time.Time.Compare)
	b.spent[domain] = slices.CompactFunc(times, time.Time.Equal)
}

// pruneLocked drops domain's orders older than a week and returns the rest.
func (b *budget) pruneLocked(domain string, now time.Time) []time.Time {
	times := b.spent[domain]
	i := 0
	for i < len(times) && !now.Before(times[i].Add(week)) {
		i++
	}
	times = times[i:]
	if len(times) == 0 {
		delete(b.spent, domain)
		return nil
	}
	b.spent[domain] = times
	return times
}

// remaining returns the orders the hourly bucket holds at now, less the
// shares taken.
func (b *budget) remaining(now time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hour.TokensAt(now) - float64(b.taken)
}

// ordersPrefix is where the queue records its orders in the certificate
// storage, one key per order under the registered domain:
// <prefix><domain>/<unix nanoseconds>-<random>. In the fleet store every
// edge reads the others', so the per-domain budget holds for the fleet
// (Let's Encrypt counts certificates per registered domain across
// accounts) and across restarts.
const ordersPrefix = "scafo-edge/prefetch/orders/"

// maxRecorded bounds the orders read for one domain; more than a week's
// budget for every edge of a large fleet.
const maxRecorded = 1000

// recordOrder records an order for name placed at t.
func recordOrder(ctx context.Context, storage certmagic.Storage, name string, t time.Time) error {
	if err := stamps.Record(ctx, storage, ordersPrefix+registeredDomain(name), t, []byte(name)); err != nil {
		return fmt.Errorf("record order for %s: %w", name, err)
	}
	return nil
}

// recordedOrders returns when the orders recorded for name's registered
// domain in the week before now were placed, deleting older records.
func recordedOrders(ctx context.Context, storage certmagic.Storage, name string, now time.Time) ([]time.Time, error) {
	times, err := stamps.Since(ctx, storage, ordersPrefix+registeredDomain(name), now, week, maxRecorded)
	if err != nil {
		return nil, fmt.Errorf("recorded orders for %s: %w", name, err)
	}
	return times, nil
}
