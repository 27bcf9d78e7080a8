// Package classifiers forwards the channel classifier API
// (/api/2/channel-classifiers) of ../shared/api/experiments-scim-classifiers.md
// on the admin listener, on the upstream's paths.
//
// Every endpoint of the document's table is routed (Routes); other paths
// under /api/2/channel-classifiers are answered 404 locally. The upstream is
// --analytics-url, or the analytics_url of the project named by
// X-Relay-Project (or of the project whose api_key a pass-through Basic
// header carries), else of its organization. Credentials: the caller's
// Authorization passes through; with X-Relay-Project the project's
// "Basic api_key:secret_key" is injected.
//
// Local validation, with the upstream's statuses (Errors table), body
// {"error": "...", "source": "relay"}: POST with a name other than letters,
// digits, '_' and '-' (400); POST and PATCH bodies that are not a JSON
// object, lack csvDefinition or csvDefinition.csvText (400), have a csvText
// above MaxCSVBytes (413) or a displayName or description above MaxTextChars
// characters (400). The document's "1 MB" is read as 1 MiB (1,048,576
// bytes of the decoded string): the relay never refuses what the upstream
// may take; between 1,000,000 bytes and 1 MiB the upstream decides. The
// upstream has no documented rate limit here.
package classifiers

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Limits of the document.
const (
	MaxCSVBytes  = 1 << 20
	MaxTextChars = 1000
	// Root is the path every route is under.
	Root = "/api/2/channel-classifiers"
)

// Config configures the classifier routes.
type Config struct {
	// URL is --analytics-url, the upstream base; "" means none (only
	// projects with an analytics_url can be served).
	URL string
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error { return nil }

// API forwards the classifier routes.
type API struct {
	cfg   Config
	creds *credentials.Store
	fwd   *forward.Forwarder
	log   *zap.Logger
	mux   forward.Mux
}

// New returns the classifier routes. creds, log and reg may be nil.
func New(cfg Config, creds *credentials.Store, fwd *forward.Forwarder, log *zap.Logger, reg prometheus.Registerer) (*API, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if fwd == nil {
		return nil, errors.New("classifiers: nil forwarder")
	}
	if log == nil {
		log = zap.NewNop()
	}
	a := &API{cfg: cfg, creds: creds, fwd: fwd, log: log}
	a.routes()
	return a, nil
}

// Routes returns the admin-listener routes (admintoken.ModeForward).
func (a *API) Routes() []adminroute.Route { return a.mux.AdminRoutes(Root) }

// ValidName reports whether name has only letters, digits, '_' and '-'
// (and is not empty).
func ValidName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// CheckBody validates a POST or PATCH body; it returns 0 when it is
// acceptable, else the upstream's status and a message.
func CheckBody(body []byte) (int, string) {
	var b struct {
		DisplayName *string         `json:"displayName"`
		Description *string         `json:"description"`
		Def         json.RawMessage `json:"csvDefinition"`
	}
	if err := json.Unmarshal(body, &b); err != nil || len(body) == 0 {
		return fasthttp.StatusBadRequest, "body must be a JSON object"
	}
	var def struct {
		CSV *string `json:"csvText"`
	}
	if len(b.Def) == 0 || string(b.Def) == "null" {
		return fasthttp.StatusBadRequest, "csvDefinition is required"
	}
	if err := json.Unmarshal(b.Def, &def); err != nil || b.Def[0] != '{' {
		return fasthttp.StatusBadRequest, "csvDefinition must be an object"
	}
	if def.CSV == nil {
		return fasthttp.StatusBadRequest, "csvDefinition.csvText is required"
	}
	if n := len(*def.CSV); n > MaxCSVBytes {
		return fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("csvDefinition.csvText is %d bytes; at most 1 MB (%d bytes)", n, MaxCSVBytes)
	}
	for _, f := range []struct {
		name string
		v    *string
	}{{"displayName", b.DisplayName}, {"description", b.Description}} {
		if f.v != nil && utf8.RuneCountInString(*f.v) > MaxTextChars {
			return fasthttp.StatusBadRequest, fmt.Sprintf("%s is longer than %d characters", f.name, MaxTextChars)
		}
	}
	return 0, ""
}

func (a *API) handle(method, pattern string, checkName, checkBody bool) {
	up := forward.Upstream{API: "classifier", Kind: credentials.KindAnalytics, Fallback: a.cfg.URL,
		Flag: "--analytics-url", Scheme: forward.SchemeProjectBasic}
	a.mux.Handle(method, pattern, func(ctx *fasthttp.RequestCtx, p forward.Params) {
		r, e := forward.Resolve(ctx, a.creds, up)
		if e != nil {
			e.Write(ctx)
			return
		}
		if checkName && !ValidName(p["name"]) {
			forward.WriteError(ctx, fasthttp.StatusBadRequest, "classifier name may hold letters, digits, underscores and hyphens only")
			return
		}
		if checkBody {
			body, err := forward.DecodedBody(ctx, a.fwd.MaxRequestBodyBytes())
			if err != nil {
				forward.WriteError(ctx, fasthttp.StatusBadRequest, "request body could not be decoded by its Content-Encoding")
				return
			}
			if status, msg := CheckBody(body); status != 0 {
				forward.WriteError(ctx, status, msg)
				return
			}
		}
		a.fwd.Forward(ctx, r.Target)
	})
}

func (a *API) routes() {
	a.handle(fasthttp.MethodGet, Root, false, false)
	a.handle(fasthttp.MethodGet, Root+"/{name}", false, false)
	a.handle(fasthttp.MethodPost, Root+"/{name}", true, true)
	a.handle(fasthttp.MethodPatch, Root+"/{name}", false, true)
}
