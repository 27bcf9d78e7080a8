//go:build linux

package batcher

import (
	"bytes"
	"syscall"
	"testing"
)

// TestPrefetch: prefetch reads nothing past its slice (the page after it
// is inaccessible) and changes nothing, whatever the slice's length.
func TestPrefetch(t *testing.T) {
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, 2*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skip("mmap:", err)
	}
	defer syscall.Munmap(mem)
	if err := syscall.Mprotect(mem[page:], syscall.PROT_NONE); err != nil {
		t.Skip("mprotect:", err)
	}
	for i := range page {
		mem[i] = byte(i)
	}
	want := bytes.Clone(mem[:page])
	prefetch(nil)
	for _, n := range []int{0, 1, 63, 64, 65, 500, page} {
		prefetch(mem[page-n : page])
		prefetch(mem[:n])
	}
	if !bytes.Equal(mem[:page], want) {
		t.Fatal("prefetch changed its bytes")
	}
}
