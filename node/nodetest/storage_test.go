package nodetest_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// storageDo sends one raw storage request and returns the status and body.
func storageDo(t *testing.T, n *nodetest.Node, method, pathAndQuery, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, n.URL()+pathAndQuery, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, pathAndQuery, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestStorageSurface(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{Token: "tok"})
	steps := []struct {
		name                      string
		method, path, token, body string
		wantStatus                int
		wantBody                  string // substring; empty: not checked
	}{
		{"a request without the token is refused", "GET", "/v1/storage/objects/a/b", "", "", 401, ""},
		{"a missing object is 404", "GET", "/v1/storage/objects/a/b", "tok", "", 404, ""},
		{"an empty list is 404", "GET", "/v1/storage/list?prefix=a&recursive=true", "tok", "", 404, ""},
		{"a put stores raw bytes", "PUT", "/v1/storage/objects/a/b%20c/d", "tok", "one", 204, ""},
		{"a second object below", "PUT", "/v1/storage/objects/a/b%20c/e/f", "tok", "two", 204, ""},
		{"a get returns them with the key unescaped", "GET", "/v1/storage/objects/a/b%20c/d", "tok", "", 200, "one"},
		{"a direct list gives files and directories", "GET", "/v1/storage/list?prefix=a%2Fb+c&recursive=false", "tok", "", 200, `{"keys":["a/b c/d","a/b c/e"]}`},
		{"a recursive list gives every object beneath", "GET", "/v1/storage/list?prefix=a&recursive=true", "tok", "", 200, `{"keys":["a/b c/d","a/b c/e/f"]}`},
		{"a prefix is matched by component", "GET", "/v1/storage/list?prefix=a%2Fb&recursive=true", "tok", "", 404, ""},
		{"stat gives the size", "GET", "/v1/storage/stat?key=a%2Fb+c%2Fd", "tok", "", 200, `"size":3`},
		{"stat of a directory is 404", "GET", "/v1/storage/stat?key=a", "tok", "", 404, ""},
		{"a delete removes everything beneath", "DELETE", "/v1/storage/objects/a/b%20c", "tok", "", 204, ""},
		{"so nothing is left", "GET", "/v1/storage/list?prefix=&recursive=true", "tok", "", 404, ""},
		{"a delete of a missing key is fine", "DELETE", "/v1/storage/objects/a/b%20c", "tok", "", 204, ""},
		{"a free lock is taken", "POST", "/v1/storage/locks/issue_cert_x", "tok", "holder-a", 201, ""},
		{"a held lock is 409 at once", "POST", "/v1/storage/locks/issue_cert_x", "tok", "holder-b", 409, ""},
		{"a release is 204", "DELETE", "/v1/storage/locks/issue_cert_x", "tok", "", 204, ""},
		{"a second release is 204 too", "DELETE", "/v1/storage/locks/issue_cert_x", "tok", "", 204, ""},
		{"a released lock is free again", "POST", "/v1/storage/locks/issue_cert_x", "tok", "holder-b", 201, ""},
		{"an object takes no POST", "POST", "/v1/storage/objects/a", "tok", "", 405, ""},
		{"a path with an empty component is refused", "PUT", "/v1/storage/objects/a/%2F/b", "tok", "x", 400, ""},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			code, body := storageDo(t, n, s.method, s.path, s.token, s.body)
			if code != s.wantStatus || !strings.Contains(body, s.wantBody) {
				t.Errorf("%s %s = %d %q, want %d with %q", s.method, s.path, code, body, s.wantStatus, s.wantBody)
			}
		})
	}
	if body, held := n.StorageLock("issue_cert_x"); !held || string(body) != "holder-b" {
		t.Errorf("StorageLock = %q, %v, want holder-b, held", body, held)
	}
	c := n.StorageCounts()
	if c.Puts != 3 || c.LocksTaken != 2 || c.LockConflicts != 1 || c.Unlocks != 2 || c.Refused != 1 {
		t.Errorf("StorageCounts = %+v, want 3 puts, 2 locks taken, 1 conflict, 2 unlocks, 1 refused", c)
	}
}

func TestStorageSwitches(t *testing.T) {
	n := nodetest.New(t, nodetest.Options{Token: "tok"})
	n.PutStorageObject("k", []byte("v"))

	t.Run("a forced status answers storage and leaves routes alone", func(t *testing.T) {
		n.SetDocument(&node.Document{V: 1})
		n.SetStorageStatus(http.StatusBadGateway)
		if code, _ := storageDo(t, n, "GET", "/v1/storage/objects/k", "tok", ""); code != http.StatusBadGateway {
			t.Errorf("storage GET = %d, want 502", code)
		}
		if code, _ := storageDo(t, n, "GET", node.RoutesPath, "tok", ""); code != http.StatusOK {
			t.Errorf("routes GET = %d, want 200", code)
		}
		n.SetStorageStatus(0)
		if code, _ := storageDo(t, n, "GET", "/v1/storage/objects/k", "tok", ""); code != http.StatusOK {
			t.Errorf("storage GET after SetStorageStatus(0) = %d, want 200", code)
		}
	})

	t.Run("objects and locks survive a stop and restart", func(t *testing.T) {
		storageDo(t, n, "POST", "/v1/storage/locks/l", "tok", "")
		n.Stop()
		if err := n.Restart(); err != nil {
			t.Fatal(err)
		}
		if code, body := storageDo(t, n, "GET", "/v1/storage/objects/k", "tok", ""); code != 200 || body != "v" {
			t.Errorf("GET after restart = %d %q, want 200 v", code, body)
		}
		if code, _ := storageDo(t, n, "POST", "/v1/storage/locks/l", "tok", ""); code != http.StatusConflict {
			t.Errorf("POST lock after restart = %d, want 409", code)
		}
	})

	t.Run("a delayed answer ends when the client gives up", func(t *testing.T) {
		n.SetStorageDelay(time.Minute)
		defer n.SetStorageDelay(0)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", n.URL()+"/v1/storage/objects/k", nil)
		req.Header.Set("Authorization", "Bearer tok")
		start := time.Now()
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("delayed GET answered %d, want the client to give up", resp.StatusCode)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("gave up after %v, want about 100ms", d)
		}
	})

	t.Run("a stat answer is node.ObjectInfo", func(t *testing.T) {
		code, body := storageDo(t, n, "GET", "/v1/storage/stat?key=k", "tok", "")
		var info node.ObjectInfo
		if err := json.Unmarshal([]byte(body), &info); code != 200 || err != nil || info.Key != "k" || info.Size != 1 {
			t.Errorf("stat = %d %q (%v), want 200 with key k, size 1", code, body, err)
		}
	})
}
