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

// fleetOutbox is the key prefix, in the local bbolt store, of writes that
// have not reached the node yet. certmagic never uses it.
const fleetOutbox = "scafo-edge-fleet-outbox"

type fleetOp struct {
	Seq    uint64 `json:"seq"`
	Delete bool   `json:"delete,omitempty"`
	Key    string `json:"key"`
}

func (o fleetOp) outboxKey() string { return fmt.Sprintf("%s/%020d", fleetOutbox, o.Seq) }

// Store writes value to the local copy, then to the node, queueing it when
// the node does not take it.
func (s *FleetStorage) Store(ctx context.Context, key string, value []byte) error {
	key = cleanKey(key)
	if key == "" {
		return errors.New("store: empty key")
	}
	if err := s.localWrite(func() error { return s.local.Store(ctx, key, value) }); err != nil {
		return err
	}
	defer s.endWrite()
	return s.write(ctx, fleetOp{Key: key}, func(ctx context.Context) error {
		return s.remote.Put(ctx, key, value)
	})
}

// Delete removes key and everything beneath it, locally and on the node,
// queueing the delete when the node does not take it.
func (s *FleetStorage) Delete(ctx context.Context, key string) error {
	key = cleanKey(key)
	if key == "" {
		// Deleting the root would empty the whole fleet's store (and the
		// local bucket the ACME account shares); certmagic never does.
		return errors.New("delete: empty key")
	}
	if err := s.localWrite(func() error { return s.local.Delete(ctx, key) }); err != nil {
		return err
	}
	defer s.endWrite()
	return s.write(ctx, fleetOp{Key: key, Delete: true}, func(ctx context.Context) error {
		return s.remote.Delete(ctx, key)
	})
}

func (s *FleetStorage) localWrite(f func() error) error {
	s.localMu.Lock()
	defer s.localMu.Unlock()
	s.gen.Add(1)
	s.inflight++
	if err := f(); err != nil {
		s.inflight--
		return err
	}
	return nil
}

func (s *FleetStorage) endWrite() {
	s.localMu.Lock()
	defer s.localMu.Unlock()
	s.gen.Add(1)
	s.inflight--
}

// write sends op to the node after whatever is queued before it, or
// queues it. The local copy already holds the write, so a queued write
// returns nil: it is durable here and will land.
func (s *FleetStorage) write(ctx context.Context, op fleetOp, send func(context.Context) error) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	if s.available() && (s.Pending() == 0 || s.flushLocked(ctx) == nil) {
		nctx, cancel := s.nodeCtx(ctx)
		err := send(nctx)
		cancel()
		if err == nil {
			s.up()
			return nil
		}
		if !s.outage(ctx, err) && ctx.Err() == nil {
			// The node answered and refused this write (a 4xx about the
			// write itself): retrying cannot help.
			return fmt.Errorf("write to fleet store: %w", err)
		}
	}
	if err := s.enqueue(op); err != nil {
		return err
	}
	s.wake()
	return nil
}

func (s *FleetStorage) enqueue(op fleetOp) error {
	s.mu.Lock()
	op.Seq = s.nextSeq
	s.nextSeq++
	s.mu.Unlock()
	b, err := json.Marshal(op)
	if err != nil {
		return fmt.Errorf("queue write %q: %w", op.Key, err)
	}
	// The outbox lives outside the context of the call that queued it.
	if err := s.local.Store(context.Background(), op.outboxKey(), b); err != nil {
		return fmt.Errorf("queue write %q: %w", op.Key, err)
	}
	s.mu.Lock()
	s.queue = append(s.queue, op)
	n := len(s.queue)
	s.mu.Unlock()
	s.m.pending.Set(float64(n))
	return nil
}

func (s *FleetStorage) loadQueue() error {
	ctx := context.Background()
	keys, err := s.local.List(ctx, fleetOutbox, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load queued writes: %w", err)
	}
	for _, k := range keys {
		b, err := s.local.Load(ctx, k)
		if err != nil {
			return fmt.Errorf("load queued write %q: %w", k, err)
		}
		var op fleetOp
		if err := json.Unmarshal(b, &op); err != nil {
			s.log.Error().Err(err).Str("entry", k).Msg("certificate store: dropping an unreadable queued write")
			_ = s.local.Delete(ctx, k)
			continue
		}
		s.queue = append(s.queue, op)
		s.nextSeq = max(s.nextSeq, op.Seq+1)
	}
	return nil
}

// flushLocked sends the queue to the node in order, dropping each entry
// as it lands. flushMu must be held. It stops at the first failure.
func (s *FleetStorage) flushLocked(ctx context.Context) error {
	landed := 0
	defer func() {
		if landed > 0 {
			s.log.Info().Int("writes", landed).Int("still_queued", s.Pending()).Msg("certificate store: queued writes reached the node")
		}
	}()
	for {
		s.mu.Lock()
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return nil
		}
		op := s.queue[0]
		s.mu.Unlock()

		err := s.send(ctx, op)
		if err != nil && s.outage(ctx, err) {
			return err
		}
		if err != nil && ctx.Err() != nil {
			return err
		}
		if err != nil {
			// The node refuses this write for good; keeping it would stall
			// every write after it.
			s.log.Error().Err(err).Str("key", op.Key).Msg("certificate store: node refused a queued write; dropping it")
		} else {
			landed++
			s.up()
		}
		if derr := s.local.Delete(context.Background(), op.outboxKey()); derr != nil {
			return fmt.Errorf("drop queued write %q: %w", op.Key, derr)
		}
		s.mu.Lock()
		s.queue = s.queue[1:]
		n := len(s.queue)
		s.mu.Unlock()
		s.m.pending.Set(float64(n))
	}
}

// send replays one queued write: a put sends what the local copy holds
// now (a later write of the same key is queued after it anyway).
func (s *FleetStorage) send(ctx context.Context, op fleetOp) error {
	nctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	if op.Delete {
		return s.remote.Delete(nctx, op.Key)
	}
	v, err := s.local.Load(nctx, op.Key)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // deleted since; its delete is queued behind
	}
	if err != nil {
		return err
	}
	return s.remote.Put(nctx, op.Key, v)
}

func (s *FleetStorage) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run retries the queue until Close, with jittered, doubling waits after
// failures.
func (s *FleetStorage) run() {
	defer close(s.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	retry := backoff.Backoff{Base: s.retryMin, Max: s.retryMax, Spread: backoff.RetrySpread}
	var timer <-chan time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-s.kick:
		case <-timer:
		}
		timer = nil
		if s.Pending() == 0 {
			continue
		}
		s.flushMu.Lock()
		err := s.flushLocked(ctx)
		s.flushMu.Unlock()
		if err == nil {
			retry.Succeeded()
			continue
		}
		timer = s.clock.After(retry.Failed())
	}
}
