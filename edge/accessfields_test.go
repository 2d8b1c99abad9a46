package edge

import (
	"bytes"
	"crypto/tls"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// loggedRequest is a record of a request through a trusted proxy, over
// TLS 1.3, with a query, User-Agent, Referer and X-Request-Id.
func loggedRequest(remote string) *Record {
	r := httptest.NewRequest("GET", "https://shop.example/cart?item=3&q=a%20b", nil)
	r.RemoteAddr = remote
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 203.0.113.77")
	r.Header.Set("User-Agent", `curl/8 "quoted"`)
	r.Header.Set("Referer", "https://ref.example/")
	r.Header.Set("X-Request-Id", "trace-42")
	r.TLS = &tls.ConnectionState{Version: tls.VersionTLS13}
	return &Record{Start: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC), Duration: time.Millisecond,
		Method: "GET", Host: r.Host, Path: r.URL.Path, Proto: "HTTP/2.0", Status: 200, BytesOut: 1234, Request: r}
}

var trustedLoopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

func TestAccessLogFields(t *testing.T) {
	tests := []struct {
		name   string
		remote string
		opts   AccessLogOptions
		want   map[string]any
	}{
		{"behind a trusted proxy: its client, its request ID",
			"127.0.0.1:5000", AccessLogOptions{TrustedProxies: trustedLoopback},
			map[string]any{"client": "203.0.113.77", "query": "item=3&q=a%20b", "user_agent": `curl/8 "quoted"`,
				"referer": "https://ref.example/", "tls": "TLS 1.3", "request_id": "trace-42"}},
		{"anonymised IPv4: the /24",
			"127.0.0.1:5000", AccessLogOptions{TrustedProxies: trustedLoopback, Anonymise: true},
			map[string]any{"client": "203.0.113.0", "request_id": "trace-42"}},
		{"an untrusted peer: its own address, not what it forwards",
			"192.0.2.9:5000", AccessLogOptions{TrustedProxies: trustedLoopback},
			map[string]any{"client": "192.0.2.9"}},
		{"anonymised IPv6: the /48",
			"[2001:db8:1234:5678::1]:443", AccessLogOptions{Anonymise: true},
			map[string]any{"client": "2001:db8:1234::"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			a := testsupport.Must(NewAccessLogWith(zerolog.New(&buf), tt.opts))
			a.Observe(loggedRequest(tt.remote))
			l := lines(t, &buf)[0]
			for k, want := range tt.want {
				if l[k] != want {
					t.Errorf("%s = %v, want %v (line %v)", k, l[k], want, l)
				}
			}
			if _, ok := tt.want["request_id"]; !ok {
				if id, _ := l["request_id"].(string); !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) {
					t.Errorf("request_id = %q, want the edge's own for an untrusted peer", id)
				}
			}
		})
	}
	t.Run("client-chosen fields are cut to 1 KiB", func(t *testing.T) {
		var buf bytes.Buffer
		a := testsupport.Must(NewAccessLog(zerolog.New(&buf), 0, nil))
		rec := loggedRequest("192.0.2.9:5000")
		rec.Request.Header.Set("User-Agent", strings.Repeat("u", 10000))
		a.Observe(rec)
		if ua := lines(t, &buf)[0]["user_agent"].(string); len(ua) != maxLoggedField {
			t.Errorf("user_agent is %d bytes, want %d", len(ua), maxLoggedField)
		}
	})
	t.Run("a record without a request logs what it has", func(t *testing.T) {
		var buf bytes.Buffer
		a := testsupport.Must(NewAccessLog(zerolog.New(&buf), 0, nil))
		a.Observe(&Record{Method: "GET", Path: "/", Status: 200})
		if l := lines(t, &buf)[0]; l["client"] != nil || l["request_id"] != nil {
			t.Errorf("line = %v, want no client nor request_id", l)
		}
	})
}

func TestAccessLogCombined(t *testing.T) {
	var out bytes.Buffer
	a := testsupport.Must(NewAccessLogWith(zerolog.Nop(), AccessLogOptions{Format: AccessLogCombined, Out: &out, TrustedProxies: trustedLoopback}))
	a.Observe(loggedRequest("127.0.0.1:5000"))
	want := `203.0.113.77 - - [04/Mar/2026:05:06:07 +0000] "GET https://shop.example/cart?item=3&q=a%20b HTTP/2.0" 200 1234 "https://ref.example/" "curl/8 \x22quoted\x22"` + "\n"
	if out.String() != want {
		t.Errorf("line =\n%q, want\n%q", out.String(), want)
	}

	t.Run("a client cannot end a field or the line", func(t *testing.T) {
		out.Reset()
		rec := loggedRequest("192.0.2.9:5000")
		rec.Request.Header.Set("User-Agent", "a\"b\\c\nd\x00é")
		rec.Request.Header.Del("Referer")
		rec.BytesOut = 0
		a.Observe(rec)
		line := out.String()
		if !strings.HasSuffix(line, ` 200 - "-" "a\x22b\x5Cc\x0Ad\x00\xC3\xA9"`+"\n") || strings.Count(line, "\n") != 1 {
			t.Errorf("line = %q, want the User-Agent escaped, no Referer and no body as -", line)
		}
	})
	t.Run("a bad format or a combined log without a writer is refused", func(t *testing.T) {
		if _, err := NewAccessLogWith(zerolog.Nop(), AccessLogOptions{Format: "xml"}); err == nil {
			t.Error("format xml accepted")
		}
		if _, err := NewAccessLogWith(zerolog.Nop(), AccessLogOptions{Format: AccessLogCombined}); err == nil {
			t.Error("combined without Out accepted")
		}
	})
	t.Run("the rate limit holds for combined lines", func(t *testing.T) {
		var out bytes.Buffer
		a := testsupport.Must(NewAccessLogWith(zerolog.Nop(), AccessLogOptions{Format: AccessLogCombined, Out: &out, PerSecond: 2}))
		for range 5 {
			a.Observe(loggedRequest("192.0.2.9:5000"))
		}
		if n := strings.Count(out.String(), "\n"); n != 2 {
			t.Errorf("%d lines written, want 2", n)
		}
	})
}
