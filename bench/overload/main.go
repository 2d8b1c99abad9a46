// Command overload is the measuring half of bench/overload.sh: what one
// slow application does to the other applications behind the same proxy.
// The shell installs, builds, configures and starts the proxies; this
// program is the application behind them, the load in front of them and the
// ruler beside them. Each step is a subcommand:
//
//	overload upstream [flags]   the applications: fast.test's answers at
//	                            once, slow.test's holds every request until
//	                            released (a long poll, an SSE stream, a stuck
//	                            app); several processes share its ports
//	overload conns [flags]      one load process: N held requests (or N idle
//	                            keep-alive connections, or h2 streams), each
//	                            bounded in time, reporting what each got
//	overload row [flags]        one row of the table: baseline of fast.test,
//	                            then the load (spread over `conns` processes,
//	                            none near the descriptor limit), fast.test
//	                            and new visitors measured under it, the
//	                            proxy's descriptors, RSS and (scafo-edge)
//	                            goroutines sampled, release, recovery
//	overload sink [flags]       a bare net/http server answering 404, to
//	                            aim a row's load at instead of the proxy
//	                            (row -load-addr): the box's floor
//	overload report [flags]     the Markdown table (or -json) of the rows
//	overload tree PID           PID and its descendants, one a line
//
// The results file holds one JSON object per line (Row), appended as rows
// run, so a run cut short still has what it measured.
package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: overload upstream|conns|row|sink|report|tree [flags]")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "overload %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func run(cmd string, args []string, stdout io.Writer) error {
	switch cmd {
	case "upstream":
		return upstreamCmd(args)
	case "conns":
		return connsCmd(args, os.Stdin, stdout)
	case "row":
		return rowCmd(args)
	case "sink":
		return sinkCmd(args)
	case "report":
		return reportCmd(args, stdout)
	case "tree":
		if len(args) != 1 {
			return fmt.Errorf("want one pid, got %q", args)
		}
		pid, err := strconv.Atoi(args[0])
		if err != nil {
			return fmt.Errorf("pid %q: %w", args[0], err)
		}
		tree, err := procFS{Dir: "/proc"}.Tree(pid)
		if err != nil {
			return err
		}
		for _, p := range tree {
			fmt.Fprintln(stdout, p)
		}
		return nil
	}
	return fmt.Errorf("unknown command %q", cmd)
}
