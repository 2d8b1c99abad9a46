package handover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
)

// Sockets are an edge's listening sockets by role. A nil field is a role
// the edge does not serve (no HTTPS with --tls off, no HTTP/3 without it).
//
// The old edge's fields must be the bound sockets themselves (a
// *net.TCPListener, a *net.UDPConn), not wrappers: the descriptor is what
// is handed over. The new edge's are built from the descriptors it received
// and are its own to close.
type Sockets struct {
	HTTP, HTTPS, Admin net.Listener
	HTTP3              net.PacketConn
}

// Serves is what a successor says it will serve, as its flags name the
// addresses (":443", "127.0.0.1:0"; empty for a listener it will not open).
// The old edge hands its sockets only to a successor that will serve every
// one of them where it does: a handover is an upgrade of the same edge, and
// a second edge started on the same state directory with other addresses (a
// debug instance, a typo in a port) must not take them and leave their
// clients refused. The admin address counts too: a successor that closed
// the admin socket would leave health checks and scrapes refused.
type Serves struct {
	HTTP  string `json:"http"`
	HTTPS string `json:"https,omitempty"`
	HTTP3 string `json:"http3,omitempty"`
	Admin string `json:"admin"`
}

// mismatch names the first socket of s that serves would not serve where s
// does, "" when there is none.
func (s Sockets) mismatch(serves Serves) string {
	for _, c := range []struct {
		role string
		have net.Addr
		want string
	}{
		{roleHTTP, addrOf(s.HTTP), serves.HTTP},
		{roleHTTPS, addrOf(s.HTTPS), serves.HTTPS},
		{roleHTTP3, packetAddrOf(s.HTTP3), serves.HTTP3},
		{roleAdmin, addrOf(s.Admin), serves.Admin},
	} {
		if c.have == nil {
			continue
		}
		if c.want == "" {
			return fmt.Sprintf("this edge serves %s on %s; the successor would not serve it", c.role, c.have)
		}
		if !SameAddr(c.want, c.have) {
			return fmt.Sprintf("this edge serves %s on %s; the successor asks for %s", c.role, c.have, c.want)
		}
	}
	return ""
}

func addrOf(l net.Listener) net.Addr {
	if l == nil {
		return nil
	}
	return l.Addr()
}

func packetAddrOf(c net.PacketConn) net.Addr {
	if c == nil {
		return nil
	}
	return c.LocalAddr()
}

// Roles, as named on the wire.
const (
	roleHTTP  = "http"
	roleHTTPS = "https"
	roleAdmin = "admin"
	roleHTTP3 = "http3"
)

// filer is what a socket must be to be handed over: *net.TCPListener and
// *net.UDPConn are.
type filer interface {
	File() (*os.File, error)
}

// files duplicates the descriptor of every socket in s, by role; the caller
// closes the files once they are sent. The sockets themselves are not
// touched: the old edge keeps serving on them.
func (s Sockets) files() (roles []string, files []*os.File, err error) {
	for _, r := range []struct {
		role string
		sock any
		set  bool
	}{
		{roleHTTP, s.HTTP, s.HTTP != nil},
		{roleHTTPS, s.HTTPS, s.HTTPS != nil},
		{roleAdmin, s.Admin, s.Admin != nil},
		{roleHTTP3, s.HTTP3, s.HTTP3 != nil},
	} {
		if !r.set {
			continue
		}
		f, ok := r.sock.(filer)
		if !ok {
			closeFiles(files)
			return nil, nil, fmt.Errorf("%s socket: a %T has no descriptor to hand over", r.role, r.sock)
		}
		file, err := f.File()
		if err != nil {
			closeFiles(files)
			return nil, nil, fmt.Errorf("%s socket: %w", r.role, err)
		}
		roles = append(roles, r.role)
		files = append(files, file)
	}
	return roles, files, nil
}

// socketsFrom builds listeners from received descriptors, one per role,
// and closes the descriptors (the listeners hold duplicates). On error
// everything is closed.
func socketsFrom(roles []string, fds []int) (s Sockets, err error) {
	defer closeFDs(fds)
	if len(roles) != len(fds) {
		return Sockets{}, fmt.Errorf("%d roles for %d descriptors", len(roles), len(fds))
	}
	for i, role := range roles {
		// os.NewFile owns the descriptor from here: closing f closes it.
		f := os.NewFile(uintptr(fds[i]), role)
		fds[i] = -1
		err := s.set(role, f)
		f.Close()
		if err != nil {
			s.Close()
			return Sockets{}, fmt.Errorf("%s socket: %w", role, err)
		}
	}
	return s, nil
}

// set fills role's field with a socket made from a duplicate of f.
func (s *Sockets) set(role string, f *os.File) error {
	var dst *net.Listener
	switch role {
	case roleHTTP:
		dst = &s.HTTP
	case roleHTTPS:
		dst = &s.HTTPS
	case roleAdmin:
		dst = &s.Admin
	case roleHTTP3:
		if s.HTTP3 != nil {
			return errors.New("sent twice")
		}
		pc, err := net.FilePacketConn(f)
		if err != nil {
			return err
		}
		if _, ok := pc.(*net.UDPConn); !ok {
			pc.Close()
			return fmt.Errorf("a %T, want UDP", pc)
		}
		s.HTTP3 = pc
		return nil
	default:
		return errors.New("unknown role")
	}
	if *dst != nil {
		return errors.New("sent twice")
	}
	l, err := net.FileListener(f)
	if err != nil {
		return err
	}
	if _, ok := l.(*net.TCPListener); !ok {
		l.Close()
		return fmt.Errorf("a %T, want TCP", l)
	}
	*dst = l
	return nil
}

// Close closes every socket in s.
func (s Sockets) Close() error {
	var errs []error
	for _, l := range []net.Listener{s.HTTP, s.HTTPS, s.Admin} {
		if l != nil {
			errs = append(errs, l.Close())
		}
	}
	if s.HTTP3 != nil {
		errs = append(errs, s.HTTP3.Close())
	}
	return errors.Join(errs...)
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// fdsOf returns the descriptor numbers of files without File.Fd, which
// would put the socket into blocking mode, and with it the old edge's own
// listener, since both share one open file description.
func fdsOf(files []*os.File) ([]int, error) {
	fds := make([]int, len(files))
	for i, f := range files {
		rc, err := f.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("%s socket: %w", f.Name(), err)
		}
		if err := rc.Control(func(fd uintptr) { fds[i] = int(fd) }); err != nil {
			return nil, fmt.Errorf("%s socket: %w", f.Name(), err)
		}
	}
	return fds, nil
}

// SameAddr reports whether a socket bound at have is what a flag value
// want (":443", "0.0.0.0:80", "127.0.0.1:9180") asks for, so that a new
// edge configured differently from the old one binds its own listener
// instead of serving on the old address. Port 0 in want matches any port;
// an empty or unspecified host matches any unspecified address (":80"
// binds [::]:80, "0.0.0.0:80" binds 0.0.0.0:80: both mean every address).
// A host name is resolved.
func SameAddr(want string, have net.Addr) bool {
	if have == nil {
		return false
	}
	got, err := netip.ParseAddrPort(have.String())
	if err != nil {
		return false
	}
	host, port, err := net.SplitHostPort(want)
	if err != nil {
		return false
	}
	p, err := net.LookupPort(have.Network(), port)
	if err != nil || (p != 0 && uint16(p) != got.Port()) {
		return false
	}
	if host == "" {
		return got.Addr().IsUnspecified()
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else if resolved, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", host); err == nil {
		ips = resolved
	}
	for _, ip := range ips {
		if ip.Unmap() == got.Addr().Unmap() || (ip.IsUnspecified() && got.Addr().IsUnspecified()) {
			return true
		}
	}
	return false
}

var (
	_ filer = (*net.TCPListener)(nil)
	_ filer = (*net.UDPConn)(nil)
)

// CloseUnused closes the sockets of s (inherited) that used (the ones
// served) does not hold, a role the successor does not have or an address
// its flags moved, so that none keeps a port listening that nobody accepts
// on. It returns the roles closed.
func (s Sockets) CloseUnused(used Sockets) []string {
	var closed []string
	for _, pair := range []struct {
		role     string
		got, use any
	}{
		{roleHTTP, s.HTTP, used.HTTP},
		{roleHTTPS, s.HTTPS, used.HTTPS},
		{roleAdmin, s.Admin, used.Admin},
		{roleHTTP3, s.HTTP3, used.HTTP3},
	} {
		if c, ok := pair.got.(interface{ Close() error }); ok && pair.got != pair.use {
			c.Close()
			closed = append(closed, pair.role)
		}
	}
	return closed
}
