package tap

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/storage"
)

func rec(dev, typ string) storage.Record {
	return storage.Record{OrderKey: []byte("d:" + dev), Data: []byte(`{"device_id":"` + dev + `","event_type":"` + typ + `","event_properties":{"k":"secret"}}`)}
}

// TestHub: a tap gets only what its filter selects; a reader that does not
// read never blocks Send, its drops are counted; taps beyond MaxTaps are
// refused; a detached tap leaves the hub inactive.
func TestHub(t *testing.T) {
	reg := prometheus.NewRegistry()
	h, err := New(Config{MaxTaps: 2, Buffer: 3}, reg)
	if err != nil {
		t.Fatal(err)
	}
	if h.Active(Ingest) {
		t.Fatal("active without taps")
	}
	key := []byte("the-key")
	dev, err := h.Attach(Filter{DeviceID: "d1", EventType: "buy", APIKeyHash: KeyHash(key)})
	if err != nil {
		t.Fatal(err)
	}
	dead, err := h.Attach(Filter{Where: Dead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Attach(Filter{}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("a third tap: %v, want ErrTooMany", err)
	}
	if h.Active(Delivered) {
		t.Fatal("active at delivered with no tap there")
	}
	recs := []storage.Record{rec("d1", "buy"), rec("d2", "buy"), rec("d1", "view")}
	h.Pick(Ingest, []byte("other-key"), "", recs).Send()
	for range 10 { // never blocks: the buffer of 3 fills, the rest drop
		h.Pick(Ingest, key, "", recs).Send()
	}
	if n, d := len(dev.c), dev.dropped.Load(); n != 3 || d != 7 {
		t.Fatalf("device tap: %d buffered, %d dropped; want 3, 7", n, d)
	}
	if got := gathered(t, reg, "relay_tap_dropped_events_total"); got != 7 {
		t.Fatalf("relay_tap_dropped_events_total %v, want 7", got)
	}
	it := <-dev.c
	if it.APIKeyHash != KeyHash(key) || !strings.Contains(string(it.Event), `"d1"`) || !Matches(dev.f, it.Event) {
		t.Fatalf("item %+v", it)
	}
	if len(dead.c) != 0 {
		t.Fatal("the dead-letter tap got ingest events")
	}
	h.PublishDead([]storage.DeadLetter{{Lane: storage.LaneKey{APIKey: "k"}, Reason: "silenced", Record: rec("d3", "x")}})
	line := string(AppendLine(nil, <-dead.c, true))
	if !strings.Contains(line, `"reason":"silenced"`) || strings.Contains(line, "secret") || !strings.Contains(line, `"k":"***"`) {
		t.Fatalf("masked dead line %s", line)
	}
	dev.Detach()
	if h.Active(Ingest) || !h.Active(Dead) || gathered(t, reg, "relay_tap_attached") != 1 {
		t.Fatal("detaching one tap did not leave exactly the other one attached")
	}
	dead.Detach()
	if h.Active(Ingest) || h.Active(Dead) {
		t.Fatal("active after every tap detached")
	}
}

func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			if m := mf.GetMetric()[0]; m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

// BenchmarkPick is the hot path's cost per ingest request of 100 events:
// without a tap (one atomic load), and with a tap on a device none of them
// has (the filter runs, nothing is copied).
func BenchmarkPick(b *testing.B) {
	recs := make([]storage.Record, 100)
	for i := range recs {
		recs[i] = rec("dev-"+string(rune('a'+i%26)), "e")
	}
	key := []byte("the-key")
	for _, attached := range []bool{false, true} {
		b.Run(map[bool]string{false: "no-tap", true: "tap-other-device"}[attached], func(b *testing.B) {
			h, _ := New(Config{}, nil)
			if attached {
				if _, err := h.Attach(Filter{DeviceID: "someone-else"}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				h.Pick(Ingest, key, "", recs).Send()
			}
		})
	}
}
