//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package h1

import "net"

// peeker cannot peek here without blocking; a connection the upstream
// closed is then found on use, and an idempotent request is resent.
// Bytes an upstream sent after a response are not seen before reuse on
// these systems.
type peeker struct{}

func (pk *peeker) init(net.Conn) {}

func (pk *peeker) alive() bool { return true }
