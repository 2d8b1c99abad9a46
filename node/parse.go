package node

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// MaxDocumentSize is the largest routing document Parse accepts (64 MiB).
// A fleet of 100,000 routes renders to roughly 20 MiB; anything far beyond
// that is a broken or hostile node, not a big fleet.
const MaxDocumentSize = 64 << 20

// errInvalid marks every refusal of a whole document, so the poller can
// count it under one result without matching strings.
var errInvalid = errors.New("invalid routing document")

// invalidf builds a refusal naming the problem; it wraps errInvalid.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalid, fmt.Sprintf(format, args...))
}

// Fingerprint is the content hash of a routing document's body: the
// lower-case hex SHA-256 of the exact bytes. It is what the poller compares
// to skip an unchanged body and what it sends back as If-None-Match (quoted).
func Fingerprint(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// Parse decodes and validates a routing document strictly. It refuses the
// document as a whole — returning an error that names the route index, host
// and field at fault — when:
//   - the body is larger than MaxDocumentSize;
//   - it is not exactly one JSON object (malformed JSON, or trailing data
//     after the object);
//   - v is not 1;
//   - routes is missing or null (an empty list is accepted: it is the node
//     saying the fleet answers on nothing, while a missing one is a broken
//     render that would withdraw every route);
//   - a route host or API host is not a valid DNS name; a route host may
//     instead be one wildcard key "*.<name>", an API host may not;
//   - two routes name the same host (compared lower-case, without a trailing
//     dot);
//   - an upstream address is not host:port with a port 1-65535;
//   - an API denied prefix does not start with "/".
//
// Duplicate hosts are refused rather than resolved "first wins": the node
// promises one entry per host (routing-and-ingress.md, "first writer wins"
// happens while it renders), and the rendered list is sorted by host, so
// which duplicate comes first says nothing about which claim class wrote it.
// Guessing could hand a platform host to a custom-domain claim; keeping the
// last good document until the node is fixed cannot.
//
// Unknown fields are ignored: the document grows by additive fields (paths
// was one), and v is what changes when old readers must stop. Entries that
// are individually wrong inside a valid document (a bad path prefix, a path
// target that is no route, more than 10,000 prefixes) are not refused here:
// edge.Compile drops and counts them. A route with no upstreams is kept; the
// edge answers it 502.
func Parse(body []byte) (*Document, error) {
	return parse(body, MaxDocumentSize)
}

// parse is Parse with the size limit of the caller (the poller's MaxSize).
func parse(body []byte, limit int64) (*Document, error) {
	if int64(len(body)) > limit {
		return nil, invalidf("document is %d bytes, over the %d byte limit", len(body), limit)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, invalidf("empty body")
	}
	var doc Document
	if err := json.Unmarshal(body, &doc); err != nil {
		// A second value (or stray bytes) after the object means the body
		// is not the document we think it is: a concatenation, a truncated
		// retry, or a proxy's error page glued on.
		// Unmarshal reports that as a syntax error; one valid value at the
		// start tells it apart from a broken document (off the hot path).
		var se *json.SyntaxError
		if errors.As(err, &se) {
			var first json.RawMessage
			dec := json.NewDecoder(bytes.NewReader(body))
			if dec.Decode(&first) == nil {
				return nil, invalidf("trailing data after the document at byte %d", dec.InputOffset())
			}
		}
		return nil, invalidf("decode json: %v", err)
	}
	if err := validate(&doc); err != nil {
		return nil, err
	}
	return &doc, nil
}

func validate(doc *Document) error {
	if doc.V != 1 {
		return invalidf("v is %d, only version 1 is understood", doc.V)
	}
	if doc.Routes == nil {
		return invalidf("routes is missing or null")
	}
	seen := make(map[string]int, len(doc.Routes))
	for i := range doc.Routes {
		r := &doc.Routes[i]
		if err := checkHost(r.Host, true); err != nil {
			return invalidf("routes[%d].host %q: %v", i, r.Host, err)
		}
		key := normalHost(r.Host)
		if j, dup := seen[key]; dup {
			return invalidf("routes[%d].host %q: duplicates routes[%d].host %q", i, r.Host, j, doc.Routes[j].Host)
		}
		seen[key] = i
		for k, u := range r.Upstreams {
			if err := checkAddress(u.Address); err != nil {
				return invalidf("routes[%d] (host %q): upstreams[%d].address %q: %v", i, r.Host, k, u.Address, err)
			}
		}
	}
	if doc.API != nil {
		for i, h := range doc.API.Hosts {
			if err := checkHost(h, false); err != nil {
				return invalidf("api.hosts[%d] %q: %v", i, h, err)
			}
		}
		for k, u := range doc.API.Upstreams {
			if err := checkAddress(u.Address); err != nil {
				return invalidf("api.upstreams[%d].address %q: %v", k, u.Address, err)
			}
		}
		for i, d := range doc.API.Denied {
			if !strings.HasPrefix(d, "/") {
				// A prefix without its slash can never match a request path:
				// the rule it states would silently not be enforced.
				return invalidf("api.denied[%d] %q: does not start with /", i, d)
			}
		}
	}
	return nil
}

// normalHost is the spelling duplicates are compared in: DNS is
// case-insensitive and "a.example." is "a.example".
func normalHost(h string) string {
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// checkHost reports why h is not a valid DNS name (RFC 1035 §2.3.1 letters,
// digits and hyphens, as relaxed by RFC 1123 to allow a leading digit),
// optionally allowing one leading "*." label. One trailing dot is allowed.
// An all-numeric last label is refused (RFC 3696 §2): it makes the name an
// IP address, which no route should be keyed by.
func checkHost(h string, wildcardOK bool) error {
	name := h
	if strings.HasPrefix(name, "*.") {
		if !wildcardOK {
			return errors.New("a wildcard is not allowed here")
		}
		name = name[2:]
	}
	name = strings.TrimSuffix(name, ".")
	if name == "" {
		return errors.New("empty name")
	}
	if len(name) > 253 {
		return fmt.Errorf("name is %d characters, over 253", len(name))
	}
	allDigits := false
	for label := range strings.SplitSeq(name, ".") {
		if err := checkLabel(label); err != nil {
			return err
		}
		allDigits = strings.Trim(label, "0123456789") == ""
	}
	if allDigits {
		return errors.New("last label is numeric (an IP address is not a host name)")
	}
	return nil
}

func checkLabel(l string) error {
	switch {
	case l == "":
		return errors.New("empty label")
	case len(l) > 63:
		return fmt.Errorf("label %q is over 63 characters", l)
	case l[0] == '-' || l[len(l)-1] == '-':
		return fmt.Errorf("label %q starts or ends with a hyphen", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			if c == '*' {
				return fmt.Errorf("label %q: a wildcard is only allowed as the whole first label", l)
			}
			return fmt.Errorf("label %q has character %q", l, c)
		}
	}
	return nil
}

// checkAddress reports why a is not host:port with a port 1-65535. The host
// may be an IP address (IPv6 in brackets) or a DNS name.
func checkAddress(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("empty host")
	}
	if net.ParseIP(host) == nil {
		if err := checkHost(host, false); err != nil {
			return err
		}
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 || port[0] == '+' {
		return fmt.Errorf("port %q is not 1-65535", port)
	}
	return nil
}
