package e2e

import "testing"

// TestStartWithoutARunningEdgeSaysSo: with nothing offering its sockets
// (no edge, or one too old to offer them) the edge says so in one line at
// info, the line an operator reads when start-up then stops at edge.db's
// lock.
func TestStartWithoutARunningEdgeSaysSo(t *testing.T) {
	e := startEdge(t, "--routes-file", oneRoute(t), "--tls", "off", "--state-dir", t.TempDir())
	waitEdgeReady(t, e)
	if !e.logged("handover: no running edge offers its sockets; binding the listeners") {
		t.Errorf("no line says the edge found nobody to take over from\n%s", e.logText())
	}
}
