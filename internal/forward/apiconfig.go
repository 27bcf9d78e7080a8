package forward

import (
	"fmt"

	"github.com/svcrelay/relay/internal/ratelimit"
)

// APIConfig configures a forwarded API whose table has client-side limits
// (scim.API, taxonomy.API, dsar.API, deletion.API): its upstream base and
// changes to its documented limits. Their knobs are all ratelimit.Config's,
// so one Config serves every API; each API's documented limits are its own
// data.
type APIConfig struct {
	// URL is the upstream base (its flag: --analytics-url, --scim-url);
	// "" means none: only projects or organizations with their own base in
	// the credentials file can be served.
	URL string
	// Limit's fields that are not zero (Name aside) replace those of each
	// of the API's documented limits: a smaller budget, a shorter MaxWait
	// (negative: never wait). The zero value keeps the documented limits.
	Limit ratelimit.Config
}

// Validate reports a configuration that cannot work (see
// ratelimit.Config.Validate; Forwarder.Routes checks the limits as
// changed, and each route's cost against them).
func (c APIConfig) Validate() error {
	if err := c.Limit.Validate(); err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	return nil
}

// Over returns doc, a documented limit, with the changes of c.Limit.
func (c APIConfig) Over(doc ratelimit.Config) ratelimit.Config {
	o := c.Limit
	if o.Limit != 0 {
		doc.Limit = o.Limit
	}
	if o.Window != 0 {
		doc.Window = o.Window
	}
	if o.MaxInFlight != 0 {
		doc.MaxInFlight = o.MaxInFlight
	}
	if o.MaxWait != 0 {
		doc.MaxWait = o.MaxWait
	}
	if o.MaxWaiting != 0 {
		doc.MaxWaiting = o.MaxWaiting
	}
	return doc
}
