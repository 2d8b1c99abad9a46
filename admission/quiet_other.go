//go:build !linux

package admission

import "net"

// newPacedSocket returns nil: the edge ships on Linux, and is measured
// there only.
func newPacedSocket(conn net.Conn) *pacedSocket { return nil }

func (s *pacedSocket) setRcvLowat(bytes int) {}

func (s *pacedSocket) peerGone() bool { return false }
