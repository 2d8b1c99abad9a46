// Command benchtab is the measuring half of bench/run.sh: the shell
// installs, builds and starts things; benchtab reads /proc around a measured
// window, parses what wrk, h2load and bench/h3load printed, turns both into
// per-request figures, and renders the rounds as the README's table or as
// JSON. Each step is a subcommand the script calls:
//
//	benchtab tree PID                 PID and its descendants, one a line
//	benchtab rss PID                  VmRSS of PID's tree, KiB
//	benchtab measure [flags] -- LOAD-COMMAND...
//	                                  sample, run the load, sample, parse,
//	                                  append one row to the results file
//	benchtab row [flags]              append a row that did not measure
//	                                  (skipped, failed, n/a) with its reason
//	benchtab report [flags]           the Markdown table (or -json) of a
//	                                  results file, medians over rounds
//	benchtab window -results FILE     the per-request line of --profile
//	benchtab allocs [flags]           allocations per request from two
//	                                  go tool pprof -top outputs
//
// The results file holds one JSON object per line (Row), appended as cells
// run, so a run cut short still has what it measured.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchtab tree|rss|measure|row|report|window|allocs [flags]")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2:], os.Stdout, procFS{Dir: "/proc"}); err != nil {
		fmt.Fprintf(os.Stderr, "benchtab %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func run(cmd string, args []string, stdout io.Writer, proc procFS) error {
	switch cmd {
	case "tree", "rss":
		if len(args) != 1 {
			return fmt.Errorf("want one pid, got %q", args)
		}
		pid, err := strconv.Atoi(args[0])
		if err != nil {
			return fmt.Errorf("pid %q: %w", args[0], err)
		}
		tree, err := proc.Tree(pid)
		if err != nil {
			return err
		}
		if cmd == "rss" {
			fmt.Fprintln(stdout, proc.Sample(tree).RSSKiB)
			return nil
		}
		for _, p := range tree {
			fmt.Fprintln(stdout, p)
		}
		return nil
	case "measure":
		return measureCmd(args, proc)
	case "row":
		return rowCmd(args)
	case "report":
		return reportCmd(args, stdout)
	case "window":
		return windowCmd(args, stdout)
	case "allocs":
		return allocsCmd(args, stdout)
	}
	return fmt.Errorf("unknown command %q", cmd)
}

// rowFlags are the flags naming a row, shared by measure and row.
type rowFlags struct {
	results, proxy, cell, note string
	round                      int
}

func (f *rowFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.results, "results", "", "results file (JSON lines), appended to")
	fs.StringVar(&f.proxy, "proxy", "", "the row's proxy")
	fs.StringVar(&f.cell, "cell", "", "the row's cell")
	fs.IntVar(&f.round, "round", 1, "the round")
	fs.StringVar(&f.note, "note", "", "a note on the row")
}

func (f *rowFlags) check() error {
	if f.results == "" || f.proxy == "" || f.cell == "" {
		return errors.New("-results, -proxy and -cell are required")
	}
	return nil
}

func (f *rowFlags) row() Row {
	return Row{Round: f.round, Summary: Summary{Proxy: f.proxy, Cell: f.cell, Note: f.note}}
}

func rowCmd(args []string) error {
	fs := flag.NewFlagSet("row", flag.ContinueOnError)
	var rf rowFlags
	rf.register(fs)
	status := fs.String("status", "", "why the row has no figures: skipped, failed, n/a, ...")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := rf.check(); err != nil {
		return err
	}
	if *status == "" || *status == "ok" {
		return errors.New("-status is required and is not ok (measure writes those)")
	}
	r := rf.row()
	r.Status = *status
	return appendRow(rf.results, r)
}

func reportCmd(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	results := fs.String("results", "", "results file (JSON lines)")
	asJSON := fs.Bool("json", false, "JSON instead of Markdown")
	var m Meta
	fs.StringVar(&m.Duration, "duration", "", "measured time per cell")
	fs.StringVar(&m.Warmup, "warmup", "", "warm-up per cell")
	fs.IntVar(&m.Rounds, "rounds", 1, "rounds")
	fs.IntVar(&m.Conns, "connections", 0, "wrk connections")
	fs.IntVar(&m.Threads, "threads", 0, "wrk threads")
	fs.IntVar(&m.Workers, "workers", 0, "workers")
	fs.IntVar(&m.CPUs, "cpus", 0, "CPUs of the machine")
	m.Versions = map[string]string{}
	fs.Func("version", "NAME=VERSION, repeated", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("want NAME=VERSION, got %q", s)
		}
		m.Versions[k] = v
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	rows, err := readRows(*results)
	if err != nil {
		return err
	}
	m.Date = time.Now().UTC().Format("2006-01-02T15:04:05Z")
	sums := aggregate(rows)
	if *asJSON {
		return writeJSON(stdout, m, sums)
	}
	writeMarkdown(stdout, m, sums)
	return nil
}
