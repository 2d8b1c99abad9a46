package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// procFS reads the figures of processes from a /proc tree. Dir is its root:
// "/proc" on a live system, a directory under testdata in tests.
type procFS struct {
	Dir string
}

// statFields returns the fields of /proc/PID/stat after the command name,
// which is in parentheses and may itself hold spaces and parentheses: field
// 0 is the state, 1 the parent pid, 11 utime, 12 stime (proc(5), counted
// from 3).
func (p procFS) statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(p.Dir, strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("parse /proc/%d/stat: no ')' in %q", pid, b)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// Tree returns root and every process descended from it, root first, the
// rest in pid order: nginx's and HAProxy's workers are children of the
// process the script started. A process that exits while the tree is read
// is left out.
func (p procFS) Tree(root int) ([]int, error) {
	entries, err := os.ReadDir(p.Dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p.Dir, err)
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := p.statFields(pid)
		if err != nil || len(f) < 2 {
			continue // gone since the directory was read
		}
		ppid, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		children[ppid] = append(children[ppid], pid)
	}
	tree := []int{root}
	// Breadth first over a finite map: each pid has one parent, so each is
	// appended at most once and the loop ends.
	for i := 0; i < len(tree); i++ {
		tree = append(tree, children[tree[i]]...)
	}
	slices.Sort(tree[1:])
	return tree, nil
}

// Sample is what /proc says about a set of processes at one moment, summed
// over them.
type Sample struct {
	// CPUTicks is utime+stime of every thread, in clock ticks.
	CPUTicks int64
	// CtxSwitches is voluntary plus involuntary context switches of every
	// thread: how often the processes slept or were preempted.
	CtxSwitches int64
	// RWSyscalls is syscr+syscw of /proc/PID/io: read- and write-family
	// calls only. recv/send/epoll are not counted, so the figure compares
	// Go programs (which use read/write on sockets) with each other, not
	// with nginx or HAProxy.
	RWSyscalls int64
	// RSSKiB and HWMKiB are VmRSS and VmHWM (peak RSS) of /proc/PID/status.
	RSSKiB, HWMKiB int64
}

// Sample sums the figures of pids. A process that has exited counts as
// zero, as the shell functions this replaces did: a proxy that forked and
// reaped a helper mid-window loses only the helper's share.
func (p procFS) Sample(pids []int) Sample {
	var s Sample
	for _, pid := range pids {
		if f, err := p.statFields(pid); err == nil && len(f) > 12 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			s.CPUTicks += u + st
		}
		status := p.keyed(filepath.Join(strconv.Itoa(pid), "status"))
		s.RSSKiB += status["VmRSS"]
		s.HWMKiB += status["VmHWM"]
		io := p.keyed(filepath.Join(strconv.Itoa(pid), "io"))
		s.RWSyscalls += io["syscr"] + io["syscw"]
		tasks, _ := filepath.Glob(filepath.Join(p.Dir, strconv.Itoa(pid), "task", "*", "status"))
		for _, t := range tasks {
			rel, _ := filepath.Rel(p.Dir, t)
			ts := p.keyed(rel)
			s.CtxSwitches += ts["voluntary_ctxt_switches"] + ts["nonvoluntary_ctxt_switches"]
		}
	}
	return s
}

// keyed reads a "Key: value [unit]" file under Dir (status, io) into a map
// of its integer values; a missing or unreadable file gives an empty map.
func (p procFS) keyed(rel string) map[string]int64 {
	m := map[string]int64{}
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
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		if n, err := strconv.ParseInt(fields[0], 10, 64); err == nil {
			m[k] = n
		}
	}
	return m
}
