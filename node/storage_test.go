package node_test

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

func newStorageClient(t *testing.T, n *nodetest.Node, token string) *node.StorageClient {
	t.Helper()
	c := node.NewStorageClient(n.URL(), token, nil)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func TestStorageClientObjects(t *testing.T) {
	ctx := context.Background()
	n := nodetest.New(t, nodetest.Options{Token: "tok"})
	c := newStorageClient(t, n, "tok")

	for _, key := range []string{
		"certificates/acme-v02.api.letsencrypt.org-directory/shop.example.com/shop.example.com.crt",
		"certificates/ca/*.example.com/wildcard_.example.com.key",
		"odd/a b/100%/q?x=1#frag/semi;colon,comma",
		"odd/ünïcode/ключ",
		"odd/plus+and&amp=eq",
	} {
		t.Run("key "+key+" round-trips byte for byte", func(t *testing.T) {
			val := []byte("value of " + key + "\x00\xff")
			if err := c.Put(ctx, key, val); err != nil {
				t.Fatalf("Put: %v", err)
			}
			// The node saw the key itself, not an escaped or cleaned form.
			if got, ok := n.StorageObject(key); !ok || string(got) != string(val) {
				t.Fatalf("node holds %q under %q (present %v), want %q", got, key, ok, val)
			}
			got, err := c.Get(ctx, key)
			if err != nil || string(got) != string(val) {
				t.Fatalf("Get = %q, %v, want %q", got, err, val)
			}
			info, err := c.Stat(ctx, key)
			if err != nil {
				t.Fatalf("Stat: %v", err)
			}
			if info.Key != key || info.Size != int64(len(val)) || time.Since(info.Modified) > time.Minute {
				t.Errorf("Stat = %+v, want key %q, size %d, modified about now", info, key, len(val))
			}
		})
	}

	t.Run("a missing key is fs.ErrNotExist to get and stat, and its error names the key", func(t *testing.T) {
		_, err := c.Get(ctx, "no/such/key")
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "no/such/key") {
			t.Errorf("Get(missing) = %v, want fs.ErrNotExist naming the key", err)
		}
		if _, err := c.Stat(ctx, "no/such/key"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Stat(missing) = %v, want fs.ErrNotExist", err)
		}
	})

	t.Run("delete removes the key and everything beneath it, and a missing key is no error", func(t *testing.T) {
		for _, k := range []string{"d/x", "d/x/1", "d/x/y/2", "d/xx", "d/keep"} {
			if err := c.Put(ctx, k, []byte("v")); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Delete(ctx, "d/x"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		keys, err := c.List(ctx, "d", true)
		if want := []string{"d/keep", "d/xx"}; err != nil || !slices.Equal(keys, want) {
			t.Errorf("after Delete(d/x): List(d) = %q, %v, want %q", keys, err, want)
		}
		if err := c.Delete(ctx, "d/x"); err != nil {
			t.Errorf("Delete(missing) = %v, want nil", err)
		}
	})
}

func TestStorageClientList(t *testing.T) {
	ctx := context.Background()
	n := nodetest.New(t, nodetest.Options{Token: "tok"})
	c := newStorageClient(t, n, "tok")
	for _, k := range []string{"acme/ca/sites/a/a.crt", "acme/ca/sites/b/b.crt", "acme/cafile", "acmeother/x", "q&a=b/one", "q&a=b/two"} {
		if err := c.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name      string
		prefix    string
		recursive bool
		want      []string
	}{
		{"direct children are files and directories", "acme", false, []string{"acme/ca", "acme/cafile"}},
		{"a recursive list gives every key beneath", "acme/ca", true, []string{"acme/ca/sites/a/a.crt", "acme/ca/sites/b/b.crt"}},
		{"a prefix is escaped in the query", "q&a=b", false, []string{"q&a=b/one", "q&a=b/two"}},
		{"an empty prefix lists the root", "", false, []string{"acme", "acmeother", "q&a=b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.List(ctx, tc.prefix, tc.recursive)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("List(%q, %v) = %q, %v, want %q", tc.prefix, tc.recursive, got, err, tc.want)
			}
		})
	}
	t.Run("nothing under a prefix is the node's 404, fs.ErrNotExist", func(t *testing.T) {
		_, err := c.List(ctx, "acme/c", false)
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("List(acme/c) = %v, want fs.ErrNotExist", err)
		}
	})
}

func TestStorageClientLocks(t *testing.T) {
	ctx := context.Background()
	n := nodetest.New(t, nodetest.Options{Token: "tok"})
	c := newStorageClient(t, n, "tok")
	name := "issue_cert_*.example.com"

	ok, err := c.TryLock(ctx, name, []byte(`{"holder":"a"}`))
	if err != nil || !ok {
		t.Fatalf("TryLock(free) = %v, %v, want true, nil", ok, err)
	}
	if body, held := n.StorageLock(name); !held || string(body) != `{"holder":"a"}` {
		t.Errorf("node holds lock %q = %v with body %q, want held with the body sent", name, held, body)
	}
	start := time.Now()
	ok, err = c.TryLock(ctx, name, []byte(`{"holder":"b"}`))
	if err != nil || ok {
		t.Fatalf("TryLock(held) = %v, %v, want false, nil", ok, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("TryLock(held) took %v; it must never wait", d)
	}
	for i := range 2 {
		if err := c.Unlock(ctx, name); err != nil {
			t.Errorf("Unlock #%d = %v, want nil (release is idempotent)", i+1, err)
		}
	}
	if ok, err := c.TryLock(ctx, name, nil); err != nil || !ok {
		t.Errorf("TryLock after Unlock = %v, %v, want true, nil", ok, err)
	}
	if got := n.StorageCounts(); got.LocksTaken != 2 || got.LockConflicts != 1 || got.Unlocks != 2 {
		t.Errorf("node counts = %+v, want 2 taken, 1 conflict, 2 unlocks", got)
	}
}

// storageCalls is every client call, for tests that check all of them.
var storageCalls = []struct {
	op   string
	call func(c *node.StorageClient) error
}{
	{"put", func(c *node.StorageClient) error { return c.Put(context.Background(), "k/ey", []byte("v")) }},
	{"get", func(c *node.StorageClient) error { _, err := c.Get(context.Background(), "k/ey"); return err }},
	{"delete", func(c *node.StorageClient) error { return c.Delete(context.Background(), "k/ey") }},
	{"list", func(c *node.StorageClient) error { _, err := c.List(context.Background(), "k", true); return err }},
	{"stat", func(c *node.StorageClient) error { _, err := c.Stat(context.Background(), "k/ey"); return err }},
	{"lock", func(c *node.StorageClient) error { _, err := c.TryLock(context.Background(), "k/ey", nil); return err }},
	{"unlock", func(c *node.StorageClient) error { return c.Unlock(context.Background(), "k/ey") }},
}

func TestStorageClientErrors(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{Token: "tok"})
	n.PutStorageObject("k/ey", []byte("v"))

	for _, tc := range storageCalls {
		t.Run(tc.op+" sends the bearer token", func(t *testing.T) {
			if err := tc.call(newStorageClient(t, n, "tok")); err != nil {
				t.Errorf("%s with the right token: %v", tc.op, err)
			}
			n.PutStorageObject("k/ey", []byte("v"))
		})
		t.Run(tc.op+" with a wrong token fails with the status and the key", func(t *testing.T) {
			err := tc.call(newStorageClient(t, n, "wrong"))
			key := "k/ey"
			if tc.op == "list" {
				key = "k"
			}
			var se *node.StatusError
			if !errors.As(err, &se) || se.Status != http.StatusUnauthorized || se.Key != key || se.Op != tc.op {
				t.Fatalf("%s with a wrong token = %v, want a StatusError 401 for %s of %s", tc.op, err, tc.op, key)
			}
			if errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), `"`+key+`"`) || !strings.Contains(err.Error(), "401") {
				t.Errorf("error %q: want it to name the key and 401, and not be fs.ErrNotExist", err)
			}
		})
	}

	t.Run("a node answering 503 gives a StatusError with 503 on every call", func(t *testing.T) {
		c := newStorageClient(t, n, "tok")
		n.SetStorageStatus(http.StatusServiceUnavailable)
		defer n.SetStorageStatus(0)
		for _, tc := range storageCalls {
			var se *node.StatusError
			if err := tc.call(c); !errors.As(err, &se) || se.Status != http.StatusServiceUnavailable {
				t.Errorf("%s = %v, want a StatusError 503", tc.op, err)
			}
		}
	})

	t.Run("a stopped node gives an error naming the key that is no StatusError", func(t *testing.T) {
		c := newStorageClient(t, n, "tok")
		n.Stop()
		defer func() {
			if err := n.Restart(); err != nil {
				t.Fatal(err)
			}
		}()
		for _, tc := range storageCalls {
			err := tc.call(c)
			var se *node.StatusError
			if err == nil || errors.As(err, &se) || errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), `"k`) {
				t.Errorf("%s against a stopped node = %v, want a transport error naming the key", tc.op, err)
			}
		}
	})

	t.Run("keys no store can hold are refused before any request", func(t *testing.T) {
		c := newStorageClient(t, n, "tok")
		before := n.StorageCounts()
		for _, key := range []string{"", "a//b", "a/../b", "./a", "a/"} {
			if err := c.Put(context.Background(), key, nil); !errors.Is(err, node.ErrBadKey) {
				t.Errorf("Put(%q) = %v, want node.ErrBadKey", key, err)
			}
		}
		if after := n.StorageCounts(); after != before {
			t.Errorf("node counts went from %+v to %+v, want no request sent", before, after)
		}
	})

	t.Run("a base url that does not parse fails every call with the reason", func(t *testing.T) {
		c := node.NewStorageClient("ftp://x", "", nil)
		for _, tc := range storageCalls {
			if err := tc.call(c); err == nil || !strings.Contains(err.Error(), "parse node url") {
				t.Errorf("%s = %v, want a parse node url error", tc.op, err)
			}
		}
	})
}

func TestEscapeKey(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"a/b/c", "a/b/c"},
		{"a b/c?d", "a%20b/c%3Fd"},
		{"100%/#x", "100%25/%23x"},
		{"*.example.com/x", "%2A.example.com/x"},
	} {
		t.Run(tc.key+" escapes each component and keeps the slashes", func(t *testing.T) {
			got, err := node.EscapeKey(tc.key)
			if err != nil || got != tc.want {
				t.Fatalf("EscapeKey(%q) = %q, %v, want %q", tc.key, got, err, tc.want)
			}
			back, err := node.UnescapeKey(got)
			if err != nil || back != tc.key {
				t.Errorf("UnescapeKey(%q) = %q, %v, want %q", got, back, err, tc.key)
			}
		})
	}
}
