// Command scafo-edge is the ingress of a Scafo fleet: it polls the routing
// document from the box's node, proxies traffic down each route's upstream
// priority list, obtains certificates on demand for the names the document
// allows, and is scraped by Prometheus.
//
// This package only wires the others together: flags and environment,
// logging, listeners, signals and sub-commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is stamped at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a sub-command and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		err = serveCommand(ctx, args, stdout, stderr)
	case "demo":
		err = demoCommand(ctx, args, stdout, stderr)
	case "health":
		err = healthCommand(ctx, args, stdout, stderr)
	case "routes":
		err = routesCommand(ctx, args, stdout, stderr)
	case "import":
		err = importCommand(ctx, args, stdout, stderr)
	case "version":
		fmt.Fprintf(stdout, "scafo-edge %s\n", version)
	default:
		err = fmt.Errorf("unknown command %q (serve, demo, routes, health, import, version)", cmd)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintf(stderr, "scafo-edge: %v\n", err)
	return 1
}
