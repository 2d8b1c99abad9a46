package tickets

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// maxKeys bounds the keys of one document: the schedule keeps about four;
// a document with far more is not one this package wrote.
const maxKeys = 16

// key is one session ticket key and when it starts encrypting tickets.
type key struct {
	Secret []byte    `json:"key"` // 32 bytes
	From   time.Time `json:"from"`
}

// schedule is the keys of one edge or one fleet, newest From first: the
// newest that has started encrypts, all are accepted.
type schedule struct {
	Keys []key `json:"keys"`
}

// timing is the schedule's durations (see the package doc).
type timing struct {
	rotate, retain, lead time.Duration
}

// active returns the index of the key that encrypts at now: the newest
// that has started, or, when none has (clocks apart), the oldest.
func (s schedule) active(now time.Time) int {
	for i, k := range s.Keys {
		if !k.From.After(now) {
			return i
		}
	}
	return len(s.Keys) - 1
}

// due reports whether s needs a key added at now: it has none, or its
// newest is Lead short of having encrypted for Rotate.
func (s schedule) due(now time.Time, t timing) bool {
	return len(s.Keys) == 0 || !now.Before(s.Keys[0].From.Add(t.rotate-t.lead))
}

// rotated returns s at now: keys past Retain dropped, and a new key added
// if one is due, encrypting at once when s had none that encrypts, Lead
// from now otherwise. changed reports whether anything was.
func (s schedule) rotated(now time.Time, t timing) (next schedule, changed bool) {
	next.Keys = slices.DeleteFunc(slices.Clone(s.Keys), func(k key) bool { return expired(k, now, t) })
	changed = len(next.Keys) != len(s.Keys)
	if !next.due(now, t) {
		return next, changed
	}
	from := now.Add(t.lead)
	if len(next.Keys) == 0 || next.Keys[len(next.Keys)-1].From.After(now) {
		from = now
	}
	next.Keys = slices.Insert(next.Keys, 0, key{Secret: newSecret(), From: from})
	if len(next.Keys) > maxKeys {
		next.Keys = next.Keys[:maxKeys]
	}
	return next, true
}

func expired(k key, now time.Time, t timing) bool {
	return !now.Before(k.From.Add(t.retain))
}

// next returns when s next changes by itself at now: a key starts
// encrypting, expires, or a rotation falls due. Zero: never (no keys).
func (s schedule) next(now time.Time, t timing) time.Time {
	var at time.Time
	earlier := func(c time.Time) {
		if c.After(now) && (at.IsZero() || c.Before(at)) {
			at = c
		}
	}
	for _, k := range s.Keys {
		earlier(k.From)
		earlier(k.From.Add(t.retain))
	}
	if len(s.Keys) > 0 {
		earlier(s.Keys[0].From.Add(t.rotate - t.lead))
	}
	return at
}

func (s schedule) has(secret []byte) bool {
	return slices.ContainsFunc(s.Keys, func(k key) bool { return string(k.Secret) == string(secret) })
}

func newSecret() []byte {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand, Go 1.24)
	return b
}

// parseSchedule reads a schedule as marshalSchedule wrote it, newest
// first; a key of another size or more than maxKeys is an error.
func parseSchedule(b []byte) (schedule, error) {
	var s schedule
	if err := json.Unmarshal(b, &s); err != nil {
		return schedule{}, fmt.Errorf("decode session ticket keys: %w", err)
	}
	if len(s.Keys) > maxKeys {
		return schedule{}, fmt.Errorf("decode session ticket keys: %d keys, at most %d", len(s.Keys), maxKeys)
	}
	for _, k := range s.Keys {
		if len(k.Secret) != 32 {
			return schedule{}, fmt.Errorf("decode session ticket keys: a key of %d bytes, want 32", len(k.Secret))
		}
		if k.From.IsZero() {
			return schedule{}, errors.New("decode session ticket keys: a key without its start")
		}
	}
	slices.SortStableFunc(s.Keys, func(a, b key) int { return b.From.Compare(a.From) })
	return s, nil
}

func (s schedule) marshal() []byte {
	b, _ := json.Marshal(s) // a struct of byte slices and times: cannot fail
	return b
}
