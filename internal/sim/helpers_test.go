package sim

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

// readOut returns the answer of the read-out GET path, decoded.
func readOut[T any](t testing.TB, s *Sim, path string) T {
	t.Helper()
	w := httptest.NewRecorder()
	s.ControlHandler().ServeHTTP(w, httptest.NewRequest("GET", path, nil))
	var out T
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("%s: %v: %s", path, err, w.Body)
	}
	return out
}

// Count returns the number of events ingested (duplicates excluded), also
// those Config.Keep no longer keeps.
func (s *Sim) Count() int64 { return s.Stats().Ingested }

// Duplicates returns how many events were recognised as duplicates.
func (s *Sim) Duplicates() int64 { return s.Stats().Duplicates }

// fakeClock is an injected clock for rate, penalty, dedup and quota tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// start starts a Sim on 127.0.0.1:0 and returns it with its base URL.
func start(t testing.TB, cfg Config) (*Sim, string) {
	t.Helper()
	s := New(cfg, nil)
	url, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, url
}

// answer is a decoded upstream answer.
type answer = wiretest.Answer

var client = &http.Client{Timeout: 30 * time.Second}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func mustJSON(t testing.TB, a answer, want map[string]any) {
	t.Helper()
	for k, v := range want {
		got, _ := json.Marshal(a.JSON[k])
		w, _ := json.Marshal(v)
		if !bytes.Equal(got, w) {
			t.Errorf("field %s = %s, want %s (body %s)", k, got, w, a.Body)
		}
	}
}
