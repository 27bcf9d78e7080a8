package adminapi

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// brokenPipe is the connection of a scraper that went away: every write
// fails as a real socket's does.
type brokenPipe struct{ h http.Header }

func (b *brokenPipe) Header() http.Header { return b.h }
func (b *brokenPipe) WriteHeader(int)     {}
func (b *brokenPipe) Write([]byte) (int, error) {
	return 0, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}
}

// TestAbortedScrapesSampled: 20 scrapes whose scraper went away are
// counted 20 times and logged at most once, not once per metric family.
func TestAbortedScrapesSampled(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector()) // dozens of families
	s, err := New(Config{Gatherer: reg}, zap.New(core), reg)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		s.srv.Handler.ServeHTTP(&brokenPipe{h: http.Header{}}, httptest.NewRequest("GET", "/metrics", nil))
	}
	if n := logs.Len(); n != 1 {
		for _, e := range logs.All() {
			t.Log(e.Message, e.ContextMap())
		}
		t.Fatalf("%d log lines for 20 aborted scrapes, want 1", n)
	}
	if e := logs.All()[0]; !strings.Contains(e.Message, "relay_admin_metrics_write_errors_total") {
		t.Errorf("line %q does not name the counter", e.Message)
	}
	// A scrape read in full is neither counted nor logged; it shows the 20.
	w := httptest.NewRecorder()
	s.srv.Handler.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 200 || !strings.Contains(w.Body.String(), "relay_admin_metrics_write_errors_total 20") {
		t.Fatalf("scrape: %d %.200s", w.Code, w.Body.String())
	}
	if logs.Len() != 1 {
		t.Errorf("a good scrape was logged: %d lines", logs.Len())
	}
}
