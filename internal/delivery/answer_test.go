package delivery

import (
	"reflect"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

func TestRetryWaits(t *testing.T) {
	r := NewRetry(100*time.Millisecond, time.Second)
	for i := range 50 {
		d := r.Next()
		if d <= 0 || d > time.Second {
			t.Fatalf("wait %d = %v, want in (0, 1s]", i, d)
		}
	}
	r.Reset()
	if d := r.Next(); d > 150*time.Millisecond {
		t.Fatalf("after Reset: %v, want near 100ms (±50%%)", d)
	}
	// max below initial is raised.
	if d := NewRetry(time.Second, time.Millisecond).Next(); d > time.Second || d <= 0 {
		t.Fatalf("max < initial: %v", d)
	}
}

// decide, the one answer rule, for an events request (pauses by key) and a
// form one (no keys: a 429 waits, at least the kind's ThrottleWait without
// Retry-After; a silenced answer is a 400).
func TestDecide(t *testing.T) {
	rec := func(key, user string) item {
		return item{rec: storage.Record{OrderKey: []byte(key), UserID: []byte(user)}}
	}
	batch := []item{rec("d:a", ""), rec("d:b", "x"), rec("u:y", "y")}
	ev := &Pipeline{cfg: Config{MaxRetryAfter: 5 * time.Second}}
	form := &Pipeline{cfg: ev.cfg, form: &FormConfig{ThrottleWait: 2 * time.Second}}
	const bad = reasonBadRequest
	tests := []struct {
		name string
		res  upstream.Result
		want verdict
		form *verdict // when it differs
	}{
		{"200", upstream.Result{Kind: upstream.OK}, verdict{outcome: delivered}, nil},
		{"429 names a device of the request", upstream.Result{Kind: upstream.Throttled, ThrottledDevices: []string{"b", "z"}},
			verdict{outcome: resend, dead: map[int]string{}, pause: []string{"d:b", "d:z"}}, &verdict{outcome: wait, wait: 2 * time.Second}},
		{"429 names a user of the request", upstream.Result{Kind: upstream.Throttled, ThrottledUsers: []string{"x"}},
			verdict{outcome: resend, dead: map[int]string{}, pause: []string{"u:x"}}, &verdict{outcome: wait, wait: 2 * time.Second}},
		{"429 names events only", upstream.Result{Kind: upstream.Throttled, ThrottledEvents: []int{2, 7}},
			verdict{outcome: resend, dead: map[int]string{}, pause: []string{"u:y"}}, &verdict{outcome: wait, wait: 2 * time.Second}},
		{"429 names others only, Retry-After clamped", upstream.Result{Kind: upstream.Throttled, RetryAfter: time.Hour, ThrottledDevices: []string{"z"}, ThrottledEvents: []int{0}},
			verdict{outcome: wait, wait: 5 * time.Second, dead: map[int]string{}, pause: []string{"d:z"}}, &verdict{outcome: wait, wait: 5 * time.Second}},
		{"silenced and over quota", upstream.Result{Kind: upstream.Silenced, SilencedEvents: []int{2, 9}, SilencedDevices: []string{"a"}, QuotaDevices: []string{"q"}},
			verdict{outcome: resend, dead: map[int]string{0: reasonSilenced, 2: reasonSilenced}, quota: []string{"d:q"}}, &verdict{outcome: split, reason: bad}},
		{"over quota", upstream.Result{Kind: upstream.Silenced, QuotaDevices: []string{"b"}},
			verdict{outcome: resend, dead: map[int]string{}, quota: []string{"d:b"}}, &verdict{outcome: split, reason: bad}},
		{"invalid records", upstream.Result{Kind: upstream.Invalid, InvalidEvents: map[int]string{0: "invalid_fields", 2: "missing_fields", 3: "x", -1: "y"}},
			verdict{outcome: resend, dead: map[int]string{0: "invalid_fields", 2: "missing_fields"}}, nil},
		{"invalid, none of the request", upstream.Result{Kind: upstream.Invalid, InvalidEvents: map[int]string{7: "x"}}, verdict{outcome: split, reason: bad}, nil},
		{"400", upstream.Result{Kind: upstream.BadRequest}, verdict{outcome: split, reason: bad}, nil},
		{"413", upstream.Result{Kind: upstream.TooLarge}, verdict{outcome: split, reason: reasonTooLarge}, nil},
		{"invalid API key", upstream.Result{Kind: upstream.InvalidAPIKey}, verdict{outcome: stop, reason: "invalid API key"}, nil},
		{"wrong URL", upstream.Result{Kind: upstream.Fatal, Answer: []byte("HTTP 404: no such path")},
			verdict{outcome: stop, reason: "upstream answered HTTP 404: no such path"}, nil},
		{"5xx", upstream.Result{Kind: upstream.Retryable}, verdict{outcome: wait}, nil},
		{"5xx with Retry-After", upstream.Result{Kind: upstream.Retryable, RetryAfter: 3 * time.Second}, verdict{outcome: wait, wait: 3 * time.Second}, nil},
	}
	for _, tc := range tests {
		if got := ev.decide(&tc.res, batch); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		want := tc.want
		if tc.form != nil {
			want = *tc.form
		}
		if got := form.decide(&tc.res, batch); !reflect.DeepEqual(got, want) {
			t.Errorf("form, %s: %+v, want %+v", tc.name, got, want)
		}
	}
	// The events hot path decides every 200: it must not allocate.
	ok := upstream.Result{Kind: upstream.OK}
	if n := testing.AllocsPerRun(100, func() { ev.decide(&ok, batch) }); n != 0 {
		t.Fatalf("a 200 allocates %v times", n)
	}
}
