package serving

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"

	"github.com/scafo/scafo-edge/admission"
	"github.com/scafo/scafo-edge/handover"
)

// The public listeners' layers come in one order, and each accepted
// connection is wrapped in it: the gate's outermost (right below TLS),
// admission's on the socket itself.
func TestClientStackWrapsConnectionsInItsOrder(t *testing.T) {
	adm, err := admission.New(admission.Options{Limits: admission.Limits{MaxConns: 100, ConnsPerClient: 100,
		RequestsPerClient: 100, AppShare: admission.DefaultAppShare, QueueTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		proxyFrom []netip.Prefix
		layers    []string
		conns     []string
	}{
		{"without PROXY sources", nil,
			[]string{"admission", "spread deadlines", "send timeout", "handover gate"},
			[]string{"*handover.gateConn", "*serving.sendTimeoutConn", "*serving.spreadConn", "*admission.trackedConn", "*net.TCPConn"}},
		{"with PROXY sources", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
			[]string{"admission", "spread deadlines", "send timeout", "proxy protocol", "handover gate"},
			[]string{"*handover.gateConn", "*proxyproto.Conn", "*serving.sendTimeoutConn", "*serving.spreadConn", "*admission.trackedConn", "*net.TCPConn"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gate handover.Gate
			s := ClientStack(ClientOptions{Admission: adm.Listener, SendTimeout: time.Minute,
				ProxyFrom: tc.proxyFrom, HeaderTimeout: time.Second, Gate: &gate})
			if got := s.Names(); !slices.Equal(got, tc.layers) {
				t.Fatalf("layers %q, want %q", got, tc.layers)
			}
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			l := s.Listener(raw)
			defer l.Close()
			client, err := net.Dial("tcp", raw.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			c, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := connChain(c); !slices.Equal(got, tc.conns) {
				t.Errorf("connection wrapped as %q, want %q", got, tc.conns)
			}
		})
	}
}

// connChain names c's wrappers from the outermost in.
func connChain(c net.Conn) []string {
	var chain []string
	for range 10 {
		chain = append(chain, fmt.Sprintf("%T", c))
		switch u := c.(type) {
		case interface{ NetConn() net.Conn }:
			c = u.NetConn()
		case *proxyproto.Conn:
			c = u.Raw()
		default:
			return chain
		}
	}
	return chain
}

func TestConnStatesCallsEachHookInOrder(t *testing.T) {
	var got []string
	hook := func(name string) func(net.Conn, http.ConnState) {
		return func(net.Conn, http.ConnState) { got = append(got, name) }
	}
	ConnStates(hook("gate"), nil, hook("admission"))(nil, http.StateNew)
	if want := []string{"gate", "admission"}; !slices.Equal(got, want) {
		t.Errorf("hooks called %q, want %q", got, want)
	}
}

func TestConnContextsPassesEachHooksContextToTheNext(t *testing.T) {
	type key string
	hook := func(name string) func(context.Context, net.Conn) context.Context {
		return func(ctx context.Context, _ net.Conn) context.Context {
			prev, _ := ctx.Value(key("chain")).(string)
			return context.WithValue(ctx, key("chain"), prev+name+" ")
		}
	}
	ctx := ConnContexts(hook("gate"), nil, hook("admission"))(context.Background(), nil)
	if got, want := ctx.Value(key("chain")), "gate admission "; got != want {
		t.Errorf("hooks chained %q, want %q", got, want)
	}
}
