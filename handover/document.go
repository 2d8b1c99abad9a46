package handover

import (
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/node"
)

// HandedDocument is the routing document an old edge hands over: the one
// persisted in db (nil: none), fresh only if the source confirmed it and it
// is the one served (st is the source's status). Saving a change can fail
// (the edge logs it and serves the new table anyway); the persisted
// document is then older than the one the source confirmed, and must not
// travel as fresh.
func HandedDocument(db *bolt.DB, st node.PollStatus) (*node.Update, error) {
	doc, err := node.LoadDocument(db)
	if err != nil || doc == nil {
		return nil, err
	}
	doc.Stale = st.Stale || st.Fingerprint != doc.Fingerprint
	return doc, nil
}
