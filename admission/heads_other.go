//go:build !linux

package admission

import "errors"

// headPoller needs epoll: elsewhere first heads are read by the server.
type headPoller struct{}

func newHeadPoller() (*headPoller, error) {
	return nil, errors.New("awaiting first heads needs Linux's epoll")
}

func (p *headPoller) add(*trackedConn, uint64) error { return errors.ErrUnsupported }
func (p *headPoller) remove(*trackedConn)            {}
func (p *headPoller) close()                         {}

func peekHead(*trackedConn, []byte) (int, bool) { return 0, true }
func drainUnread(*trackedConn)                  {}

func (h *headWait) poll() {}
