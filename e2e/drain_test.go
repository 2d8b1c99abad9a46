package e2e

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/scafo/scafo-edge/node"
)

// TestSIGTERMDrainsWebSocketsUntilTheShutdownTimeout: a docker stop sends
// SIGTERM; a WebSocket open through the edge keeps echoing while the edge
// drains, as plain requests do, and is cut at --shutdown-timeout, not as
// soon as the plain requests are done (http.Server.Shutdown forgets a
// hijacked connection).
func TestSIGTERMDrainsWebSocketsUntilTheShutdownTimeout(t *testing.T) {
	ws := wsEchoServer(t)
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "ws.example", Application: "ws", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(ws)}}},
	}})
	const shutdownTimeout = 3 * time.Second
	e := startEdge(t, "--routes-file", routes, "--tls", "off", "--handover=false", "--shutdown-timeout", shutdownTimeout.String())
	waitEdgeReady(t, e)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws://"+e.HTTPAddr+"/ws", &websocket.DialOptions{Host: "ws.example"})
	if err != nil {
		t.Fatalf("open WebSocket through the edge: %v", err)
	}
	defer conn.CloseNow()
	echo := func(msg string) error {
		if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			return err
		}
		_, got, err := conn.Read(ctx)
		if err != nil {
			return err
		}
		if string(got) != msg {
			return fmt.Errorf("echo of %q: %q", msg, got)
		}
		return nil
	}
	if err := echo("before SIGTERM"); err != nil {
		t.Fatal(err)
	}

	stopped := time.Now()
	e.cmd.Process.Signal(syscall.SIGTERM)
	// Echo every 100ms until the edge cuts the WebSocket; the loop is
	// bounded by ctx and by the count.
	var lastEcho time.Duration
	for i := 0; i < 300; i++ {
		if err := echo(fmt.Sprintf("after SIGTERM %d", i)); err != nil {
			break
		}
		lastEcho = time.Since(stopped)
		time.Sleep(100 * time.Millisecond) // paces the echoes; nothing waits on it
	}
	cut := time.Since(stopped)
	if err := e.stop(t); err != nil {
		t.Errorf("the edge exited with %v after SIGTERM, want 0", err)
	}
	t.Logf("figures: WebSocket echoed until %v after SIGTERM, cut at %v (shutdown timeout %v)", lastEcho.Round(time.Millisecond), cut.Round(time.Millisecond), shutdownTimeout)
	if lastEcho < shutdownTimeout-time.Second {
		t.Errorf("the WebSocket echoed only until %v after SIGTERM, want it kept until about the shutdown timeout, %v", lastEcho, shutdownTimeout)
	}
	if cut > shutdownTimeout+5*time.Second {
		t.Errorf("the WebSocket was cut %v after SIGTERM, want by about the shutdown timeout, %v", cut, shutdownTimeout)
	}
}
