package nodetest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/scafo/scafo-edge/node"
)

// StorageCounts counts the storage requests a Node has received, by what
// they asked for, whether answered or refused.
type StorageCounts struct {
	Puts, Gets, Deletes, Lists, Stats int
	// LocksTaken counts POSTs to a free lock; LockConflicts those answered
	// 409; Unlocks every DELETE of a lock, held or not.
	LocksTaken, LockConflicts, Unlocks int
	// Refused counts requests answered with SetStorageStatus's code or 401.
	Refused int
}

// storage is the node's /v1/storage surface, kept in memory. Its state
// survives Stop and Restart, as a real node's bucket would.
type storage struct {
	mu      sync.Mutex
	objects map[string]object
	locks   map[string][]byte
	status  int
	delay   time.Duration
	counts  StorageCounts
}

type object struct {
	data     []byte
	modified time.Time
}

// registerStorage serves /v1/storage (routing-and-ingress.md,
// "Certificate storage") behind the ingress token:
//
//	PUT/GET/DELETE /v1/storage/objects/<key>  raw bytes; a delete removes the
//	                                          key and everything beneath it
//	GET /v1/storage/list?prefix=&recursive=   {"keys":[...]}, sorted; 404 when empty
//	GET /v1/storage/stat?key=                 {"key","size","modified"}; 404 when missing
//	POST/DELETE /v1/storage/locks/<name>      201 taken, 409 held (never waits);
//	                                          release always 204
//
// Keys are slash-separated, each component percent-escaped in paths. A
// prefix is matched component-wise ("acme" covers "acme/x", not
// "acmeother"). A non-recursive list gives the direct children, files and
// directories alike; a recursive one every object beneath, as a bucket
// would (no directory entries). Stat knows objects only: a directory is
// 404, as it is to a bucket.
func (n *Node) registerStorage(mux *http.ServeMux) {
	n.st = &storage{objects: map[string]object{}, locks: map[string][]byte{}}
	mux.HandleFunc(node.StorageObjectsPath, n.serveObject)
	mux.HandleFunc("GET "+node.StorageListPath, n.serveList)
	mux.HandleFunc("GET "+node.StorageStatPath, n.serveStat)
	mux.HandleFunc(node.StorageLocksPath, n.serveLock)
}

// SetStorageStatus answers every storage request with code and a short
// body, before checking the token; 0 restores normal service. The routes
// surface is not affected (SetStatus is its switch).
func (n *Node) SetStorageStatus(code int) {
	st := n.st
	st.mu.Lock()
	defer st.mu.Unlock()
	st.status = code
}

// SetStorageDelay holds every storage request for d before answering (a
// client that gives up, or Stop, ends the wait); 0 restores.
func (n *Node) SetStorageDelay(d time.Duration) {
	st := n.st
	st.mu.Lock()
	defer st.mu.Unlock()
	st.delay = d
}

// StorageCounts returns the storage request counters.
func (n *Node) StorageCounts() StorageCounts {
	st := n.st
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.counts
}

// StorageObject returns a copy of the object at key.
func (n *Node) StorageObject(key string) ([]byte, bool) {
	st := n.st
	st.mu.Lock()
	defer st.mu.Unlock()
	o, ok := st.objects[key]
	return slices.Clone(o.data), ok
}

// PutStorageObject stores value at key, as a client's PUT would.
func (n *Node) PutStorageObject(key string, value []byte) {
	st := n.st
	st.mu.Lock()
	defer st.mu.Unlock()
	st.objects[key] = object{data: slices.Clone(value), modified: time.Now()}
}

// StorageKeys returns every object key, sorted.
func (n *Node) StorageKeys() []string {
	st := n.st
	st.mu.Lock()
	defer st.mu.Unlock()
	keys := make([]string, 0, len(st.objects))
	for k := range st.objects {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// StorageLock returns the body the holder of lock name left, and whether
// the lock is held.
func (n *Node) StorageLock(name string) ([]byte, bool) {
	st := n.st
	st.mu.Lock()
	defer st.mu.Unlock()
	b, ok := st.locks[name]
	return slices.Clone(b), ok
}

// storageGate counts the request with count, waits out the delay, and
// answers the forced status or the token refusal itself. It reports
// whether the handler should go on.
func (n *Node) storageGate(w http.ResponseWriter, r *http.Request, count func(*StorageCounts)) bool {
	st := n.st
	n.mu.Lock()
	stop := n.stop
	n.mu.Unlock()
	st.mu.Lock()
	count(&st.counts)
	delay := st.delay
	st.mu.Unlock()

	if !hold(r, delay, stop) {
		return false
	}

	st.mu.Lock()
	status := st.status
	if status != 0 {
		st.counts.Refused++
	}
	st.mu.Unlock()
	if status != 0 {
		http.Error(w, fmt.Sprintf("test node: forced storage status %d", status), status)
		return false
	}
	if !authorized(w, r, n.currentToken()) {
		st.mu.Lock()
		st.counts.Refused++
		st.mu.Unlock()
		return false
	}
	return true
}

// pathKey reads the key after prefix from r's escaped path, answering 400
// itself when there is none or it does not unescape.
func pathKey(w http.ResponseWriter, r *http.Request, prefix string) (string, bool) {
	esc, ok := strings.CutPrefix(r.URL.EscapedPath(), prefix)
	if !ok || esc == "" {
		http.Error(w, "missing key", http.StatusBadRequest)
		return "", false
	}
	key, err := node.UnescapeKey(esc)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return "", false
	}
	return key, true
}

// under reports whether key lies beneath prefix, component-wise; every
// key lies beneath the empty prefix.
func under(key, prefix string) bool {
	return prefix == "" || strings.HasPrefix(key, prefix+"/")
}

func (n *Node) serveObject(w http.ResponseWriter, r *http.Request) {
	st := n.st
	var count func(*StorageCounts)
	switch r.Method {
	case http.MethodPut:
		count = func(c *StorageCounts) { c.Puts++ }
	case http.MethodGet:
		count = func(c *StorageCounts) { c.Gets++ }
	case http.MethodDelete:
		count = func(c *StorageCounts) { c.Deletes++ }
	default:
		w.Header().Set("Allow", "GET, PUT, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if !n.storageGate(w, r, count) {
		return
	}
	key, ok := pathKey(w, r, node.StorageObjectsPath)
	if !ok {
		return
	}
	switch r.Method {
	case http.MethodPut:
		body, err := io.ReadAll(io.LimitReader(r.Body, node.MaxObjectSize+1))
		if err != nil {
			http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(body) > node.MaxObjectSize {
			http.Error(w, "object too large", http.StatusRequestEntityTooLarge)
			return
		}
		n.PutStorageObject(key, body)
		w.WriteHeader(http.StatusNoContent)
	case http.MethodGet:
		data, ok := n.StorageObject(key)
		if !ok {
			http.Error(w, "no such key", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(data)
	case http.MethodDelete:
		st.mu.Lock()
		for k := range st.objects {
			if k == key || under(k, key) {
				delete(st.objects, k)
			}
		}
		st.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}
}

func (n *Node) serveList(w http.ResponseWriter, r *http.Request) {
	st := n.st
	if !n.storageGate(w, r, func(c *StorageCounts) { c.Lists++ }) {
		return
	}
	q := r.URL.Query()
	prefix := strings.Trim(q.Get("prefix"), "/")
	recursive := q.Get("recursive") == "true" || q.Get("recursive") == "1"
	seen := map[string]bool{}
	st.mu.Lock()
	for k := range st.objects {
		if !under(k, prefix) {
			continue
		}
		if !recursive {
			rest := k
			if prefix != "" {
				rest = k[len(prefix)+1:]
			}
			if i := strings.IndexByte(rest, '/'); i >= 0 {
				k = k[:len(k)-len(rest)+i]
			}
		}
		seen[k] = true
	}
	st.mu.Unlock()
	if len(seen) == 0 {
		http.Error(w, "nothing under prefix", http.StatusNotFound)
		return
	}
	res := node.ListResult{Keys: make([]string, 0, len(seen))}
	for k := range seen {
		res.Keys = append(res.Keys, k)
	}
	slices.Sort(res.Keys)
	writeJSON(w, res)
}

func (n *Node) serveStat(w http.ResponseWriter, r *http.Request) {
	st := n.st
	if !n.storageGate(w, r, func(c *StorageCounts) { c.Stats++ }) {
		return
	}
	key := r.URL.Query().Get("key")
	st.mu.Lock()
	o, ok := st.objects[key]
	st.mu.Unlock()
	if !ok {
		http.Error(w, "no such key", http.StatusNotFound)
		return
	}
	writeJSON(w, node.ObjectInfo{Key: key, Size: int64(len(o.data)), Modified: o.modified})
}

func (n *Node) serveLock(w http.ResponseWriter, r *http.Request) {
	st := n.st
	switch r.Method {
	case http.MethodPost:
		if !n.storageGate(w, r, func(*StorageCounts) {}) {
			return
		}
	case http.MethodDelete:
		if !n.storageGate(w, r, func(c *StorageCounts) { c.Unlocks++ }) {
			return
		}
	default:
		w.Header().Set("Allow", "POST, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, ok := pathKey(w, r, node.StorageLocksPath)
	if !ok {
		return
	}
	if r.Method == http.MethodDelete {
		st.mu.Lock()
		delete(st.locks, name)
		st.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	st.mu.Lock()
	_, held := st.locks[name]
	if held {
		st.counts.LockConflicts++
	} else {
		st.counts.LocksTaken++
		st.locks[name] = body
	}
	st.mu.Unlock()
	if held {
		http.Error(w, "lock held", http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "test node: marshal: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
