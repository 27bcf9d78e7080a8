package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestLogFormatSwap: a new format (a reload) applies to loggers derived
// before it, their names and fields kept.
func TestLogFormatSwap(t *testing.T) {
	var buf bytes.Buffer
	log, _, setFormat, err := newLeveledLogger("info", "json", &buf)
	if err != nil {
		t.Fatal(err)
	}
	child := log.Named("spool").With(zap.String("lane", "events-1"))
	child.Info("before")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil || line["logger"] != "spool" || line["lane"] != "events-1" {
		t.Fatalf("json line %q: %v", buf.String(), err)
	}
	buf.Reset()
	if err := setFormat("console"); err != nil {
		t.Fatal(err)
	}
	child.Info("after", zap.Int("n", 1))
	got := buf.String()
	if json.Valid(buf.Bytes()) || !strings.Contains(got, "\tspool\tafter\t") || !strings.Contains(got, `{"lane": "events-1", "n": 1}`) {
		t.Fatalf("console line %q", got)
	}
	if err := setFormat("xml"); err == nil {
		t.Fatal("format xml taken")
	}
}
