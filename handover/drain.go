package handover

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
)

// Requests counts the requests in flight through a handler, so a stopping
// edge can wait for them. http.Server.Shutdown does not: it forgets a
// connection once it is hijacked, and a WebSocket or other upgraded
// tunnel is a hijacked connection whose handler runs until the tunnel
// closes. The zero value is ready to use and safe for concurrent use.
//
// A request costs two atomic additions; the mutex is taken only while
// someone waits.
type Requests struct {
	n       atomic.Int64
	waiting atomic.Bool // set by the first Wait, never cleared

	mu   sync.Mutex
	idle chan struct{} // closed when n drops to zero while waited on
}

// Handler counts every request next serves, from entry to return.
func (r *Requests) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.n.Add(1)
		defer r.done()
		next.ServeHTTP(w, req)
	})
}

func (r *Requests) done() {
	if r.n.Add(-1) == 0 && r.waiting.Load() {
		r.mu.Lock()
		if r.idle != nil {
			close(r.idle)
			r.idle = nil
		}
		r.mu.Unlock()
	}
}

// Wait returns nil once no request is in flight, or ctx's error when it
// ends first. Requests that start while it waits are waited for too.
func (r *Requests) Wait(ctx context.Context) error {
	r.waiting.Store(true)
	for {
		r.mu.Lock()
		// Checked under mu: a done that takes n to zero after this sees
		// waiting set and closes the channel made here.
		if r.n.Load() == 0 {
			r.mu.Unlock()
			return nil
		}
		if r.idle == nil {
			r.idle = make(chan struct{})
		}
		idle := r.idle
		r.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
