package admission

import rtmetrics "runtime/metrics"

// goMemoryInUse is the memory the edge's work holds: the heap the last
// collection found live, and goroutine stacks. Garbage waiting for the next
// collection is left out: with a memory limit set, the collector lets it grow
// to near the limit by design, which is no reason to refuse requests.
func goMemoryInUse() int64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	rtmetrics.Read(s)
	var n int64
	for _, v := range s {
		if v.Value.Kind() == rtmetrics.KindUint64 {
			n += int64(v.Value.Uint64())
		}
	}
	return n
}
