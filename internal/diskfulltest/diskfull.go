// Package diskfull gives tests a real full filesystem: a small tmpfs
// mounted for one test, and a file that fills it. It is imported by tests
// only (the spool's and the relay's full-disk tests).
package diskfulltest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// Tmpfs mounts a tmpfs of size (mount's syntax, "64m") on a new temporary
// directory, unmounted when the test ends, and returns that directory. It
// skips the test, saying why and adding why (what covers the logic
// instead), where mounting is not allowed (not root, no mount command).
func Tmpfs(t testing.TB, size, why string) string {
	t.Helper()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", mnt).CombinedOutput(); err != nil {
		msg := "cannot mount a tmpfs for a full filesystem (%v: %s)"
		if why != "" {
			msg += "; " + why
		}
		t.Skipf(msg, err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

// Fill writes path until its filesystem has no space left (at most 128 MiB:
// more than the tmpfs of these tests), then the last few blocks.
func Fill(t testing.TB, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for range 2048 {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	for len(buf) > 1 {
		buf = buf[:len(buf)/2]
		_, _ = f.Write(buf)
	}
}
