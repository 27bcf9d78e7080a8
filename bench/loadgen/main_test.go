package main

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestTemplates(t *testing.T) {
	tests := []struct {
		name    string
		events  int
		apiKeys int
	}{
		{"one event", 1, 1},
		{"100 events", 100, 1},
		{"1000 events, 3 keys", 1000, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := config{events: tc.events, apiKeys: tc.apiKeys, devices: 100000, zipfS: 1.1, seed: 1, templates: 3}
			keys := map[string]bool{}
			for _, tp := range buildTemplates(c, 3) {
				if len(tp.insertIDs) != tc.events || len(tp.sentUS) != tc.events {
					t.Fatalf("%d insert_id and %d sent_us offsets, want %d", len(tp.insertIDs), len(tp.sentUS), tc.events)
				}
				b := append([]byte(nil), tp.body...)
				for i := range tp.insertIDs {
					put16(b, tp.insertIDs[i], uint64(1000+i))
					put16(b, tp.sentUS[i], 1763700000000000)
				}
				var env struct {
					APIKey string `json:"api_key"`
					Events []struct {
						DeviceID   string `json:"device_id"`
						InsertID   string `json:"insert_id"`
						EventProps struct {
							SentUS int64 `json:"sent_us"`
						} `json:"event_properties"`
					} `json:"events"`
				}
				if err := json.Unmarshal(b, &env); err != nil {
					t.Fatalf("patched body is not JSON: %v", err)
				}
				keys[env.APIKey] = true
				ids := map[string]bool{}
				for _, e := range env.Events {
					if e.DeviceID == "" || e.EventProps.SentUS != 1763700000000000 || ids[e.InsertID] {
						t.Fatalf("bad event: %+v", e)
					}
					ids[e.InsertID] = true
				}
				if len(env.Events) != tc.events {
					t.Fatalf("%d events, want %d", len(env.Events), tc.events)
				}
				// bench/sink counts events by their "event_type" keys.
				if n := bytes.Count(b, []byte(`"event_type"`)); n != tc.events {
					t.Fatalf("%d \"event_type\" strings, want one per event (%d)", n, tc.events)
				}
				if tc.events >= 100 {
					avg := float64(len(b)) / float64(tc.events)
					if avg < 430 || avg > 560 {
						t.Fatalf("average %.0f bytes per event, want ~490", avg)
					}
				}
			}
			if want := min(tc.apiKeys, 3); len(keys) != want {
				t.Fatalf("%d distinct api_keys, want %d", len(keys), want)
			}
		})
	}
}
