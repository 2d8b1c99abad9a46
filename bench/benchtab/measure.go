package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"time"
)

// measureCmd samples the proxy's and the upstream's process trees, runs the
// load command with its output in -out, samples again, and appends the
// row. The trees are read once, before the window, and sampled at both
// ends: the window's figures belong to the processes that served it.
func measureCmd(args []string, proc procFS) error {
	fs := flag.NewFlagSet("measure", flag.ContinueOnError)
	var rf rowFlags
	rf.register(fs)
	tool := fs.String("tool", "wrk", "the load tool whose output -out holds: wrk, h2load or h3load")
	pid := fs.Int("pid", 0, "the proxy's pid (its descendants count too)")
	upPid := fs.Int("upstream-pid", 0, "the upstream's pid")
	out := fs.String("out", "", "where the load command's output goes")
	h2log := fs.String("h2load-log", "", "h2load's --log-file, read for p50/p99 and then removed")
	idle := fs.Int64("idle-kib", 0, "the proxy's VmRSS before any load (benchtab rss)")
	tck := fs.Int64("clock-ticks", 100, "clock ticks per second (getconf CLK_TCK)")
	statsURL := fs.String("stats-url", "", "bench/upstream's /stats, read around the window to note TLS resumptions")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := rf.check(); err != nil {
		return err
	}
	if *pid == 0 || *upPid == 0 || *out == "" || fs.NArg() == 0 {
		return errors.New("-pid, -upstream-pid, -out and a load command after -- are required")
	}
	pids, err := proc.Tree(*pid)
	if err != nil {
		return err
	}
	upPids, err := proc.Tree(*upPid)
	if err != nil {
		return err
	}
	var stats0 upstreamStats
	if *statsURL != "" {
		stats0, _ = getStats(*statsURL)
	}
	w := Window{IdleKiB: *idle, ClockTicks: *tck}
	load := func() ([]byte, error) {
		w.Before, w.UpBefore = proc.Sample(pids), proc.Sample(upPids)
		return runLoad(*out, fs.Args())
	}
	output, err := load()
	if err != nil {
		return err
	}
	if *tool == "wrk" && parseWrk(output).Requests == 0 {
		// wrk 4.1 now and then stalls every connection of a TLS
		// Connection: close run; a second run has always gone through.
		fmt.Fprintf(os.Stderr, "run.sh: %s %s: wrk measured no request; running it once more\n", rf.proxy, rf.cell)
		if output, err = load(); err != nil {
			return err
		}
	}
	w.After, w.UpAfter = proc.Sample(pids), proc.Sample(upPids)

	r := rf.row()
	if *statsURL != "" {
		if stats1, err := getStats(*statsURL); err == nil {
			if n := resumptionNote(stats0, stats1); n != "" {
				r.Note = n
			}
		}
	}
	w.Load, err = parseLoad(*tool, output, readOptional(*h2log))
	if *h2log != "" {
		os.Remove(*h2log) // per-request lines: large, and read
	}
	if err != nil {
		return err
	}
	if w.Load.Requests == 0 {
		r.Status, r.Note = "failed", *tool+" measured no request: "+lastWords(output)
		return appendRow(rf.results, r)
	}
	if w.Load.Note != "" {
		r.Note = w.Load.Note
	}
	r.figures(w, rf.proxy == "direct")
	return appendRow(rf.results, r)
}

// runLoad runs argv with its output in path and returns that output. The
// tool's exit status is not an error: what it measured is in its output, and
// a run that measured nothing becomes a failed row.
func runLoad(path string, argv []string) ([]byte, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create load output: %w", err)
	}
	c := exec.Command(argv[0], argv[1:]...)
	c.Stdout, c.Stderr = f, f
	runErr := c.Run()
	f.Close()
	var exit *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exit) {
		return nil, fmt.Errorf("run %s: %w", argv[0], runErr)
	}
	return os.ReadFile(path)
}

// upstreamStats is bench/upstream's /stats: TLS requests served, and those
// on a resumed session.
type upstreamStats struct {
	TLSRequests int64 `json:"tls_requests"`
	Resumed     int64 `json:"resumed"`
}

func getStats(url string) (upstreamStats, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: insecureTransport()}
	resp, err := c.Get(url)
	if err != nil {
		return upstreamStats{}, err
	}
	defer resp.Body.Close()
	return decodeStats(resp.Body)
}

// resumptionNote says how many of the window's new TLS connections resumed
// a session: wrk keeps each connection's session, so in a new-connection
// cell the handshakes measured are mostly resumptions.
func resumptionNote(before, after upstreamStats) string {
	t, r := after.TLSRequests-before.TLSRequests, after.Resumed-before.Resumed
	if t <= 0 {
		return ""
	}
	return fmt.Sprintf("%.0f%% of the new TLS connections resumed a session (so the handshakes measured are mostly resumptions)", 100*float64(r)/float64(t))
}

func decodeStats(r io.Reader) (upstreamStats, error) {
	var s upstreamStats
	err := json.NewDecoder(r).Decode(&s)
	return s, err
}

// insecureTransport does not check the upstream's certificate: it is the
// bench's own self-signed one, as wrk and curl -k do not check it either.
func insecureTransport() *http.Transport {
	return &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
}
