package nodetest

import "net/http"

// registerStorage is where the node's /v1/storage surface goes
// (routing-and-ingress.md, "Certificate storage"; issue 5): objects
// (PUT/GET/DELETE /v1/storage/objects/<key>, a delete removing the key and
// everything beneath it), GET /v1/storage/list?prefix=&recursive= (an empty
// result is 404), GET /v1/storage/stat?key=, and POST/DELETE
// /v1/storage/locks/<name> (409 when held, never waiting; release
// idempotent). Its handlers check the ingress token with
// authorized(w, r, n.currentToken()), as the routes handler does, and keep
// their state under n.mu or a lock of their own. Until then the node
// answers 404 there, as a node without the surface would.
func (n *Node) registerStorage(mux *http.ServeMux) {}
