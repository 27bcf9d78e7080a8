package sim

// registerRoutes registers every route group (doc.go, Routes), each in a
// file of its own.
func (s *Sim) registerRoutes() {
	s.registerHTTPAPI()       // /2/httpapi, /batch (httpapi.go)
	s.registerControl()       // /sim/... (control.go), never faulted
	s.registerMgmt()          // the management APIs' shared state (mgmt.go)
	s.registerGroupIdentify() // /groupidentify, /sim/groupidentify (groupidentify.go)
	s.registerUserMap()       // /usermap, /api/2/usermap, /sim/usermap (usermap.go)
	s.registerExperiments()   // /api/1/experiments... (experiments.go; shared parts in mgmt.go)
	s.registerSCIM()          // /scim/1/Users, /scim/1/Groups (scim.go)
	s.registerClassifiers()   // /api/2/channel-classifiers... (classifiers.go)
	s.registerTaxonomy()      // /api/2/taxonomy/... (taxonomy.go)
	s.registerFeedback()      // /api/1/ai-feedback/ingest, /sim/feedback (feedback.go)
	s.registerDSAR()          // /api/2/dsar/requests..., /objects/dsar/..., /sim/dsar/config (dsar.go)
	s.registerDeletion()      // /api/2/deletions/users... (deletion.go)
	s.registerExport()        // /api/2/export, /sim/export/... (export.go)
}

// validKey reports whether apiKey is acceptable: non-empty, one of
// Config.APIKeys when those are set, and not refused (Knobs.RefusedKeys).
// The caller must not hold s.mu.
func (s *Sim) validKey(apiKey string) bool {
	if apiKey == "" || (s.keys != nil && !s.keys[apiKey]) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.knobs.RefusedKeys[apiKey]
	if ok && !s.cfg.Now().Before(u) {
		delete(s.knobs.RefusedKeys, apiKey)
		return true
	}
	return !ok
}
