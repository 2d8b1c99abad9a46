package admission

import "sync/atomic"

// An address's share is a count of what it holds, and a count is a poor
// measure of a claim: an office NAT's thousand browsers each hold a
// keep-alive connection and finish a request on it every second or so,
// while a slowloris or a long-poll flood holds as many and finishes
// nothing. Under contention the NAT, past its share by count, would be
// refused new connections, have its idle ones shed first and its requests
// refused 429, while the attack holds its place. So an address's shares
// grow with the requests it finishes: it may hold, besides its share, as
// many connections as it finished requests in the last claimSeconds, and
// as many requests in flight as it finished in the last second. What holds
// without moving (held requests, idle connections, slow first requests)
// keeps the share it had, and goes first.
const claimSeconds = 2

// finishedRate counts the requests an address finished, by second: the
// last whole second's count and the one going on. Counted with atomics
// only, on the request's own path; a count that races with the turn of a
// second may land in either, which a share does not notice.
type finishedRate struct {
	sec  atomic.Int64 // the second cur counts, Unix s
	cur  atomic.Int64
	prev atomic.Int64
}

// add counts a request finished in second now; one of a second before
// the counted ones is not counted.
func (f *finishedRate) add(now int64) {
	s := f.sec.Load()
	if now < s {
		return
	}
	if s != now && f.sec.CompareAndSwap(s, now) {
		last := int64(0)
		if s == now-1 {
			last = f.cur.Load()
		}
		f.prev.Store(last)
		f.cur.Store(0)
	}
	f.cur.Add(1)
}

// perSecond is how many requests were finished a second around now: the
// last whole second's count, or the one going on if it is already more.
func (f *finishedRate) perSecond(now int64) int {
	switch f.sec.Load() {
	case now:
		return int(max(f.prev.Load(), f.cur.Load()))
	case now - 1:
		return int(f.cur.Load())
	}
	return 0
}
