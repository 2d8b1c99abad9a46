package backhaul

import (
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/scafo/scafo-edge/node"
)

// seen is what a recording upstream received.
type seen struct {
	RequestURI string
	Host       string
	Header     http.Header
	// Close is whether the request asked to close its connection: the
	// transport does, the pooled client does not, so it tells which path
	// the request took.
	Close bool
}

// recorder starts an upstream that answers with what it received as JSON.
func recorder(t *testing.T) node.Upstream {
	return upstream(t, "rec", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(seen{RequestURI: r.RequestURI, Host: r.Host, Header: r.Header, Close: r.Close})
	})
}

func decodeSeen(t *testing.T, body string) seen {
	t.Helper()
	var s seen
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("decode upstream echo %q: %v", body, err)
	}
	return s
}

func TestUpstreamReceivesTheOriginalRequestURI(t *testing.T) {
	rec := recorder(t)
	e := startEdge(t, newProxy(t, Options{}), rec)
	tests := []struct {
		name   string
		method string
		target string
		want   string
	}{
		{"dot segments after a doubled slash are not cleaned", "GET", "//a/../b", "//a/../b"},
		{"percent-encoded dots are not decoded (rule 4)", "GET", "/%2e%2e/x", "/%2e%2e/x"},
		{"an encoded slash stays encoded", "GET", "/a%2fb", "/a%2fb"},
		{"plain dot segments are not cleaned", "GET", "/a/./b/../c", "/a/./b/../c"},
		{"lower- and upper-case escapes keep their case", "GET", "/%7euser/%7Eother", "/%7euser/%7Eother"},
		{"the query is passed byte for byte", "GET", "/p?x=%2F&y=a+b&&z", "/p?x=%2F&y=a+b&&z"},
		{"an empty query keeps its question mark", "GET", "/p?", "/p?"},
		{"semicolon parameters stay", "GET", "/a;v=1/b", "/a;v=1/b"},
		{"a doubled slash with escapes keeps both", "GET", "//paulca/%2e%2e/x?q", "//paulca/%2e%2e/x?q"},
		{"an absolute-form target is sent as its path and query", "GET", "http://other.example/a%2fb?q=1", "/a%2fb?q=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := rawDo(t, e.addr, tt.method+" "+tt.target+" HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n\r\n")
			if resp.StatusCode != 200 {
				t.Fatalf("status = %d, want 200 (%s)", resp.StatusCode, body)
			}
			if got := decodeSeen(t, body).RequestURI; got != tt.want {
				t.Errorf("upstream request-URI for %q = %q, want %q", tt.target, got, tt.want)
			}
		})
	}
}

func TestForwardedHeaders(t *testing.T) {
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	tests := []struct {
		name    string
		trusted []netip.Prefix
		head    string // request header lines
		want    map[string]string
		absent  []string
	}{
		{
			name: "the Host header reaches the upstream unchanged",
			head: "Host: App.Example:8080\r\n",
			want: map[string]string{"Host": "App.Example:8080", "X-Forwarded-Host": "App.Example:8080"},
		},
		{
			name: "X-Forwarded-For names the client; Proto and Host are set",
			head: "Host: app.example\r\n",
			want: map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "app.example"},
		},
		{
			name: "an untrusted client's X-Forwarded-* and Forwarded are replaced",
			head: "Host: app.example\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\n" +
				"X-Forwarded-Host: evil.example\r\nX-Forwarded-Port: 1\r\nForwarded: for=6.6.6.6\r\nX-Real-Ip: 6.6.6.6\r\n",
			want:   map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "app.example"},
			absent: []string{"X-Forwarded-Port", "Forwarded", "X-Real-Ip"},
		},
		{
			name: "an untrusted client's CDN client-address fields are dropped",
			head: "Host: app.example\r\nTrue-Client-IP: 6.6.6.6\r\nCF-Connecting-IP: 6.6.6.6\r\nFastly-Client-IP: 6.6.6.6\r\n" +
				"X-Client-IP: 6.6.6.6\r\nX-Cluster-Client-IP: 6.6.6.6\r\nTrue_Client_IP: 6.6.6.6\r\nClient-IP: 6.6.6.6\r\n",
			want:   map[string]string{"X-Forwarded-For": "127.0.0.1"},
			absent: []string{"True-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip", "X-Client-Ip", "X-Cluster-Client-Ip", "True_client_ip", "True_Client_IP", "Client-Ip"},
		},
		{
			name:    "a trusted proxy's True-Client-IP is kept",
			trusted: []netip.Prefix{loopback},
			head:    "Host: app.example\r\nTrue-Client-IP: 203.0.113.9\r\n",
			want:    map[string]string{"True-Client-Ip": "203.0.113.9"},
		},
		{
			name:    "a trusted proxy's X-Forwarded-For is appended to and its other headers kept",
			trusted: []netip.Prefix{loopback},
			head: "Host: app.example\r\nX-Forwarded-For: 203.0.113.9, 10.0.0.1\r\nX-Forwarded-For: 10.0.0.2\r\n" +
				"X-Forwarded-Proto: https\r\nX-Forwarded-Host: public.example\r\nForwarded: for=203.0.113.9\r\n",
			want: map[string]string{
				"X-Forwarded-For": "203.0.113.9, 10.0.0.1, 10.0.0.2, 127.0.0.1", "X-Forwarded-Proto": "https",
				"X-Forwarded-Host": "public.example", "Forwarded": "for=203.0.113.9",
			},
		},
		{
			name:    "a client outside the trusted networks is not trusted",
			trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			head:    "Host: app.example\r\nX-Forwarded-For: 6.6.6.6\r\n",
			want:    map[string]string{"X-Forwarded-For": "127.0.0.1"},
		},
		{
			name: "hop-by-hop headers and those named in Connection are removed (RFC 7230 6.1)",
			head: "Host: app.example\r\nConnection: keep-alive, X-Hop, x-other-hop\r\nX-Hop: 1\r\nX-Other-Hop: 2\r\n" +
				"Keep-Alive: timeout=5\r\nProxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\n" +
				"Te: gzip\r\nUpgrade: h2c\r\nX-End-To-End: kept\r\n",
			want:   map[string]string{"X-End-To-End": "kept"},
			absent: []string{"X-Hop", "X-Other-Hop", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Te", "Upgrade"},
		},
		{
			name:   "a header the client names in Connection is removed, not replaced: User-Agent",
			head:   "Host: app.example\r\nConnection: User-Agent\r\nUser-Agent: curl/8\r\n",
			absent: []string{"User-Agent"},
		},
		{
			name:    "a trusted proxy's forwarding headers named in Connection are replaced",
			trusted: []netip.Prefix{loopback},
			head: "Host: app.example\r\nConnection: X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host\r\n" +
				"X-Forwarded-For: 10.0.0.1\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: public.example\r\nForwarded: for=10.0.0.1\r\n",
			want: map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http",
				"X-Forwarded-Host": "app.example", "Forwarded": "for=10.0.0.1"},
		},
		{
			name:    "names that alias a forwarding header are dropped, even from a trusted proxy",
			trusted: []netip.Prefix{loopback},
			head:    "Host: app.example\r\nX_Forwarded_For: 6.6.6.6\r\nX-Real_Ip: 6.6.6.6\r\nX_Custom: kept\r\n",
			want:    map[string]string{"X-Forwarded-For": "127.0.0.1", "X_custom": "kept"},
			absent:  []string{"X_forwarded_for", "X-Real_ip"},
		},
		{
			name: "an untrusted client's X-Request-Id is replaced by the edge's own",
			head: "Host: app.example\r\nX-Request-Id: chosen-by-client\r\n",
		},
		{
			name:    "a trusted proxy's X-Request-Id is passed on as sent",
			trusted: []netip.Prefix{loopback},
			head:    "Host: app.example\r\nX-Request-Id: Root=1-67891233-abcdef012345678912345678\r\n",
			want:    map[string]string{"X-Request-Id": "Root=1-67891233-abcdef012345678912345678"},
		},
		{
			name:    "a trusted proxy's X-Request-Id with a quote is replaced",
			trusted: []netip.Prefix{loopback},
			head:    "Host: app.example\r\nX-Request-Id: a\"b\r\n",
		},
		{
			name:    "a trusted proxy's X-Request-Id with a space is replaced",
			trusted: []netip.Prefix{loopback},
			head:    "Host: app.example\r\nX-Request-Id: a b\r\n",
		},
		{
			name:    "a trusted proxy's X-Request-Id over 128 bytes is replaced",
			trusted: []netip.Prefix{loopback},
			head:    "Host: app.example\r\nX-Request-Id: " + strings.Repeat("a", 129) + "\r\n",
		},
		{
			name:    "a trusted proxy's two X-Request-Id fields are replaced",
			trusted: []netip.Prefix{loopback},
			head:    "Host: app.example\r\nX-Request-Id: one\r\nX-Request-Id: two\r\n",
		},
		{
			name:    "a trusted proxy's X-Request-Id listing two IDs is replaced",
			trusted: []netip.Prefix{loopback},
			head:    "Host: app.example\r\nX-Request-Id: one, two\r\n",
		},
		{
			name:    "a trusted proxy's X-Request-Id named in Connection is replaced",
			trusted: []netip.Prefix{loopback},
			head:    "Host: app.example\r\nConnection: X-Request-Id\r\nX-Request-Id: hop\r\n",
		},
		{
			name:    "a name that aliases X-Request-Id is dropped, even from a trusted proxy",
			trusted: []netip.Prefix{loopback},
			head:    "Host: app.example\r\nX_Request_Id: forged\r\n",
			absent:  []string{"X_request_id", "X_Request_Id"},
		},
		{
			name: "TE: trailers is the one TE value passed on",
			head: "Host: app.example\r\nTe: trailers, deflate\r\n",
			want: map[string]string{"Te": "trailers"},
		},
		{
			name:   "the client's Accept-Encoding is passed as sent, none added",
			head:   "Host: app.example\r\nAccept-Encoding: br\r\n",
			want:   map[string]string{"Accept-Encoding": "br"},
			absent: []string{},
		},
		{
			name:   "no Accept-Encoding is added when the client sent none",
			head:   "Host: app.example\r\n",
			absent: []string{"Accept-Encoding"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := recorder(t)
			e := startEdge(t, newProxy(t, Options{TrustedProxies: tt.trusted}), rec)
			var first http.Header
			for _, shape := range forwardingShapes {
				s := decodeSeen(t, finalBody(t, e.addr, shape.head+tt.head+shape.framing+"\r\n"+shape.body))
				if s.Close != shape.transport {
					t.Fatalf("%s: upstream saw a request to close its connection = %t, want %t: the request took the other path",
						shape.name, s.Close, shape.transport)
				}
				for k, want := range tt.want {
					got := strings.Join(s.Header.Values(k), ", ")
					if k == "Host" {
						got = s.Host
					}
					if got != want {
						t.Errorf("%s: upstream %s = %q, want %q", shape.name, k, got, want)
					}
				}
				for _, k := range tt.absent {
					if v, ok := s.Header[http.CanonicalHeaderKey(k)]; ok {
						t.Errorf("%s: upstream got %s: %q, want it removed", shape.name, k, v)
					}
				}
				// Unless a row wants a trusted proxy's, the request ID is
				// the edge's own, new for every request.
				if _, relayed := tt.want["X-Request-Id"]; !relayed {
					ids := s.Header.Values("X-Request-Id")
					if len(ids) != 1 || !ownRequestID.MatchString(ids[0]) {
						t.Errorf("%s: upstream X-Request-Id = %q, want one of the edge's own", shape.name, ids)
					}
					s.Header["X-Request-Id"] = []string{"(the edge's own)"}
				}
				// The client's Connection never passes: the pooled client
				// keeps its connection alive, the transport asks for one
				// per request.
				wantConn := ""
				if shape.transport {
					wantConn = "close"
				}
				if c := s.Header.Get("Connection"); c != wantConn {
					t.Errorf("%s: upstream Connection = %q, want %q", shape.name, c, wantConn)
				}
				// Beyond the rows' fields, both paths send the same
				// header; only the fields that frame each shape's body
				// and its connection differ.
				for _, k := range []string{"Connection", "Content-Length", "Expect", "Trailer", "Transfer-Encoding"} {
					delete(s.Header, k)
				}
				if first == nil {
					first = s.Header
				} else if !reflect.DeepEqual(s.Header, first) {
					t.Errorf("%s: upstream header = %v, want %v as %s sent it", shape.name, s.Header, first, forwardingShapes[0].name)
				}
			}
		})
	}
}

// ownRequestID is the form of the edge's own request IDs.
var ownRequestID = regexp.MustCompile(`^[0-9a-f]{16}$`)

// forwardingShapes are the requests each TestForwardedHeaders row is sent
// as, one for each path h1Eligible can choose, so that both writers of the
// forwarding policy (writeRequest for the pooled client, outboundHeader
// for the transport) are held to every row.
var forwardingShapes = []struct {
	name      string
	head      string // the request line
	framing   string // header lines that frame the body
	body      string
	transport bool
}{
	{name: "a plain GET (pooled client)", head: "GET / HTTP/1.1\r\n"},
	{
		name: "a POST expecting 100-continue (transport)", head: "POST / HTTP/1.1\r\n",
		framing: "Expect: 100-continue\r\nContent-Length: 2\r\n", body: "hi", transport: true,
	},
	{
		name: "a POST with trailers (transport)", head: "POST / HTTP/1.1\r\n",
		framing: "Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\n", body: "2\r\nhi\r\n0\r\nX-Sum: 1\r\n\r\n", transport: true,
	},
}

// finalBody sends raw to addr and returns the body of the final response,
// past any 100 Continue the edge sends first.
func finalBody(t *testing.T, addr, raw string) string {
	t.Helper()
	c, br := rawSend(t, addr, raw)
	defer c.Close()
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("read response to %q: %v", firstLine(raw), err)
		}
		if resp.StatusCode >= 200 {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("read body of %q: %v", firstLine(raw), err)
			}
			return string(b)
		}
	}
}

func TestHopByHopResponseHeadersAreRemoved(t *testing.T) {
	up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "X-Secret")
		w.Header().Set("X-Secret", "internal")
		w.Header().Set("Keep-Alive", "timeout=1")
		w.Header().Set("Proxy-Authenticate", "Basic")
		w.Header().Set("X-App", "kept")
		w.Write([]byte("ok"))
	})
	e := startEdge(t, newProxy(t, Options{}), up)
	resp, _ := rawDo(t, e.addr, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
	for _, k := range []string{"X-Secret", "Keep-Alive", "Proxy-Authenticate"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("client got %s: %q, want it removed", k, v)
		}
	}
	if v := resp.Header.Get("X-App"); v != "kept" {
		t.Errorf("client X-App = %q, want kept", v)
	}
}

func TestAliasesOfProtectedHeadersAreRecognised(t *testing.T) {
	tests := []struct {
		key  string
		want bool
	}{
		{"X_Forwarded_For", true},
		{"X-Forwarded_For", true},
		{"X_forwarded_for", true},
		{"X.Forwarded.For", true}, // PHP reads '.' as '_'
		{"X-Forwarded_Host", true},
		{"X_Forwarded_Anything", true},
		{"X-Real_Ip", true},
		{"X.Real.Ip", true},
		{"Proxy_Connection", true},
		{"Transfer_Encoding", true},
		{"Content_Length", true},
		{"Keep_Alive", true},
		{"Proxy_Authorization", true},
		{"X_Request_Id", true},
		{"X-Request_Id", true},
		{"X-Forwarded-For", false}, // the real name: the trust rules decide
		{"X-Request-Id", false},
		{"X_Custom_Thing", false},
		{"X_Real_Ip_Extra", false},
		{"Content_Type", false},
		{"Accept", false},
	}
	for _, tt := range tests {
		if got := aliasesProtected(tt.key); got != tt.want {
			t.Errorf("aliasesProtected(%q) = %t, want %t", tt.key, got, tt.want)
		}
	}
}

func TestRequestID(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	tests := []struct {
		name    string
		remote  string
		header  http.Header
		relayed string // "": the edge's own
	}{
		{"a trusted proxy's ID is believed", "10.1.2.3:5000", http.Header{"X-Request-Id": {"abc-123"}}, "abc-123"},
		{"a trusted proxy over IPv4-mapped IPv6 is trusted", "[::ffff:10.1.2.3]:5000", http.Header{"X-Request-Id": {"abc-123"}}, "abc-123"},
		{"an untrusted client's ID is not", "192.0.2.1:5000", http.Header{"X-Request-Id": {"abc-123"}}, ""},
		{"a peer that is no address is not trusted", "@unix", http.Header{"X-Request-Id": {"abc-123"}}, ""},
		{"no ID sent: the edge's own", "10.1.2.3:5000", http.Header{}, ""},
		{"an empty ID: the edge's own", "10.1.2.3:5000", http.Header{"X-Request-Id": {""}}, ""},
		{"a control byte: the edge's own", "10.1.2.3:5000", http.Header{"X-Request-Id": {"a\x01"}}, ""},
		{"a non-ASCII byte: the edge's own", "10.1.2.3:5000", http.Header{"X-Request-Id": {"caf\xc3\xa9"}}, ""},
		{"a backslash: the edge's own", "10.1.2.3:5000", http.Header{"X-Request-Id": {`a\b`}}, ""},
		{"128 bytes: believed", "10.1.2.3:5000", http.Header{"X-Request-Id": {strings.Repeat("x", 128)}}, strings.Repeat("x", 128)},
		{"129 bytes: the edge's own", "10.1.2.3:5000", http.Header{"X-Request-Id": {strings.Repeat("x", 129)}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tt.remote, Header: tt.header}
			id := RequestIDFor(r, trusted)
			if tt.relayed != "" {
				if !id.Relayed() || id.String() != tt.relayed {
					t.Errorf("RequestIDFor = %q (relayed %t), want %q relayed", id, id.Relayed(), tt.relayed)
				}
				return
			}
			if id.Relayed() || !ownRequestID.MatchString(id.String()) {
				t.Errorf("RequestIDFor = %q (relayed %t), want one of the edge's own", id, id.Relayed())
			}
			if again := RequestIDFor(r, trusted); again == id {
				t.Errorf("RequestIDFor gave %q twice, want a new ID each time", id)
			}
		})
	}
	if !(RequestID{}).IsZero() || (RequestID{}).String() != "" {
		t.Error("the zero RequestID is not empty")
	}
	if got := string(RequestID{own: 0xa}.AppendTo(nil)); got != "000000000000000a" {
		t.Errorf("AppendTo = %q, want 16 digits, zero-padded", got)
	}
}

func TestRequestIDTrailerIsDropped(t *testing.T) {
	tr := http.Header{"X-Request-Id": {"forged"}, "X-Sum": {"1"}}
	dropForbiddenTrailers(tr, nil)
	if _, ok := tr["X-Request-Id"]; ok || tr.Get("X-Sum") != "1" {
		t.Errorf("trailer after dropForbiddenTrailers = %v, want X-Request-Id dropped and X-Sum kept", tr)
	}
}
