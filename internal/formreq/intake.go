package formreq

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
)

// APIKey resolves the api_key of a spooling form route (POST /groupidentify,
// POST /usermap): apiKey as the request gave it, or, when project (the
// X-Relay-Project header) is not empty, the api_key of that project in
// creds (the request must then not give its own). The result is not empty
// and at most event.MaxAPIKeyBytes long (issue 19: a lane per key).
func APIKey(creds *credentials.Store, project, apiKey string) (string, *ValidationError) {
	if project != "" {
		if apiKey != "" {
			return "", Bad("conflict", "api_key and X-Relay-Project: give one, not both")
		}
		p, ok := creds.Project(project)
		if !ok {
			return "", Bad("unknown_project", "X-Relay-Project: no project of that name in the credentials file")
		}
		apiKey = p.APIKey.Reveal()
	}
	if apiKey == "" {
		return "", Bad("missing_field", "api_key: missing or empty")
	}
	if len(apiKey) > event.MaxAPIKeyBytes {
		return "", Bad("invalid_api_key", "api_key: longer than %d bytes", event.MaxAPIKeyBytes)
	}
	return apiKey, nil
}

// Spool appends b (n records) to the lane of key and answers the request:
// once the spool holds b, it adds n to accepted and answers 200 with
// {"code":200,"<field>":<n>}; else (through SpoolFailed) 503.
func (r *Rejecter) Spool(w http.ResponseWriter, sp *spool.Spool, key spool.LaneKey, b *spool.Batch, accepted prometheus.Counter, field string, n int) {
	ctx := context.Background()
	lane, err := sp.Lane(ctx, key)
	if err == nil {
		err = sp.Append(ctx, lane, b)
	}
	if err != nil {
		r.SpoolFailed(w, err)
		return
	}
	accepted.Add(float64(n))
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"code":200,%q:%d}`, field, n)
}
