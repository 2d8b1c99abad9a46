package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/textproto"
	"net/url"
	"strings"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/net/http/httpguts"
)

// MaxOperatorFileSize is the largest operator routes file ParseOperator
// accepts (4 MiB): a file a person writes by hand, not a fleet.
const MaxOperatorFileSize = 4 << 20

// OperatorDocument is the operator's own routes file (--operator-routes):
// the routing document's format ({"v":1,"routes":[...]}), with per-route
// fields only an operator may write. The node's Document has no such
// fields, so a node can never redirect, gate or rewrite a response: its
// parser does not know them (unknown fields are ignored there, refused
// here).
type OperatorDocument struct {
	// V is the version; only 1 is understood.
	V      int             `json:"v"`
	Routes []OperatorRoute `json:"routes"`
}

// OperatorRoute is one route of the operator file. Host, Application,
// Upstreams and Paths mean what they mean in a node's Route; the rest is
// the operator's alone. A route has upstreams or a redirect, never both.
type OperatorRoute struct {
	Host string `json:"host"`
	// Application names the route in metrics and logs; empty: its host.
	Application string            `json:"application,omitempty"`
	Upstreams   []Upstream        `json:"upstreams,omitempty"`
	Paths       map[string]string `json:"paths,omitempty"`

	// Redirect, if set, is answered by the edge and never forwarded.
	Redirect *Redirect `json:"redirect,omitempty"`
	// Allow lists the client networks (CIDRs or bare addresses) the route
	// answers, judged on the client address after --trusted-proxies; any
	// other client gets 403. Empty: every client.
	Allow []string `json:"allow,omitempty"`
	// BasicAuth, if set, asks for a user and password (401 otherwise).
	BasicAuth *BasicAuth `json:"basic_auth,omitempty"`
	// Headers sets or removes headers of the route's responses.
	Headers *HeaderRules `json:"headers,omitempty"`
	// MaxBodyBytes bounds a request body on the route, in place of
	// --max-body-bytes (413 beyond it); 0: no bound on this route. Nil:
	// --max-body-bytes.
	MaxBodyBytes *int64 `json:"max_body_bytes,omitempty"`
}

// Redirect answers every request of a route with a redirect.
type Redirect struct {
	// To is the absolute http or https URL redirected to.
	To string `json:"to"`
	// Status is 301, 302, 307 or 308; zero: 308.
	Status int `json:"status,omitempty"`
	// KeepPath appends the request's path and query, as they arrived, to
	// To (whose own path then must not end in "/", nor have a query).
	KeepPath bool `json:"keep_path,omitempty"`
}

// BasicAuth is HTTP basic authentication (RFC 7617) against htpasswd lines.
type BasicAuth struct {
	// Realm is shown by browsers; empty: the route's host.
	Realm string `json:"realm,omitempty"`
	// Users are htpasswd lines "user:<bcrypt hash>" ($2a$, $2b$ or $2y$,
	// as `htpasswd -B` writes them). At least one.
	Users []string `json:"users"`
}

// HeaderRules change a route's response headers: Remove first, then Set.
type HeaderRules struct {
	Set    map[string]string `json:"set,omitempty"`
	Remove []string          `json:"remove,omitempty"`
}

// RedirectStatuses are the statuses a Redirect may use.
var RedirectStatuses = []int{301, 302, 307, 308}

// OperatorError is a refusal of an operator file, naming where: the file,
// the line and column (1-based; zero when unknown) and the field at fault
// ("routes[1].upstreams[0].address"). It wraps the cause.
type OperatorError struct {
	File   string
	Line   int
	Column int
	Field  string
	Err    error
}

func (e *OperatorError) Error() string {
	var b strings.Builder
	b.WriteString("operator routes ")
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	if e.Field != "" {
		b.WriteString(": ")
		b.WriteString(e.Field)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns the cause, and the package's mark of an invalid document.
func (e *OperatorError) Unwrap() []error { return []error{errInvalid, e.Err} }

// ParseOperator decodes and validates an operator routes file strictly;
// file names it in errors. It refuses the whole file, with an
// *OperatorError naming line, column and field, when:
//   - it is over MaxOperatorFileSize, empty, not one JSON object, or a
//     value has the wrong type;
//   - a field is not one this format knows (a typo must not quietly open a
//     route that was meant to be gated);
//   - v is not 1, routes is missing, or a host, duplicate host or upstream
//     address is refused as Parse refuses it in a node's document;
//   - a route has neither upstreams nor a redirect, or both;
//   - a redirect is not an absolute http(s) URL or has another status than
//     301, 302, 307 or 308;
//   - an allow entry is not a CIDR or an address;
//   - a basic_auth user is not "user:<bcrypt hash>", or names no user;
//   - a header name is not a valid field name, or is one the edge owns
//     (hop-by-hop, Content-Length, Transfer-Encoding);
//   - max_body_bytes is negative, or set on a redirect.
//
// A path prefix or target that is wrong on its own is dropped by
// edge.Compile, as for a node's document.
func ParseOperator(file string, body []byte) (*OperatorDocument, error) {
	fail := func(off int64, field string, err error) error {
		e := &OperatorError{File: file, Field: field, Err: err}
		if off >= 0 {
			e.Line, e.Column = lineColumn(body, off)
		}
		return e
	}
	if len(body) > MaxOperatorFileSize {
		return nil, fail(-1, "", fmt.Errorf("file is %d bytes, over the %d byte limit", len(body), MaxOperatorFileSize))
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, fail(-1, "", errors.New("empty file"))
	}
	var doc OperatorDocument
	if err := json.Unmarshal(body, &doc); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			var first json.RawMessage
			dec := json.NewDecoder(bytes.NewReader(body))
			if dec.Decode(&first) == nil {
				off := dec.InputOffset()
				off += int64(len(body[off:]) - len(bytes.TrimLeft(body[off:], " \t\r\n")))
				return nil, fail(off, "", errors.New("trailing data after the document"))
			}
			// Offset is just past the byte that broke the syntax.
			return nil, fail(max(se.Offset-1, 0), "", se)
		case errors.As(err, &te):
			field := te.Field
			pos, perr := positions(body)
			if perr == nil {
				if p, ok := pos.closestBefore(te.Offset); ok {
					field = p.field()
				}
			}
			return nil, fail(max(te.Offset-1, 0), field, fmt.Errorf("a JSON %s where %s is wanted", te.Value, te.Type))
		}
		return nil, fail(-1, "", fmt.Errorf("decode json: %w", err))
	}
	pos, err := positions(body)
	if err != nil {
		return nil, fail(-1, "", fmt.Errorf("decode json: %w", err))
	}
	for _, p := range pos {
		if why := unknownField(p.path); why != "" {
			return nil, fail(p.off, p.field(), errors.New(why))
		}
	}
	if path, err := validateOperator(&doc); err != nil {
		off := int64(-1)
		if p, ok := pos.find(path); ok {
			off = p.off
		}
		return nil, fail(off, jsonPath(path).field(), err)
	}
	return &doc, nil
}

// Document returns the node-document form of d's routes (host,
// application, upstreams, paths), which the shared checks of Parse run on.
func (d *OperatorDocument) Document() *Document {
	doc := &Document{V: d.V, Routes: make([]Route, len(d.Routes))}
	for i, r := range d.Routes {
		doc.Routes[i] = Route{Host: r.Host, Application: r.Application, Upstreams: r.Upstreams, Paths: r.Paths}
	}
	return doc
}

// fieldsOf are the fields each object of the operator file may have, by
// the shape of its path ("" for the top level); a nil set is a free map.
var fieldsOf = map[string]map[string]bool{
	"":                     {"v": true, "routes": true},
	"routes[]":             {"host": true, "application": true, "upstreams": true, "paths": true, "redirect": true, "allow": true, "basic_auth": true, "headers": true, "max_body_bytes": true},
	"routes[].upstreams[]": {"node": true, "address": true},
	"routes[].redirect":    {"to": true, "status": true, "keep_path": true},
	"routes[].basic_auth":  {"realm": true, "users": true},
	"routes[].headers":     {"set": true, "remove": true},
}

// unknownField says why the member at path is not allowed, or "" when it is
// (or path ends in an array element, or sits in a free map).
func unknownField(path jsonPath) string {
	if len(path) == 0 {
		return ""
	}
	name, ok := path[len(path)-1].(string)
	if !ok {
		return ""
	}
	fields, known := fieldsOf[path[:len(path)-1].shape()]
	if !known || fields[name] {
		return ""
	}
	return fmt.Sprintf("unknown field %q", name)
}

// validateOperator runs the checks of Parse on d's routes, then the
// operator's own; on failure it returns the path of the field at fault.
func validateOperator(d *OperatorDocument) (jsonPath, error) {
	if d.V != 1 {
		return jsonPath{"v"}, fmt.Errorf("v is %d, only version 1 is understood", d.V)
	}
	if d.Routes == nil {
		return jsonPath{"routes"}, errors.New("routes is missing or null")
	}
	seen := make(map[string]int, len(d.Routes))
	for i := range d.Routes {
		r := &d.Routes[i]
		at := func(rest ...any) jsonPath { return append(jsonPath{"routes", i}, rest...) }
		if err := checkHost(r.Host, true); err != nil {
			return at("host"), fmt.Errorf("%q: %w", r.Host, err)
		}
		key := normalHost(r.Host)
		if j, dup := seen[key]; dup {
			return at("host"), fmt.Errorf("%q duplicates routes[%d].host %q", r.Host, j, d.Routes[j].Host)
		}
		seen[key] = i
		for k, u := range r.Upstreams {
			if err := checkAddress(u.Address); err != nil {
				return at("upstreams", k, "address"), fmt.Errorf("%q: %w", u.Address, err)
			}
		}
		switch {
		case r.Redirect == nil && len(r.Upstreams) == 0:
			return at("host"), fmt.Errorf("route %q has neither upstreams nor a redirect", r.Host)
		case r.Redirect != nil && len(r.Upstreams) > 0:
			return at("redirect"), fmt.Errorf("route %q has both upstreams and a redirect: a redirect is answered by the edge, never forwarded", r.Host)
		case r.Redirect != nil && len(r.Paths) > 0:
			return at("paths"), fmt.Errorf("route %q has a redirect: its paths would never be used", r.Host)
		case r.Redirect != nil && r.MaxBodyBytes != nil:
			return at("max_body_bytes"), fmt.Errorf("route %q has a redirect: no body is ever forwarded", r.Host)
		case r.MaxBodyBytes != nil && *r.MaxBodyBytes < 0:
			return at("max_body_bytes"), fmt.Errorf("%d: want a number of bytes, 0 for no bound", *r.MaxBodyBytes)
		}
		if r.Redirect != nil {
			if p, err := checkRedirect(r.Redirect); err != nil {
				return at(append([]any{"redirect"}, p...)...), err
			}
		}
		for k, a := range r.Allow {
			if _, err := ParseAllow(a); err != nil {
				return at("allow", k), err
			}
		}
		if b := r.BasicAuth; b != nil {
			if len(b.Users) == 0 {
				return at("basic_auth", "users"), errors.New("no users: nobody could ever pass")
			}
			users := make(map[string]int, len(b.Users))
			for k, line := range b.Users {
				user, _, err := ParseHtpasswd(line)
				if err != nil {
					return at("basic_auth", "users", k), err
				}
				if j, dup := users[user]; dup {
					return at("basic_auth", "users", k), fmt.Errorf("user %q duplicates users[%d]", user, j)
				}
				users[user] = k
			}
			if strings.ContainsAny(b.Realm, "\"\\\r\n") {
				return at("basic_auth", "realm"), errors.New("realm contains a quote, backslash or line break")
			}
		}
		if h := r.Headers; h != nil {
			for name, v := range h.Set {
				if err := checkHeader(name); err != nil {
					return at("headers", "set", name), err
				}
				if !httpguts.ValidHeaderFieldValue(v) {
					return at("headers", "set", name), fmt.Errorf("value %q is not a valid header value", v)
				}
			}
			for k, name := range h.Remove {
				if err := checkHeader(name); err != nil {
					return at("headers", "remove", k), err
				}
			}
		}
	}
	return nil, nil
}

func checkRedirect(r *Redirect) ([]any, error) {
	switch r.Status {
	case 0, 301, 302, 307, 308:
	default:
		return []any{"status"}, fmt.Errorf("%d: want 301, 302, 307 or 308", r.Status)
	}
	u, err := url.Parse(r.To)
	if err != nil {
		return []any{"to"}, fmt.Errorf("%q: %w", r.To, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" {
		return []any{"to"}, fmt.Errorf("%q: want an absolute http or https URL without user or fragment", r.To)
	}
	if !httpguts.ValidHeaderFieldValue(r.To) {
		return []any{"to"}, fmt.Errorf("%q is not a valid Location value", r.To)
	}
	if r.KeepPath && (strings.HasSuffix(u.Path, "/") || u.RawQuery != "" || strings.HasSuffix(r.To, "?")) {
		return []any{"to"}, fmt.Errorf("%q: with keep_path the request's path and query are appended, so it must not end in / nor have a query", r.To)
	}
	return nil, nil
}

// edgeOwnedHeaders are response headers a route's rules may not touch: the
// framing and the hop-by-hop headers (RFC 9110 §7.6.1) are the edge's.
var edgeOwnedHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Content-Length": true,
}

func checkHeader(name string) error {
	if !httpguts.ValidHeaderFieldName(name) {
		return fmt.Errorf("%q is not a valid header name", name)
	}
	if edgeOwnedHeaders[textproto.CanonicalMIMEHeaderKey(name)] {
		return fmt.Errorf("%q is the edge's to set (framing or hop-by-hop)", name)
	}
	return nil
}

// ParseAllow parses one allow entry: a CIDR, or a bare address (its own
// /32 or /128). The prefix is masked and IPv4-mapped addresses unmapped.
func ParseAllow(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or an address", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// ParseHtpasswd splits an htpasswd line into its user and bcrypt hash, and
// checks the hash is one bcrypt can verify (only bcrypt: the MD5 and SHA-1
// schemes of htpasswd are too fast to guess against).
func ParseHtpasswd(line string) (user string, hash []byte, err error) {
	user, h, ok := strings.Cut(strings.TrimSpace(line), ":")
	if !ok || user == "" {
		return "", nil, errors.New(`want "user:<bcrypt hash>" as htpasswd -B writes it`)
	}
	if !strings.HasPrefix(h, "$2a$") && !strings.HasPrefix(h, "$2b$") && !strings.HasPrefix(h, "$2y$") {
		return "", nil, fmt.Errorf("user %q: only bcrypt hashes ($2a$, $2b$, $2y$; htpasswd -B) are accepted", user)
	}
	if _, err := bcrypt.Cost([]byte(h)); err != nil {
		return "", nil, fmt.Errorf("user %q: bcrypt hash: %w", user, err)
	}
	return user, []byte(h), nil
}
