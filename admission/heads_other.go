//go:build !linux

package admission

import (
	"errors"
	"net"
)

// Awaiting first heads needs epoll: elsewhere the server reads them. The
// edge ships on Linux, and is measured there only.
type headPoller struct{}

func newHeadPoller() (*headPoller, error) {
	return nil, errors.New("awaiting first heads needs Linux's epoll")
}

func (p *headPoller) add(*trackedConn, uint64) error { return errors.ErrUnsupported }
func (p *headPoller) remove(*trackedConn)            {}
func (p *headPoller) close()                         {}
func (h *headWait) poll()                            {}

type headSocket struct{}

func newHeadSocket(net.Conn) *headSocket        { return nil }
func (s *headSocket) setRcvLowat(int)           {}
func peekHead(*trackedConn, []byte) (int, bool) { return 0, true }
func drainUnread(*trackedConn)                  {}
