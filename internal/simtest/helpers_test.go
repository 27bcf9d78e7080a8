package simtest

import (
	"net/http"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim"
)

// start starts a Sim on 127.0.0.1:0 and returns it with its base URL.
func start(t testing.TB, cfg sim.Config) (*Sim, string) {
	t.Helper()
	s := New(cfg, nil)
	url, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, url
}

var client = &http.Client{Timeout: 30 * time.Second}
