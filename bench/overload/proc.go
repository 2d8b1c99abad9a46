package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// procFS reads processes from a /proc tree: "/proc" on a live system, a
// directory under testdata in tests.
type procFS struct {
	Dir string
}

// ppid is the parent of pid (field 4 of /proc/PID/stat, after the command
// name, which is in parentheses and may hold spaces and parentheses).
func (p procFS) ppid(pid int) (int, bool) {
	b, err := os.ReadFile(filepath.Join(p.Dir, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	n, err := strconv.Atoi(f[1])
	return n, err == nil
}

// Tree returns root and every process descended from it, root first, the
// rest in pid order: nginx's workers are children of the process the
// script started. A process that exits while the tree is read is left out.
func (p procFS) Tree(root int) ([]int, error) {
	entries, err := os.ReadDir(p.Dir)
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, ok := p.ppid(pid); ok {
			children[pp] = append(children[pp], pid)
		}
	}
	tree := []int{root}
	// Each pid has one parent, so each is appended at most once.
	for i := 0; i < len(tree); i++ {
		tree = append(tree, children[tree[i]]...)
	}
	slices.Sort(tree[1:])
	return tree, nil
}

// CPUTicks sums the user and system time of pids (fields 14 and 15 of
// /proc/PID/stat) in clock ticks, USER_HZ, which Linux fixes at 100 a
// second; a process gone counts zero.
func (p procFS) CPUTicks(pids []int) int64 {
	var sum int64
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join(p.Dir, strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		// After the name: state (field 3) onwards; utime and stime are 14, 15.
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			continue
		}
		u, uerr := strconv.ParseInt(f[11], 10, 64)
		s, serr := strconv.ParseInt(f[12], 10, 64)
		if uerr == nil && serr == nil {
			sum += u + s
		}
	}
	return sum
}

// Alive reports whether pid exists and is not a zombie.
func (p procFS) Alive(pid int) bool {
	st := p.keyed(filepath.Join(strconv.Itoa(pid), "status"), true)
	s, ok := st["State"]
	return ok && !strings.HasPrefix(s, "Z") && !strings.HasPrefix(s, "X")
}

// FDs counts the open descriptors of pids (entries of /proc/PID/fd); a
// process gone counts zero.
func (p procFS) FDs(pids []int) int {
	n := 0
	for _, pid := range pids {
		f, err := os.Open(filepath.Join(p.Dir, strconv.Itoa(pid), "fd"))
		if err != nil {
			continue
		}
		// Names only, in batches: no Lstat of 20,000 links.
		for {
			names, err := f.Readdirnames(4096)
			n += len(names)
			if err != nil || len(names) == 0 {
				break
			}
		}
		f.Close()
	}
	return n
}

// RSSKiB sums VmRSS of pids.
func (p procFS) RSSKiB(pids []int) int64 {
	var sum int64
	for _, pid := range pids {
		st := p.keyed(filepath.Join(strconv.Itoa(pid), "status"), false)
		if v, ok := st["VmRSS"]; ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			sum += n
		}
	}
	return sum
}

// keyed reads a "Key: value" file under Dir into a map of its values (the
// first field only unless whole); missing gives an empty map.
func (p procFS) keyed(rel string, whole bool) map[string]string {
	m := map[string]string{}
	f, err := os.Open(filepath.Join(p.Dir, rel))
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		if !whole {
			v = strings.Fields(v)[0]
		}
		m[k] = v
	}
	return m
}

// ListenDrops reads the kernel's counters of connections dropped at a
// listener, for the whole box (net/netstat's TcpExt, as nstat shows them):
// ListenOverflows, a full accept queue; ListenDrops, every drop there.
func (p procFS) ListenDrops() (overflows, drops int64, err error) {
	b, err := os.ReadFile(filepath.Join(p.Dir, "net", "netstat"))
	if err != nil {
		return 0, 0, err
	}
	// Pairs of lines: "TcpExt: name name ...", "TcpExt: value value ...".
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != "TcpExt:" || len(values) != len(names) || values[0] != "TcpExt:" {
			continue
		}
		for j, n := range names {
			v, _ := strconv.ParseInt(values[j], 10, 64)
			switch n {
			case "ListenOverflows":
				overflows = v
			case "ListenDrops":
				drops = v
			}
		}
		return overflows, drops, nil
	}
	return 0, 0, errors.New("no TcpExt counters in net/netstat")
}
