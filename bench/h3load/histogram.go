package main

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

const (
	subBits     = 6
	subBuckets  = 1 << subBits
	maxExp      = 32 // 2^(32+6) µs, days: far beyond any request timeout
	histBuckets = subBuckets * (maxExp + 2)
)

// histogram is a log-linear latency histogram in microseconds: values below
// subBuckets are exact, above them every power of two is split in
// subBuckets equal buckets, so a bucket is at most 1/subBuckets of its value
// wide. Its size is fixed whatever the number of samples. Safe for
// concurrent use.
type histogram struct {
	counts [histBuckets]atomic.Uint64
	max    atomic.Int64 // nanoseconds, exact
}

func bucketOf(us uint64) int {
	if us < subBuckets {
		return int(us)
	}
	e := bits.Len64(us) - subBits - 1 // us>>e is in [subBuckets, 2*subBuckets)
	if e > maxExp {
		return histBuckets - 1
	}
	return subBuckets + e*subBuckets + int(us>>e) - subBuckets
}

// bucketMid is the middle of bucket i's range, in microseconds.
func bucketMid(i int) float64 {
	if i < subBuckets {
		return float64(i) + 0.5
	}
	e := (i - subBuckets) / subBuckets
	lo := uint64(subBuckets+(i-subBuckets)%subBuckets) << e
	return float64(lo) + float64(uint64(1)<<e)/2
}

func (h *histogram) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d/time.Microsecond))].Add(1)
	for {
		m := h.max.Load()
		if int64(d) <= m || h.max.CompareAndSwap(m, int64(d)) {
			return
		}
	}
}

func (h *histogram) merge(o *histogram) {
	for i := range o.counts {
		if n := o.counts[i].Load(); n > 0 {
			h.counts[i].Add(n)
		}
	}
	if m := o.max.Load(); m > h.max.Load() {
		h.max.Store(m)
	}
}

// quantile returns the q-quantile in milliseconds, never above the exact
// maximum, or 0 without samples.
func (h *histogram) quantile(q float64) float64 {
	var total uint64
	for i := range h.counts {
		total += h.counts[i].Load()
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return math.Min(bucketMid(i)/1e3, float64(h.max.Load())/1e6)
		}
	}
	return float64(h.max.Load()) / 1e6
}
