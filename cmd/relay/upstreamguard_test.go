package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"go.uber.org/zap"
)

// A spool with records waiting for one upstream refuses a start against
// another (sandbox included) unless allowed; an empty spool takes the new
// one; the identity survives a reopen.
func TestGuardSpoolUpstream(t *testing.T) {
	dir := t.TempDir()
	open := func() *spool.Spool {
		sp, err := spool.Open(spool.Config{Dir: dir, NoSync: true, MinFreeBytes: -1}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return sp
	}
	sp := open()
	prod := upstreamIdentity("https://ingest.example.test/")
	if err := guardSpoolUpstream(sp, prod, false, zap.NewNop()); err != nil {
		t.Fatalf("first start: %v", err)
	}
	l, err := sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	b.Add(storage.Record{OrderKey: []byte("d:x"), Data: []byte(`{"event_type":"e","device_id":"x"}`)})
	if err := sp.Append(context.Background(), l, &b); err != nil {
		t.Fatal(err)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}

	sp = open()
	defer func() { sp.Close() }()
	err = guardSpoolUpstream(sp, upstreamIdentity(""), false, zap.NewNop())
	if !errors.Is(err, errUpstreamChanged) || !strings.Contains(err.Error(), "https://ingest.example.test") ||
		!strings.Contains(err.Error(), "--spool-upstream-change=allow") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("sandbox over a production backlog: %v", err)
	}
	if err := guardSpoolUpstream(sp, "https://other.example.test", false, zap.NewNop()); !errors.Is(err, errUpstreamChanged) {
		t.Fatalf("another upstream: %v", err)
	}
	if err := guardSpoolUpstream(sp, prod, false, zap.NewNop()); err != nil {
		t.Fatalf("same upstream (trailing slash aside): %v", err)
	}
	if err := guardSpoolUpstream(sp, "https://other.example.test", true, zap.NewNop()); err != nil {
		t.Fatalf("allowed: %v", err)
	}
	if id := sp.Stats().Upstream; id != "https://other.example.test" {
		t.Fatalf("stored %q after an allowed change", id)
	}
}

// An empty spool takes any upstream.
func TestGuardEmptySpool(t *testing.T) {
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), NoSync: true, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	for _, id := range []string{"https://a.test", sandboxUpstream, "https://b.test"} {
		if err := guardSpoolUpstream(sp, id, false, zap.NewNop()); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
}
