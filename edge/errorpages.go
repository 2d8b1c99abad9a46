package edge

// The operator's pages for the edge's own answers (--error-pages), and the
// JSON form of those answers for clients that prefer it.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/qvalue"
)

// PageStatuses are the statuses an error pages directory may hold a page
// for, as <status>.html.
var PageStatuses = [...]int{http.StatusNotFound, http.StatusTooManyRequests, http.StatusBadGateway,
	http.StatusServiceUnavailable, http.StatusGatewayTimeout}

// MaxErrorPageSize bounds one page: a larger file is not served (the
// edge's own text is) and is logged.
const MaxErrorPageSize = 1 << 20

// ErrorPagesOptions configures ErrorPages.
type ErrorPagesOptions struct {
	// Dir holds 404.html, 429.html, 502.html, 503.html and 504.html, any
	// of them. It must be a directory.
	Dir string
	// Every is how often the files are looked at again for a change, at
	// most: on the first page served after it has passed. Zero: 2s.
	Every time.Duration
	// Log says which pages are served, and once each, which file is
	// missing or unreadable.
	Log zerolog.Logger
	// Clock reads the time for Every. Nil: the wall clock.
	Clock clock.Clock
}

// ErrorPages serves the operator's HTML pages in place of the edge's own
// text for the answers the edge gives itself: never in place of an
// application's response. It reads the directory when made, then, at most
// every Every, on the first page asked for after that, looks at each
// file's modification time, size and identity and reads again the ones that
// changed: no inotify, nothing on the request path of a proxied request,
// and one look for a whole flood of 404s. A file missing, unreadable, not a
// regular file or over MaxErrorPageSize is not served: the edge's own text
// is, and the case is logged once, until it changes. Safe for concurrent
// use.
type ErrorPages struct {
	dir   string
	every time.Duration
	log   zerolog.Logger
	clock clock.Clock

	pages atomic.Pointer[pageSet]
	next  atomic.Int64 // UnixNano of the next look
	mu    sync.Mutex   // one look at a time
}

// pageSet is the pages as last read, indexed as PageStatuses.
type pageSet [len(PageStatuses)]pageFile

type pageFile struct {
	body []byte // nil: not served
	info os.FileInfo
	// problem says why the file is not served ("" when it is, or when it
	// is simply absent), so that a case is logged once.
	problem string
	absent  bool
}

// NewErrorPages reads o.Dir's pages, or fails when o.Dir is not a
// directory; missing pages are not an error.
func NewErrorPages(o ErrorPagesOptions) (*ErrorPages, error) {
	if err := CheckErrorPagesDir(o.Dir); err != nil {
		return nil, err
	}
	e := &ErrorPages{dir: o.Dir, every: o.Every, log: o.Log, clock: clock.OrReal(o.Clock)}
	if e.every <= 0 {
		e.every = 2 * time.Second
	}
	set := e.read(&pageSet{}, true)
	e.pages.Store(set)
	e.next.Store(e.clock.Now().Add(e.every).UnixNano())
	var served, builtin []string
	for i, s := range PageStatuses {
		if set[i].body != nil {
			served = append(served, strconv.Itoa(s))
		} else {
			builtin = append(builtin, strconv.Itoa(s))
		}
	}
	ev := e.log.Info()
	if len(served) == 0 {
		ev = e.log.Warn()
	}
	ev.Str("dir", o.Dir).Strs("pages", served).Strs("built_in", builtin).
		Msg("error pages read; the edge's own text answers where no page is")
	return e, nil
}

// CheckErrorPagesDir reports why dir cannot be an error pages directory.
func CheckErrorPagesDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("error pages: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("error pages: %s is not a directory", dir)
	}
	return nil
}

// page returns the page for status, nil when none is served.
func (e *ErrorPages) page(status int) []byte {
	i := pageIndex(status)
	if e == nil || i < 0 {
		return nil
	}
	if now := e.clock.Now().UnixNano(); now >= e.next.Load() {
		e.refresh(now)
	}
	return e.pages.Load()[i].body
}

func pageIndex(status int) int {
	for i, s := range PageStatuses {
		if s == status {
			return i
		}
	}
	return -1
}

// refresh looks at the files again, if no other request is doing so.
func (e *ErrorPages) refresh(now int64) {
	if !e.mu.TryLock() {
		return
	}
	defer e.mu.Unlock()
	if now < e.next.Load() {
		return
	}
	e.pages.Store(e.read(e.pages.Load(), false))
	e.next.Store(e.clock.Now().Add(e.every).UnixNano())
}

// read returns the pages, reading again only the files that changed since
// old. At start (first) an absent file is said in the summary line instead.
func (e *ErrorPages) read(old *pageSet, first bool) *pageSet {
	set := *old
	for i, status := range PageStatuses {
		name := filepath.Join(e.dir, strconv.Itoa(status)+".html")
		prev := old[i]
		fi, err := os.Stat(name)
		switch {
		case err == nil && prev.info != nil && os.SameFile(fi, prev.info) &&
			fi.ModTime().Equal(prev.info.ModTime()) && fi.Size() == prev.info.Size():
			continue // unchanged
		case errors.Is(err, fs.ErrNotExist):
			if !prev.absent && !first {
				e.log.Warn().Str("file", name).Msg("error page gone; the edge's own text answers in its place")
			}
			set[i] = pageFile{absent: true}
			continue
		}
		body, fi, err := readPage(name)
		if err != nil {
			problem := err.Error()
			if problem != prev.problem {
				e.log.Warn().Str("file", name).Err(err).Msg("error page not served; the edge's own text answers in its place")
			}
			// info is kept so that an unchanged bad file is not read again.
			set[i] = pageFile{problem: problem, info: fi}
			continue
		}
		if !first {
			e.log.Info().Str("file", name).Int("bytes", len(body)).Msg("error page read")
		}
		set[i] = pageFile{body: body, info: fi}
	}
	return &set
}

// readPage reads a page: a regular file of at most MaxErrorPageSize bytes.
// It is opened without blocking, so that a FIFO in its place cannot stall
// the request that looks. fi is the file's, when it could be read.
func readPage(name string) ([]byte, os.FileInfo, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fi, errors.New("not a regular file")
	}
	if fi.Size() > MaxErrorPageSize {
		return nil, fi, fmt.Errorf("%d bytes, over the %d byte limit", fi.Size(), MaxErrorPageSize)
	}
	body, err := io.ReadAll(io.LimitReader(f, MaxErrorPageSize+1))
	if err != nil {
		return nil, fi, err
	}
	if int64(len(body)) != fi.Size() {
		// procfs and the like say 0 and read more: not a page.
		return nil, fi, fmt.Errorf("read %d bytes of a file that says %d", len(body), fi.Size())
	}
	if len(body) > MaxErrorPageSize {
		return nil, fi, fmt.Errorf("over the %d byte limit", MaxErrorPageSize)
	}
	if body == nil {
		body = []byte{} // an empty page is served empty, not skipped
	}
	return body, fi, nil
}

// jsonAnswers are the JSON bodies of the edge's own answers, for clients
// whose Accept prefers application/json over text/html:
// {"status":502,"reason":"no_upstream","message":"..."}.
var jsonAnswers = func() map[Reason][]byte {
	m := make(map[Reason][]byte, len(selfAnswers))
	for reason, a := range selfAnswers {
		b, err := json.Marshal(struct {
			Status  int    `json:"status"`
			Reason  Reason `json:"reason"`
			Message string `json:"message"`
		}{a.status, reason, strings.TrimSuffix(strings.TrimPrefix(a.body, "scafo-edge: "), "\n")})
		if err != nil {
			panic(err)
		}
		m[reason] = append(b, '\n')
	}
	return m
}()

// prefersJSON reports whether the Accept values rank application/json above
// text/html: each type's weight is that of the most specific media range
// that matches it (RFC 9110 §12.5.1), a range's q defaulting to 1 and a
// malformed q counting as 0. Without an Accept both weigh the same, and
// HTML (or the edge's text) is sent.
func prefersJSON(accept []string) bool {
	var jsonQ, htmlQ int // thousandths
	var jsonSpec, htmlSpec int
	for _, v := range accept {
		for v != "" {
			var elem string
			elem, v, _ = strings.Cut(v, ",")
			mr, params, _ := strings.Cut(elem, ";")
			typ, sub, ok := strings.Cut(strings.TrimSpace(mr), "/")
			if !ok {
				continue
			}
			q := qvalue.FromParams(params)
			if s := rangeSpec(typ, sub, "application", "json"); s > jsonSpec {
				jsonSpec, jsonQ = s, q
			}
			if s := rangeSpec(typ, sub, "text", "html"); s > htmlSpec {
				htmlSpec, htmlQ = s, q
			}
		}
	}
	return jsonQ > htmlQ
}

// rangeSpec returns how specifically the media range typ/sub matches
// wantTyp/wantSub: 3 exactly, 2 by type, 1 as */*, 0 not at all.
func rangeSpec(typ, sub, wantTyp, wantSub string) int {
	switch {
	case typ == "*" && sub == "*":
		return 1
	case !strings.EqualFold(typ, wantTyp):
		return 0
	case sub == "*":
		return 2
	case strings.EqualFold(sub, wantSub):
		return 3
	}
	return 0
}
