package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDocumentedBuildNamesRevision builds the relay with the README's build
// command on a machine whose Go settings say -buildvcs=false, and requires
// `relay --version` to name the checkout's revision.
func TestDocumentedBuildNamesRevision(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the relay")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout (or no git): %v", err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^go build -ldflags .* -o relay \./cmd/relay$`).Find(readme)
	if line == nil {
		t.Fatal("the README has no stamped build command (go build -ldflags ... -o relay ./cmd/relay)")
	}
	bin := filepath.Join(t.TempDir(), "relay")
	cmdline := strings.Replace(string(line), "-o relay ", "-o "+bin+" ", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "sh", "-c", cmdline)
	build.Dir = root
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmdline, err, out)
	}
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "revision " + strings.TrimSpace(string(head)); !strings.Contains(string(out), want) {
		t.Fatalf("relay --version = %q, want it to name %q", out, want)
	}
}
