package main

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/ingest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"go.uber.org/zap"
)

// TestReloadAllowedKeys: with --allowed-api-keys=credentials, a reloaded
// credentials file's projects are what the ingest takes; with a list given
// on the command line, a reload changes nothing.
func TestReloadAllowedKeys(t *testing.T) {
	creds := func(keys ...string) *credentials.Store {
		var b strings.Builder
		b.WriteString("projects:\n")
		for i, k := range keys {
			b.WriteString("  - name: p" + string(rune('a'+i)) + "\n    api_key: \"" + k + "\"\n    secret_key: \"s\"\n")
		}
		st, err := credentials.Parse([]byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	sp, err := spool.Open(spool.Config{Dir: filepath.Join(t.TempDir(), "spool"), NoSync: true, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	v1 := creds("key-one")
	cfg := config.Config{AllowedKeysFromCredentials: true}
	ing, err := ingest.New(ingest.Config{Open: ingest.Open{AllowedAPIKeys: cfg.IngestAllowedAPIKeys(v1)}}, spool.NewBackend(sp), event.NewIDGen(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ing.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
		defer cancel()
		ing.Shutdown(ctx)
	}()
	hc := &http.Client{Timeout: polltest.Max}
	post := func(key string) int {
		t.Helper()
		body := `{"api_key":"` + key + `","events":[{"event_type":"e","device_id":"device-1"}]}`
		resp, err := hc.Post("http://"+ln.Addr().String()+"/2/httpapi", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s1, s2 := post("key-one"), post("key-two"); s1 != 200 || s2 != 403 {
		t.Fatalf("before the reload: key-one %d, key-two %d; want 200, 403", s1, s2)
	}
	reloadOpen(ing, cfg, creds("key-two"), zap.NewNop())
	if s1, s2 := post("key-one"), post("key-two"); s1 != 403 || s2 != 200 {
		t.Fatalf("after the reload: key-one %d, key-two %d; want 403, 200", s1, s2)
	}
	// A list from the flag is the flag's, whatever the credentials file holds.
	reloadOpen(ing, config.Config{AllowedAPIKeys: []string{"key-three"}}, creds("key-one"), zap.NewNop())
	if s1, s3 := post("key-one"), post("key-three"); s1 != 403 || s3 != 200 {
		t.Fatalf("after a reload with the flag's list: key-one %d, key-three %d, want 403, 200", s1, s3)
	}
}
