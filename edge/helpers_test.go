package edge

import (
	"net/url"
	"path"
)

func decodeForTest(raw string) (string, bool) {
	s, err := url.PathUnescape(raw)
	return s, err == nil
}

func cleanForTest(p string) string { return path.Clean("/" + p) }
