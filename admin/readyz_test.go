package admin

import (
	"slices"
	"strings"
	"testing"
)

// Off loopback /readyz says ready or not and nothing more: the source's URL
// names the node and its token's user, and an error's text can name
// internal addresses (issue 50). Loopback and the token get the detail.
func TestReadyzGivesTheDetailOnlyToAPrivilegedClient(t *testing.T) {
	a := accessServer(t, "private")
	cases := []struct {
		name   string
		req    accessRequest
		detail bool
	}{
		{"loopback", accessRequest{remote: "127.0.0.1:50000"}, true},
		{"a private network", accessRequest{remote: "10.0.0.9:50000"}, false},
		{"a public address", accessRequest{remote: "11.0.0.9:50000"}, false},
		{"a trusted proxy", accessRequest{remote: "198.51.100.7:50000"}, false},
		{"a public address with the token", accessRequest{remote: "11.0.0.9:50000", auth: "Bearer " + statusToken}, true},
		{"loopback relaying a public client", accessRequest{remote: "127.0.0.1:50000", xff: []string{"11.0.0.9"}}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := tc.req.serve(t, a, "/readyz")
			body := rec.Body.String()
			if rec.Code != 200 {
				t.Fatalf("GET /readyz = %d %q, want 200", rec.Code, body)
			}
			if got := strings.Contains(body, "fingerprint: "); got != tc.detail {
				t.Errorf("GET /readyz gave the detail: %v, want %v: %q", got, tc.detail, body)
			}
			if !tc.detail && body != "ready\n" {
				t.Errorf("GET /readyz = %q, want %q", body, "ready\n")
			}
		})
	}
}

func TestRedactArgsHidesTheTokenInEverySpelling(t *testing.T) {
	cases := []struct{ in, want []string }{
		{[]string{"scafo-edge", "serve", "--ingress-token", "s3cret", "--node", "http://n"}, []string{"scafo-edge", "serve", "--ingress-token", "REDACTED", "--node", "http://n"}},
		{[]string{"scafo-edge", "serve", "-ingress-token", "s3cret"}, []string{"scafo-edge", "serve", "-ingress-token", "REDACTED"}},
		{[]string{"scafo-edge", "serve", "--ingress-token=s3cret"}, []string{"scafo-edge", "serve", "--ingress-token=REDACTED"}},
		{[]string{"scafo-edge", "serve", "-ingress-token=s3=cret"}, []string{"scafo-edge", "serve", "-ingress-token=REDACTED"}},
		{[]string{"scafo-edge", "serve", "--ingress-token"}, []string{"scafo-edge", "serve", "--ingress-token"}},
		{[]string{"scafo-edge", "serve", "--ingress-token-file", "/run/token"}, []string{"scafo-edge", "serve", "--ingress-token-file", "/run/token"}},
	}
	for _, tc := range cases {
		if got := redactArgs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("redactArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
