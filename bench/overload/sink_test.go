package main

import (
	"net"
	"net/http"
	"testing"
	"time"
)

func TestSinkAnswersEveryRequest404(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newSink(time.Second)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + ln.Addr().String() + "/hold")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the sink answered %d, want 404", resp.StatusCode)
	}
}

func TestSinkWantsAnAddress(t *testing.T) {
	if err := sinkCmd(nil); err == nil {
		t.Error("sink without -addr started")
	}
}
