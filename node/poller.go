package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/scafo/scafo-edge/internal/clock"
)

// RoutesPath is the node endpoint that serves the routing document.
const RoutesPath = "/v1/ingress/routes"

// PollerOptions configure a Poller.
type PollerOptions struct {
	// Node is the node API's base URL, e.g. "http://127.0.0.1:7400".
	// Required.
	Node string
	// Token is the ingress bearer token. Empty: no Authorization header is
	// sent (a node with a token answers 401, which is logged plainly).
	Token string
	// Prefer is sent as ?prefer=: "self" (the zero value) puts the answering
	// node's upstreams first, a node id puts that node's first, and "none"
	// sends no prefer parameter (the fleet's own order).
	Prefer string
	// Interval between polls, jittered by ±10%. Zero: 5s.
	Interval time.Duration
	// Timeout bounds one poll, body included. Zero: Interval, at least 1s
	// and at most 30s.
	Timeout time.Duration
	// MaxSize is the largest body accepted. Zero: MaxDocumentSize. It may
	// be set lower than MaxDocumentSize, not higher.
	MaxSize int64
	// Client sends the polls. Nil: a private client that uses no proxy
	// (the token must not transit one) and follows no redirect (a node
	// does not redirect; the token must not follow one elsewhere).
	Client *http.Client
	// Log receives failures (once per cause), recoveries and changes. The
	// zero value logs nothing.
	Log zerolog.Logger
	// Registerer receives the scafo_edge_routing_* collectors. Nil: no
	// metrics.
	Registerer prometheus.Registerer

	// Clock is what the poller reads the time from and waits on between
	// polls. Nil means the wall clock.
	Clock clock.Clock
}

// Poller keeps a current routing document from a node: it polls
// GET <node>/v1/ingress/routes with the bearer token, sends the served
// document's validator as If-None-Match, and hands on only changed, valid
// documents. No failure — a 503 before the node's first pass, a rejected
// token, a 5xx, a timeout, a refused connection, a garbage or invalid body —
// ever replaces the last good document.
type Poller struct {
	loop
	url     string
	token   string
	client  *http.Client
	private bool // client is ours: close its idle connections when Run ends
}

// NewPoller checks opts and returns a Poller; nothing is sent until Run.
func NewPoller(opts PollerOptions) (*Poller, error) {
	u, err := url.Parse(opts.Node)
	if err != nil {
		return nil, fmt.Errorf("parse node url: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("parse node url %q: want http(s)://host[:port]", opts.Node)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("parse node url %q: a base url has no query or fragment", opts.Node)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + RoutesPath
	u.RawPath = ""
	switch p := opts.Prefer; p {
	case "none":
	case "":
		u.RawQuery = "prefer=self"
	default:
		u.RawQuery = url.Values{"prefer": {p}}.Encode()
	}
	if err := checkToken(opts.Token); err != nil {
		return nil, fmt.Errorf("ingress token: %w", err)
	}
	if opts.MaxSize < 0 || opts.MaxSize > MaxDocumentSize {
		return nil, fmt.Errorf("max size %d: want 0 to %d", opts.MaxSize, MaxDocumentSize)
	}
	p := &Poller{url: u.String(), token: opts.Token, client: opts.Client}
	if p.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil
		p.client = &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
		p.private = true
	}
	p.loop = loop{
		source:   "node " + u.Scheme + "://" + u.Host,
		interval: opts.Interval,
		timeout:  opts.Timeout,
		maxSize:  opts.MaxSize,
		fetch:    p.get,
		log:      opts.Log,
		clock:    clock.OrReal(opts.Clock),
	}
	if p.interval <= 0 {
		p.interval = 5 * time.Second
	}
	if p.timeout <= 0 {
		p.timeout = min(max(p.interval, time.Second), 30*time.Second)
	}
	if p.maxSize == 0 {
		p.maxSize = MaxDocumentSize
	}
	p.st.Source = p.source
	if p.m, err = newMetrics(opts.Registerer, &p.loop); err != nil {
		return nil, err
	}
	return p, nil
}

// Run polls until ctx ends; see Source.
func (p *Poller) Run(ctx context.Context, seed *Update, apply func(Update)) {
	if p.private {
		defer p.client.CloseIdleConnections()
	}
	p.run(ctx, seed, apply)
}

func (p *Poller) get(ctx context.Context, etag string) (fetched, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return fetched{}, &pollError{resultUnreachable, fmt.Errorf("build request: %w", err)}
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "scafo-edge")
	if p.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fetched{}, transportError("get routes", err)
	}
	defer func() {
		// Drain a little so the connection can be reused; a huge error
		// body is not worth reading to save one handshake.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}()

	switch code := resp.StatusCode; {
	case code == http.StatusOK:
		if resp.ContentLength > p.maxSize {
			return fetched{}, &pollError{resultTooLarge, fmt.Errorf("document is %d bytes, over the %d byte limit", resp.ContentLength, p.maxSize)}
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, p.maxSize+1))
		if err != nil {
			return fetched{}, transportError("read routes", err)
		}
		if int64(len(body)) > p.maxSize {
			return fetched{}, &pollError{resultTooLarge, fmt.Errorf("document is over the %d byte limit", p.maxSize)}
		}
		return fetched{body: body, etag: resp.Header.Get("ETag")}, nil
	case code == http.StatusNotModified:
		return fetched{notModified: true}, nil
	case code == http.StatusServiceUnavailable:
		return fetched{}, &pollError{resultDraining, fmt.Errorf("node answered 503 (draining: no reconcile pass yet, or going away): %s", snippet(resp.Body))}
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		what := "node rejected the ingress token"
		if p.token == "" {
			what = "node requires an ingress token and none is configured"
		}
		return fetched{}, &pollError{resultUnauthorize, fmt.Errorf("%s (%d %s): set --ingress-token or --ingress-token-file to the node's ingress token (<node state-dir>/ingress-token)", what, code, http.StatusText(code))}
	default:
		return fetched{}, &pollError{resultHTTPError, fmt.Errorf("node answered %d %s: %s", code, http.StatusText(code), snippet(resp.Body))}
	}
}

// transportError classifies a failure to get an answer at all.
func transportError(step string, err error) error {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return &pollError{resultTimeout, fmt.Errorf("%s: %w", step, err)}
	}
	return &pollError{resultUnreachable, fmt.Errorf("%s: %w", step, err)}
}

// snippet is the start of an error body, made safe for a log line.
func snippet(r io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(r, 200))
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(string(b), "?"))
	s = strings.TrimSpace(s)
	if s == "" {
		return "(empty body)"
	}
	return fmt.Sprintf("%q", s)
}
