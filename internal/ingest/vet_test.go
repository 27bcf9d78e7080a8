package ingest

import (
	"bytes"
	"context"
	"testing"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/valyala/fasthttp"
)

// planFunc is a Plan of function fields.
type planFunc func(apiKey []byte) (uint64, func(*event.Request, *event.Event) bool)

func (f planFunc) Vet(apiKey []byte) (uint64, func(*event.Request, *event.Event) bool) {
	return f(apiKey)
}
func (f planFunc) Checking() bool { return true }

// verdicts keeps each record's verdict as the store got it.
type verdicts struct{ got []uint64 }

func (v *verdicts) Append(_ context.Context, req storage.Request) error {
	for _, r := range req.Batch.Records() {
		v.got = append(v.got, r.Verdict)
	}
	return nil
}

// TestVet: with a Plan, each record the plan's check finds clean (given
// the event as parsed, and where its event_type is) carries the plan's
// verdict, the others none; without one (or for a key the plan does not
// check) no record carries one.
func TestVet(t *testing.T) {
	const v = 0xabcdef0123456783
	body := []byte(`{"api_key":"k-vet","events":[` +
		`{"device_id":"dev-1","event_type":"good","event_properties":{"a":1}},{"device_id":"dev-2","event_type":"bad"},{"device_id":"dev-3","event_type":"good","ip":"$remote","event_properties":{"b":[2]}}]}`)
	var seen [][]byte
	vet := planFunc(func(apiKey []byte) (uint64, func(*event.Request, *event.Event) bool) {
		if string(apiKey) != "k-vet" {
			return 0, nil
		}
		return v, func(req *event.Request, e *event.Event) bool {
			seen = append(seen, bytes.Clone(e.Raw))
			// The event type read where the parser found its key, the
			// members of the event properties recorded (Checking).
			keys := e.PlanKeys()
			ms, ok := req.PropMembers(e, 0)
			return keys[0] > 0 && bytes.HasPrefix(e.Raw[keys[0]:], []byte(`"event_type":"good"`)) && ok && len(ms) == 1
		}
	})
	for _, tc := range []struct {
		name string
		plan Plan
		body []byte
		want []uint64
	}{
		{"plan", vet, body, []uint64{v, 0, v}},
		{"no plan", nil, body, []uint64{0, 0, 0}},
		{"other key", vet, bytes.Replace(body, []byte("k-vet"), []byte("k-off"), 1), []uint64{0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen = nil
			st := &verdicts{}
			s, err := New(Config{}, st, event.NewIDGen(), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.plan != nil {
				s.SetPlan(tc.plan)
			}
			var rc fasthttp.RequestCtx
			callInProcess(s.strictHandle, inProcessRequest("/2/httpapi", tc.body, "Content-Type", "application/json"), &rc)
			if rc.Response.StatusCode() != 200 {
				t.Fatalf("%d %s", rc.Response.StatusCode(), rc.Response.Body())
			}
			if len(st.got) != len(tc.want) {
				t.Fatalf("verdicts %#x, want %#x", st.got, tc.want)
			}
			for i := range tc.want {
				if st.got[i] != tc.want[i] {
					t.Errorf("record %d: verdict %#x, want %#x", i, st.got[i], tc.want[i])
				}
			}
			// What was checked is each event as it came.
			if tc.name == "plan" && (len(seen) != 3 || !bytes.Equal(seen[2], []byte(`{"device_id":"dev-3","event_type":"good","ip":"$remote","event_properties":{"b":[2]}}`))) {
				t.Errorf("checked %q", seen)
			}
		})
	}
}
