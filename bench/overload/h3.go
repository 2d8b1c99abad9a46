package main

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// h3Conn: one QUIC connection (its own UDP socket, from the connection's
// source address) carrying n held requests as HTTP/3 streams.
func (p *loadProc) h3Conn(ctx context.Context, i, n int, sem chan struct{}, attempted func()) {
	cfg := p.cfg
	var wg sync.WaitGroup
	fail := func(outcome string) {
		for range n {
			p.record(outcome)
			attempted()
		}
	}
	raddr, err := net.ResolveUDPAddr("udp", cfg.Target)
	if err != nil {
		fail(OutError)
		return
	}
	src := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}
	if len(cfg.Srcs) > 0 {
		src.IP = net.ParseIP(cfg.Srcs[(cfg.Offset+i)%len(cfg.Srcs)])
	}
	pc, err := net.ListenUDP("udp", src)
	if err != nil {
		fail(Classify(err))
		return
	}
	qt := &quic.Transport{Conn: pc}
	defer pc.Close()
	defer qt.Close()
	tr := &http3.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: cfg.Host},
		QUICConfig:      &quic.Config{HandshakeIdleTimeout: cfg.DialTimeout, MaxIdleTimeout: cfg.Timeout},
		Dial: func(ctx context.Context, _ string, tlsCfg *tls.Config, qc *quic.Config) (*quic.Conn, error) {
			return qt.Dial(ctx, raddr, tlsCfg, qc)
		},
	}
	defer tr.Close()
	sem <- struct{}{}
	var wrote sync.WaitGroup
	wrote.Add(n)
	url := "https://" + cfg.Host + cfg.Path
	for s := 0; s < n; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			done := func() {
				once.Do(func() {
					attempted()
					wrote.Done()
				})
			}
			defer done()
			rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
			if err != nil {
				p.record(OutError)
				return
			}
			req.Header.Set("User-Agent", "bench-overload")
			p.open.Add(1)
			// http3 has no WroteRequest trace: a request counts as
			// placed once its round trip started and a moment passed,
			// or when it ends.
			go func() {
				select {
				case <-time.After(200 * time.Millisecond):
				case <-rctx.Done():
				}
				done()
			}()
			resp, err := tr.RoundTrip(req)
			p.open.Add(-1)
			if err != nil {
				p.record(Classify(err))
				return
			}
			io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			p.record(strconv.Itoa(resp.StatusCode))
		}()
	}
	ch := make(chan struct{})
	go func() { wrote.Wait(); close(ch) }()
	t := time.NewTimer(2 * time.Second)
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	<-sem
	wg.Wait()
}
