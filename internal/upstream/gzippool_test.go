package upstream

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/svcrelay/relay/internal/polltest"
)

// TestGzipBodiesReused: gzipped requests sent at once from several
// goroutines, each body different (and of a different size), arrive each
// intact and once, although the client reuses its compressed-body buffers
// (Client.gzBufs): a buffer given back before its request is sent would
// carry another request's body.
func TestGzipBodiesReused(t *testing.T) {
	var mu sync.Mutex
	got := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got[string(b)]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"code":200}`)
	}))
	defer srv.Close()
	c := newClient(t, Config{Timeout: polltest.Max})
	const workers, each = 8, 40
	body := func(w, i int) string {
		return fmt.Sprintf(`{"api_key":"k","events":[{"event_type":"e","device_id":"d-%d-%d","note":"%s"}]}`,
			w, i, strings.Repeat(fmt.Sprintf("%d-%d ", w, i), 1+(w*7+i*13)%300))
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				r := c.Do(context.Background(), &Request{URL: srv.URL + "/2/httpapi", Body: []byte(body(w, i)), Gzip: true})
				if r.Kind != OK {
					errs <- fmt.Errorf("worker %d request %d: %+v", w, i, r)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for w := range workers {
		for i := range each {
			if n := got[body(w, i)]; n != 1 {
				t.Errorf("body %d/%d arrived %d times", w, i, n)
			}
		}
	}
	if len(got) != workers*each {
		t.Errorf("%d distinct bodies arrived, want %d", len(got), workers*each)
	}
}
