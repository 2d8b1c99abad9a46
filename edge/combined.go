package edge

// The access log's "combined" format, as Apache's LogFormat
// "%h %l %u %t \"%r\" %>s %b \"%{Referer}i\" \"%{User-agent}i\"" and
// nginx's log_format combined write it, so that the log analysers built for
// them (GoAccess, AWStats, fail2ban's filters) read the edge's lines.

import (
	"strconv"
	"sync"
)

// combinedTime is the format of %t, without its brackets.
const combinedTime = "02/Jan/2006:15:04:05 -0700"

var combinedBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// writeCombined writes rec's line to a.out in one Write, so that lines of
// concurrent requests never interleave.
func (a *AccessLog) writeCombined(rec *Record, f *requestFields) {
	bp := combinedBufs.Get().(*[]byte)
	b := appendCombined((*bp)[:0], rec, f)
	a.out.Write(b)
	if cap(b) <= 64<<10 {
		*bp = b
		combinedBufs.Put(bp)
	}
}

// appendCombined appends rec's combined line, newline included, to b.
// Quoted fields escape '"', '\' and bytes outside printable ASCII as \xHH,
// as nginx does, so that a client cannot end a field or a line early.
func appendCombined(b []byte, rec *Record, f *requestFields) []byte {
	if len(f.client) > 0 {
		b = append(b, f.client...)
	} else {
		b = append(b, '-')
	}
	b = append(b, " - - ["...)
	b = rec.Start.AppendFormat(b, combinedTime)
	b = append(b, "] \""...)
	b = appendEscaped(b, rec.Method)
	b = append(b, ' ')
	if r := rec.Request; r != nil && r.RequestURI != "" {
		b = appendEscaped(b, r.RequestURI)
	} else {
		b = appendEscaped(b, rec.Path)
		if f.query != "" {
			b = append(b, '?')
			b = appendEscaped(b, f.query)
		}
	}
	b = append(b, ' ')
	b = appendEscaped(b, rec.Proto)
	b = append(b, "\" "...)
	b = strconv.AppendInt(b, int64(rec.Status), 10)
	b = append(b, ' ')
	if rec.BytesOut > 0 {
		b = strconv.AppendInt(b, rec.BytesOut, 10)
	} else {
		b = append(b, '-') // %b: no body
	}
	b = append(b, " \""...)
	b = appendOrDash(b, f.referer)
	b = append(b, "\" \""...)
	b = appendOrDash(b, f.userAgent)
	return append(b, "\"\n"...)
}

func appendOrDash(b []byte, s string) []byte {
	if s == "" {
		return append(b, '-')
	}
	return appendEscaped(b, s)
}

func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			b = append(b, '\\', 'x', hex[c>>4], hex[c&0xf])
			continue
		}
		b = append(b, c)
	}
	return b
}
