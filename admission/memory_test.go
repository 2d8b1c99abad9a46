package admission

import (
	"strings"
	"testing"
	"testing/fstest"
)

// box is a fake root file system: path (absolute, as on the box) to
// content.
func box(files map[string]string) fstest.MapFS {
	m := fstest.MapFS{}
	for p, content := range files {
		m[strings.TrimPrefix(p, "/")] = &fstest.MapFile{Data: []byte(content)}
	}
	return m
}

// Mount lines as /proc/self/mountinfo has them.
const (
	mountV1Memory = "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
	mountV1CPU    = "31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
	mountUnified  = "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
	mountV2       = "30 22 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
	mountProc     = "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw\n"
	v1NoLimit     = "9223372036854771712\n"
)

func TestCgroupMemoryLimitFindsTheTightestOfTheProcessCgroupAndItsAncestors(t *testing.T) {
	cases := []struct {
		name      string
		files     map[string]string
		wantBytes int64
		wantFrom  string
		wantFile  string
		wantErr   string
	}{
		{
			name: "v2: the systemd service's own MemoryMax",
			files: map[string]string{
				"/proc/self/cgroup":    "0::/system.slice/scafo-edge.service\n",
				"/proc/self/mountinfo": mountProc + mountV2,
				"/sys/fs/cgroup/system.slice/scafo-edge.service/memory.max": "536870912\n",
				"/sys/fs/cgroup/system.slice/memory.max":                    "max\n",
			},
			wantBytes: 512 * mib, wantFrom: MemoryFromCgroupV2, wantFile: "/sys/fs/cgroup/system.slice/scafo-edge.service/memory.max",
		},
		{
			name: "v2: a parent slice tighter than the service wins",
			files: map[string]string{
				"/proc/self/cgroup":    "0::/edge.slice/scafo-edge.service\n",
				"/proc/self/mountinfo": mountV2,
				"/sys/fs/cgroup/edge.slice/scafo-edge.service/memory.max": "max\n",
				"/sys/fs/cgroup/edge.slice/memory.max":                    "268435456\n",
			},
			wantBytes: 256 * mib, wantFrom: MemoryFromCgroupV2, wantFile: "/sys/fs/cgroup/edge.slice/memory.max",
		},
		{
			name: "v2: three levels, the middle one tightest",
			files: map[string]string{
				"/proc/self/cgroup":               "0::/a/b/c\n",
				"/proc/self/mountinfo":            mountV2,
				"/sys/fs/cgroup/a/b/c/memory.max": "1073741824",
				"/sys/fs/cgroup/a/b/memory.max":   "268435456",
				"/sys/fs/cgroup/a/memory.max":     "536870912",
			},
			wantBytes: 256 * mib, wantFrom: MemoryFromCgroupV2, wantFile: "/sys/fs/cgroup/a/b/memory.max",
		},
		{
			name: "v2: max all the way up is no limit",
			files: map[string]string{
				"/proc/self/cgroup":    "0::/system.slice/scafo-edge.service\n",
				"/proc/self/mountinfo": mountV2,
				"/sys/fs/cgroup/system.slice/scafo-edge.service/memory.max": "max\n",
				"/sys/fs/cgroup/system.slice/memory.max":                    "max\n",
			},
		},
		{
			name: "v2: no memory.max anywhere (the memory controller not enabled) is no limit",
			files: map[string]string{
				"/proc/self/cgroup":                      "0::/user.slice/session-1.scope\n",
				"/proc/self/mountinfo":                   mountV2,
				"/sys/fs/cgroup/user.slice/cgroup.procs": "",
			},
		},
		{
			name: "v2: a container with its own cgroup namespace sees its cgroup at the mount's root",
			files: map[string]string{
				"/proc/self/cgroup":         "0::/\n",
				"/proc/self/mountinfo":      "1200 1100 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n",
				"/sys/fs/cgroup/memory.max": "805306368\n",
			},
			wantBytes: 768 * mib, wantFrom: MemoryFromCgroupV2, wantFile: "/sys/fs/cgroup/memory.max",
		},
		{
			name: "v2: a container sharing the host's cgroup namespace has the container's cgroup mounted at the mount point",
			files: map[string]string{
				"/proc/self/cgroup":         "0::/system.slice/docker-abc.scope\n",
				"/proc/self/mountinfo":      "1200 1100 0:27 /system.slice/docker-abc.scope /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n",
				"/sys/fs/cgroup/memory.max": "805306368\n",
			},
			wantBytes: 768 * mib, wantFrom: MemoryFromCgroupV2, wantFile: "/sys/fs/cgroup/memory.max",
		},
		{
			name: "v2: a cgroup path outside the mount's root reads the mount point",
			files: map[string]string{
				"/proc/self/cgroup":         "0::/../../elsewhere\n",
				"/proc/self/mountinfo":      "1200 1100 0:27 /system.slice/docker-abc.scope /sys/fs/cgroup ro - cgroup2 cgroup rw\n",
				"/sys/fs/cgroup/memory.max": "805306368\n",
			},
			wantBytes: 768 * mib, wantFrom: MemoryFromCgroupV2, wantFile: "/sys/fs/cgroup/memory.max",
		},
		{
			name: "v2: no mountinfo: the hierarchy is taken to be at /sys/fs/cgroup",
			files: map[string]string{
				"/proc/self/cgroup":              "0::/edge\n",
				"/sys/fs/cgroup/edge/memory.max": "536870912\n",
			},
			wantBytes: 512 * mib, wantFrom: MemoryFromCgroupV2, wantFile: "/sys/fs/cgroup/edge/memory.max",
		},
		{
			name: "v2: an unreadable limit is reported, and an ancestor's still counts",
			files: map[string]string{
				"/proc/self/cgroup":             "0::/a/b\n",
				"/proc/self/mountinfo":          mountV2,
				"/sys/fs/cgroup/a/b/memory.max": "lots\n",
				"/sys/fs/cgroup/a/memory.max":   "536870912\n",
			},
			wantBytes: 512 * mib, wantFrom: MemoryFromCgroupV2, wantFile: "/sys/fs/cgroup/a/memory.max",
			wantErr: `/sys/fs/cgroup/a/b/memory.max: "lots" is not a number of bytes`,
		},
		{
			name: "v1: a memory group made by hand",
			files: map[string]string{
				"/proc/self/cgroup":    "5:pids:/\n4:memory:/scafo-edge\n1:cpu:/\n",
				"/proc/self/mountinfo": mountV1CPU + mountV1Memory,
				"/sys/fs/cgroup/memory/scafo-edge/memory.limit_in_bytes": "268435456\n",
				"/sys/fs/cgroup/memory/memory.limit_in_bytes":            v1NoLimit,
			},
			wantBytes: 256 * mib, wantFrom: MemoryFromCgroupV1, wantFile: "/sys/fs/cgroup/memory/scafo-edge/memory.limit_in_bytes",
		},
		{
			name: "v1: memory.stat saying the same as the group's own limit names the limit file",
			files: map[string]string{
				"/proc/self/cgroup":    "4:memory:/scafo-edge\n",
				"/proc/self/mountinfo": mountV1Memory,
				"/sys/fs/cgroup/memory/scafo-edge/memory.limit_in_bytes": "268435456\n",
				"/sys/fs/cgroup/memory/scafo-edge/memory.stat":           "cache 0\nhierarchical_memory_limit 268435456\n",
				"/sys/fs/cgroup/memory/memory.limit_in_bytes":            v1NoLimit,
			},
			wantBytes: 256 * mib, wantFrom: MemoryFromCgroupV1, wantFile: "/sys/fs/cgroup/memory/scafo-edge/memory.limit_in_bytes",
		},
		{
			name: "v1: a parent tighter than the group wins",
			files: map[string]string{
				"/proc/self/cgroup":    "4:memory:/system.slice/scafo-edge.service\n",
				"/proc/self/mountinfo": mountV1Memory,
				"/sys/fs/cgroup/memory/system.slice/scafo-edge.service/memory.limit_in_bytes": v1NoLimit,
				"/sys/fs/cgroup/memory/system.slice/memory.limit_in_bytes":                    "805306368\n",
				"/sys/fs/cgroup/memory/memory.limit_in_bytes":                                 v1NoLimit,
			},
			wantBytes: 768 * mib, wantFrom: MemoryFromCgroupV1, wantFile: "/sys/fs/cgroup/memory/system.slice/memory.limit_in_bytes",
		},
		{
			name: "v1: memory.stat's hierarchical limit counts ancestors above the mount",
			files: map[string]string{
				"/proc/self/cgroup":                           "4:memory:/docker/abc\n",
				"/proc/self/mountinfo":                        "900 800 0:31 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
				"/sys/fs/cgroup/memory/memory.limit_in_bytes": v1NoLimit,
				"/sys/fs/cgroup/memory/memory.stat":           "cache 0\nrss 1\nhierarchical_memory_limit 268435456\nhierarchical_memsw_limit 9223372036854771712\n",
			},
			wantBytes: 256 * mib, wantFrom: MemoryFromCgroupV1, wantFile: "/sys/fs/cgroup/memory/memory.stat",
		},
		{
			name: "v1: the memory controller shares a hierarchy with others",
			files: map[string]string{
				"/proc/self/cgroup":    "3:cpu,memory:/edge\n",
				"/proc/self/mountinfo": "34 30 0:31 / /sys/fs/cgroup/cpu,memory rw - cgroup cgroup rw,cpu,memory\n",
				"/sys/fs/cgroup/cpu,memory/edge/memory.limit_in_bytes": "268435456\n",
			},
			wantBytes: 256 * mib, wantFrom: MemoryFromCgroupV1, wantFile: "/sys/fs/cgroup/cpu,memory/edge/memory.limit_in_bytes",
		},
		{
			name: "v1: the huge page-rounded number everywhere is no limit",
			files: map[string]string{
				"/proc/self/cgroup":    "4:memory:/process_api/7262bc\n",
				"/proc/self/mountinfo": mountV1Memory,
				"/sys/fs/cgroup/memory/process_api/7262bc/memory.limit_in_bytes": v1NoLimit,
				"/sys/fs/cgroup/memory/process_api/7262bc/memory.stat":           "hierarchical_memory_limit 9223372036854771712\n",
				"/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes":        v1NoLimit,
				"/sys/fs/cgroup/memory/memory.limit_in_bytes":                    v1NoLimit,
			},
		},
		{
			name: "v1: missing files are no limit",
			files: map[string]string{
				"/proc/self/cgroup":    "4:memory:/gone\n",
				"/proc/self/mountinfo": mountV1Memory,
			},
		},
		{
			name: "hybrid: the v1 memory controller is the one that limits, not the unified hierarchy",
			files: map[string]string{
				"/proc/self/cgroup":                                "4:memory:/edge\n1:cpu:/\n0::/edge\n",
				"/proc/self/mountinfo":                             mountV1CPU + mountV1Memory + mountUnified,
				"/sys/fs/cgroup/memory/edge/memory.limit_in_bytes": "268435456\n",
				"/sys/fs/cgroup/unified/edge/memory.max":           "536870912\n",
			},
			wantBytes: 256 * mib, wantFrom: MemoryFromCgroupV1, wantFile: "/sys/fs/cgroup/memory/edge/memory.limit_in_bytes",
		},
		{
			name: "a mount point with a space in it",
			files: map[string]string{
				"/proc/self/cgroup":                 "0::/edge\n",
				"/proc/self/mountinfo":              `30 22 0:27 / /sys/fs/my\040cgroup rw - cgroup2 cgroup2 rw` + "\n",
				"/sys/fs/my cgroup/edge/memory.max": "268435456",
			},
			wantBytes: 256 * mib, wantFrom: MemoryFromCgroupV2, wantFile: "/sys/fs/my cgroup/edge/memory.max",
		},
		{
			name: "mountinfo lists cgroups but not the process's hierarchy: no limit",
			files: map[string]string{
				"/proc/self/cgroup":                                "4:memory:/edge\n",
				"/proc/self/mountinfo":                             mountV1CPU,
				"/sys/fs/cgroup/memory/edge/memory.limit_in_bytes": "268435456\n",
			},
		},
		{
			name:  "no /proc/self/cgroup: no limit",
			files: map[string]string{"/sys/fs/cgroup/memory.max": "268435456\n"},
		},
		{
			name: "garbage in /proc/self/cgroup: no limit",
			files: map[string]string{
				"/proc/self/cgroup":         "not a cgroup line\n\n::\n",
				"/proc/self/mountinfo":      mountV2,
				"/sys/fs/cgroup/memory.max": "268435456\n",
			},
		},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			got, err := cgroupMemoryLimit(box(tt.files))
			if got.bytes != tt.wantBytes || got.version != tt.wantFrom || got.file != tt.wantFile {
				t.Errorf("cgroupMemoryLimit = %d from %q %q, want %d from %q %q", got.bytes, got.version, got.file, tt.wantBytes, tt.wantFrom, tt.wantFile)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error %v, want one saying %q", err, tt.wantErr)
			}
		})
	}
}

func TestMemTotal(t *testing.T) {
	cases := []struct {
		name    string
		meminfo string
		want    int64
	}{
		{"a real box", "MemTotal:       24683548 kB\nMemFree:        23566372 kB\nMemAvailable:   24019068 kB\n", 24683548 << 10},
		{"4 GiB", "MemFree: 1 kB\nMemTotal: 4194304 kB\n", 4 << 30},
		{"no MemTotal line", "MemFree: 1 kB\n", 0},
		{"not kB", "MemTotal: 4194304 MB\n", 0},
		{"not a number", "MemTotal: lots kB\n", 0},
		{"zero", "MemTotal: 0 kB\n", 0},
		{"negative", "MemTotal: -4 kB\n", 0},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			if got := memTotal(box(map[string]string{"/proc/meminfo": tt.meminfo})); got != tt.want {
				t.Errorf("memTotal = %d, want %d", got, tt.want)
			}
		})
	}
	if got := memTotal(box(nil)); got != 0 {
		t.Errorf("memTotal with no /proc/meminfo = %d, want 0", got)
	}
}
