package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/scafo/scafo-edge/admin"
)

// healthCommand probes the admin listener's /healthz and exits non-zero when
// it does not answer 200. The container image has no shell or curl, so its
// HEALTHCHECK runs this.
func healthCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("health")
	fs.SetOutput(stderr)
	var addr string
	var timeout time.Duration
	fs.group = "Health"
	fs.stringVar(&addr, "admin-addr", "SCAFO_EDGE_ADMIN_ADDR", ":9180", "admin listener of the edge to probe")
	fs.durationVar(&timeout, "timeout", "", 3*time.Second, "how long to wait for an answer")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	u, err := admin.URL(addr, "/healthz")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("health %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health %s: status %s", u, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}
