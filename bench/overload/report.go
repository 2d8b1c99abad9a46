package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// ReadRows reads a results file: one Row per line, in the order run.
func ReadRows(r io.Reader) ([]Row, error) {
	var rows []Row
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var row Row
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			return rows, fmt.Errorf("line %d: %w", n, err)
		}
		rows = append(rows, row)
	}
	return rows, sc.Err()
}

type versionsFlag []string

func (v *versionsFlag) String() string     { return strings.Join(*v, ",") }
func (v *versionsFlag) Set(s string) error { *v = append(*v, s); return nil }

// Report is what -json prints.
type Report struct {
	Settings map[string]string `json:"settings"`
	Versions map[string]string `json:"versions"`
	Rows     []Row             `json:"rows"`
}

func reportCmd(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	results := fs.String("results", "", "results file (JSON lines)")
	asJSON := fs.Bool("json", false, "print JSON instead of the Markdown table")
	var versions, settings versionsFlag
	fs.Var(&versions, "version", "NAME=VERSION of a proxy or tool (repeatable)")
	fs.Var(&settings, "setting", "KEY=VALUE shown above the table (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *results == "" {
		return errors.New("need -results")
	}
	f, err := os.Open(*results)
	if err != nil {
		return err
	}
	defer f.Close()
	rows, err := ReadRows(f)
	if err != nil {
		return err
	}
	rep := Report{Settings: kv(settings), Versions: kv(versions), Rows: rows}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	_, err = io.WriteString(stdout, Markdown(rep))
	return err
}

func kv(list []string) map[string]string {
	m := map[string]string{}
	for _, s := range list {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return m
}

func mib(kib int64) string { return strconv.FormatInt((kib+512)/1024, 10) }

func ms(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// Markdown renders the table: one line per proxy and row, in the order
// run, and the rows' notes below it.
func Markdown(rep Report) string {
	var b strings.Builder
	b.WriteString("## Overload: one slow application\n\n")
	var keys []string
	for k := range rep.Versions {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) > 0 {
		var vs []string
		for _, k := range keys {
			vs = append(vs, k+" "+rep.Versions[k])
		}
		b.WriteString("Versions: " + strings.Join(vs, "; ") + ".\n")
	}
	keys = keys[:0]
	for k := range rep.Settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) > 0 {
		var ss []string
		for _, k := range keys {
			ss = append(ss, k+" "+rep.Settings[k])
		}
		b.WriteString("Settings: " + strings.Join(ss, "; ") + ".\n")
	}
	b.WriteString("\n| proxy | load | fds peak | RSS MiB peak → after | fast.test served / failed | p50 / p99 / max ms | base p99 ms | p99 attack ms (× base) | new visitors ≤1 s | admin /healthz | the load's requests got | held at app | back to base s |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|\n")
	var notes []string
	for _, r := range rep.Rows {
		ref := ""
		var rn []string
		if r.Note != "" {
			rn = append(rn, r.Note)
		}
		rn = append(rn, r.Notes...)
		if len(rn) > 0 {
			notes = append(notes, fmt.Sprintf("%d. %s, %s: %s", len(notes)+1, r.Proxy, r.Row, strings.Join(rn, "; ")))
			ref = fmt.Sprintf(" (%d)", len(notes))
		}
		if r.Status != "" {
			fmt.Fprintf(&b, "| %s | %s | %s%s | | | | | | | | | | | |\n", r.Proxy, r.Row, r.Status, ref)
			continue
		}
		admin := "—"
		if r.AdminTotal > 0 {
			admin = fmt.Sprintf("%d/%d", r.AdminOK, r.AdminTotal)
		}
		got := r.Outcomes.String()
		switch r.Kind {
		case "idle":
			got += fmt.Sprintf("; open at release %s", thousands(r.OpenAtRelease))
			if r.ClosedEarly > 0 {
				got += fmt.Sprintf(", closed by the proxy %s", thousands(r.ClosedEarly))
			}
		case "nat":
			got = natGot(r.Outcomes, r.NAT)
		case "slow":
			got = "connections ended: " + got
		default:
			if early := r.Early.Total(); early > 0 {
				got += fmt.Sprintf(" (%s before the release)", thousands(early))
			}
			if r.Kind == "natheld" {
				got += "; NAT " + NATAddr + ": " + natGot(r.NATOutcomes, r.NAT)
			}
		}
		held := "—"
		if (Spec{Kind: r.Kind}).Holds() {
			held = thousands(int(r.AppHeld))
		}
		back := fmt.Sprintf("no (fds %s → %s)", thousands(r.FDBase), thousands(r.FDAfter))
		if r.RecoverySeconds >= 0 {
			back = strconv.FormatFloat(r.RecoverySeconds, 'f', 1, 64)
		}
		if r.GoroutinesBase > 0 {
			back += fmt.Sprintf(" (goroutines %s → %s → %s)", thousands(r.GoroutinesBase), thousands(r.GoroutinesPeak), thousands(r.GoroutinesAfter))
		}
		failed := thousands(r.FastFailed)
		if r.FastFailed > 0 {
			failed += " (" + r.FastFailures.String() + ")"
		}
		newv := fmt.Sprintf("%d/%d", r.NewOK, r.NewTotal)
		var nx []string
		if r.NewMaxMs > 0 {
			nx = append(nx, "max "+ms(r.NewMaxMs)+" ms")
		}
		if r.NewSlow > 0 {
			nx = append(nx, fmt.Sprintf("%d over 1 s", r.NewSlow))
		}
		if r.ListenOverflows+r.ListenDrops > 0 {
			nx = append(nx, fmt.Sprintf("kernel listen overflows %s, drops %s", thousands(int(r.ListenOverflows)), thousands(int(r.ListenDrops))))
		}
		if r.AcceptPauses > 0 {
			nx = append(nx, fmt.Sprintf("accept pauses %d", r.AcceptPauses))
		}
		if len(nx) > 0 {
			newv += " (" + strings.Join(nx, "; ") + ")"
		}
		if r.ProxyExited {
			ref += " exited"
		}
		fmt.Fprintf(&b, "| %s | %s%s | %s | %s → %s | %s / %s | %s / %s / %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Proxy, r.Row, ref, thousands(r.FDPeak), mib(r.RSSPeakKiB), mib(r.RSSAfterKiB),
			thousands(r.FastServed), failed, ms(r.FastP50Ms), ms(r.FastP99Ms), ms(r.FastMaxMs),
			ms(r.BaseP99Ms), attackP99(r), newv, admin, got, held, back)
	}
	if len(notes) > 0 {
		b.WriteString("\n" + strings.Join(notes, "\n") + "\n")
	}
	return b.String()
}

// attackP99 is the keep-alive clients' p99 over the whole attack, against
// their base, and how many of their requests then failed: a p99 of the
// served alone would hide those.
func attackP99(r Row) string {
	total := r.FastAttackServed + r.FastAttackFailed
	switch {
	case total == 0: // a results file from before the attack was timed
		return "—"
	case r.FastAttackServed == 0:
		return fmt.Sprintf("none served, %s failed", thousands(total))
	}
	out := ms(r.FastAttackP99Ms)
	if r.BaseP99Ms > 0 {
		out += fmt.Sprintf(" (%.1f×)", r.FastAttackP99Ms/r.BaseP99Ms)
	}
	if r.FastAttackFailed > 0 {
		out += fmt.Sprintf("; %s of %s failed", thousands(r.FastAttackFailed), thousands(total))
	}
	return out
}

// natGot is what browsers behind a NAT got: how many of their requests
// failed, how each ended, and how long they waited, above all those whose
// connection the proxy closed and who had to connect again.
func natGot(out Counts, t *NATTimes) string {
	got := fmt.Sprintf("%s failed of %s: %s", thousands(out.Total()-out["200"]), thousands(out.Total()), out.String())
	if t == nil { // a results file from before the NAT was timed
		return got
	}
	got += "; slowest " + ms(t.SlowestMs) + " ms"
	if t.Slow > 0 {
		got += fmt.Sprintf(", %s over 1 s", thousands(t.Slow))
	}
	if t.Reopened == 0 {
		return got + "; none reconnected"
	}
	got += fmt.Sprintf("; reconnected %s, connect to answer max %s ms", thousands(t.Reopened), ms(t.ReopenMaxMs))
	if t.ReopenSlow > 0 {
		got += fmt.Sprintf(", %s over 1 s", thousands(t.ReopenSlow))
	}
	return got
}
