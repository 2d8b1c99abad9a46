package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// The node's storage surface (routing-and-ingress.md, "Certificate
// storage"): the fleet's certificates, keys and issuance locks, kept in the
// fleet's bucket and reached only through the node with the ingress token.
const (
	// StorageObjectsPath + key: PUT, GET and DELETE raw bytes. A delete
	// removes the key and everything beneath it.
	StorageObjectsPath = "/v1/storage/objects/"
	// StorageListPath?prefix=&recursive=: the keys under prefix; an empty
	// result is 404.
	StorageListPath = "/v1/storage/list"
	// StorageStatPath?key=: size and modification time of one object.
	StorageStatPath = "/v1/storage/stat"
	// StorageLocksPath + name: POST try-acquires (409 when held, never
	// waits), DELETE releases (idempotent).
	StorageLocksPath = "/v1/storage/locks/"
)

// MaxObjectSize is the largest object the storage client reads back
// (16 MiB). The store holds certificates, keys and small JSON documents;
// anything far larger is a broken node, not a certificate.
const MaxObjectSize = 16 << 20

// ErrBadKey is the error for a key no store can hold (empty, or with an
// empty, "." or ".." component); no request is sent for it.
var ErrBadKey = errors.New("bad storage key")

// ObjectInfo is what the node's stat answers for one object, and the JSON
// body GET /v1/storage/stat carries.
type ObjectInfo struct {
	Key      string    `json:"key"`
	Size     int64     `json:"size"`
	Modified time.Time `json:"modified"`
}

// ListResult is the JSON body of GET /v1/storage/list: full keys, sorted.
type ListResult struct {
	Keys []string `json:"keys"`
}

// StatusError is an answer from the node other than the one a call wants.
// A 404 is fs.ErrNotExist to errors.Is, so callers treat a missing key the
// same way whatever store it came from. A failure to get any answer at all
// (refused, reset, timeout) is not a StatusError.
type StatusError struct {
	Op     string // "get", "put", "delete", "list", "stat", "lock", "unlock"
	Key    string // the key, list prefix or lock name
	Status int
	Body   string // a short, printable excerpt of the answer
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("storage %s %q: node answered %d %s: %s", e.Op, e.Key, e.Status, http.StatusText(e.Status), e.Body)
}

// Is makes a 404 match fs.ErrNotExist.
func (e *StatusError) Is(target error) bool {
	return target == fs.ErrNotExist && e.Status == http.StatusNotFound
}

// StorageClient calls the node's /v1/storage surface with the ingress
// token. It holds no state beyond its configuration and is safe for
// concurrent use. It does not retry: what a failure means (fall back to a
// local copy, queue a write) is the caller's decision.
type StorageClient struct {
	base    *url.URL // scheme://host[/path], no trailing slash
	baseErr error
	token   string
	client  *http.Client
	private bool
}

// NewStorageClient returns a client of the storage surface of the node at
// base (e.g. "http://127.0.0.1:7400"), sending token as the bearer token
// (empty: none). A nil client means a private one without proxies or
// redirects (a redirect would drop the token); CloseIdleConnections closes
// its connections. A base that does not parse makes every call fail with
// the reason.
func NewStorageClient(base, token string, client *http.Client) *StorageClient {
	c := &StorageClient{token: token, client: client}
	u, err := url.Parse(base)
	switch {
	case err != nil:
		c.baseErr = fmt.Errorf("parse node url: %w", err)
	case (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		c.baseErr = fmt.Errorf("parse node url %q: want http(s)://host[:port]", base)
	case u.RawQuery != "" || u.Fragment != "":
		c.baseErr = fmt.Errorf("parse node url %q: a base url has no query or fragment", base)
	default:
		u.Path = strings.TrimSuffix(u.Path, "/")
		u.RawPath = ""
		c.base = u
	}
	if c.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil
		c.client = &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
		c.private = true
	}
	return c
}

// String names the node the client talks to, for logs.
func (c *StorageClient) String() string {
	if c.base == nil {
		return "node storage (bad url)"
	}
	return "node storage " + c.base.Scheme + "://" + c.base.Host
}

// CloseIdleConnections closes the idle connections of a client made
// without an http.Client of the caller's.
func (c *StorageClient) CloseIdleConnections() {
	if c.private {
		c.client.CloseIdleConnections()
	}
}

// The answers a call takes as success; any other is a *StatusError.
var (
	answerStored  = []int{http.StatusOK, http.StatusCreated, http.StatusNoContent}
	answerFound   = []int{http.StatusOK}
	answerRemoved = []int{http.StatusOK, http.StatusNoContent, http.StatusNotFound}
	answerLocked  = append(slices.Clone(answerStored), http.StatusConflict)
)

// Put stores value at key, replacing what was there.
func (c *StorageClient) Put(ctx context.Context, key string, value []byte) error {
	_, _, err := c.call(ctx, request{op: "put", key: key, method: http.MethodPut, endpoint: StorageObjectsPath, body: value, ok: answerStored})
	return err
}

// Get returns the bytes at key; a missing key is an error matching
// fs.ErrNotExist.
func (c *StorageClient) Get(ctx context.Context, key string) ([]byte, error) {
	_, body, err := c.call(ctx, request{op: "get", key: key, method: http.MethodGet, endpoint: StorageObjectsPath, ok: answerFound, read: true})
	return body, err
}

// Delete removes key and everything beneath it. A key that is not there
// is not an error.
func (c *StorageClient) Delete(ctx context.Context, key string) error {
	_, _, err := c.call(ctx, request{op: "delete", key: key, method: http.MethodDelete, endpoint: StorageObjectsPath, ok: answerRemoved})
	return err
}

// List returns the keys under prefix (component-wise: "acme" covers
// "acme/x", not "acmeother"): the direct children, or with recursive
// everything beneath. Nothing under prefix is the node's 404, returned as
// an error matching fs.ErrNotExist, as certmagic's own stores do. An empty
// prefix lists from the root.
func (c *StorageClient) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	q := url.Values{"prefix": {prefix}, "recursive": {fmt.Sprint(recursive)}}
	_, body, err := c.call(ctx, request{op: "list", key: prefix, method: http.MethodGet, endpoint: StorageListPath, query: q, ok: answerFound, read: true})
	if err != nil {
		return nil, err
	}
	var res ListResult
	if err := json.Unmarshal(body, &res); err != nil {
		// A bare array of keys says the same thing; accept it too.
		if err2 := json.Unmarshal(body, &res.Keys); err2 != nil {
			return nil, fmt.Errorf("storage list %q: decode answer: %w", prefix, err)
		}
	}
	if len(res.Keys) == 0 {
		return nil, fmt.Errorf("storage list %q: %w", prefix, fs.ErrNotExist)
	}
	return res.Keys, nil
}

// Stat returns the size and modification time of the object at key; a
// missing key is an error matching fs.ErrNotExist.
func (c *StorageClient) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	_, body, err := c.call(ctx, request{op: "stat", key: key, method: http.MethodGet, endpoint: StorageStatPath, query: url.Values{"key": {key}}, ok: answerFound, read: true})
	if err != nil {
		return ObjectInfo{}, err
	}
	var info ObjectInfo
	if err := json.Unmarshal(body, &info); err != nil {
		return ObjectInfo{}, fmt.Errorf("storage stat %q: decode answer: %w", key, err)
	}
	if info.Key == "" {
		info.Key = key
	}
	return info, nil
}

// TryLock tries once to take the lock name, leaving body with the node (a
// record of who holds it). It reports false, with no error, when someone
// holds the lock (the node's 409); it never waits.
func (c *StorageClient) TryLock(ctx context.Context, name string, body []byte) (bool, error) {
	status, _, err := c.call(ctx, request{op: "lock", key: name, method: http.MethodPost, endpoint: StorageLocksPath, body: body, ok: answerLocked})
	return err == nil && status != http.StatusConflict, err
}

// Unlock releases the lock name. Releasing a lock nobody holds is not an
// error.
func (c *StorageClient) Unlock(ctx context.Context, name string) error {
	_, _, err := c.call(ctx, request{op: "unlock", key: name, method: http.MethodDelete, endpoint: StorageLocksPath, ok: answerRemoved})
	return err
}

// request is one call to the storage surface and the answers it accepts.
type request struct {
	op               string // names the call in errors (StatusError.Op)
	key              string // the key, list prefix or lock name; on the objects and locks endpoints also the path after endpoint
	method, endpoint string
	query            url.Values // nil: none
	body             []byte     // nil: none
	ok               []int      // the statuses that are success; any other is a *StatusError
	read             bool       // read a success's body (at most MaxObjectSize)
}

// call sends r and returns the status of a successful answer, with its body
// when r.read is set.
func (c *StorageClient) call(ctx context.Context, r request) (int, []byte, error) {
	resp, err := c.do(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	defer drain(resp)
	if !slices.Contains(r.ok, resp.StatusCode) {
		return 0, nil, &StatusError{Op: r.op, Key: r.key, Status: resp.StatusCode, Body: snippet(resp.Body)}
	}
	if !r.read {
		return resp.StatusCode, nil, nil
	}
	body, err := readLimited(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("storage %s %q: %w", r.op, r.key, err)
	}
	return resp.StatusCode, body, nil
}

// do sends one request: endpoint, then on the objects and locks endpoints
// the key escaped component by component, then the query.
func (c *StorageClient) do(ctx context.Context, r request) (*http.Response, error) {
	if c.baseErr != nil {
		return nil, fmt.Errorf("storage %s %q: %w", r.op, r.key, c.baseErr)
	}
	u := *c.base
	if r.endpoint == StorageObjectsPath || r.endpoint == StorageLocksPath {
		esc, err := EscapeKey(r.key)
		if err != nil {
			return nil, fmt.Errorf("storage %s: %w", r.op, err)
		}
		u.Path = c.base.Path + r.endpoint + r.key
		u.RawPath = c.base.EscapedPath() + r.endpoint + esc
	} else {
		u.Path = c.base.Path + r.endpoint
		u.RawPath = ""
	}
	if r.query != nil {
		u.RawQuery = r.query.Encode()
	}
	var rd io.Reader
	if r.body != nil {
		rd = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("storage %s %q: build request: %w", r.op, r.key, err)
	}
	if r.body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	req.Header.Set("User-Agent", "scafo-edge")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("storage %s %q: %w", r.op, r.key, err)
	}
	return resp, nil
}

// EscapeKey returns key as a URL path: each slash-separated component
// percent-escaped on its own (url.PathEscape), the slashes kept as
// separators. A key with an empty, "." or ".." component is refused: no
// store has such a key, and servers clean them out of paths.
func EscapeKey(key string) (string, error) {
	if key == "" {
		return "", fmt.Errorf("empty key: %w", ErrBadKey)
	}
	parts := strings.Split(key, "/")
	for i, p := range parts {
		if p == "" || p == "." || p == ".." {
			return "", fmt.Errorf("key %q: empty, . or .. component: %w", key, ErrBadKey)
		}
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/"), nil
}

// UnescapeKey is EscapeKey's inverse, for a server reading a key from an
// escaped path (url.URL.EscapedPath after the endpoint prefix).
func UnescapeKey(escaped string) (string, error) {
	parts := strings.Split(escaped, "/")
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil {
			return "", fmt.Errorf("unescape key %q: %w", escaped, err)
		}
		parts[i] = u
	}
	key := strings.Join(parts, "/")
	if _, err := EscapeKey(key); err != nil {
		return "", err
	}
	return key, nil
}

func readLimited(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxObjectSize+1))
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if len(b) > MaxObjectSize {
		return nil, fmt.Errorf("answer is over the %d byte limit", MaxObjectSize)
	}
	return b, nil
}

// drain reads a little of what is left and closes the body, so the
// connection can be reused; a large leftover is not worth reading.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}
