package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestListenDropsReadsTheTcpExtCounters(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	netstat := "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 1 230 241\n" +
		"IpExt: InNoRoutes\nIpExt: 0\n"
	if err := os.WriteFile(filepath.Join(dir, "net", "netstat"), []byte(netstat), 0o644); err != nil {
		t.Fatal(err)
	}
	overflows, drops, err := procFS{Dir: dir}.ListenDrops()
	if err != nil || overflows != 230 || drops != 241 {
		t.Errorf("ListenDrops = %d, %d, %v; want 230, 241", overflows, drops, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "net", "netstat"), []byte("IpExt: InNoRoutes\nIpExt: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := (procFS{Dir: dir}).ListenDrops(); err == nil {
		t.Error("ListenDrops without TcpExt: no error")
	}
}
