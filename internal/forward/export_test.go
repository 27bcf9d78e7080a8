package forward_test

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"github.com/svcrelay/relay/internal/forward"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

func TestExportParseRange(t *testing.T) {
	for _, tc := range []struct {
		start, end string
		hours      int
		err        bool
	}{
		{"20261122T00", "20261122T23", 24, false},
		{"20261122T05", "20261122T05", 1, false},
		{"20251122T00", "20261121T23", 365 * 24, false},
		{"20251122T00", "20261122T00", 0, true},
		{"20261122T06", "20261122T05", 0, true},
		{"2026112200", "20261122T05", 0, true},
		{"20261122T24", "20261123T05", 0, true},
		{"", "20261122T05", 0, true},
	} {
		r, err := forward.ParseExportRange(tc.start, tc.end)
		if (err != nil) != tc.err || (err == nil && r.Hours() != tc.hours) || (err != nil && !errors.Is(err, forward.ErrBadExportRange)) {
			t.Errorf("%s..%s: %v hours %d, err %v", tc.start, tc.end, r, r.Hours(), err)
		}
	}
}

func TestExportRangeSplitHalves(t *testing.T) {
	r, _ := forward.ParseExportRange("20261122T00", "20261124T05")
	parts := r.Split(24)
	if len(parts) != 3 || parts[0].String() != "20261122T00-20261122T23" || parts[2].String() != "20261124T00-20261124T05" {
		t.Fatalf("split %v", parts)
	}
	a, b, ok := parts[2].Halves()
	if !ok || a.String() != "20261124T00-20261124T02" || b.String() != "20261124T03-20261124T05" {
		t.Fatalf("halves %v %v", a, b)
	}
	one, _ := forward.ParseExportRange("20261124T00", "20261124T00")
	if _, _, ok := one.Halves(); ok {
		t.Fatal("a single hour was halved")
	}
}

func TestExportRoute(t *testing.T) {
	clock := time.Date(2026, 11, 22, 12, 30, 0, 0, time.UTC)
	s, up := forwardtest.StartSim(t, sim.Config{Now: func() time.Time { return clock }})
	_ = s
	ingest := `{"api_key":"proj","events":[{"event_type":"e1","user_id":"alice"}]}`
	forwardtest.Call(t, "POST", up+"/2/httpapi", strings.NewReader(ingest))
	relay := forwardtest.ServeAdmin(t, exportNewAPI(t, up).Routes())
	basic := "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("proj:proj-secret"))
	proxyTok := "Proxy-Authorization: Bearer " + forwardtest.AdminToken
	for _, tc := range []struct {
		name  string
		query string
		hdr   []string
		want  int
		local bool
	}{
		{"no token", "start=20261122T00&end=20261122T23", []string{basic}, 401, true},
		{"missing end", "start=20261122T00", []string{basic, proxyTok}, 400, true},
		{"bad form", "start=2026-11-22&end=20261122T23", []string{basic, proxyTok}, 400, true},
		{"too long", "start=20251122T00&end=20261122T23", []string{basic, proxyTok}, 400, true},
		{"pass-through", "start=20261122T00&end=20261122T23", []string{basic, proxyTok}, 200, false},
		{"injected", "start=20261122T00&end=20261122T23", []string{"X-Relay-Project: web", "Authorization: Bearer " + forwardtest.AdminToken}, 200, false},
		{"empty range 404 passed back", "start=20261121T00&end=20261121T23", []string{basic, proxyTok}, 404, false},
		{"upstream 401 passed back", "start=20261122T00&end=20261122T23", []string{proxyTok}, 401, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := forwardtest.Call(t, "GET", relay+forward.ExportPath+"?"+tc.query, nil, tc.hdr...)
			if a.Status != tc.want {
				t.Fatalf("got %v, want %d", a, tc.want)
			}
			if local := bytes.Contains(a.Body, []byte(`"source":"relay"`)); local != tc.local && a.Status != 401 {
				t.Errorf("local answer %v, want %v: %s", local, tc.local, a.Body)
			}
			if tc.name == "upstream 401 passed back" && a.Header.Get("Www-Authenticate") != `Basic realm="svc"` {
				t.Errorf("401 not the upstream's: %v %v", a, a.Header)
			}
			if a.Status == 200 {
				zr, err := zip.NewReader(bytes.NewReader(a.Body), int64(len(a.Body)))
				if err != nil || len(zr.File) != 1 || !strings.HasSuffix(zr.File[0].Name, "_2026-11-22_12#0.json") {
					t.Fatalf("archive: %v", err)
				}
			}
		})
	}
	log, _ := (&simtest.Control{Base: up}).ExportLog(context.Background())
	if len(log) != 3 {
		t.Errorf("upstream served %d exports, want 3 (local refusals send nothing): %+v", len(log), log)
	}
}

func FuzzExportParseRange(f *testing.F) {
	f.Add("20261122T00", "20261122T23")
	f.Add("20251122T00", "20261122T00")
	f.Add("2026112200", "x")
	f.Fuzz(func(t *testing.T, start, end string) {
		r, err := forward.ParseExportRange(start, end)
		if err != nil {
			if !errors.Is(err, forward.ErrBadExportRange) {
				t.Fatalf("error %v is not ErrBadRange", err)
			}
			return
		}
		if r.Hours() < 1 || r.Hours() > int(forward.ExportMaxRange/time.Hour) {
			t.Fatalf("accepted %d hours", r.Hours())
		}
		// Pieces cover the range exactly.
		n := 0
		for _, p := range r.Split(7) {
			n += p.Hours()
		}
		if n != r.Hours() {
			t.Fatalf("split covers %d of %d hours", n, r.Hours())
		}
	})
}
