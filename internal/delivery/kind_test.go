package delivery

import (
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
)

// TestBuildBodies: the bodies build packs, byte for byte, for a few
// batches: the envelope (api_key, options), the separators, the event and
// byte limits (a body stays strictly under MaxBatchBytes), an event too
// large alone dead-lettered, the order kept. The expected bodies are what
// build produced before the events kind packed them.
func TestBuildBodies(t *testing.T) {
	ev := func(n int, c string) storage.Record {
		return storage.Record{OrderKey: []byte("d:" + c), Data: []byte(`"` + strings.Repeat(c, n-2) + `"`)}
	}
	tests := []struct {
		name      string
		key       storage.LaneKey
		maxEvents int
		maxBytes  int
		recs      []storage.Record
		bodies    []string
		dead      []string
	}{
		{
			name: "events limit, options", key: storage.LaneKey{APIKey: `k"ey/ü`, Options: `{"min_id_length":2}`},
			maxEvents: 3, maxBytes: 1_000_000,
			recs: []storage.Record{ev(3, "a"), ev(4, "b"), ev(3, "c"), ev(5, "d"), ev(3, "e"), ev(3, "f"), ev(6, "g")},
			bodies: []string{
				`{"api_key":"k\"ey/ü","events":["a","bb","c"],"options":{"min_id_length":2}}`,
				`{"api_key":"k\"ey/ü","events":["ddd","e","f"],"options":{"min_id_length":2}}`,
				`{"api_key":"k\"ey/ü","events":["gggg"],"options":{"min_id_length":2}}`,
			},
		},
		{
			// prefix 25 + suffix 2 = 27: an event of 31 bytes fits alone
			// (58 < 59), one of 32 does not; two of 10 do (48), three not.
			name: "bytes limit, too large", key: storage.LaneKey{APIKey: "k"},
			maxEvents: 1000, maxBytes: 59,
			recs: []storage.Record{ev(10, "a"), ev(10, "b"), ev(10, "c"), ev(32, "x"), ev(31, "y"), ev(10, "z"), ev(10, "w")},
			bodies: []string{
				`{"api_key":"k","events":["aaaaaaaa","bbbbbbbb"]}`,
				`{"api_key":"k","events":["cccccccc"]}`,
				`{"api_key":"k","events":["` + strings.Repeat("y", 29) + `"]}`,
				`{"api_key":"k","events":["zzzzzzzz","wwwwwwww"]}`,
			},
			dead: []string{`"` + strings.Repeat("x", 30) + `"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			thr, _ := throttle.New(throttle.Config{}, nil)
			cfg := Config{Live: Live{IngestURL: "http://x", MaxBatchEvents: tc.maxEvents, MaxBatchBytes: tc.maxBytes}}.withDefaults()
			p := newPipeline(cfg, nil, nil, thr, nil)
			p.m = newMetrics(nil, p)
			lr := newRunner(p, nil, 1, "lane", tc.key)
			s := lr.shard(0)
			now := time.Now()
			ck := &chunkRef{accepted: now}
			for _, r := range tc.recs {
				s.ready.push(item{rec: r, ck: ck, enq: now})
			}
			var bodies, dead []string
			for i := 0; s.ready.len() > 0 && i < 20; i++ {
				body := s.build(now)
				if len(body) >= tc.maxBytes {
					t.Errorf("body of %d bytes, limit %d", len(body), tc.maxBytes)
				}
				bodies = append(bodies, string(body))
				for _, d := range s.dead {
					if d.reason != "too_large" {
						t.Errorf("dead letter %q: %s", d.it.rec.Data, d.reason)
					}
					dead = append(dead, string(d.it.rec.Data))
				}
				s.dead = s.dead[:0]
			}
			if strings.Join(bodies, "\n") != strings.Join(tc.bodies, "\n") {
				t.Errorf("bodies:\n%s\nwant:\n%s", strings.Join(bodies, "\n"), strings.Join(tc.bodies, "\n"))
			}
			if strings.Join(dead, " ") != strings.Join(tc.dead, " ") {
				t.Errorf("dead %q, want %q", dead, tc.dead)
			}
		})
	}
}
