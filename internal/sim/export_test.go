package sim

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func TestExportArchive(t *testing.T) {
	clock := newFakeClock() // 2026-11-22 12:00 UTC
	s, url := start(t, Config{Now: clock.Now})
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("proj", `{"event_type":"e1","user_id":"alice","insert_id":"i1","time":1763812800000}`,
		`{"event_type":"e2","device_id":"device-1"}`))
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("other", `{"event_type":"x","user_id":"carol"}`))
	clock.Advance(2 * time.Hour)
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("proj", `{"event_type":"e3","user_id":"alice"}`))

	get := func(q string) answer { return apiCall(t, "GET", url+"/api/2/export?"+q, "proj", nil) }
	for _, q := range []string{"start=20261122T12", "start=2026112212&end=20261122T13", "start=20261122T13&end=20261122T12",
		"start=20251122T12&end=20261122T12"} {
		if a := get(q); a.Status != 400 {
			t.Errorf("%s: %d", q, a.Status)
		}
	}
	if a := get("start=20251122T13&end=20261122T12"); a.Status != 200 {
		t.Errorf("365 days: %d %s", a.Status, a.Body)
	}
	if a := get("start=20261122T13&end=20261122T13"); a.Status != 404 {
		t.Errorf("empty hour: %d", a.Status)
	}
	a := get("start=20261122T00&end=20261122T23")
	if a.Status != 200 {
		t.Fatal(a.Status, string(a.Body))
	}
	zr, err := zip.NewReader(bytes.NewReader(a.Body), int64(len(a.Body)))
	if err != nil {
		t.Fatal(err)
	}
	var names, types []string
	for _, f := range zr.File {
		names = append(names, f.Name)
		rc, _ := f.Open()
		b, _ := io.ReadAll(rc)
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var r ExportRecord
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatal(err)
			}
			types = append(types, r.EventType)
			if r.EventType == "e1" && (r.EventTime != "2025-11-22 12:00:00.000000" || r.ServerUploadTime != "2026-11-22 12:00:00.000000" ||
				r.InsertID != "i1" || r.SvcID != SvcID("proj", "alice") || r.App != appID("proj")) {
				t.Errorf("record %s", l)
			}
		}
	}
	app := strconv.Itoa(int(appID("proj")))
	if strings.Join(names, ",") != app+"/"+app+"_2026-11-22_12#0.json,"+app+"/"+app+"_2026-11-22_14#0.json" ||
		strings.Join(types, ",") != "e1,e2,e3" {
		t.Fatalf("entries %v types %v", names, types)
	}
	// Over the size limit: 400; synthetic data fills empty hours.
	s.Knobs(func(k *Knobs) { k.ExportMaxBytes = 500 })
	if a := get("start=20261122T00&end=20261122T23"); a.Status != 400 {
		t.Errorf("over MaxBytes: %d", a.Status)
	}
	syn := int64(3 << 20)
	s.Knobs(func(k *Knobs) { k.ExportMaxBytes, k.ExportSyntheticBytes = 1<<40, syn })
	a = get("start=20200101T00&end=20200101T00")
	zr, err = zip.NewReader(bytes.NewReader(a.Body), int64(len(a.Body)))
	if err != nil || len(zr.File) != 1 || zr.File[0].UncompressedSize64 < uint64(syn) || zr.File[0].UncompressedSize64 > uint64(syn)+2<<20 {
		t.Fatalf("synthetic: %v %d", err, len(a.Body))
	}
	var served struct{ Served []ExportServed }
	wiretest.GetJSON(t, url+"/sim/export/log", &served)
	log := served.Served
	var statuses []int
	for _, l := range log {
		statuses = append(statuses, l.Status)
	}
	if !slices.Equal(statuses, []int{400, 400, 400, 400, 200, 404, 200, 400, 200}) || log[8].Bytes != int64(len(a.Body)) || log[5].Bytes != 0 {
		t.Fatalf("log %+v", log)
	}
}
