package handover

import (
	"context"
	"net/http"
	"sync"
)

// Requests counts the requests in flight through a handler, so a stopping
// edge can wait for them. http.Server.Shutdown does not: it forgets a
// connection once it is hijacked, and a WebSocket or other upgraded
// tunnel is a hijacked connection whose handler runs until the tunnel
// closes. The zero value is ready to use and safe for concurrent use.
type Requests struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to zero; nil while n is zero
}

// Handler counts every request next serves, from entry to return.
func (r *Requests) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.add(1)
		defer r.add(-1)
		next.ServeHTTP(w, req)
	})
}

func (r *Requests) add(d int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n += d
	switch {
	case r.n > 0 && r.idle == nil:
		r.idle = make(chan struct{})
	case r.n == 0 && r.idle != nil:
		close(r.idle)
		r.idle = nil
	}
}

// Wait returns nil once no request is in flight, or ctx's error when it
// ends first. Requests that start while it waits are waited for too.
func (r *Requests) Wait(ctx context.Context) error {
	for {
		r.mu.Lock()
		idle := r.idle
		r.mu.Unlock()
		if idle == nil {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
