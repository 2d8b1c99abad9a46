package certs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/scafo/scafo-edge/internal/backoff"
)

// fleetLockRecords is the key prefix, in the node's store, of the records
// lock holders leave: who holds a lock and until when.
const fleetLockRecords = "locks"

// fleetHeld is a lock this value holds: on the node under token, or, when
// the node could not be reached, in the local store.
type fleetHeld struct {
	token string
	local bool
}

// noRecordSeen tracks a lock seen held with no record, in consecutive
// looks: it is stale once that has lasted LockTTL over several looks.
type noRecordSeen struct {
	since time.Time
	looks int
}

// fleetLock is a lock record, the body of the node's lock and the value
// of its record object.
type fleetLock struct {
	Holder  string    `json:"holder"`
	Token   string    `json:"token"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
}

// NewFleetStorage returns a store writing through remote and keeping its
func lockRecordKey(name string) string { return fleetLockRecords + "/" + name }

// lockBody is the record this edge leaves for a lock it holds under token,
// valid for lease from now.
func (s *FleetStorage) lockBody(token string, lease time.Duration) ([]byte, error) {
	now := s.clock.Now()
	return json.Marshal(fleetLock{Holder: s.holder, Token: token, Created: now, Expires: now.Add(lease)})
}

// lockRecord reads the record of lock name from the node. found is false
// when there is none or it cannot be decoded (an unreadable record names
// no holder); err is a failure to ask, never a missing record.
func (s *FleetStorage) lockRecord(ctx context.Context, name string) (rec fleetLock, found bool, err error) {
	b, err := s.remote.Get(ctx, lockRecordKey(name))
	if errors.Is(err, fs.ErrNotExist) {
		return fleetLock{}, false, nil
	}
	if err != nil {
		return fleetLock{}, false, err
	}
	if json.Unmarshal(b, &rec) != nil {
		return fleetLock{}, false, nil
	}
	return rec, true, nil
}

// Lock blocks until it holds the lock for name, or ctx ends. It tries
// again after jittered waits doubling up to LockPollMax, or at once when
// this value releases a lock.
func (s *FleetStorage) Lock(ctx context.Context, name string) error {
	retry := backoff.Backoff{Base: max(s.poll/20, time.Millisecond), Max: s.poll, Spread: backoff.RetrySpread}
	return pollLock(ctx, s.clock, name, &s.unlocked, retry.Failed, s.TryLock)
}

// TryLock takes the lock for name if it is free or stale, without
// waiting. While the node cannot be reached it takes the local store's
// lock instead.
func (s *FleetStorage) TryLock(ctx context.Context, name string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if !s.available() {
		return s.tryLocal(ctx, name)
	}
	for attempt := 0; ; attempt++ {
		token := randomHex(12)
		body, err := s.lockBody(token, s.ttl)
		if err != nil {
			return false, fmt.Errorf("lock %q: %w", name, err)
		}
		nctx, cancel := s.nodeCtx(ctx)
		ok, err := s.remote.TryLock(nctx, name, body)
		cancel()
		if err != nil {
			if s.outage(ctx, err) {
				return s.tryLocal(ctx, name)
			}
			return false, fmt.Errorf("lock %q: %w", name, err)
		}
		s.up()
		if ok {
			s.mu.Lock()
			s.held[name] = fleetHeld{token: token}
			delete(s.noRecord, name)
			s.mu.Unlock()
			nctx, cancel := s.nodeCtx(ctx)
			if err := s.remote.Put(nctx, lockRecordKey(name), body); err != nil {
				// Without a record, waiters take the lock over after
				// LockTTL of seeing none: the same bound as an expiry.
				s.log.Warn().Err(err).Str("lock", name).Msg("certificate store: could not write a lock record")
			}
			cancel()
			return true, nil
		}
		if attempt > 0 {
			return false, nil
		}
		stale, holder := s.stale(ctx, name)
		if !stale {
			return false, nil
		}
		s.log.Warn().Str("lock", name).Str("holder", holder).Msg("certificate store: taking over a stale lock (its holder stopped renewing it)")
		nctx, cancel = s.nodeCtx(ctx)
		err = s.remote.Unlock(nctx, name)
		cancel()
		if err != nil {
			s.outage(ctx, err)
			return false, nil
		}
		s.m.takeovers.Inc()
	}
}

// stale reports whether the held lock name was left by a holder that
// died: its record expired, or no record has been seen for LockTTL over
// several looks (a holder dies between taking the lock and writing the
// record, or a record is being replaced, for a moment at most).
func (s *FleetStorage) stale(ctx context.Context, name string) (bool, string) {
	nctx, cancel := s.nodeCtx(ctx)
	rec, ok, err := s.lockRecord(nctx, name)
	cancel()
	if err != nil {
		s.outage(ctx, err)
		return false, ""
	}
	now := s.clock.Now()
	if ok && !rec.Expires.IsZero() {
		s.mu.Lock()
		delete(s.noRecord, name)
		s.mu.Unlock()
		return now.After(rec.Expires), rec.Holder
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen, ok := s.noRecord[name]
	if !ok {
		seen.since = now
	}
	seen.looks++
	s.noRecord[name] = seen
	if seen.looks >= 3 && now.Sub(seen.since) > s.ttl {
		delete(s.noRecord, name)
		return true, "(no record)"
	}
	return false, ""
}

func (s *FleetStorage) tryLocal(ctx context.Context, name string) (bool, error) {
	ok, err := s.local.TryLock(ctx, name)
	if ok {
		s.mu.Lock()
		s.held[name] = fleetHeld{local: true}
		s.mu.Unlock()
		s.m.localLocks.Inc()
	}
	return ok, err
}

// Unlock releases the lock for name if this value still holds it; a lock
// that went stale and was taken over is left to its new holder.
func (s *FleetStorage) Unlock(ctx context.Context, name string) error {
	s.mu.Lock()
	h, ok := s.held[name]
	delete(s.held, name)
	s.mu.Unlock()
	defer s.unlocked.release()
	if !ok {
		return fmt.Errorf("unlock %q: not held by this storage", name)
	}
	if h.local {
		return s.local.Unlock(ctx, name)
	}
	nctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	rec, found, err := s.lockRecord(nctx, name)
	if err != nil {
		s.outage(ctx, err)
		return fmt.Errorf("unlock %q: %w", name, err)
	}
	if found && rec.Token != h.token {
		s.log.Warn().Str("lock", name).Str("holder", rec.Holder).Msg("certificate store: a lock this edge held was taken over as stale")
		return nil
	}
	// The record goes first: a waiter that then sees the lock held with no
	// record waits LockTTL before it doubts it.
	if err := s.remote.Delete(nctx, lockRecordKey(name)); err != nil {
		s.outage(ctx, err)
		return fmt.Errorf("unlock %q: %w", name, err)
	}
	if err := s.remote.Unlock(nctx, name); err != nil {
		s.outage(ctx, err)
		return fmt.Errorf("unlock %q: %w", name, err)
	}
	s.up()
	return nil
}

// RenewLockLease extends a lock this value holds to now+lease.
func (s *FleetStorage) RenewLockLease(ctx context.Context, name string, lease time.Duration) error {
	s.mu.Lock()
	h, ok := s.held[name]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("renew lock %q: not held by this storage", name)
	}
	if h.local {
		return s.local.RenewLockLease(ctx, name, lease)
	}
	nctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	rec, found, err := s.lockRecord(nctx, name)
	if err != nil {
		return s.renewFailed(ctx, name, err)
	}
	if found && rec.Token != h.token {
		return fmt.Errorf("renew lock %q: taken over by %s", name, rec.Holder)
	}
	body, err := s.lockBody(h.token, lease)
	if err != nil {
		return fmt.Errorf("renew lock %q: %w", name, err)
	}
	if err := s.remote.Put(nctx, lockRecordKey(name), body); err != nil {
		return s.renewFailed(ctx, name, err)
	}
	return nil
}

// renewFailed decides what a renewal the node did not take means. An
// outage is not worth failing an issuance attempt for (certmagic would
// abort it): the lock stays held until its last expiry, after which an
// edge that can still reach the node takes it over, as for any stale lock.
func (s *FleetStorage) renewFailed(ctx context.Context, name string, err error) error {
	if s.outage(ctx, err) {
		return nil
	}
	return fmt.Errorf("renew lock %q: %w", name, err)
}
