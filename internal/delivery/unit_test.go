package delivery

import (
	"strconv"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/storage"
)

func TestConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		want string // "" = valid
	}{
		{Config{Live: Live{IngestURL: "http://x"}}, ""},
		{Config{Live: Live{IngestURL: "https://x/", MaxBatchEvents: 1999, MaxBatchBytes: 1024}}, ""},
		{Config{}, "ingest URL is required"},
		{Config{Live: Live{IngestURL: "ftp://x"}}, "not http(s)"},
		{Config{Live: Live{IngestURL: "http://x", MaxBatchEvents: 2000}}, "max batch events"},
		{Config{Live: Live{IngestURL: "http://x", MaxBatchEvents: -1}}, "max batch events"},
		{Config{Live: Live{IngestURL: "http://x", MaxBatchBytes: 10}}, "max batch bytes"},
		{Config{Live: Live{IngestURL: "http://x", FlushInterval: -1}}, "negative duration"},
		{Config{Live: Live{IngestURL: "http://x"}, ShardsPerLane: 5000}, "shards per lane"},
		{Config{Live: Live{IngestURL: "http://x"}, MaxReadAheadBytes: -1}, "negative read-ahead"},
	} {
		err := tt.cfg.Validate()
		if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%+v: %v, want %q", tt.cfg, err, tt.want)
		}
	}
	c := Config{Live: Live{IngestURL: "http://x/"}}.withDefaults()
	if c.MaxBatchEvents != 1000 || c.MaxBatchBytes != 1_000_000 || c.ThrottlePause != DefaultThrottlePause ||
		c.MaxEventAge != DefaultMaxEventAge || c.FlushInterval != DefaultFlushInterval || c.IngestURL != "http://x" {
		t.Fatalf("defaults %+v", c)
	}
}

func TestQueue(t *testing.T) {
	mk := func(i int) item { return item{rec: storage.Record{Data: []byte(strconv.Itoa(i))}} }
	var q queue
	next := 0 // next value expected from the front
	pushed := 0
	for round := 0; round < 50; round++ {
		for i := 0; i < 100; i++ {
			q.push(mk(pushed))
			pushed++
		}
		var back []item
		for i := 0; i < 70 && q.len() > 0; i++ {
			it := q.pop()
			if got := string(it.rec.Data); got != strconv.Itoa(next) {
				t.Fatalf("popped %s, want %d", got, next)
			}
			next++
			back = append(back, it)
		}
		if round%3 == 0 { // put the last 20 popped back in front, in order
			q.pushFront(back[len(back)-20:])
			next -= 20
		}
		want := 0
		for i := q.head; i < len(q.buf); i++ {
			want += len(q.buf[i].rec.Data)
		}
		if q.bytes != want {
			t.Fatalf("bytes %d, want %d", q.bytes, want)
		}
	}
	for q.len() > 0 {
		if got := string(q.pop().rec.Data); got != strconv.Itoa(next) {
			t.Fatalf("popped %s, want %d", got, next)
		}
		next++
	}
	if next != pushed || q.bytes != 0 {
		t.Fatalf("drained %d of %d, bytes %d", next, pushed, q.bytes)
	}
}

func TestEnvelope(t *testing.T) {
	f := events{}.Frame(storage.LaneKey{APIKey: `k"ey`, Options: `{"min_id_length":2}`})
	if got := f.Prefix + `{}` + f.Suffix; got != `{"api_key":"k\"ey","events":[{}],"options":{"min_id_length":2}}` {
		t.Fatal(got)
	}
	f = events{}.Frame(storage.LaneKey{APIKey: "k"})
	if got := f.Prefix + f.Suffix; got != `{"api_key":"k","events":[]}` {
		t.Fatal(got)
	}
}

// The ingest's 413 check measures the envelope as the batcher writes it.
func TestEnvelopeOverheadAgrees(t *testing.T) {
	for _, k := range []storage.LaneKey{{APIKey: "k"}, {APIKey: `<a&"b>`, Options: `{"min_id_length":3}`}, {APIKey: "ключ"}} {
		f := events{}.Frame(k)
		if got, want := event.EnvelopeOverhead(k.APIKey, []byte(k.Options)), len(f.Prefix)+len(f.Suffix); got != want {
			t.Errorf("%+v: EnvelopeOverhead %d, envelope %d", k, got, want)
		}
	}
}
