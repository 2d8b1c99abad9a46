// Package node owns scafo-edge's side of the node API: the routing document's
// types, parsing and validation, the poller that keeps a current copy of it
// (fingerprint, bearer token, prefer, keep-last-good, file source), the
// persisted last good document, and the client of the node's storage surface.
//
// It knows nothing about serving HTTP or TLS: it hands a valid, changed
// document to whoever asked for it and stops there.
//
// The entry points:
//   - Parse refuses a broken document as a whole; Fingerprint hashes a body.
//   - A Source keeps the document current and hands on only changed, valid
//     ones: a Poller from the node (GET /v1/ingress/routes with the bearer
//     token, If-None-Match, ?prefer=), or a FileSource (--routes-file).
//     Whatever fails, the last good document stays.
//   - OpenState opens <state-dir>/edge.db; SaveDocument and LoadDocument
//     keep the last good document there, so a restart with the node down
//     still serves it (marked Stale).
//   - LoadToken reads the ingress token from a flag value or a file.
//
// Package nodetest is an in-process node to test all of this against.
package node

// Document is the fleet routing document a node serves at
// GET /v1/ingress/routes, as routing-and-ingress.md gives it, plus the
// routes[].paths extension of docs/design.md.
type Document struct {
	// V is the document version; only 1 is understood.
	V      int     `json:"v"`
	Routes []Route `json:"routes"`
	// API is nil when the node does not publish the platform API apex.
	API *API `json:"api,omitempty"`
}

// Route is one host and the upstreams that serve it, in priority order.
type Route struct {
	// Host is a fully qualified name or a single wildcard key "*.<base>".
	Host        string     `json:"host"`
	Application string     `json:"application"`
	Upstreams   []Upstream `json:"upstreams"`
	// Paths maps a bare first path segment ("paulca", never "/paulca") to
	// the host of another route of the same document. Absent or empty: the
	// host routes by hostname alone.
	Paths map[string]string `json:"paths,omitempty"`
}

// Upstream is one node serving a route, at host:port.
type Upstream struct {
	Node    string `json:"node"`
	Address string `json:"address"`
}

// API is the platform API apex: hosts that route to the node API, and the
// path prefixes the ingress must refuse itself.
type API struct {
	Hosts     []string   `json:"hosts"`
	Upstreams []Upstream `json:"upstreams"`
	Denied    []string   `json:"denied"`
}
