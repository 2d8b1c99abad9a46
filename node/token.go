package node

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode"
)

// LoadToken returns the ingress token from a flag value or a token file.
// The flag value wins; a file's content is trimmed of surrounding
// whitespace. Both empty is allowed and returns "" (a node without a token,
// on a development box). Warnings are for the operator's eyes at start-up:
// a token file readable by group or others, since the token guards the
// fleet's private keys on the node's storage surface, and a file that was
// named but ignored because a flag value was given.
func LoadToken(token, tokenFile string) (tok string, warnings []string, err error) {
	if token != "" {
		if tokenFile != "" {
			warnings = append(warnings, fmt.Sprintf("both an ingress token and an ingress token file (%s) were given; using the token, ignoring the file", tokenFile))
		}
		tok = strings.TrimSpace(token)
		if err := checkToken(tok); err != nil {
			return "", warnings, fmt.Errorf("ingress token: %w", err)
		}
		return tok, warnings, nil
	}
	if tokenFile == "" {
		return "", nil, nil
	}
	fi, err := os.Stat(tokenFile)
	if err != nil {
		return "", nil, fmt.Errorf("read ingress token file: %w", err)
	}
	if fi.IsDir() {
		return "", nil, fmt.Errorf("read ingress token file %s: is a directory", tokenFile)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		warnings = append(warnings, fmt.Sprintf(
			"INGRESS TOKEN FILE %s IS READABLE BY GROUP OR OTHERS (mode %04o): the ingress token guards the fleet's certificates and private keys; run chmod 600 %s",
			tokenFile, perm, tokenFile))
	}
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return "", warnings, fmt.Errorf("read ingress token file: %w", err)
	}
	tok = strings.TrimSpace(string(b))
	if tok == "" {
		return "", warnings, fmt.Errorf("read ingress token file %s: file is empty", tokenFile)
	}
	if err := checkToken(tok); err != nil {
		return "", warnings, fmt.Errorf("ingress token file %s: %w", tokenFile, err)
	}
	return tok, warnings, nil
}

// checkToken refuses a token that cannot travel in an Authorization header
// (a file with two lines, say), which would otherwise fail every poll with
// a transport error far from its cause.
func checkToken(tok string) error {
	if strings.ContainsFunc(tok, func(r rune) bool { return r > unicode.MaxASCII || !unicode.IsPrint(r) || r == ' ' }) {
		return errors.New("contains spaces, line breaks or non-ASCII characters")
	}
	return nil
}
