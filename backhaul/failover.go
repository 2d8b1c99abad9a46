package backhaul

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"syscall"

	"github.com/scafo/scafo-edge/backhaul/internal/h1"
	"github.com/scafo/scafo-edge/node"
)

// Errors Forward returns when it wrote nothing; the caller answers the client
// itself.
var (
	// ErrNoUpstream: no upstream produced a response, because none could be
	// connected or because the one connected failed before its response
	// headers (the edge answers 502).
	ErrNoUpstream = errors.New("no upstream answered")
	// ErrUpstreamTimeout: the upstream did not send response headers within
	// Options.ResponseHeaderTimeout (the edge answers 504).
	ErrUpstreamTimeout = errors.New("upstream response header timeout")
	// ErrUpstreamFailed: an upstream was connected but failed before its
	// response headers (reset, malformed response). An error that matches it
	// also matches ErrNoUpstream, so a caller may tell the cases apart in
	// its text without having to handle a third status.
	ErrUpstreamFailed = errors.New("upstream failed before responding")
)

// Result describes how Forward went, for access logs and metrics.
type Result struct {
	// Node and Address name the upstream that answered, or the last one
	// tried when none did; both are empty when none was tried.
	Node, Address string
	// Failovers counts the upstreams that could not be connected before the
	// last one tried.
	Failovers int
	// Status is the status code written to the client, 0 when Forward wrote
	// nothing.
	Status int
	// BytesIn counts the request body bytes read from the client, BytesOut
	// the response body bytes written to it; for an upgraded connection,
	// the bytes tunnelled each way.
	BytesIn, BytesOut int64
	// RequestID is the ID sent upstream as X-Request-Id (RequestIDFor);
	// zero when the request was not prepared (its body broke off first).
	RequestID RequestID
}

// Forward proxies r to the first usable upstream of ups, a priority list
// (never a weighting, docs/design.md rule 7). An upstream that cannot be
// connected is ejected for a while and the next one is tried, unseen by the
// client; ejected upstreams are skipped while another remains and are tried
// last, in order, rather than failing the request.
//
// When Result.Status is 0 nothing was written: the error matches
// ErrNoUpstream or ErrUpstreamTimeout and the caller answers 502 or 504, or
// it matches context.Canceled when the client went away first (nothing to
// answer; not an upstream failure). When Result.Status is set the response
// was written; an error then only reports a body cut short, and the client
// connection has already been closed so the client sees the truncation (on
// a connection that cannot be hijacked, HTTP/2, Forward panics with
// http.ErrAbortHandler instead, as httputil.ReverseProxy does).
//
// It is one pass: the request is prepared once (outbound.go), the
// upstreams are tried in order, one exchange each (the pooled client,
// h1.go, or the transport), and the first answer is relayed.
func (p *Proxy) Forward(w http.ResponseWriter, r *http.Request, ups []node.Upstream) (Result, error) {
	var res Result
	if len(ups) == 0 {
		return res, fmt.Errorf("%w: empty upstream list", ErrNoUpstream)
	}
	out, err := p.prepare(w, r)
	if err != nil {
		return res, clientGone(err)
	}
	res.RequestID = RequestID{own: out.fwd.ownID}
	if out.fwd.relayID {
		res.RequestID = RequestID{relayed: r.Header[headerXRequestID][0]}
	}
	var lastErr error
	tried := false
	for u, s := range p.inOrder(ups) {
		if tried {
			res.Failovers++
			p.metrics.failover(res.Node)
		}
		tried = true
		res.Node, res.Address = u.Node, u.Address
		ans, err := p.exchange(&out, u.Address)
		if err != nil {
			// Only a connect failure moves on: nothing was sent, so the
			// next upstream is safe for every method. Once connected,
			// the upstream may have acted on the request.
			connectFailed, err := p.failed(r, out.body, u, s, err)
			if connectFailed {
				lastErr = err
				continue
			}
			return res, err
		}
		p.connected(u, s)
		return res, p.relay(w, &out, ans, &res)
	}
	return res, fmt.Errorf("%w: %w", ErrNoUpstream, lastErr)
}

// inOrder yields ups in the order they are tried, each with its health:
// those not ejected when the request started, then the ejected ones, in
// order, which get a turn only after every other one failed to connect.
func (p *Proxy) inOrder(ups []node.Upstream) iter.Seq2[node.Upstream, *hostState] {
	return func(yield func(node.Upstream, *hostState) bool) {
		now := p.clock.Now()
		var skipped indexSet
		for i, u := range ups {
			s := p.health.state(u, now)
			if s.ejected(now) {
				skipped.add(i)
				continue
			}
			if !yield(u, s) {
				return
			}
		}
		if skipped.empty() {
			return
		}
		for i, u := range ups {
			if skipped.has(i) && !yield(u, p.health.state(u, now)) {
				return
			}
		}
	}
}

// answer is an upstream's response whose head has arrived: from the
// transport (resp), or from the pooled client on pc.
type answer struct {
	resp *http.Response
	pc   *h1.Conn
}

// exchange sends out to addr and reads the response head, on out's path.
// An error is for failed to classify.
func (p *Proxy) exchange(out *outbound, addr string) (answer, error) {
	if out.pooled {
		return p.exchangeH1(out, addr)
	}
	if out.req.URL.Host != "" {
		// The transport may still touch the request an earlier attempt
		// failed with, from its own goroutines: each attempt gets its own.
		out.req = retarget(out.req)
	}
	out.req.URL.Host = addr
	resp, err := p.transport.RoundTrip(out.req)
	if err != nil {
		return answer{}, err
	}
	if resp.StatusCode < 100 || resp.StatusCode > 999 {
		// Go's client takes "HTTP/1.1 099"; its server panics on it.
		resp.Body.Close()
		return answer{}, fmt.Errorf("%w: status %d", h1.ErrMalformedResponse, resp.StatusCode)
	}
	return answer{resp: resp}, nil
}

// relay writes the answer to w: its head, then its body as it arrives
// (or, after a 101, the tunnel), then its trailers.
func (p *Proxy) relay(w http.ResponseWriter, out *outbound, ans answer, res *Result) error {
	if ans.pc != nil {
		return p.relayH1(w, out, ans, res)
	}
	err := p.respond(w, out.r, ans.resp, out.upgrade, res)
	if out.body != nil {
		res.BytesIn += out.body.sent()
	}
	return err
}

// indexSet is a set of small indexes; the first 64 cost no allocation,
// which covers any realistic upstream list.
type indexSet struct {
	lo uint64
	hi map[int]bool
}

func (s *indexSet) add(i int) {
	if i < 64 {
		s.lo |= 1 << i
		return
	}
	if s.hi == nil {
		s.hi = map[int]bool{}
	}
	s.hi[i] = true
}

func (s *indexSet) has(i int) bool {
	if i < 64 {
		return s.lo&(1<<i) != 0
	}
	return s.hi[i]
}

func (s *indexSet) empty() bool { return s.lo == 0 && len(s.hi) == 0 }

// failed classifies a round trip that produced no response.
func (p *Proxy) failed(r *http.Request, body *requestBody, u node.Upstream, s *hostState, err error) (connectFailed bool, _ error) {
	ctx := r.Context()
	switch {
	case ctx.Err() != nil:
		return false, clientGone(ctx.Err())
	case body != nil && body.clientFailed.Load():
		// The client's upload broke off: its fault, not the upstream's.
		return false, clientGone(err)
	case isConnectError(err) && outOfDescriptors(err):
		// The edge ran out, not the upstream: ejecting it would turn
		// the edge's own shortage into an outage of every application
		// behind it.
		return true, err
	case isConnectError(err):
		p.connectFailed(u, s, err)
		return true, err
	}
	// Connected, so reachable: whatever went wrong next is no reason to
	// eject it, nor to try another (the request may have been acted on).
	p.connected(u, s)
	if h1.IsTimeout(err) {
		return false, fmt.Errorf("%w: %s: %w", ErrUpstreamTimeout, u.Address, err)
	}
	return false, fmt.Errorf("%w: %w: %s: %w", ErrNoUpstream, ErrUpstreamFailed, u.Address, err)
}

// outOfDescriptors reports whether a dial failed because this process or the
// system has no descriptor left.
func outOfDescriptors(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// connectFailed ejects u and logs the first failure of an episode.
func (p *Proxy) connectFailed(u node.Upstream, s *hostState, err error) {
	n, d := p.health.connectFailed(s, p.clock.Now())
	p.metrics.connectFailure(u.Node)
	if n == 1 {
		p.log.Warn().Str("node", u.Node).Str("upstream", u.Address).Err(err).
			Dur("ejected_for", d).Msg("upstream connect failed; ejecting it")
	}
}

// connected clears u's failures and logs a recovery once.
func (p *Proxy) connected(u node.Upstream, s *hostState) {
	if n := p.health.connected(s); n > 0 {
		p.log.Info().Str("node", u.Node).Str("upstream", u.Address).Int32("failures", n).
			Msg("upstream recovered")
	}
}

// clientGone wraps the reason a client went away so that it matches
// context.Canceled: the caller must neither answer nor count a 502.
func clientGone(cause error) error {
	if errors.Is(cause, context.Canceled) {
		return fmt.Errorf("client gone: %w", cause)
	}
	return fmt.Errorf("client gone: %w: %w", context.Canceled, cause)
}
