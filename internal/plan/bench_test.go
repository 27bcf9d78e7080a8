package plan

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/svcrelay/relay/internal/benchtest"
	"github.com/svcrelay/relay/internal/event"
)

// benchPlan is a 200-event-type plan that benchtest.SDKEvent's events
// follow: its four event types with their properties, 196 others.
func benchPlan() *Plan {
	p := &Plan{
		EventTypes: []string{"Product Viewed", "Page Viewed", "Search", "Button Clicked"},
		Shared:     []Property{{Name: "note", Type: "string"}, {Name: "sent_us", Type: "number"}},
		Overrides: map[string][]Property{
			"Product Viewed": {{Name: "product_id", Type: "string", Regex: `SKU-[0-9]{6}`, Required: true},
				{Name: "category", Type: "enum", Enum: []string{"garden", "shoes", "books"}}, {Name: "price", Type: "number"},
				{Name: "quantity", Type: "number"}, {Name: "tags", Type: "string", Array: true}},
			"Page Viewed": {{Name: "page_path", Type: "string", Regex: `/.*`}, {Name: "page_title", Type: "string"}, {Name: "referrer", Type: "string"}},
			"Search":      {{Name: "query", Type: "string"}, {Name: "results", Type: "number"}, {Name: "filters"}},
			"Button Clicked": {{Name: "screen", Type: "string"}, {Name: "element_id", Type: "string", Regex: `btn-.*`},
				{Name: "position", Type: "number"}},
		},
		UserProperties: []Property{{Name: "plan", Type: "enum", Enum: []string{"free", "growth", "enterprise"}},
			{Name: "signup_cohort", Type: "string", Regex: `2026-W[0-9]{2}`}, {Name: "beta", Type: "boolean"}},
	}
	for i := len(p.EventTypes); i < 200; i++ {
		et := fmt.Sprintf("Filler Event %d", i)
		p.EventTypes = append(p.EventTypes, et)
		for j := range 5 {
			p.Overrides[et] = append(p.Overrides[et], Property{Name: fmt.Sprintf("prop_%d", j), Type: "string"})
		}
	}
	return p
}

// BenchmarkCheck checks 100 SDK-shaped events (one request's worth) in
// block mode against a 200-event-type plan they follow.
func BenchmarkCheck(b *testing.B) {
	c, err := compile(benchPlan())
	if err != nil {
		b.Fatal(err)
	}
	evs := make([][]byte, 100)
	for i := range evs {
		evs[i] = []byte(benchtest.SDKEvent(i))
		if _, vs := c.check(evs[i], Block, nil); len(vs) > 0 {
			b.Fatalf("event %d: %v\n%s", i, vs, evs[i])
		}
	}
	b.ReportAllocs()
	cpu0 := benchtest.ProcessCPU()
	for b.Loop() {
		for _, e := range evs {
			c.check(e, Block, nil)
		}
	}
	b.ReportMetric(float64(benchtest.ProcessCPU()-cpu0)/float64(b.N*len(evs)), "cpu-ns/event")
}

// BenchmarkEnforcerCheck is BenchmarkCheck through the Enforcer's
// delivery.Frame.Check (the project looked up, the plan loaded).
func BenchmarkEnforcerCheck(b *testing.B) {
	e, _, _ := newEnforcer(&testing.T{}, Config{}, nil)
	c, err := compile(benchPlan())
	if err != nil {
		b.Fatal(err)
	}
	e.state("web").cur.Store(&cached{plan: benchPlan(), c: c})
	check := e.Check("key-web")
	evs := make([][]byte, 100)
	for i := range evs {
		evs[i] = []byte(benchtest.SDKEvent(i))
	}
	b.ReportAllocs()
	cpu0 := benchtest.ProcessCPU()
	for b.Loop() {
		for _, ev := range evs {
			if _, reason, _ := check(ev, 0); reason != "" {
				b.Fatal(reason)
			}
		}
	}
	b.ReportMetric(float64(benchtest.ProcessCPU()-cpu0)/float64(b.N*len(evs)), "cpu-ns/event")
}

// BenchmarkCheckCold is BenchmarkCheck on records that left the cache, as
// at delivery: 64 MiB of them, checked in a shuffled order (the delivery
// shards of a lane take every few records of a chunk).
func BenchmarkCheckCold(b *testing.B) { checkSpread(b, 64<<20) }

// BenchmarkCheckVaried is BenchmarkCheckCold on 512 KiB of records: they
// stay in the cache, but are many and in no order.
func BenchmarkCheckVaried(b *testing.B) { checkSpread(b, 512<<10) }

func checkSpread(b *testing.B, size int) {
	c, err := compile(benchPlan())
	if err != nil {
		b.Fatal(err)
	}
	var buf []byte
	var spans [][2]int
	for i := 0; len(buf) < size; i++ {
		from := len(buf)
		buf = append(buf, benchtest.SDKEvent(i%1000)...)
		spans = append(spans, [2]int{from, len(buf)})
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(spans), func(i, j int) { spans[i], spans[j] = spans[j], spans[i] })
	b.ReportAllocs()
	cpu0 := benchtest.ProcessCPU()
	k := 0
	for b.Loop() {
		for range 100 {
			s := spans[k]
			if k++; k == len(spans) {
				k = 0
			}
			c.check(buf[s[0]:s[1]:s[1]], Block, nil)
		}
	}
	b.ReportMetric(float64(benchtest.ProcessCPU()-cpu0)/float64(b.N*100), "cpu-ns/event")
}

// BenchmarkVet is the ingest's check of BenchmarkCheck's events, as
// parsed: with the members of their property objects recorded by the
// parser (cleanAt, as the ingest does), without (cleanAt walks them), and
// in full (isClean, for comparison).
func BenchmarkVet(b *testing.B) {
	c, err := compile(benchPlan())
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"api_key":"k","events":[`)
	for i := range 100 {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, benchtest.SDKEvent(i)...)
	}
	body = append(body, "]}"...)
	for _, by := range []string{"members", "keys", "full"} {
		req := event.Request{PlanMembers: by == "members"}
		if err := event.Parse(body, &req); err != nil {
			b.Fatal(err)
		}
		b.Run("by="+by, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := benchtest.ProcessCPU()
			for b.Loop() {
				for i := range req.Events {
					e := &req.Events[i]
					if ok := by != "full" && c.cleanAt(&req, e) || by == "full" && c.isClean(e.Raw); !ok {
						b.Fatalf("event %d not clean", i)
					}
				}
			}
			b.ReportMetric(float64(benchtest.ProcessCPU()-cpu0)/float64(b.N*len(req.Events)), "cpu-ns/event")
		})
	}
}
