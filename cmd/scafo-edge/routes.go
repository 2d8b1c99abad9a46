package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/scafo/scafo-edge/admin"
	"github.com/scafo/scafo-edge/node"
)

// routesCommand prints the routing table of a running edge, read from its
// admin listener's /status.json (admin.PrintRoutes lays it out).
func routesCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("routes")
	fs.SetOutput(stderr)
	var o admin.RoutesOptions
	var token, tokenFile string
	fs.group = "Routes"
	fs.stringVar(&o.Admin, "admin", "SCAFO_EDGE_ADMIN_ADDR", ":9180", "admin listener of the edge: an address (:9180) or a base URL (http://edge-1:9180)")
	fs.stringVar(&token, "token", "SCAFO_INGRESS_TOKEN", "", "ingress token; needed when the admin listener is reached off loopback")
	fs.stringVar(&tokenFile, "token-file", "SCAFO_INGRESS_TOKEN_FILE", "", "file holding the ingress token")
	fs.boolVar(&o.JSON, "json", "", false, "print the edge's status.json as is, for scripts")
	fs.intVar(&o.MaxPaths, "max-paths", "", 0, "list at most this many path prefixes per host, then a count (0: all)")
	fs.durationVar(&o.Timeout, "timeout", "", 5*time.Second, "how long to wait for the edge")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	tok, warnings, err := node.LoadToken(token, tokenFile)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		fmt.Fprintln(stderr, "scafo-edge routes:", w)
	}
	o.Token = tok
	return admin.PrintRoutes(ctx, o, stdout)
}
