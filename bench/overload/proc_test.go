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

func TestCPUTicksSumsUserAndSystemTime(t *testing.T) {
	dir := t.TempDir()
	for pid, stat := range map[string]string{
		// A name with spaces and a parenthesis, as /proc shows it.
		"10": "10 (load (x) 1) S 1 10 10 0 -1 4194560 500 0 0 0 120 35 0 0 20 0 9 0 100 0 0\n",
		"11": "11 (edge) R 1 11 11 0 -1 4194560 500 0 0 0 7 3 0 0 20 0 9 0 100 0 0\n",
		"12": "12 (short) R 1\n",
	} {
		if err := os.MkdirAll(filepath.Join(dir, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pid, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := (procFS{Dir: dir}).CPUTicks([]int{10, 11, 12, 13}); got != 165 {
		t.Errorf("CPUTicks = %d, want 120+35+7+3 = 165 (12 unreadable, 13 gone)", got)
	}
}
