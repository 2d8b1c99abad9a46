// Package qvalue reads the weights of the Accept and Accept-Encoding
// header fields (RFC 9110 §12.4.2), for the edge's content negotiation.
package qvalue

import "strings"

// FromParams returns the weight among the parameters of one list item (what
// follows its first ';'), in thousandths: 1000 when it gives none, 0 when
// it gives one that is not a qvalue (a weight that cannot be read accepts
// nothing).
func FromParams(params string) int {
	for params != "" {
		var p string
		p, params, _ = strings.Cut(params, ";")
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "q") {
			continue
		}
		return Parse(strings.TrimSpace(v))
	}
	return 1000
}

// Parse reads a qvalue, "0" to "1" with at most three decimals, in
// thousandths; anything else is 0.
func Parse(s string) int {
	if s == "" || len(s) > 5 || (s[0] != '0' && s[0] != '1') {
		return 0
	}
	q := int(s[0]-'0') * 1000
	if len(s) > 1 {
		if s[1] != '.' {
			return 0
		}
		scale := 100
		for _, c := range s[2:] {
			if c < '0' || c > '9' {
				return 0
			}
			q += int(c-'0') * scale
			scale /= 10
		}
	}
	if q > 1000 {
		return 0
	}
	return q
}
