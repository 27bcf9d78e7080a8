package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

// Each reading the Sim plays (the package doc's Readings), against the
// strict default.
func TestReadings(t *testing.T) {
	batch := func(key, dev string, n int, tag string) []byte {
		evs := make([]string, n)
		for i := range evs {
			evs[i] = wiretest.Event(dev, fmt.Sprintf("%s-%d", tag, i))
		}
		return wiretest.Envelope(key, evs...)
	}
	t.Run("strict rate counts the request's own events", func(t *testing.T) {
		clk := newFakeClock()
		s, url := start(t, Config{Now: clk.Now}) // 30 eps over 10s
		if a := wiretest.Post(t, url+"/2/httpapi", batch("k", "hot-device", 301, "a")); a.Status != 429 {
			t.Fatalf("301 events of one device in one request: %d %s", a.Status, a.Body)
		}
		clk.Advance(31 * time.Second) // the penalty
		if a := wiretest.Post(t, url+"/2/httpapi", batch("k", "hot-device", 300, "b")); a.Status != 200 {
			t.Fatalf("300 events: %d %s", a.Status, a.Body)
		}
		if a := wiretest.Post(t, url+"/2/httpapi", batch("k", "hot-device", 1, "c")); a.Status != 429 {
			t.Fatalf("the 301st event in the window: %d %s", a.Status, a.Body)
		}
		if s.Count() != 300 {
			t.Fatalf("count %d", s.Count())
		}
		lenient, lurl := start(t, Config{Now: clk.Now, LenientRate: true})
		if a := wiretest.Post(t, lurl+"/2/httpapi", batch("k", "hot-device", 1000, "a")); a.Status != 200 || lenient.Count() != 1000 {
			t.Fatalf("lenient: %d", a.Status)
		}
	})
	t.Run("rate across api keys", func(t *testing.T) {
		clk := newFakeClock()
		_, url := start(t, Config{Now: clk.Now, RateAcrossKeys: true})
		wiretest.Post(t, url+"/2/httpapi", batch("k1", "dev-1", 200, "a"))
		if a := wiretest.Post(t, url+"/2/httpapi", batch("k2", "dev-1", 200, "b")); a.Status != 429 {
			t.Fatalf("400 events of one device over two projects: %d", a.Status)
		}
		_, url2 := start(t, Config{Now: clk.Now})
		wiretest.Post(t, url2+"/2/httpapi", batch("k1", "dev-1", 200, "a"))
		if a := wiretest.Post(t, url2+"/2/httpapi", batch("k2", "dev-1", 200, "b")); a.Status != 200 {
			t.Fatalf("per api_key: %d", a.Status)
		}
	})
	t.Run("partial 429", func(t *testing.T) {
		clk := newFakeClock()
		s, url := start(t, Config{Now: clk.Now, PartialThrottle: true})
		body := wiretest.Envelope("k", append([]string{wiretest.Event("cold-device", "c1")}, batchEvents("hot-device", 301)...)...)
		if a := wiretest.Post(t, url+"/2/httpapi", body); a.Status != 429 || s.Count() != 1 {
			t.Fatalf("%d, count %d (want the cold event ingested)", a.Status, s.Count())
		}
	})
	t.Run("partial silenced 400", func(t *testing.T) {
		s, url := start(t, Config{PartialSilence: true})
		s.Knobs(func(k *Knobs) { k.Silenced["quiet-device"] = true })
		if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("quiet-device", "q"), wiretest.Event("other-device", "o"))); a.Status != 400 || s.Count() != 1 {
			t.Fatalf("%d, count %d", a.Status, s.Count())
		}
		strict, surl := start(t, Config{})
		strict.Knobs(func(k *Knobs) { k.Silenced["quiet-device"] = true })
		if a := wiretest.Post(t, surl+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("quiet-device", "q"), wiretest.Event("other-device", "o"))); a.Status != 400 || strict.Count() != 0 {
			t.Fatalf("strict: %d, count %d", a.Status, strict.Count())
		}
	})
	t.Run("daily quota for 24h from the refusal", func(t *testing.T) {
		clk := newFakeClock() // a UTC midnight
		clk.Advance(23 * time.Hour)
		_, url := start(t, Config{Now: clk.Now, DailyQuota: 2, QuotaRolling: true, LenientRate: true})
		wiretest.Post(t, url+"/2/httpapi", batch("k", "dev-q", 2, "a"))
		if a := wiretest.Post(t, url+"/2/httpapi", batch("k", "dev-q", 1, "b")); a.Status != 400 {
			t.Fatalf("over quota: %d", a.Status)
		}
		clk.Advance(2 * time.Hour) // past UTC midnight
		if a := wiretest.Post(t, url+"/2/httpapi", batch("k", "dev-q", 1, "c")); a.Status != 400 {
			t.Fatalf("rolling quota reset at midnight: %d", a.Status)
		}
		clk.Advance(23 * time.Hour)
		if a := wiretest.Post(t, url+"/2/httpapi", batch("k", "dev-q", 1, "d")); a.Status != 200 {
			t.Fatalf("24h after the refusal: %d %s", a.Status, a.Body)
		}
	})
	t.Run("invalid API key for a while", func(t *testing.T) {
		clk := newFakeClock()
		s, url := start(t, Config{Now: clk.Now})
		s.Knobs(func(k *Knobs) { k.RefusedKeys["k"] = s.cfg.Now().Add(time.Minute) })
		if a := wiretest.Post(t, url+"/2/httpapi", batch("k", "dev-r", 1, "a")); a.Status != 400 || a.JSON["error"] != "Invalid API key" {
			t.Fatalf("%d %s", a.Status, a.Body)
		}
		clk.Advance(time.Minute)
		if a := wiretest.Post(t, url+"/2/httpapi", batch("k", "dev-r", 1, "b")); a.Status != 200 {
			t.Fatalf("after the rotation: %d %s", a.Status, a.Body)
		}
	})
	t.Run("1 MB as 2^20", func(t *testing.T) {
		_, url := start(t, Config{MaxBodyBytes: 1 << 20})
		pad := make([]byte, 1_010_000)
		for i := range pad {
			pad[i] = 'p'
		}
		e := fmt.Sprintf(`{"event_type":"e","device_id":"dev-big","event_properties":{"p":%q}}`, pad)
		if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", e)); a.Status != 200 {
			t.Fatalf("1,010,000 bytes under 2^20: %d", a.Status)
		}
	})
}

func batchEvents(dev string, n int) []string {
	evs := make([]string, n)
	for i := range evs {
		evs[i] = wiretest.Event(dev, fmt.Sprintf("%s-%d", dev, i))
	}
	return evs
}
