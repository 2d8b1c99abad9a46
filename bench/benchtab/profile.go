package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// windowCmd prints the per-request line of a --profile summary from the
// row the profiled window appended.
func windowCmd(args []string, stdout io.Writer) error {
	r, _, err := profiledWindow("window", args)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "    CPU %s µs/request; %s context switches/request; %s read+write syscalls/request\n",
		orDash(r.CPU, 1), orDash(r.CtxSwitches, 2), orDash(r.RWSyscalls, 2))
	return nil
}

// allocsCmd prints allocations per request in the profiled window from the
// totals of two `go tool pprof -top` outputs (-objects: alloc_objects;
// -bytes: alloc_space with -unit=B) over the allocs profiles taken at its
// two ends.
func allocsCmd(args []string, stdout io.Writer) error {
	r, fs, err := profiledWindow("allocs", args, "objects", "bytes")
	if err != nil {
		return err
	}
	o := pprofTotal(readOptional(fs.Lookup("objects").Value.String()))
	b := pprofTotal(readOptional(fs.Lookup("bytes").Value.String()))
	n := float64(*r.Requests)
	fmt.Fprintf(stdout, "About %.0f objects and %.0f bytes allocated per request (the heap profile is sampled and ends at the last GC).\n", o/n, b/n)
	return nil
}

// profiledWindow parses the flags of a --profile subcommand (-results and
// the file flags named) and returns the window's row: the last of the
// results file, which must have measured.
func profiledWindow(name string, args []string, files ...string) (Row, *flag.FlagSet, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	results := fs.String("results", "", "results file holding the profiled window's row")
	for _, f := range files {
		fs.String(f, "", "a go tool pprof -top output")
	}
	if err := fs.Parse(args); err != nil {
		return Row{}, nil, err
	}
	rows, err := readRows(*results)
	if err != nil {
		return Row{}, nil, err
	}
	if len(rows) == 0 || rows[len(rows)-1].Status != "ok" || rows[len(rows)-1].Requests == nil || *rows[len(rows)-1].Requests == 0 {
		return Row{}, nil, errors.New("the profiled window measured nothing")
	}
	return rows[len(rows)-1], fs, nil
}

// pprofTotal reads the total of a `go tool pprof -top` output, from its
// line "Showing nodes accounting for X, P% of TOTAL total"; TOTAL may carry
// a unit (1234567B, 12.5MB, 3.1k). Zero when there is none.
func pprofTotal(out []byte) float64 {
	for _, line := range lines(out) {
		f := strings.Fields(line)
		if len(f) < 2 || f[len(f)-1] != "total" {
			continue
		}
		v := f[len(f)-2]
		scale := 1.0
		for _, u := range []struct {
			suffix string
			scale  float64
		}{{"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}, {"G", 1e9}, {"M", 1e6}, {"k", 1e3}} {
			if strings.HasSuffix(v, u.suffix) {
				v, scale = strings.TrimSuffix(v, u.suffix), u.scale
				break
			}
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0
		}
		return n * scale
	}
	return 0
}
