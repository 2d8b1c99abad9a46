package handover

import (
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/node"
)

func TestHandedDocumentIsFreshOnlyWhenConfirmedAndServed(t *testing.T) {
	db, err := node.OpenState(t.TempDir(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if doc, err := HandedDocument(db, node.PollStatus{}); doc != nil || err != nil {
		t.Fatalf("HandedDocument with nothing persisted = %v, %v; want nil, nil", doc, err)
	}
	body := func(app string) []byte {
		return fmt.Appendf(nil, `{"v":1,"routes":[{"host":"app.example","application":%q,"upstreams":[{"node":"n1","address":"127.0.0.1:1"}]}]}`, app)
	}
	persisted := node.Update{Body: body("one"), FetchedAt: time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)}
	if err := node.SaveDocument(db, persisted); err != nil {
		t.Fatal(err)
	}
	saved, served := node.Fingerprint(body("one")), node.Fingerprint(body("two"))
	for _, tc := range []struct {
		name      string
		st        node.PollStatus
		wantStale bool
	}{
		{"the persisted document the source confirmed travels fresh", node.PollStatus{Fingerprint: saved}, false},
		{"a document loaded from edge.db and never confirmed travels stale", node.PollStatus{Fingerprint: saved, Stale: true}, true},
		{"an older document than the one served (its save failed) travels stale", node.PollStatus{Fingerprint: served}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := HandedDocument(db, tc.st)
			if err != nil || doc == nil {
				t.Fatalf("HandedDocument = %v, %v", doc, err)
			}
			if doc.Stale != tc.wantStale || doc.Fingerprint != saved {
				t.Errorf("HandedDocument = fingerprint %.12s stale=%v, want %.12s stale=%v", doc.Fingerprint, doc.Stale, saved, tc.wantStale)
			}
		})
	}
}
