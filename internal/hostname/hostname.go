// Package hostname normalises the host a client names, in a Host header or
// in a TLS ClientHello, into the one spelling the edge looks routes up by
// and certs decides certificates by (docs/design.md rule 3).
//
// It lives apart from edge, which owns routing, so that certs can apply the
// same rule without knowing about routing; it depends on nothing.
package hostname

import "strings"

// MaxLen is the longest host Normalise accepts: the longest DNS name
// (RFC 1035 §2.3.4) plus room for a port and brackets. A caller on the
// request path appends into a [MaxLen]byte on its stack.
const MaxLen = 253 + 1 + 6 + 2

// Normalise returns host lower-case, without :port and without one trailing
// dot, or "" and false when host is empty or malformed: a character a DNS
// name does not hold (a "*" included: a wildcard key names routes, never a
// client's host), an empty or over-long label, a port that is not 1–5
// digits. A bracketed IPv6 literal is well formed and keeps its brackets.
// When host is already normal it is returned as it is, without allocating.
func Normalise(host string) (string, bool) {
	var buf [MaxLen]byte
	key, ok := Append(buf[:0], host)
	if !ok {
		return "", false
	}
	if string(key) == host {
		return host, true
	}
	return string(key), true
}

// Append is Normalise appending to dst, so that a caller with a buffer
// allocates nothing. On false, what it appended is unspecified.
func Append(dst []byte, host string) ([]byte, bool) {
	if len(host) == 0 || len(host) > MaxLen {
		return dst, false
	}
	if host[0] == '[' {
		end := strings.IndexByte(host, ']')
		if end < 0 || !validPort(host[end+1:]) {
			return dst, false
		}
		dst = append(dst, '[')
		for i := 1; i < end; i++ {
			c := host[i]
			if !(c == ':' || c == '.' || isHex(c)) {
				return dst, false
			}
			if 'A' <= c && c <= 'F' {
				c += 'a' - 'A'
			}
			dst = append(dst, c)
		}
		return append(dst, ']'), true
	}
	if i := strings.IndexByte(host, ':'); i >= 0 {
		if !validPort(host[i:]) {
			return dst, false
		}
		host = host[:i]
	}
	if n := len(host); n > 0 && host[n-1] == '.' {
		host = host[:n-1]
	}
	if len(host) == 0 || len(host) > 253 {
		return dst, false
	}
	labelLen := 0
	for i := 0; i < len(host); i++ {
		c := host[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		case c == '.':
			if labelLen == 0 {
				return dst, false
			}
			labelLen = 0
			dst = append(dst, c)
			continue
		default:
			return dst, false
		}
		labelLen++
		if labelLen > 63 {
			return dst, false
		}
		dst = append(dst, c)
	}
	return dst, labelLen > 0
}

// validPort reports whether s is empty or ":" followed by 1–5 digits.
func validPort(s string) bool {
	if s == "" {
		return true
	}
	if s[0] != ':' || len(s) < 2 || len(s) > 6 {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
