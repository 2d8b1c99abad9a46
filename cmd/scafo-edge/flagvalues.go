package main

// Flag values checked as they are parsed, so that a bad one stops the
// process before anything opens (or is taken over from a running edge).

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/scafo/scafo-edge/edge"
)

// bytesVar declares a flag of a number of bytes, with an optional unit as
// --memory-limit takes (parseBytes); 0 is its default.
func (fs *flagSet) bytesVar(p *int64, name, env, usage string) {
	fs.Var((*bytesValue)(p), name, usage)
	fs.add(name, env, usage, "0")
}

type bytesValue int64

func (v *bytesValue) String() string { return strconv.FormatInt(int64(*v), 10) }

func (v *bytesValue) Set(s string) error {
	n, err := parseBytes(strings.TrimSpace(s))
	if err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("%q: want a number of bytes, 0 for no limit", s)
	}
	*v = bytesValue(n)
	return nil
}

// oneOfVar declares a flag that takes one of a few words.
func (fs *flagSet) oneOfVar(p *string, name, env, def string, words []string, usage string) {
	*p = def
	fs.Var(&oneOfValue{p: p, words: words}, name, usage)
	fs.add(name, env, usage, def)
}

type oneOfValue struct {
	p     *string
	words []string
}

func (v *oneOfValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v *oneOfValue) Set(s string) error {
	for _, w := range v.words {
		if s == w {
			*v.p = s
			return nil
		}
	}
	return fmt.Errorf("%q: want %s", s, strings.Join(v.words, " or "))
}

// dirVar declares a flag naming a directory that must exist ("" for none).
func (fs *flagSet) dirVar(p *string, name, env, usage string) {
	fs.Var((*dirValue)(p), name, usage)
	fs.add(name, env, usage, "")
}

type dirValue string

func (v *dirValue) String() string { return string(*v) }

func (v *dirValue) Set(s string) error {
	if s == "" {
		return errors.New("empty: name a directory")
	}
	if err := edge.CheckErrorPagesDir(s); err != nil {
		return err
	}
	*v = dirValue(s)
	return nil
}

var (
	_ flag.Value = (*bytesValue)(nil)
	_ flag.Value = (*oneOfValue)(nil)
	_ flag.Value = (*dirValue)(nil)
)
