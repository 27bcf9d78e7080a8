package forward

import (
	"cmp"

	"github.com/svcrelay/relay/internal/ratelimit"
)

// APIConfig configures a forwarded API with client-side limits (scim,
// taxonomy, dsar, deletion): its upstream base and changes to its
// documented limits, which stay each API's own data.
type APIConfig struct {
	// URL is the upstream base (--analytics-url, --scim-url); "" means
	// none: only projects or organizations with their own base are served.
	URL string
	// Limit's fields that are not zero (Name aside) replace those of each
	// documented limit (MaxWait negative: never wait); zero keeps them.
	// Forwarder.Routes checks the result.
	Limit ratelimit.Config
}

// Validate reports a configuration that cannot work.
func (c APIConfig) Validate() error { return c.Limit.Validate() }

// Over returns doc, a documented limit, with the changes of c.Limit.
func (c APIConfig) Over(doc ratelimit.Config) ratelimit.Config {
	o := c.Limit
	doc.Limit, doc.Window, doc.MaxInFlight = cmp.Or(o.Limit, doc.Limit), cmp.Or(o.Window, doc.Window), cmp.Or(o.MaxInFlight, doc.MaxInFlight)
	doc.MaxWait, doc.MaxWaiting = cmp.Or(o.MaxWait, doc.MaxWait), cmp.Or(o.MaxWaiting, doc.MaxWaiting)
	return doc
}
