// Command slowlink times requests sent the way clients on slow links send
// them: the request head written in pieces with a pause between them (a
// userspace stand-in for a shaped link, which this kernel's missing netem
// cannot give), then the whole response read. It prints, per link profile
// and target, the median and the worst of -n requests, so that the edge
// can be set beside a bare server and other proxies on each profile.
//
//	slowlink -target app=127.0.0.1:8081 -target edge=127.0.0.1:8080 -host app.example
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

// A profile is how a link delivers the request head: pieces of size bytes,
// every gap (a 4 KB/s link, a device writing a header line at a time).
type profile struct {
	name string
	size int
	gap  time.Duration
}

var profiles = []profile{
	{"fast", 1 << 20, 0},
	{"mss every 300ms", 1448, 300 * time.Millisecond},
	{"4 KB/s", 410, 100 * time.Millisecond},
	{"200 B writes", 200, 50 * time.Millisecond},
	{"64 B writes", 64, 25 * time.Millisecond},
}

type targets []string

func (t *targets) String() string     { return strings.Join(*t, ",") }
func (t *targets) Set(s string) error { *t = append(*t, s); return nil }

func main() {
	var ts targets
	flag.Var(&ts, "target", "name=host:port to time (repeatable)")
	host := flag.String("host", "app.example", "Host header")
	n := flag.Int("n", 5, "requests per profile and target")
	cookie := flag.Int("cookie", 6<<10, "bytes of Cookie header (an ordinary session's)")
	flag.Parse()
	if len(ts) == 0 {
		fmt.Fprintln(os.Stderr, "slowlink: give at least one -target name=host:port")
		os.Exit(2)
	}
	head := []byte("GET / HTTP/1.1\r\nHost: " + *host + "\r\nUser-Agent: slowlink\r\nCookie: s=" +
		strings.Repeat("c", *cookie) + "\r\nConnection: close\r\n\r\n")
	fmt.Printf("%-16s", "profile")
	for _, t := range ts {
		fmt.Printf(" %26s", t)
	}
	fmt.Println()
	for _, p := range profiles {
		fmt.Printf("%-16s", p.name)
		for _, t := range ts {
			_, addr, _ := strings.Cut(t, "=")
			var took []time.Duration
			for range *n {
				d, err := timeOne(addr, head, p)
				if err != nil {
					fmt.Fprintf(os.Stderr, "slowlink: %s, %s: %v\n", t, p.name, err)
					os.Exit(1)
				}
				took = append(took, d)
			}
			slices.Sort(took)
			fmt.Printf(" %12s med %8s max", took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
		}
		fmt.Println()
	}
}

// timeOne sends head to addr in p's pieces and reads the whole response.
func timeOne(addr string, head []byte, p profile) (time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true) // each piece its own segment
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	for rest := head; len(rest) > 0; {
		k := min(p.size, len(rest))
		if _, err := c.Write(rest[:k]); err != nil {
			return 0, err
		}
		if rest = rest[k:]; len(rest) > 0 {
			time.Sleep(p.gap) // the link's pace, not a synchronisation
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return time.Since(start), err
}
