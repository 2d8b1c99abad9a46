package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
)

// machines maps a Go architecture name, as Docker's platforms use it, to
// the ELF machine a binary for it carries.
var machines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64,
	"arm64": elf.EM_AARCH64,
}

// capNetBindService is CAP_NET_BIND_SERVICE's bit (linux/capability.h).
const capNetBindService = 10

// binaryCheck reads an image's file system as a tar stream (docker export)
// on stdin and checks the file -path in it: an ELF for -arch, static, with
// the file capability cap_net_bind_service=+ep and no other. It prints one
// line saying what it found, or fails saying what is wrong.
//
// The image of another architecture cannot be run here, so this is what
// tells that its binary is that architecture's and kept the capability
// the builder set: the runtime checks prove the same of the native image.
func binaryCheck(args []string) error {
	fs := flag.NewFlagSet("binary", flag.ExitOnError)
	file := fs.String("path", "scafo-edge", "the binary's path in the image, as the tar names it")
	arch := fs.String("arch", "", "the architecture the binary must be built for: amd64 or arm64")
	fs.Parse(args)
	want, ok := machines[*arch]
	if !ok {
		return fmt.Errorf("binary: -arch %q: want amd64 or arm64", *arch)
	}
	line, err := checkBinary(os.Stdin, path.Clean(*file), want)
	if err != nil {
		return fmt.Errorf("binary %s (want %s): %w", *file, *arch, err)
	}
	fmt.Println(line)
	return nil
}

// checkBinary finds name in the tar stream r and checks it is a static ELF
// for machine carrying cap_net_bind_service=+ep alone.
func checkBinary(r io.Reader, name string, machine elf.Machine) (string, error) {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return "", errors.New("not in the image")
		}
		if err != nil {
			return "", fmt.Errorf("read the image's tar: %w", err)
		}
		if path.Clean(hdr.Name) != name && path.Clean("/"+hdr.Name) != name {
			continue
		}
		if hdr.Typeflag != tar.TypeReg {
			return "", fmt.Errorf("tar type %q, want a regular file", hdr.Typeflag)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return "", fmt.Errorf("read: %w", err)
		}
		f, err := elf.NewFile(bytes.NewReader(b))
		if err != nil {
			return "", fmt.Errorf("not an ELF: %w", err)
		}
		if f.Machine != machine {
			return "", fmt.Errorf("ELF machine %v", f.Machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				return "", errors.New("has PT_INTERP: it needs a dynamic loader the image lacks")
			}
		}
		caps, err := fileCaps(hdr.PAXRecords["SCHILY.xattr.security.capability"])
		if err != nil {
			return "", err
		}
		if caps != "cap_net_bind_service=+ep" {
			return "", fmt.Errorf("file capability %s, want cap_net_bind_service=+ep", caps)
		}
		return fmt.Sprintf("%s: ELF %v, %s, static, %d bytes, %s", name, f.Machine, f.Class, len(b), caps), nil
	}
}

// fileCaps decodes a security.capability extended attribute (struct
// vfs_cap_data or vfs_ns_cap_data, linux/capability.h) into setcap's words
// for the cases the check tells apart: none, cap_net_bind_service=+ep, or
// something else, spelled out as masks.
func fileCaps(v string) (string, error) {
	if v == "" {
		return "none", nil
	}
	b := []byte(v)
	if len(b) < 4 {
		return "", fmt.Errorf("security.capability of %d bytes", len(b))
	}
	magic := binary.LittleEndian.Uint32(b)
	var n int
	switch magic &^ 1 { // bit 0: the effective flag
	case 0x01000000: // revision 1: 32 bits
		n = 1
	case 0x02000000, 0x03000000: // revisions 2 and 3 (3 adds a root uid): 64 bits
		n = 2
	default:
		return "", fmt.Errorf("security.capability revision %#x unknown", magic&^1)
	}
	if len(b) < 4+8*n {
		return "", fmt.Errorf("security.capability of %d bytes for revision %#x", len(b), magic&^1)
	}
	var permitted, inheritable uint64
	for i := range n {
		permitted |= uint64(binary.LittleEndian.Uint32(b[4+8*i:])) << (32 * i)
		inheritable |= uint64(binary.LittleEndian.Uint32(b[8+8*i:])) << (32 * i)
	}
	effective := magic&1 == 1
	if permitted == 1<<capNetBindService && inheritable == 0 && effective {
		return "cap_net_bind_service=+ep", nil
	}
	return fmt.Sprintf("permitted=%#x inheritable=%#x effective=%t", permitted, inheritable, effective), nil
}
