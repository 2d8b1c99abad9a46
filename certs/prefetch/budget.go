package prefetch

import (
	"sync"
	"time"

	"golang.org/x/net/publicsuffix"
	"golang.org/x/time/rate"
)

// week is the window of the per-registered-domain budget, as Let's
// Encrypt counts its certificates per registered domain.
const week = 7 * 24 * time.Hour

// budget is the queue's order budget: a token bucket of perHour orders an
// hour, and at most perDomain orders per registered domain in any week.
// Only orders spend it: a name is checked against it before its turn
// (wait) and spends it just before ordering (spend), so a name that turns
// out to be held or unreachable costs nothing.
type budget struct {
	hour      *rate.Limiter
	perDomain int

	mu sync.Mutex
	// spent holds, per registered domain, when its orders of the last
	// week were placed, oldest first.
	spent map[string][]time.Time
}

func newBudget(perHour, perDomain int, now time.Time) *budget {
	lim := rate.NewLimiter(rate.Limit(float64(perHour)/3600), perHour)
	// Start the bucket full at the queue's now, so an injected clock and
	// time.Now are never mixed.
	lim.SetLimitAt(now, lim.Limit())
	return &budget{hour: lim, perDomain: perDomain, spent: map[string][]time.Time{}}
}

// registeredDomain returns the registered domain (eTLD+1) of name, or
// name itself when it has none (a bare suffix, an address).
func registeredDomain(name string) string {
	if d, err := publicsuffix.EffectiveTLDPlusOne(name); err == nil {
		return d
	}
	return name
}

// wait returns how long until an order for name fits the budget at now;
// zero when it fits now.
func (b *budget) wait(name string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waitLocked(registeredDomain(name), now)
}

func (b *budget) waitLocked(domain string, now time.Time) time.Duration {
	var d time.Duration
	if times := b.pruneLocked(domain, now); len(times) >= b.perDomain {
		d = times[len(times)-b.perDomain].Add(week).Sub(now)
	}
	if t := b.hour.TokensAt(now); t < 1 {
		// Rounded up, so a wait is never zero while the bucket is short.
		d = max(d, time.Duration((1-t)/float64(b.hour.Limit())*float64(time.Second))+time.Millisecond)
	}
	return d
}

// spend takes one order for name from the budget at now, or returns how
// long until one fits when another name took the last since wait.
func (b *budget) spend(name string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	domain := registeredDomain(name)
	if d := b.waitLocked(domain, now); d > 0 {
		return d
	}
	b.hour.AllowN(now, 1)
	b.spent[domain] = append(b.spent[domain], now)
	return 0
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

// remaining returns the orders the hourly bucket holds at now.
func (b *budget) remaining(now time.Time) float64 {
	return b.hour.TokensAt(now)
}
