package sim

import (
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{EPSThreshold: -1}, {RateWindow: -1}, {DedupWindow: -1}, {DedupMaxKeys: -1}, {MaxBodyBytes: -1},
		{MaxEvents: -1}, {APIKeys: []string{""}}, {DailyQuota: -2}} {
		if c.Validate() == nil {
			t.Errorf("%+v valid", c)
		}
	}
	if err := (&Config{RateWindow: -time.Second}).Validate(); err == nil || err.Error() != "sim: RateWindow -1s < 0" {
		t.Errorf("negative RateWindow: %v", err)
	}
	if (&Config{}).Validate() != nil {
		t.Error("zero config invalid")
	}
	c := New(Config{}, nil).cfg
	if c.EPSThreshold != 30 || c.RateWindow != 10*time.Second || c.MaxBodyBytes != 1_000_000 || c.ThrottlePenalty != 30*time.Second {
		t.Errorf("defaults %+v", c)
	}
	// The document's figures (the knobs' defaults).
	k := New(Config{}, nil).knobs
	if k.SCIMLimit != 100 || k.SCIMWindow != time.Minute || k.TaxonomyMaxInFlight != 4 || k.TaxonomyPeriodCost != 7200 ||
		k.TaxonomyPeriod != time.Hour || k.UserMapLimit != 1500 || k.UserMapWindow != 30*time.Second || k.DSARPollsToDone != 3 {
		t.Errorf("knob defaults %+v", k)
	}
}
