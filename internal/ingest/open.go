package ingest

import (
	"errors"
	"fmt"
	"math"
)

// Open configures what an ingest listener reachable from browsers and the
// internet needs. The zero value changes nothing: no CORS, every
// api_key, no rate limit, addresses forwarded as they are.
type Open struct {
	// CORSOrigins are the origins (scheme://host[:port], see
	// NormalizeOrigin) whose browser pages may POST to the ingest paths, or
	// the one entry "*" for every origin; the package doc says how
	// preflights and other origins are answered. nil or empty: no CORS
	// headers are sent and the Origin header is not looked at.
	CORSOrigins []string
	// AllowedAPIKeys, when non-nil, are the only api_keys taken; a valid
	// request with another is answered 403 {"code":403,"error":"API key not
	// allowed"} and nothing of it is spooled. nil: every api_key; empty and
	// non-nil: none. Server.SetOpen replaces it at run time.
	AllowedAPIKeys []string
	// ClientRateLimit is the requests per second (of accepted-looking
	// requests: valid, allowed) one client address may send, with a burst of
	// twice as many, by Config.Now's time; the package doc says how a request
	// above it is answered. 0: no limit, at no cost.
	ClientRateLimit float64
	// AnonymizeIP drops the last octet of IPv4 / the last 80 bits of IPv6
	// addresses (see the package doc for which). false: addresses are
	// forwarded as they are.
	AnonymizeIP bool
}

// maxClientRateLimit keeps the token interval at least a nanosecond.
const maxClientRateLimit = 1e9

// validate reports an error of o, or returns its CORS policy (nil: off).
func (o Open) validate() (*corsPolicy, error) {
	cors, err := newCORS(o.CORSOrigins)
	switch r := o.ClientRateLimit; {
	case err != nil:
		return nil, err
	case math.IsNaN(r) || r < 0:
		return nil, fmt.Errorf("ingest: ClientRateLimit %v is negative", r)
	case r > maxClientRateLimit:
		return nil, fmt.Errorf("ingest: ClientRateLimit %v is above %v", r, maxClientRateLimit)
	}
	for _, k := range o.AllowedAPIKeys {
		if k == "" {
			return nil, errors.New("ingest: empty api_key in AllowedAPIKeys")
		}
	}
	return cors, nil
}

// openState is a Server's state of Open. What requests read of it is one
// immutable snapshot, swapped whole by SetOpen (a reload), so a request
// sees the old settings or the new, never a mix.
type openState struct {
	corsPol *corsPolicy         // nil: CORS off
	allowed map[string]struct{} // nil: every api_key
	limiter *clientLimiter      // nil: no rate limit
	rate    float64             // limiter's rate
	anonIP  bool
}

// st is the Open state in force: load it once per use.
func (s *Server) st() *openState { return s.opened.Load() }

// SetOpen puts o in force for every later request while the server runs
// (a configuration reload), or changes nothing and returns an error when o
// is invalid. A client rate limit kept at the same rate keeps its clients'
// state.
func (s *Server) SetOpen(o Open) error {
	cors, err := o.validate()
	if err != nil {
		return err
	}
	n := &openState{corsPol: cors, rate: o.ClientRateLimit, anonIP: o.AnonymizeIP}
	if o.AllowedAPIKeys != nil {
		n.allowed = make(map[string]struct{}, len(o.AllowedAPIKeys))
		for _, k := range o.AllowedAPIKeys {
			n.allowed[k] = struct{}{}
		}
	}
	if old := s.st(); old != nil && old.rate == o.ClientRateLimit {
		n.limiter = old.limiter
	} else if o.ClientRateLimit > 0 {
		n.limiter = newClientLimiter(o.ClientRateLimit, limiterMaxClients, s.cfg.Now)
	}
	s.opened.Store(n)
	return nil
}

// SetMaxBatchBytes puts n (> 0) in force as Config.MaxBatchBytes for every
// later request (a configuration reload): an event that cannot fit alone in
// a request under it is refused (413).
func (s *Server) SetMaxBatchBytes(n int) {
	if n > 0 {
		s.maxBatch.Store(int64(n))
	}
}

// apiKeyAllowed reports whether the allow-list takes key.
func (o *openState) apiKeyAllowed(key []byte) bool {
	if o.allowed == nil {
		return true
	}
	_, ok := o.allowed[string(key)]
	return ok
}
