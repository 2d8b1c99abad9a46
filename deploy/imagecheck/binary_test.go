package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"strings"
	"testing"
)

// elfFile is the smallest ELF64 little-endian file debug/elf reads: a
// header for machine and, with interp, one PT_INTERP program header.
func elfFile(machine elf.Machine, interp bool) []byte {
	var b bytes.Buffer
	le := binary.LittleEndian
	ident := [16]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)}
	b.Write(ident[:])
	phnum := uint16(0)
	if interp {
		phnum = 1
	}
	binary.Write(&b, le, struct {
		Type, Machine                                   uint16
		Version                                         uint32
		Entry, Phoff, Shoff                             uint64
		Flags                                           uint32
		Ehsize, Phentsize, Phnum, Shentsize, Shnum, Shx uint16
	}{uint16(elf.ET_EXEC), uint16(machine), uint32(elf.EV_CURRENT), 0x401000, 64, 0, 0, 64, 56, phnum, 64, 0, 0})
	if interp {
		binary.Write(&b, le, elf.Prog64{Type: uint32(elf.PT_INTERP), Off: 120, Filesz: 1, Memsz: 1, Align: 1})
		b.WriteByte(0)
	}
	return b.Bytes()
}

// capXattr is a security.capability value: revision 2 (or 3, with a root
// uid), permitted and inheritable masks, and the effective flag.
func capXattr(rev uint32, permitted, inheritable uint64, effective bool) string {
	le := binary.LittleEndian
	magic := rev << 24
	if effective {
		magic |= 1
	}
	b := le.AppendUint32(nil, magic)
	b = le.AppendUint32(b, uint32(permitted))
	b = le.AppendUint32(b, uint32(inheritable))
	b = le.AppendUint32(b, uint32(permitted>>32))
	b = le.AppendUint32(b, uint32(inheritable>>32))
	if rev == 3 {
		b = le.AppendUint32(b, 0)
	}
	return string(b)
}

type tarEntry struct {
	name  string
	typ   byte
	body  []byte
	xattr string // security.capability, as docker export writes it
}

func tarOf(t *testing.T, entries ...tarEntry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o755, Size: int64(len(e.body)), Format: tar.FormatPAX}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if e.typ == tar.TypeSymlink {
			hdr.Linkname = "elsewhere"
		}
		if e.xattr != "" {
			hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": e.xattr}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write(e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestCheckBinary(t *testing.T) {
	bind := uint64(1) << capNetBindService
	arm := elfFile(elf.EM_AARCH64, false)
	good := capXattr(2, bind, 0, true)
	others := []tarEntry{{name: "etc/", typ: tar.TypeDir}, {name: "etc/passwd", typ: tar.TypeReg, body: []byte("root:x:0:0::/:/sbin/nologin\n")}}
	for _, tc := range []struct {
		name    string
		entries []tarEntry
		path    string
		want    string // a substring of the line, or of the error with wantErr
		wantErr bool
	}{
		{"arm64, static, the capability", append(others, tarEntry{"scafo-edge", tar.TypeReg, arm, good}), "scafo-edge",
			"scafo-edge: ELF EM_AARCH64, ELFCLASS64, static, 64 bytes, cap_net_bind_service=+ep", false},
		{"revision 3 (a root uid)", []tarEntry{{"scafo-edge", tar.TypeReg, arm, capXattr(3, bind, 0, true)}}, "scafo-edge", "cap_net_bind_service=+ep", false},
		{"named ./ in the tar", []tarEntry{{"./scafo-edge", tar.TypeReg, arm, good}}, "scafo-edge", "EM_AARCH64", false},
		{"asked for with a leading /", []tarEntry{{"scafo-edge", tar.TypeReg, arm, good}}, "/scafo-edge", "EM_AARCH64", false},
		{"another architecture", []tarEntry{{"scafo-edge", tar.TypeReg, elfFile(elf.EM_X86_64, false), good}}, "scafo-edge", "ELF machine EM_X86_64", true},
		{"dynamically linked", []tarEntry{{"scafo-edge", tar.TypeReg, elfFile(elf.EM_AARCH64, true), good}}, "scafo-edge", "PT_INTERP", true},
		{"no capability (the legacy builder's image)", []tarEntry{{"scafo-edge", tar.TypeReg, arm, ""}}, "scafo-edge", "file capability none", true},
		{"not effective", []tarEntry{{"scafo-edge", tar.TypeReg, arm, capXattr(2, bind, 0, false)}}, "scafo-edge", "effective=false", true},
		{"another capability too", []tarEntry{{"scafo-edge", tar.TypeReg, arm, capXattr(2, bind|1<<12, 0, true)}}, "scafo-edge", "permitted=0x1400", true},
		{"a capability above bit 31", []tarEntry{{"scafo-edge", tar.TypeReg, arm, capXattr(2, bind|1<<33, 0, true)}}, "scafo-edge", "permitted=0x200000400", true},
		{"inheritable", []tarEntry{{"scafo-edge", tar.TypeReg, arm, capXattr(2, bind, bind, true)}}, "scafo-edge", "inheritable=0x400", true},
		{"a truncated attribute", []tarEntry{{"scafo-edge", tar.TypeReg, arm, good[:9]}}, "scafo-edge", "9 bytes", true},
		{"an unknown revision", []tarEntry{{"scafo-edge", tar.TypeReg, arm, capXattr(7, bind, 0, true)}}, "scafo-edge", "revision 0x7000000 unknown", true},
		{"not in the image", others, "scafo-edge", "not in the image", true},
		{"a symlink", []tarEntry{{"scafo-edge", tar.TypeSymlink, nil, ""}}, "scafo-edge", "want a regular file", true},
		{"not an ELF", []tarEntry{{"scafo-edge", tar.TypeReg, []byte("#!/bin/sh\necho hi\n"), good}}, "scafo-edge", "not an ELF", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line, err := checkBinary(tarOf(t, tc.entries...), tc.path, elf.EM_AARCH64)
			switch {
			case tc.wantErr && err == nil:
				t.Fatalf("checkBinary = %q, want an error with %q", line, tc.want)
			case tc.wantErr && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("checkBinary error %q, want it to say %q", err, tc.want)
			case !tc.wantErr && err != nil:
				t.Fatalf("checkBinary: %v", err)
			case !tc.wantErr && !strings.Contains(line, tc.want):
				t.Fatalf("checkBinary = %q, want it to say %q", line, tc.want)
			}
		})
	}
}

func TestCheckBinaryNotATar(t *testing.T) {
	if _, err := checkBinary(strings.NewReader(strings.Repeat("not a tar ", 100)), "scafo-edge", elf.EM_X86_64); err == nil || !strings.Contains(err.Error(), "read the image's tar") {
		t.Fatalf("checkBinary on garbage: %v, want a tar read error", err)
	}
}
