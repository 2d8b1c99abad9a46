package main

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// h3Conn: one QUIC connection (its own UDP socket, from the connection's
// source address) carrying n held requests as HTTP/3 streams.
func (p *loadProc) h3Conn(ctx context.Context, i, n int, sem chan struct{}, attempted func()) {
	cfg := p.cfg
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
	p.streams(ctx, n, "https://"+cfg.Host+cfg.Path, tr, 3, sem, attempted)
}
