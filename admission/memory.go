package admission

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	rtmetrics "runtime/metrics"
)

// goMemoryInUse is the heap the last collection found live, and goroutine
// stacks (docs/design.md, admission table).
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

// Where a memory limit came from: Limits.MemoryFrom.
const (
	MemoryFromFlag       = "flag"
	MemoryFromGOMEMLIMIT = "GOMEMLIMIT"
	MemoryFromCgroupV1   = "cgroup v1"
	MemoryFromCgroupV2   = "cgroup v2"
	MemoryFromMemTotal   = "share of MemTotal"
)

// memTotalShare: the edge claims a quarter of the box's memory when nothing
// tells it its limit.
const memTotalShare = 4

// cgroupLimit is the tightest memory limit over the process's own cgroup
// and its ancestors, and the file that set it.
type cgroupLimit struct {
	bytes   int64
	version string // MemoryFromCgroupV1 or MemoryFromCgroupV2
	file    string // absolute path
}

// cgroupMemoryLimit finds the process's memory cgroup (/proc/self/cgroup)
// and where its hierarchy is mounted (/proc/self/mountinfo), and returns
// the tightest limit of that cgroup and its ancestors up to the mount
// point, as automemlimit does. The v1 memory controller wins when the
// process is in one: on a hybrid box the unified hierarchy has no memory
// controller. err reports a limit file that could not be read or parsed,
// beside whatever limit the others gave.
func cgroupMemoryLimit(sys fs.FS) (cgroupLimit, error) {
	groups, err := fs.ReadFile(sys, "proc/self/cgroup")
	if err != nil {
		return cgroupLimit{}, nil // no cgroups here: not Linux, or /proc is not mounted
	}
	var v1, v2 string
	hasV1, hasV2 := false, false
	for _, line := range strings.Split(string(groups), "\n") {
		// hierarchy-ID:controller-list:cgroup-path (cgroups(7)); the path
		// may itself hold colons.
		id, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		controllers, p, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		switch {
		case id == "0" && controllers == "":
			v2, hasV2 = p, true
		case slices.Contains(strings.Split(controllers, ","), "memory"):
			v1, hasV1 = p, true
		}
	}
	mounts := cgroupMounts(sys)
	if hasV1 {
		if dir, top, ok := resolveCgroup(mounts, v1, func(m mount) bool {
			return m.fstype == "cgroup" && slices.Contains(strings.Split(m.options, ","), "memory")
		}, "sys/fs/cgroup/memory"); ok {
			return walkCgroup(sys, dir, top, MemoryFromCgroupV1)
		}
	}
	if hasV2 {
		if dir, top, ok := resolveCgroup(mounts, v2, func(m mount) bool { return m.fstype == "cgroup2" }, "sys/fs/cgroup"); ok {
			return walkCgroup(sys, dir, top, MemoryFromCgroupV2)
		}
	}
	return cgroupLimit{}, nil
}

// mount is a cgroup file system's line of /proc/self/mountinfo: which
// directory of the hierarchy (root) is mounted where (point, without its
// leading slash).
type mount struct{ root, point, fstype, options string }

// cgroupMounts reads the cgroup mounts off /proc/self/mountinfo
// (proc_pid_mountinfo(5)).
func cgroupMounts(sys fs.FS) []mount {
	b, err := fs.ReadFile(sys, "proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []mount
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		// 34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
		before, after, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(before), strings.Fields(after)
		if len(f) < 5 || len(g) < 3 || (g[0] != "cgroup" && g[0] != "cgroup2") {
			continue
		}
		out = append(out, mount{root: unescapeMount(f[3]), point: strings.TrimPrefix(path.Clean(unescapeMount(f[4])), "/"), fstype: g[0], options: g[2]})
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// resolveCgroup returns the directory of cgroup p under the first mount of
// its hierarchy whose root holds it, and that mount's point, where the
// walk to the ancestors stops. A container whose cgroup lies outside the
// mount's root (no cgroup namespace, an older runtime) sees its own cgroup
// at the mount point. With no mount listed, the hierarchy is taken to be
// mounted whole at fallback.
func resolveCgroup(mounts []mount, p string, match func(mount) bool, fallback string) (dir, top string, ok bool) {
	var first *mount
	for i := range mounts {
		m := &mounts[i]
		if !match(*m) {
			continue
		}
		if first == nil {
			first = m
		}
		if rel, ok := within(m.root, p); ok {
			return path.Join(m.point, rel), m.point, true
		}
	}
	if first != nil {
		return first.point, first.point, true
	}
	if len(mounts) > 0 {
		return "", "", false // mountinfo lists cgroups, but not this hierarchy
	}
	rel, _ := within("/", p)
	return path.Join(fallback, rel), fallback, true
}

// within returns p relative to root, and whether p is root or below it.
func within(root, p string) (string, bool) {
	root, p = path.Clean("/"+root), path.Clean("/"+p)
	if p == root {
		return ".", true
	}
	if root == "/" {
		return p[1:], true
	}
	if rest, ok := strings.CutPrefix(p, root+"/"); ok {
		return rest, true
	}
	return "", false
}

// walkCgroup keeps the tightest limit of dir and its ancestors up to top.
// v1's memory.stat also states the tightest over all the ancestors, those
// above the mount point included; read last, so that when a limit file
// said the same, the file is named.
func walkCgroup(sys fs.FS, dir, top, version string) (cgroupLimit, error) {
	var best cgroupLimit
	var errs []error
	take := func(file, key string) {
		n, err := readLimit(sys, file, key)
		switch {
		case err != nil:
			errs = append(errs, err)
		case n > 0 && (best.bytes == 0 || n < best.bytes):
			best = cgroupLimit{bytes: n, version: version, file: "/" + file}
		}
	}
	name := "memory.max"
	if version == MemoryFromCgroupV1 {
		name = "memory.limit_in_bytes"
	}
	for d := dir; ; d = path.Dir(d) {
		take(path.Join(d, name), "")
		if d == top || d == "." || d == "/" || !strings.HasPrefix(d, top) {
			break
		}
	}
	if version == MemoryFromCgroupV1 {
		take(path.Join(dir, "memory.stat"), "hierarchical_memory_limit")
	}
	return best, errors.Join(errs...)
}

// noLimitV1 and above is cgroup v1's "no limit": the largest int64 rounded
// down to a page. Anything at or past an exbibyte is treated so.
const noLimitV1 = 1 << 60

// readLimit reads a limit in bytes off file: the whole of it or, with key,
// the value of key's line. 0 for no limit, including a missing file or
// line (the root cgroup has none).
func readLimit(sys fs.FS, file, key string) (int64, error) {
	b, err := fs.ReadFile(sys, file)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read /%s: %w", file, err)
	}
	s := string(b)
	if key != "" {
		_, v, ok := strings.Cut("\n"+s, "\n"+key+" ")
		if !ok {
			return 0, nil
		}
		s, _, _ = strings.Cut(v, "\n")
	}
	s = strings.TrimSpace(s)
	if s == "max" || s == "-1" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read /%s: %q is not a number of bytes", file, s)
	}
	if n >= noLimitV1 {
		return 0, nil
	}
	return int64(n), nil
}

// memTotal reads the box's memory off /proc/meminfo, 0 when it cannot.
func memTotal(sys fs.FS) int64 {
	b, err := fs.ReadFile(sys, "proc/meminfo")
	if err != nil {
		return 0
	}
	_, v, ok := strings.Cut("\n"+string(b), "\nMemTotal:") // MemTotal:       24683548 kB
	if !ok {
		return 0
	}
	v, _, _ = strings.Cut(v, "\n")
	f := strings.Fields(v)
	if len(f) != 2 || f[1] != "kB" {
		return 0
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || n <= 0 || n > 1<<50 {
		return 0
	}
	return n << 10
}
