package sim

import "time"

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

// validKey reports whether apiKey is acceptable: non-empty, and one of
// Config.APIKeys when those are set.
func (s *Sim) validKey(apiKey string) bool {
	return apiKey != "" && (s.keys == nil || s.keys[apiKey]) && !s.keyRefused(apiKey)
}

// RefuseKey answers "Invalid API key" to apiKey for d (by Config.Now), as an
// upstream may while a key is rotated: the reading of ambiguity 10 where an
// invalid key is transient. d <= 0 ends it.
func (s *Sim) RefuseKey(apiKey string, d time.Duration) {
	s.keyMu.Lock()
	defer s.keyMu.Unlock()
	if d <= 0 {
		delete(s.refused, apiKey)
		return
	}
	if s.refused == nil {
		s.refused = map[string]time.Time{}
	}
	s.refused[apiKey] = s.cfg.Now().Add(d)
}

func (s *Sim) keyRefused(apiKey string) bool {
	s.keyMu.Lock()
	defer s.keyMu.Unlock()
	u, ok := s.refused[apiKey]
	if ok && !s.cfg.Now().Before(u) {
		delete(s.refused, apiKey)
		return false
	}
	return ok
}
