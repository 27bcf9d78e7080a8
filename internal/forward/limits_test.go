package forward_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/deletion"
	"github.com/svcrelay/relay/internal/dsar"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/scim"
	"github.com/svcrelay/relay/internal/taxonomy"
)

// TestDocumentedLimits: each API with limits gives the documents' figures
// by default (one forward.APIConfig for all, each API's limits its own),
// and a change (here MaxWait and a budget) reaches every one of them.
func TestDocumentedLimits(t *testing.T) {
	for _, c := range []struct {
		api  func(forward.APIConfig) forward.API
		want []ratelimit.Config
	}{
		{scim.API, []ratelimit.Config{{Name: "scim", Limit: 100, Window: time.Minute}}},
		{taxonomy.API, []ratelimit.Config{{Name: "taxonomy", Limit: 7200, Window: time.Hour, MaxInFlight: 4}}},
		{dsar.API, []ratelimit.Config{{Name: "dsar", Limit: 14400, Window: time.Hour}}},
		{deletion.API, []ratelimit.Config{{Name: "deletion_post", Limit: 1, Window: time.Second}, {Name: "deletion", MaxInFlight: 8}}},
	} {
		for _, change := range []ratelimit.Config{{}, {MaxWait: -1, Limit: 9}} {
			a := c.api(forward.APIConfig{URL: "http://up", Limit: change})
			var got []ratelimit.Config
			for _, l := range a.Limits {
				got = append(got, l.Config)
			}
			want := make([]ratelimit.Config, len(c.want))
			for i, w := range c.want {
				want[i] = forward.APIConfig{Limit: change}.Over(w)
			}
			if a.Fallback != "http://up" || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s with %+v: base %q, limits %+v, want %+v", a.API, change, a.Fallback, got, want)
			}
		}
	}
}
