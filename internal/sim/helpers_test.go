package sim

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

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
type answer struct {
	Status int
	Body   []byte
	JSON   map[string]any
}

var client = &http.Client{Timeout: 5 * time.Second}

func post(t testing.TB, url string, body []byte, hdr ...string) answer {
	t.Helper()
	a, err := tryPost(url, body, hdr...)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return a
}

func tryPost(url string, body []byte, hdr ...string) (answer, error) {
	req, err := http.NewRequest("POST", url, bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{Status: resp.StatusCode}, err
	}
	a := answer{Status: resp.StatusCode, Body: b}
	json.Unmarshal(b, &a.JSON)
	return a, nil
}

func getJSON(t testing.TB, url string, v any) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// env builds an envelope body from raw event objects.
func env(key string, events ...string) []byte {
	var b bytes.Buffer
	b.WriteString(`{"api_key":`)
	k, _ := json.Marshal(key)
	b.Write(k)
	b.WriteString(`,"events":[`)
	for i, e := range events {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e)
	}
	b.WriteString("]}")
	return b.Bytes()
}

func ev(dev, insert string) string {
	return `{"event_type":"e","device_id":"` + dev + `","insert_id":"` + insert + `"}`
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

// queueFaults is a minimal Faults for the model's own tests: each request
// takes the next queued fault (simtest has the full injector).
type queueFaults struct {
	mu sync.Mutex
	q  []Fault
}

func (f *queueFaults) add(fs ...Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.q = append(f.q, fs...)
}

func (f *queueFaults) Take(string) (time.Duration, Fault, bool, DownMode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.q) == 0 {
		return 0, Fault{}, false, ""
	}
	x := f.q[0]
	f.q = f.q[1:]
	return 0, x, true, ""
}

func (f *queueFaults) Routes(*Sim, *http.ServeMux) {}
