package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// TestDumpLargeChunk: a chunk larger than dump's 4 MB read comes in parts;
// dump prints each of its records once, indexed within the chunk, and goes
// on to the next chunk.
func TestDumpLargeChunk(t *testing.T) {
	dir := t.TempDir()
	sp, err := spool.Open(spool.Config{Dir: dir, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: "dump-key"})
	if err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("x", 1<<20)
	for _, n := range []int{5, 1} { // 5 MB, then a small chunk
		var b storage.Batch
		for i := range n {
			b.Add(storage.Record{OrderKey: []byte("d:dev"), Data: fmt.Appendf(nil, `{"insert_id":"iid-%d-%d","pad":"%s"}`, n, i, pad)})
		}
		if err := sp.Append(context.Background(), l, &b); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	n, err := dump(context.Background(), dir, &out)
	if err != nil || n != 6 {
		t.Fatalf("dump: %d records, %v; want 6", n, err)
	}
	var got []string
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var line struct {
			Seq   uint64 `json:"seq"`
			Index int    `json:"index"`
			Data  struct {
				InsertID string `json:"insert_id"`
			} `json:"data"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d/%d/%s", line.Seq, line.Index, line.Data.InsertID))
	}
	want := "1/0/iid-5-0 1/1/iid-5-1 1/2/iid-5-2 1/3/iid-5-3 1/4/iid-5-4 2/0/iid-1-0"
	if s := strings.Join(got, " "); s != want {
		t.Fatalf("dump: %s\nwant %s", s, want)
	}
}
