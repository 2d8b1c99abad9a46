// Package forwarded reads which client a chain of trusted proxies vouches
// for in X-Forwarded-For. Admission counts a request by that client and the
// admin listener judges it by the same one, so both read the header alike.
package forwarded

import (
	"errors"
	"net/netip"
	"strings"
)

// ErrBadAddress is returned for an X-Forwarded-For entry that is not an
// address: nothing a proxy names after it can be trusted either.
var ErrBadAddress = errors.New("X-Forwarded-For names something that is not an address")

// Client returns the rightmost address named in the X-Forwarded-For values
// xff that trusted does not contain, unmapped and without a zone: the client
// the trusted proxies vouch for, as any address left of it could be forged.
// When every address named is trusted, it returns the leftmost with
// vouched false; when none is named, the zero Addr.
func Client(xff []string, trusted []netip.Prefix) (client netip.Addr, vouched bool, err error) {
	for i := len(xff) - 1; i >= 0; i-- {
		v := xff[i]
		for v != "" {
			j := strings.LastIndexByte(v, ',')
			part := strings.TrimSpace(v[j+1:])
			v = v[:max(j, 0)]
			a, err := netip.ParseAddr(part)
			if err != nil {
				return netip.Addr{}, false, ErrBadAddress
			}
			client = a.Unmap().WithZone("")
			if !Contains(trusted, client) {
				return client, true, nil
			}
		}
	}
	return client, false, nil
}

// Contains reports whether a is in one of nets.
func Contains(nets []netip.Prefix, a netip.Addr) bool {
	for _, p := range nets {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Origin returns the client a request comes from, as the edge's forwarded
// headers name it to its upstreams: the peer (remoteAddr, "ip:port", after
// the PROXY protocol), or, when the peer is trusted, the client the proxies
// vouch for in X-Forwarded-For. When they vouch for nobody, or name
// something that is not an address, it is the peer, the one address known
// for sure. The zero Addr when remoteAddr is no address.
func Origin(remoteAddr string, xff []string, trusted []netip.Prefix) netip.Addr {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	peer := ap.Addr().Unmap().WithZone("")
	if !Contains(trusted, peer) {
		return peer
	}
	client, vouched, err := Client(xff, trusted)
	if err != nil || !vouched {
		return peer
	}
	return client
}
