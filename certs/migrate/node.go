package migrate

import (
	"context"

	"github.com/scafo/scafo-edge/node"
)

// NodeStore is the fleet certificate store reached straight through the
// node's storage API: what the edges of the fleet read first. Writing
// there needs no edge stopped.
type NodeStore struct{ Client *node.StorageClient }

var _ Store = NodeStore{}

// Load returns the object at key; a missing key matches fs.ErrNotExist.
func (s NodeStore) Load(ctx context.Context, key string) ([]byte, error) {
	return s.Client.Get(ctx, key)
}

// Store puts value at key.
func (s NodeStore) Store(ctx context.Context, key string, value []byte) error {
	return s.Client.Put(ctx, key, value)
}
