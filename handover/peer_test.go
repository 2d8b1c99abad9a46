package handover

import (
	"context"
	"errors"
	"fmt"
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
	tk, err := Take(ctx, dir)
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

	child := exec.Command(bin, "-test.run=^$")
	child.Env = append(os.Environ(), takeAsChildEnv+"="+dir)
	child.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, NoSetGroups: true}}
	out, err := child.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "not this edge's user") {
		t.Fatalf("Take as uid 65534: %v\n%s\nwant a refusal naming the user", err, out)
	}

	tk := take(t, dir)
	t.Cleanup(func() { tk.Sockets.Close() })
	if h := <-handoffs; h == nil {
		t.Fatal("the offer did not stand after refusing another user")
	} else {
		h.Close()
	}
}
