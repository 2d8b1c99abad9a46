package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/admin"
	"github.com/scafo/scafo-edge/edge"
)

// runRoutes runs the routes command with args and returns its output.
func runRoutes(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := routesCommand(context.Background(), args, &out, &errOut)
	if errOut.Len() > 0 {
		t.Logf("routes stderr: %s", errOut.String())
	}
	return out.String(), err
}

func TestRoutesCommand(t *testing.T) {
	const token = "s3cret-ingress-token"
	// An admin listener as a remote client sees it: the handler is told
	// the request came from off loopback, so the token matters.
	status := &admin.Server{Live: &edge.Live{}, Registry: prometheus.NewRegistry(), Token: token}
	remote := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RemoteAddr = "203.0.113.9:40000"
		status.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(remote.Close)

	t.Run("the token and the address also come from the environment", func(t *testing.T) {
		t.Setenv("SCAFO_INGRESS_TOKEN", token)
		t.Setenv("SCAFO_EDGE_ADMIN_ADDR", strings.TrimPrefix(remote.URL, "http://"))
		if _, err := runRoutes(t); err != nil {
			t.Error(err)
		}
	})
	t.Run("--token is sent as a bearer token and --max-paths reaches the table", func(t *testing.T) {
		out, err := runRoutes(t, "--admin", remote.URL, "--token", token, "--max-paths", "1")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "NONE: every request is answered 503") {
			t.Errorf("routes output for an edge without a document:\n%s", out)
		}
	})
	t.Run("without the token off loopback it fails", func(t *testing.T) {
		if _, err := runRoutes(t, "--admin", remote.URL); err == nil || !strings.Contains(err.Error(), "403") {
			t.Errorf("err = %v, want a 403", err)
		}
	})
}
