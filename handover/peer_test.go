package handover

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMayTake(t *testing.T) {
	for _, tc := range []struct {
		peer, own uint32
		want      bool
	}{
		{65532, 65532, true},  // the edge's own user, as the image runs it
		{0, 65532, true},      // root could take the sockets from the process anyway
		{0, 0, true},          // both root
		{65534, 65532, false}, // another user reaching a loosened socket
		{65532, 0, false},     // an unprivileged user asking a root edge
	} {
		if got := mayTake(tc.peer, tc.own); got != tc.want {
			t.Errorf("mayTake(peer %d, own %d) = %v, want %v", tc.peer, tc.own, got, tc.want)
		}
	}
}

// takeAsChildEnv makes the test binary, run as a child, call Take on the
// directory it names and exit: 0 when the edge refused it, 1 otherwise.
const takeAsChildEnv = "SCAFO_HANDOVER_TEST_TAKE_DIR"

func takeAsChild(dir string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tk, err := Take(ctx, dir, loopbackServes)
	if err == nil {
		tk.Sockets.Close()
		tk.Close()
		fmt.Println("took the sockets")
		return 1
	}
	fmt.Println(err)
	if errors.Is(err, errRefused) {
		return 0
	}
	return 1
}

// silentAsChildEnv makes the test binary, run as a child, open
// silentPeers connections to the handover socket in the directory it names,
// say "connected", and hold them, silent, until its stdin closes.
const silentAsChildEnv = "SCAFO_HANDOVER_TEST_SILENT_DIR"

// silentPeers silent strangers would cost a successor queued behind them
// more than its 5s if each held the offer for its hello's second.
const silentPeers = 8

func silentAsChild(dir string) int {
	var conns []net.Conn
	for range silentPeers {
		c, err := net.Dial("unix", filepath.Join(dir, SocketFile))
		if err != nil {
			fmt.Println(err)
			return 1
		}
		conns = append(conns, c)
	}
	fmt.Println("connected")
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
	return 0
}

// TestOfferRefusesAnotherUser loosens the socket's mode, as a volume's
// permissions or a umask might, and has a process of another user ask for
// the sockets: the kernel's record of who connected decides, the offer
// stands, and the edge's own user still takes them.
func TestOfferRefusesAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running a process as another user needs root (CI runs as root); TestMayTake covers the decision")
	}
	// A directory the other user may enter, with a copy of this test binary
	// it may run: go test's own build directory is its owner's only.
	dir, err := os.MkdirTemp("", "handover-peer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "handover.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}

	old := bindProcess(t, "old")
	t.Cleanup(func() { old.socks.Close() })
	o := listen(t, dir)
	if err := os.Chmod(o.Path(), 0o666); err != nil {
		t.Fatal(err)
	}
	handoffs := wait(t, o, old.socks)

	asNobody := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, NoSetGroups: true}}
	child := exec.Command(bin, "-test.run=^$")
	child.Env = append(os.Environ(), takeAsChildEnv+"="+dir)
	child.SysProcAttr = asNobody
	out, err := child.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "not this edge's user") {
		t.Fatalf("Take as uid 65534: %v\n%s\nwant a refusal naming the user", err, out)
	}

	// Strangers who connect and say nothing are queued ahead of the
	// successor: it still takes the sockets within its budget.
	silent := exec.Command(bin, "-test.run=^$")
	silent.Env = append(os.Environ(), silentAsChildEnv+"="+dir)
	silent.SysProcAttr = asNobody
	hold, err := silent.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	said, err := silent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := silent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hold.Close(); silent.Wait() })
	if line, _ := bufio.NewReader(said).ReadString('\n'); line != "connected\n" {
		t.Fatalf("silent strangers: %q", line)
	}

	tk := take(t, dir)
	t.Cleanup(func() { tk.Sockets.Close() })
	if h := <-handoffs; h == nil {
		t.Fatal("the offer did not stand after refusing another user")
	} else {
		h.Close()
	}
}
