package certstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// BINDPackage is the Debian package that installs named.
const BINDPackage = "bind9"

// BINDConfig is what StartBIND serves.
type BINDConfig struct {
	// Zones maps each zone (example.test) to records of its own, in zone
	// file syntax relative to the zone ("_acme-challenge.www CNAME
	// www.acme.test."); each zone also gets its SOA and NS.
	Zones map[string][]string
}

// BIND is a running named, primary for its zones on loopback, taking
// RFC 2136 updates signed with one TSIG key, and answering recursive
// queries only from its own zones (it is primary for the root too, so it
// never asks anyone else): a CA's resolver that follows a CNAME from one
// of its zones into another.
type BIND struct {
	// Addr is host:port, UDP and TCP.
	Addr string
	// KeyName and KeySecret (base64) are the TSIG key, hmac-sha256.
	KeyName, KeySecret string
}

// RequireBIND returns named's path; without it t is skipped with one line
// naming the Debian package, or fails when the environment variable CI is
// set (testsupport.NeedTool).
func RequireBIND(t testing.TB) string {
	t.Helper()
	// /usr/sbin is not on every user's PATH.
	if _, err := os.Stat("/usr/sbin/named"); err == nil {
		return "/usr/sbin/named"
	}
	return testsupport.NeedTool(t, "named", BINDPackage)
}

// StartBIND runs named with cfg's zones on a free loopback port and stops
// it when t ends; it skips or fails as RequireBIND does without named.
func StartBIND(t testing.TB, cfg BINDConfig) *BIND {
	t.Helper()
	named := RequireBIND(t)
	dir := t.TempDir()
	b := &BIND{Addr: testsupport.FreeUDPAndTCPAddr(t), KeyName: "scafo-edge-test", KeySecret: "c2NhZm8tZWRnZS10ZXN0LWtleS1ub3QtYS1zZWNyZXQ="}
	host, port, _ := strings.Cut(b.Addr, ":")

	var conf strings.Builder
	fmt.Fprintf(&conf, `options {
	directory %q;
	pid-file %q;
	session-keyfile %q;
	listen-on port %s { %s; };
	listen-on-v6 { none; };
	recursion yes;
	allow-recursion { 127.0.0.0/8; };
	dnssec-validation no;
	notify no;
};
controls { };
key %q { algorithm hmac-sha256; secret %q; };
zone "." { type primary; file "root.zone"; };
`, dir, filepath.Join(dir, "named.pid"), filepath.Join(dir, "session.key"), port, host, b.KeyName, b.KeySecret)
	zones := map[string][]string{".": nil}
	for z, recs := range cfg.Zones {
		zones[z] = recs
	}
	names := make([]string, 0, len(zones))
	for z := range zones {
		names = append(names, z)
	}
	sort.Strings(names)
	for _, z := range names {
		origin := dns.Fqdn(z)
		file := "root.zone"
		if z != "." {
			file = strings.TrimSuffix(origin, ".") + ".zone"
			fmt.Fprintf(&conf, "zone %q { type primary; file %q; allow-update { key %q; }; };\n", strings.TrimSuffix(origin, "."), file, b.KeyName)
		}
		zf := fmt.Sprintf("$ORIGIN %s\n$TTL 60\n@ SOA ns hostmaster 1 3600 600 86400 1\n@ NS ns\nns A %s\n%s\n",
			origin, host, strings.Join(zones[z], "\n"))
		if err := os.WriteFile(filepath.Join(dir, file), []byte(zf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	confPath := filepath.Join(dir, "named.conf")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	// -g: foreground, log to stderr; -n 1: one worker (2 shared cores);
	// -4: no IPv6 sockets.
	cmd := exec.Command(named, "-g", "-4", "-n", "1", "-c", confPath)
	var out testsupport.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("certstest: start named: %v", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("named output:\n%s", out.String())
		}
	})
	var once sync.Once
	testsupport.WaitForNil(t, 20*time.Second, "named answering", func() error {
		select {
		case <-exited:
			once.Do(func() { t.Fatalf("certstest: named exited: %v\n%s", waitErr, out.String()) })
		default:
		}
		for _, z := range names {
			if z == "." {
				continue
			}
			r, err := b.Query(dns.Fqdn(z), dns.TypeSOA)
			if err != nil {
				return err
			}
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
				return fmt.Errorf("SOA %s: %s", z, dns.RcodeToString[r.Rcode])
			}
		}
		return nil
	})
	return b
}

// Query asks the server name's qtype, without recursion.
func (b *BIND) Query(name string, qtype uint16) (*dns.Msg, error) {
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	q.RecursionDesired = false
	c := &dns.Client{Timeout: 3 * time.Second}
	r, _, err := c.Exchange(q, b.Addr)
	return r, err
}

// TXT returns the TXT values the server holds at name.
func (b *BIND) TXT(t testing.TB, name string) []string {
	t.Helper()
	r, err := b.Query(name, dns.TypeTXT)
	if err != nil {
		t.Fatalf("certstest: query TXT %s: %v", name, err)
	}
	var out []string
	for _, rr := range r.Answer {
		if txt, ok := rr.(*dns.TXT); ok && strings.EqualFold(txt.Hdr.Name, dns.Fqdn(name)) {
			out = append(out, strings.Join(txt.Txt, ""))
		}
	}
	return out
}
