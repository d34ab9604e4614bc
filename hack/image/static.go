package main

import (
	"bytes"
	"debug/elf"

	"github.com/pkg/errors"
)

// static refuses a binary that needs a dynamic loader or C libraries: the image has none.
func static(bin []byte) error {
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return errors.Wrap(err, "is not a Linux (ELF) binary")
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("is linked dynamically (it names a program interpreter), and the image has no C library: build it with CGO_ENABLED=0")
		}
	}
	return nil
}
