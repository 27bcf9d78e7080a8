// Package wiretest is the HTTP client side of the simulator's tests: it
// posts a body, reads the whole answer and decodes it, and builds
// envelopes. It is imported by tests only: those of package sim (which is
// why it does not import sim) and of package simtest.
package wiretest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"
)

// Answer is an upstream answer read in full; JSON is its body decoded when
// it is a JSON object (nil otherwise).
type Answer struct {
	Status int
	Body   []byte
	JSON   map[string]any
}

// timeout bounds one request: generous, so that a loaded machine does not
// fail a test, and finite, so that a hung server does.
const timeout = 30 * time.Second

// Post sends body to url as JSON with the header pairs hdr (name, value,
// ...) and fails the test unless an answer is read.
func Post(t testing.TB, url string, body []byte, hdr ...string) Answer {
	t.Helper()
	a, err := TryPost(url, body, hdr...)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return a
}

// TryPost is Post returning the error instead of failing.
func TryPost(url string, body []byte, hdr ...string) (Answer, error) {
	req, err := http.NewRequest("POST", url, bytes.NewReader(body))
	if err != nil {
		return Answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Answer{Status: resp.StatusCode}, err
	}
	a := Answer{Status: resp.StatusCode, Body: b}
	json.Unmarshal(b, &a.JSON)
	return a, nil
}

// GetJSON decodes the answer to GET url into v and fails the test unless
// it is a 200 with JSON.
func GetJSON(t testing.TB, url string, v any) {
	t.Helper()
	resp, err := (&http.Client{Timeout: timeout}).Get(url)
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

// Envelope builds a /2/httpapi body from an api_key and raw event objects.
func Envelope(key string, events ...string) []byte {
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

// Event is a minimal event object of device dev with insert_id insert.
func Event(dev, insert string) string {
	return `{"event_type":"e","device_id":"` + dev + `","insert_id":"` + insert + `"}`
}
