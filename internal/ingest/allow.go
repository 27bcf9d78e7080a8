package ingest

// The api_key allow-list.

// keySet is an immutable set of api_keys.
type keySet struct{ keys map[string]struct{} }

func newKeySet(keys []string) *keySet {
	if keys == nil {
		return nil
	}
	ks := &keySet{keys: make(map[string]struct{}, len(keys))}
	for _, k := range keys {
		ks.keys[k] = struct{}{}
	}
	return ks
}

// SetAllowedAPIKeys replaces the allow-list of api_keys (Config.AllowedAPIKeys)
// while the server runs, e.g. after the credentials file was reloaded: nil
// takes every api_key, an empty non-nil slice none. Requests already past the
// check are not affected. keys is not retained.
func (s *Server) SetAllowedAPIKeys(keys []string) {
	s.allowed.Store(newKeySet(keys))
}

// apiKeyAllowed reports whether the allow-list takes key.
func (s *Server) apiKeyAllowed(key []byte) bool {
	ks := s.allowed.Load()
	if ks == nil {
		return true
	}
	_, ok := ks.keys[string(key)]
	return ok
}
