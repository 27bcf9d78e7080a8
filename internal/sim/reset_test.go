package sim

import "testing"

// TestResetClearsRouteGroups: Reset forgets the state the route groups keep
// outside the store and keeps their configuration.
func TestResetClearsRouteGroups(t *testing.T) {
	s := New(Config{}, nil)
	defer s.Close()
	s.Knobs(func(k *Knobs) { k.ManagementKeys["mk"], k.RejectedGroupValues["v"], k.UserMapLimit = true, true, 7 })
	gi, um, mg, k := s.gi, s.um, s.mg, &s.knobs
	gi.byKey["k"] = []GroupIdentify{{}}
	um.mapped["org"] = map[string]string{"u": "g"}
	um.calls = append(um.calls, MappingCall{})
	mg.calls = append(mg.calls, MgmtCall{})
	mg.exp.exps["1"] = &simExperiment{}
	mg.scim.orgs["o"] = &scimOrg{}
	mg.cls.byKey["k"] = map[string]*simClassifier{}
	mg.tax.projects["k"] = &taxProject{}

	s.Reset()
	if len(gi.byKey) != 0 || len(k.RejectedGroupValues) != 0 {
		t.Errorf("groupidentify kept %v %v", gi.byKey, k.RejectedGroupValues)
	}
	if len(um.mapped) != 0 || len(um.calls) != 0 || k.UserMapLimit != 7 {
		t.Errorf("usermap after Reset: mapped %v, calls %d, limit %d (want empty, 0, kept 7)", um.mapped, len(um.calls), k.UserMapLimit)
	}
	if len(mg.calls) != 0 || len(mg.exp.exps) != 0 || len(mg.scim.orgs) != 0 || len(mg.cls.byKey) != 0 || len(mg.tax.projects) != 0 {
		t.Errorf("management APIs kept state after Reset")
	}
	if !k.ManagementKeys["mk"] {
		t.Errorf("Reset forgot the management key (configuration)")
	}
}
