package admission

import rtmetrics "runtime/metrics"

// goMemoryInUse is the memory the Go runtime holds from the system, less
// what it has returned: close to the process's resident memory for a
// program that is nearly all Go.
func goMemoryInUse() int64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() != rtmetrics.KindUint64 || s[1].Value.Kind() != rtmetrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}
