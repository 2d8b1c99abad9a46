package h1

// The bytes HTTP/1.1 allows in tokens, values and targets (RFC 9110 §5.6.2,
// RFC 9112 §3.2), and header-list helpers.

import (
	"strings"
)

// appendCanonical appends key in canonical form ("content-type" →
// "Content-Type"), as net/textproto does for a valid token.
func appendCanonical(dst, key []byte) []byte {
	upper := true
	for _, c := range key {
		switch {
		case upper && 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case !upper && 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		dst = append(dst, c)
		upper = c == '-'
	}
	return dst
}

// tokenChars marks the bytes of an RFC 7230 token.
var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// ValidToken reports whether s is a token: a field name or a method.
func ValidToken(s string) bool { return validToken(s) }

func validTokenBytes(b []byte) bool { return validToken(b) }

func validToken[S string | []byte](s S) bool {
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenChars[s[i]] {
			return false
		}
	}
	return true
}

// ValidMethod reports whether m can be a request's method.
func ValidMethod(m string) bool { return ValidToken(m) }

// ValidValue reports whether a header value has no control byte other than
// tab: a CR or LF would end the line and smuggle a header in.
func ValidValue(s string) bool { return validValue(s) }

func validValueBytes(b []byte) bool { return validValue(b) }

func validValue[S string | []byte](s S) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// ValidTarget reports whether a request target can go on the request line:
// no space or control byte.
func ValidTarget(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// HasToken reports whether the comma-separated header values contain tok,
// compared case-insensitively: a Connection header naming a field, a
// TE header saying "trailers".
func HasToken(values []string, tok string) bool {
	for _, v := range values {
		for v != "" {
			var t string
			t, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(t), tok) {
				return true
			}
		}
	}
	return false
}
